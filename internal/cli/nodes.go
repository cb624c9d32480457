package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

// deviceJSON is what `devices --json` prints per node.
type deviceJSON struct {
	Name       string     `json:"name"`
	Role       string     `json:"role"`
	State      string     `json:"state"`
	Addr       string     `json:"addr,omitempty"`
	Capacity   int64      `json:"capacity"`
	Free       int64      `json:"free"`
	Used       int64      `json:"used"`
	Rate       float64    `json:"rate"` // bytes per second
	Served     int64      `json:"served"`
	Registered time.Time  `json:"registered"`
	LastSeen   *time.Time `json:"last_seen,omitempty"`
	Removed    *time.Time `json:"removed,omitempty"`
	// Metadata is set for a device that serves the realm's metadata
	// (meta.go).
	Metadata *realm.MetaMemberStatus `json:"metadata,omitempty"`
}

func unixTime(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

func (e *env) devicesCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "devices [--json]",
		Short: "List the realm's nodes: devices, benefactors and surrogates, and whether they are online",
		Long: `List every node of the realm with its role, state (online: its heartbeat
lease is alive; offline; removed), address, capacity and use of its store's
disk, and when it last reported; then where the realm's metadata lives (the
devices whose etcd member serves it, their gateways, and each member's
health: leader, follower, learner, not started).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			nodes, err := r.Meta.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			out := make([]deviceJSON, 0, len(nodes))
			for _, n := range nodes {
				out = append(out, deviceJSON{Name: n.Name, Role: n.Role, State: n.State, Addr: n.Addr, Capacity: n.Capacity, Free: n.Free, Used: n.Used,
					Rate: n.Rate, Served: n.Served, Registered: time.Unix(0, n.Registered).UTC(), LastSeen: unixTime(n.LastSeen), Removed: unixTime(n.Removed)})
			}
			metaMembers := e.metaMembers(cmd.Context(), r, out)
			if asJSON {
				return e.printJSON(out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tSTATE\tADDRESS\tCAPACITY\tUSED\tLAST SEEN")
			for _, d := range out {
				seen := "never"
				if d.LastSeen != nil {
					seen = d.LastSeen.Local().Format(time.DateTime)
				}
				cap, used := "-", "-"
				if d.Capacity > 0 {
					cap, used = human1024(d.Capacity), human1024(d.Used)
				}
				addr := d.Addr
				if addr == "" {
					addr = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, d.Role, d.State, addr, cap, used, seen)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			e.printMetaMembers(metaMembers)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func (e *env) nodeCmd() *cobra.Command {
	c := &cobra.Command{Use: "node", Short: "Run this machine's node, or remove a node from the realm"}
	var listen, advertise, gatewayListen, donate string
	var noGateway bool
	var registrars []string
	var lease time.Duration
	serve := &cobra.Command{
		Use:   "serve [--listen HOST:PORT] [--gateway-listen HOST:PORT] [--registrar ADDR] [--donate SIZE]",
		Short: "Serve this machine's store to the realm's devices (and, on a device, the join and registrar endpoints)",
		Long: `Serve this machine's local store to the realm's devices over HTTP/2 with mutual
TLS 1.3 (realm certificates only). The node registers in the realm's registry
with a lease (its heartbeat: if it stops, it shows offline once the lease
lapses) and reports its capacity, free space, use and serving rate. SIGINT or
SIGTERM deregisters it and exits 0; a node removed from the realm stops with
exit code 4.

On a device the node also serves, on the device holding the realm CA, the join
endpoint that 'cairn invite' tokens point to, and on every device the
registrar of benefactors and surrogates. The device that runs the realm's
embedded etcd also serves it to the other devices, over mutual TLS with
their node certificates (the metadata gateway: only devices get in), on
--gateway-listen (default: the --listen host and port + 1, so that port
must be free too; --no-gateway serves none); a device that joins gets
the gateways of the online devices, so run 'node serve' here before 'cairn
invite', and keep it running while other devices use the realm.

On a benefactor or surrogate (a home made by 'cairn join' with such a token:
credentials only, no keys, no metadata access) it serves the store in
$CAIRN_HOME/store and reports every lease/3 to a registrar, a device's node,
which records it in the registry: at first the device that admitted it (the
join address), then any online device the registrars name. --registrar
ADDR[,ADDR] reports to those instead. It learns the realm's revocation list
from its registrar, and refuses every request until it has one. A
benefactor refuses writes past --donate SIZE (its donation; default: no
bound but its disk); a surrogate refuses every write (it holds staged
copies only).

It prints "serving NAME on ADDRESS" once ready.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if c, err := pki.LoadCredentials(realm.CredentialsDir(e.home)); err == nil && c.Identity.Role != pki.Device {
				var donation int64
				if donate != "" {
					if c.Identity.Role != pki.Benefactor {
						return withCode(ExitUsage, fmt.Errorf("node serve: --donate is for a benefactor; a %s takes no writes", c.Identity.Role))
					}
					n, perr := parseSize(donate)
					if perr != nil {
						return withCode(ExitUsage, fmt.Errorf("node serve: --donate: %w", perr))
					}
					donation = n
				}
				return e.serveStandalone(cmd, c, realm.StandaloneOptions{Listen: listen, Advertise: advertise, Lease: lease, Registrars: registrars, Donation: donation})
			}
			if donate != "" {
				return withCode(ExitUsage, errors.New("node serve: --donate is for a benefactor; a device's store is its own"))
			}
			if len(registrars) > 0 {
				return withCode(ExitUsage, errors.New("node serve: --registrar is for a benefactor or surrogate; a device registers in the metadata itself"))
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			creds, err := r.Credentials(cmd.Context())
			if err != nil {
				return err
			}
			go e.drainWhileServing(cmd.Context())
			err = r.Serve(cmd.Context(), realm.ServeOptions{Listen: listen, Advertise: advertise, Lease: lease, GatewayListen: gatewayListen, NoGateway: noGateway, Ready: func(addr string, join bool) {
				extra := ""
				if join {
					extra = " (and the join endpoint)"
				}
				if st, nerr := r.Meta.Node(cmd.Context(), creds.Identity.Name); nerr == nil && st.Gateway != "" {
					extra += ", metadata gateway on " + st.Gateway
				}
				fmt.Fprintf(e.stdout, "serving %s on %s%s\n", creds.Identity.Name, addr, extra)
			}})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "stopped %s\n", creds.Identity.Name)
			return nil
		},
	}
	serve.Flags().StringVar(&listen, "listen", ":7461", "address of the chunk service (port 0 picks one); the metadata gateway takes port + 1 unless --gateway-listen says otherwise")
	serve.Flags().StringVar(&advertise, "advertise", "", "address other nodes dial (default: the listening address, the host name for an unspecified host)")
	serve.Flags().DurationVar(&lease, "lease", realm.DefaultLease, "heartbeat lease: a node that stops shows offline after this long")
	serve.Flags().StringVar(&gatewayListen, "gateway-listen", "", "device running the embedded etcd: where the metadata gateway listens (default: the --listen host, port + 1)")
	serve.Flags().BoolVar(&noGateway, "no-gateway", false, "do not serve the metadata gateway (no other device can then reach this realm's metadata)")
	serve.Flags().StringVar(&donate, "donate", "", "benefactor: the most its store may hold (e.g. 50GiB); puts past it are refused")
	serve.Flags().StringSliceVar(&registrars, "registrar", nil, "benefactor or surrogate: the registrars (devices' node addresses HOST:PORT) to report to, instead of those it knows")
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a node from the realm: its certificates are refused everywhere",
		Long: `Remove a node: the certificates the realm issued to it are revoked in the
realm's revocation list (kept in the metadata service, so every running node
refuses them within moments, also on connections already open), and the
registry marks it removed. The machine can join again only with a new
invitation.`,
		Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := pki.ValidName(name); err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if c, err := r.Credentials(cmd.Context()); err == nil && c.Identity.Name == name {
				return cairn.E("node remove", cairn.Invalid, name, errors.New("this is the device you are on: remove it from another device"))
			}
			if err := r.Meta.RemoveNode(cmd.Context(), name, time.Time{}); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed %s: its certificates are revoked\n", name)
			return nil
		},
	}
	c.AddCommand(serve, remove)
	return c
}

// serveStandalone runs the node of a benefactor's or surrogate's home.
func (e *env) serveStandalone(cmd *cobra.Command, c *pki.Credentials, o realm.StandaloneOptions) error {
	name := c.Identity.Name
	o.Logger = e.log
	o.Ready = func(addr, registrar string) {
		via := "registered through " + registrar
		if registrar == "" {
			via = "no registrar reached yet: retrying"
		}
		fmt.Fprintf(e.stdout, "serving %s on %s (%s; %s)\n", name, addr, c.Identity.Role, via)
	}
	if err := realm.ServeStandalone(cmd.Context(), e.home, o); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "stopped %s\n", name)
	return nil
}
