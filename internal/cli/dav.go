package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/dav"
	"cairn.dev/cairn/internal/httpauth"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
)

// defaultDavListen is where 'cairn dav' listens without --listen: this
// machine only (RFC 4918's number as the port).
const defaultDavListen = "127.0.0.1:4918"

func (e *env) davCmd() *cobra.Command {
	var listen string
	var plain bool
	var hostnames []string
	c := &cobra.Command{
		Use:   "dav VOLUME [--listen ADDR] [--http] [--hostname NAME]...",
		Short: "Serve a volume over WebDAV (file managers, davfs2, Windows and macOS clients)",
		Long: `Serve VOLUME (for example 'home') over WebDAV at ADDR until Ctrl-C or SIGTERM.

It speaks HTTPS with a certificate signed by the realm CA: on the device that
holds the CA, a certificate made at start for the listen address, --hostname
names, this machine's host name and addresses, and localhost; elsewhere the
device's own certificate. Clients must trust the realm CA:
$CAIRN_HOME/pki/node/ca.crt. --http serves plain HTTP instead, which is refused
unless ADDR is a loopback address (127.0.0.1, ::1, localhost): passwords would
cross the network in the clear.

Every request needs a user and app password (HTTP Basic authentication): make
them with 'cairn dav passwd add USER'. Each user may read and write the whole
volume. Ten wrong passwords within a minute from one address lock that address
out for the rest of the minute.

Like the mount, it is close-to-open: a GET reads the version current when it
starts; a PUT is staged in $CAIRN_HOME/dav/cache and committed as a new version
once its body is complete (an upload cut short changes nothing); DELETE moves to
the trash ('cairn trash', 'cairn restore'). Dead properties (PROPPATCH) are kept
in the realm's metadata, so every gateway of the realm sees them. WebDAV locks
(LOCK, exclusive or shared) live in this process's memory: they bind the clients
of this gateway only and end when it stops. Symbolic links are not served. A
PROPFIND of depth infinity is refused (403).`,
		Args: exactArgs(1, "VOLUME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := davVolumeName(args[0])
			if err != nil {
				return err
			}
			loop, err := dav.IsLoopback(listen)
			if err != nil {
				return withCode(ExitUsage, fmt.Errorf("dav: --listen: %w", err))
			}
			if plain && !loop {
				return withCode(ExitUsage, fmt.Errorf("dav: refusing plain HTTP on %s, which is not a loopback address: "+
					"app passwords would cross the network in the clear (drop --http to serve HTTPS with a certificate of the realm CA)", listen))
			}
			return e.serveDav(cmd.Context(), name, listen, plain, hostnames)
		},
	}
	e.wakeFlag(c)
	c.Flags().StringVar(&listen, "listen", defaultDavListen, "address to serve on, host:port (port 0: any free port)")
	c.Flags().BoolVar(&plain, "http", false, "serve plain HTTP instead of HTTPS (only on a loopback address)")
	c.Flags().StringArrayVar(&hostnames, "hostname", nil, "a name clients use to reach this machine, put in the certificate (repeatable)")
	c.AddCommand(e.davPasswdCmd())
	return c
}

// davVolumeName accepts "home", "home:" and "home:/".
func davVolumeName(s string) (string, error) {
	name, rest, hasColon := strings.Cut(s, ":")
	if hasColon && strings.Trim(rest, "/") != "" {
		return "", cairn.E("dav", cairn.Invalid, s, errors.New("serving a directory inside a volume is not supported: give the volume name"))
	}
	if err := vpath.ValidVolume(name); err != nil {
		return "", cairn.E("dav", cairn.Invalid, s, err)
	}
	return name, nil
}

func (e *env) davUsers() (*dav.Users, error) {
	if fi, err := os.Stat(e.home); err != nil || !fi.IsDir() {
		return nil, cairn.E("dav", cairn.NotFound, e.home, errors.New("no realm here: 'cairn init' or 'cairn join' first"))
	}
	return dav.OpenUsers(dav.UsersFile(e.home)), nil
}

func (e *env) serveDav(ctx context.Context, name, listen string, plain bool, hostnames []string) error {
	users, err := e.gatewayUsers("dav")
	if err != nil {
		return err
	}
	r, err := e.open(ctx)
	if err != nil {
		return err
	}
	v, err := r.Volume(ctx, name)
	if err != nil {
		return err
	}
	v.SetPlacement(r.Placement(name))
	h, err := dav.New(v, dav.Options{Users: users, Realm: "cairn " + name, CacheDir: filepath.Join(e.home, "dav", "cache"), Logger: e.log})
	if err != nil {
		return err
	}
	defer h.Close()
	ln, tc, url, err := e.listenGateway(ctx, "dav", r, listen, plain, hostnames)
	if err != nil {
		return err
	}
	// Last: scripts and tests wait for this line.
	fmt.Fprintf(e.stdout, "serving %s over WebDAV at %s (pid %d)\n", name, url, os.Getpid())
	if err := dav.Serve(ctx, ln, h, tc, e.log); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "stopped")
	return nil
}

// gatewayUsers is the account file of the HTTP gateways (cairn dav,
// cairn web), refused when it has no account yet: a gateway nobody can
// log in to is a mistake, not a choice.
func (e *env) gatewayUsers(op string) (*dav.Users, error) {
	users, err := e.davUsers()
	if err != nil {
		return nil, err
	}
	if n, err := users.Count(); err != nil {
		return nil, err
	} else if n == 0 {
		return nil, cairn.E(op, cairn.NotFound, httpauth.UsersFile(e.home), errors.New("no users yet: add one with 'cairn dav passwd add USER'"))
	}
	return users, nil
}

// listenGateway opens an HTTP gateway's listener: the certificate first
// unless plain (printing what clients must trust), then the socket. It
// returns the TLS configuration to serve with (nil for plain HTTP) and
// the base URL clients use.
func (e *env) listenGateway(ctx context.Context, op string, r *realm.Realm, listen string, plain bool, hostnames []string) (net.Listener, *tls.Config, string, error) {
	var tc *tls.Config
	certNote := ""
	if !plain {
		cert, note, err := e.davCertificate(ctx, r, listen, hostnames)
		if err != nil {
			return nil, nil, "", err
		}
		tc, certNote = httpauth.TLSConfig(cert), note
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, nil, "", cairn.E(op, cairn.Unavailable, listen, err)
	}
	scheme := "https"
	if plain {
		scheme = "http"
	}
	if certNote != "" {
		fmt.Fprintln(e.stdout, certNote)
	}
	return ln, tc, fmt.Sprintf("%s://%s/", scheme, ln.Addr()), nil
}

// davCertificate returns the certificate the gateway presents and a line
// telling the user what clients must trust. On the device holding the
// realm CA it is made now, for this device's identity with the names
// clients use as SANs (its serial recorded with the device, so removing the
// device revokes it too), and kept only in memory; elsewhere it is the
// device's own.
func (e *env) davCertificate(ctx context.Context, r *realm.Realm, listen string, hostnames []string) (tls.Certificate, string, error) {
	creds, err := r.Credentials(ctx)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	caFile := filepath.Join(realm.CredentialsDir(e.home), pki.CACertFile)
	ca, err := r.CA(ctx)
	if errors.Is(err, cairn.ErrNotFound) {
		note := fmt.Sprintf("certificate: this device's own, signed by the realm CA (trust %s); it names no host, so clients that check host names refuse it: run the gateway on the device holding the CA for one that does", caFile)
		return creds.TLSCertificate(), note, nil
	}
	if err != nil {
		return tls.Certificate{}, "", err
	}
	hosts := davHosts(listen, hostnames)
	gw, err := ca.NewCredentials(creds.Identity, pki.IssueOptions{Hosts: hosts})
	if err != nil {
		return tls.Certificate{}, "", err
	}
	// Recorded with the device, so that removing it revokes this one too.
	if err := r.Meta.AddNodeSerial(ctx, creds.Identity.Name, gw.Leaf.SerialNumber.Text(16)); err != nil {
		return tls.Certificate{}, "", err
	}
	note := fmt.Sprintf("certificate: signed by the realm CA (trust %s) for %s", caFile, strings.Join(hosts, ", "))
	return gw.TLSCertificate(), note, nil
}

// davHosts are the names a gateway's certificate carries: the listen
// host, or for all interfaces every address and the host name, plus the
// --hostname names and localhost.
func davHosts(listen string, extra []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		h = strings.Trim(h, "[]")
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, h := range extra {
		add(h)
	}
	host, _, _ := net.SplitHostPort(listen)
	if ip := net.ParseIP(strings.Trim(host, "[]")); host == "" || ip != nil && ip.IsUnspecified() {
		if hn, err := os.Hostname(); err == nil {
			add(hn)
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
					add(ipn.IP.String())
				}
			}
		}
	} else {
		add(host)
	}
	add("localhost")
	add("127.0.0.1")
	add("::1")
	return out
}

func (e *env) davPasswdCmd() *cobra.Command {
	p := &cobra.Command{
		Use:   "passwd",
		Short: "Manage the users and app passwords of 'cairn dav'",
		Long: `Manage who may use 'cairn dav' on this device. Each user has an app password that
cairn makes, shows once, and keeps only as an Argon2id hash in
$CAIRN_HOME/dav/passwd.json (mode 0600). The users are this device's: a gateway
on another device has its own. A running gateway sees changes at once.`,
		Args: exactArgs(0, "a subcommand: add, ls or rm"),
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var replace bool
	add := &cobra.Command{
		Use:   "add [--replace] USER",
		Short: "Add a user and print its new app password (shown only this once)",
		Long: `Add USER (letters, digits, '.', '_', '@', '-'; at most 64) with a new random app
password, printed on standard output, alone on its line, and never shown again.
An existing user is refused unless --replace, which gives it a new password and
stops the old one.`,
		Args: exactArgs(1, "USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			users, err := e.davUsers()
			if err != nil {
				return err
			}
			pass, err := users.Add(args[0], replace)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "app password for WebDAV user %s (shown only now; 'cairn dav passwd add --replace %s' makes a new one):\n", args[0], args[0])
			fmt.Fprintln(e.stdout, pass)
			return nil
		},
	}
	add.Flags().BoolVar(&replace, "replace", false, "give an existing user a new password")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the users",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			users, err := e.davUsers()
			if err != nil {
				return err
			}
			list, err := users.List()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tADDED")
			for _, u := range list {
				fmt.Fprintf(tw, "%s\t%s\n", u.Name, u.Created.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm USER",
		Short: "Remove a user: its password stops working at once",
		Args:  exactArgs(1, "USER"),
		RunE: func(cmd *cobra.Command, args []string) error {
			users, err := e.davUsers()
			if err != nil {
				return err
			}
			if err := users.Remove(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed WebDAV user %s\n", args[0])
			return nil
		},
	}
	p.AddCommand(add, ls, rm)
	return p
}
