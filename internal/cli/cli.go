// Package cli is cairn's command line: flag parsing, output formats, progress
// bars and exit codes. The work itself lives in the realm and fs packages.
package cli

import (
	"cairn.dev/cairn/internal/director"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
)

// Exit codes a script can rely on (documented in README.md).
const (
	ExitOK          = 0
	ExitError       = 1 // any other failure, or some items failed (put/get continue past them)
	ExitUsage       = 2 // bad command line
	ExitNotFound    = 3 // no such realm, volume, file or version
	ExitPermission  = 4 // wrong passphrase, no key for the volume
	ExitDamaged     = 5 // corrupt data found (fsck problems, a chunk or manifest failing verification)
	ExitUnavailable = 6 // the metadata service or a store cannot be reached
	ExitConflict    = 7 // another writer or gc holds a lock; a concurrent change won
	ExitExist       = 8 // the target exists (init on an existing realm, mkdir without -p, ...)
	ExitInterrupted = 130
)

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// ExitCode maps an error to the documented exit code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, context.Canceled) {
		return ExitInterrupted
	}
	switch cairn.KindOf(err) {
	case cairn.NotFound:
		return ExitNotFound
	case cairn.Permission:
		return ExitPermission
	case cairn.Corrupt:
		return ExitDamaged
	case cairn.Unavailable:
		return ExitUnavailable
	case cairn.Conflict:
		return ExitConflict
	case cairn.Exist:
		return ExitExist
	case cairn.Invalid:
		return ExitUsage
	case cairn.Canceled:
		return ExitInterrupted
	}
	return ExitError
}

// env is what every command shares: streams, global flags, the open realm.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	home           string
	etcd           string
	verbose        bool
	quiet          bool
	cpuprofile     string
	metaWait       string        // --meta-wait, else $CAIRN_META_WAIT: realm.Options.MetaWait
	target         string        // put --store: the node that receives the data
	noCache        bool          // cat/get --no-cache: read from the stores, past every local cache
	allowOffline   bool          // ls, cat, get: open the realm offline (local copies) if the service cannot be reached
	offloadTo      string        // put --offload-to
	wakeTimeout    time.Duration // get/cat/mount/dav --wake-timeout: the wait for a node a read wakes (-1 in other commands: they never wake one)
	log            *slog.Logger
	realm          *realm.Realm
	pass           []byte // the passphrase once read (for a background drainer)
	cmdPath        string // the command run ("cairn put", ...)
	// readPassword, if set, reads a passphrase instead of the terminal
	// (tests).
	readPassword func() ([]byte, error)
}

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, wakeTimeout: -1}
	root := e.rootCmd()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if e.realm != nil {
		e.realm.Close()
	}
	if e.cmdPath != "" && e.cmdPath != "cairn queue run" && e.cmdPath != "cairn init" && ctx.Err() == nil {
		// Files wait in the upload queue and no drainer runs (one was
		// killed, or gave up while a store was unreachable): start one.
		e.startDrainer()
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.stderr, "cairn: interrupted")
			return ExitInterrupted
		}
		var ee *exitError
		if !errors.As(err, &ee) || ee.err != errQuiet {
			fmt.Fprintf(e.stderr, "cairn: %v\n", err)
		}
		return ExitCode(err)
	}
	return ExitOK
}

// errQuiet marks an exit code whose message the command already printed.
var errQuiet = errors.New("failed")

func (e *env) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "cairn",
		Short: "cairn keeps your files across your machines: encrypted, deduplicated, versioned",
		Long: `cairn keeps your files across your machines: encrypted, deduplicated, versioned.

Paths inside cairn are written VOLUME:/path (for example home:/photos/2026).
A realm lives in $CAIRN_HOME (default ~/.local/share/cairn); 'cairn init' creates one.
No daemon needs starting: the first command starts the embedded metadata service
and it stops by itself when idle.

Environment: CAIRN_HOME, CAIRN_PASSPHRASE (the keyring passphrase, else a prompt),
CAIRN_ETCD (external etcd endpoints, host:port,...), CAIRN_META_WAIT (how long to
try an unavailable metadata service again, as --meta-wait; default 15s), CAIRN_LOCK_TTL (writer lock
lease, default 15s: how long a crashed writer can block others),
CAIRN_CHUNK_CACHE (bound of the cache of chunks read from other nodes, e.g.
512MiB or 4GiB; default 1GiB), CAIRN_NO_AUTODRAIN=1 (no background drainer of
the upload queue of 'put --background'; only 'cairn queue run' drains it).`,
		Version:       VersionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			e.cmdPath = cmd.CommandPath()
			level := slog.LevelWarn
			if e.verbose {
				level = slog.LevelDebug
			}
			e.log = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
			if e.home == "" {
				h, err := realm.DefaultHome()
				if err != nil {
					return err
				}
				e.home = h
			}
			if e.etcd == "" {
				e.etcd = os.Getenv("CAIRN_ETCD")
			}
			if e.metaWait == "" {
				e.metaWait = os.Getenv("CAIRN_META_WAIT")
			}
			if e.metaWait != "" {
				if d, err := time.ParseDuration(e.metaWait); err != nil || d < 0 {
					return withCode(ExitUsage, fmt.Errorf("--meta-wait (or CAIRN_META_WAIT) %q: want a duration such as 5s, or 0", e.metaWait))
				}
			}
			if e.cpuprofile != "" {
				f, err := os.Create(e.cpuprofile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
			}
			return nil
		},
		PersistentPostRun: func(cmd *cobra.Command, args []string) {
			if e.cpuprofile != "" {
				pprof.StopCPUProfile()
			}
		},
	}
	root.SetVersionTemplate("cairn {{.Version}}\n")
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return withCode(ExitUsage, fmt.Errorf("%v (see '%s --help')", err, c.CommandPath()))
	})
	pf := root.PersistentFlags()
	pf.StringVar(&e.home, "home", "", "realm directory (default $CAIRN_HOME or ~/.local/share/cairn)")
	pf.StringVar(&e.etcd, "etcd", "", "external etcd endpoints host:port,... (default $CAIRN_ETCD, else the embedded one)")
	pf.BoolVarP(&e.verbose, "verbose", "v", false, "log what happens")
	pf.BoolVarP(&e.quiet, "quiet", "q", false, "no progress bars")
	pf.StringVar(&e.metaWait, "meta-wait", "", "how long to try an unavailable metadata service again (it may be moving, restarting or asleep) before failing, e.g. 5s; 0: try once (default $CAIRN_META_WAIT, else 15s)")
	pf.StringVar(&e.cpuprofile, "cpuprofile", "", "write a CPU profile to this file (for developers)")
	_ = pf.MarkHidden("cpuprofile")
	root.AddCommand(e.initCmd(), e.putCmd(), e.getCmd(), e.lsCmd(), e.catCmd(), e.mkdirCmd(), e.rmCmd(),
		e.mvCmd(), e.versionsCmd(), e.restoreCmd(), e.trashCmd(), e.gcCmd(), e.fsckCmd(), e.statsCmd(), e.volumeCmd(),
		e.devicesCmd(), e.nodeCmd(), e.inviteCmd(), e.joinCmd())
	root.AddCommand(e.mountCmds()...)
	root.AddCommand(e.statusCmd())
	root.AddCommand(e.davCmd())
	root.AddCommand(e.webCmd())
	root.AddCommand(e.storeCmd())
	root.AddCommand(e.policyCmd(), e.repairCmd())
	root.AddCommand(e.userCmd(), e.shareCmd(), e.unshareCmd(), e.aclCmd())
	root.AddCommand(e.queueCmd())
	root.AddCommand(e.metaCmd())
	root.AddCommand(e.manCmd())
	root.AddCommand(e.offloadCmd(), e.moveCmd())
	root.AddCommand(e.surrogateCmd())
	root.AddCommand(e.pinCmd(), e.unpinCmd())
	root.AddCommand(e.conflictsCmd())
	return root
}

func usageArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return withCode(ExitUsage, fmt.Errorf("%s: want %s (see '%s --help')", cmd.Name(), what, cmd.CommandPath()))
		}
		return nil
	}
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return withCode(ExitUsage, fmt.Errorf("%s: want %s (see '%s --help')", cmd.Name(), what, cmd.CommandPath()))
		}
		return nil
	}
}

func (e *env) etcdEndpoints() []string {
	if e.etcd == "" {
		return nil
	}
	var out []string
	for _, s := range strings.Split(e.etcd, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (e *env) options() realm.Options {
	o := realm.Options{Etcd: e.etcdEndpoints(), Passphrase: e.passphrase(false), Target: e.target, NoCache: e.noCache, Logger: e.log, AllowOffline: e.allowOffline,
		WakeTimeout: e.wakeTimeout, OnWake: e.showWake, OffloadTo: e.offloadTo}
	if s := os.Getenv("CAIRN_CHUNK_CACHE"); s != "" {
		if n, err := parseSize(s); err == nil && n > 0 {
			o.CacheBytes = n
		} else {
			e.log.Warn("ignoring CAIRN_CHUNK_CACHE (want a size such as 512MiB or 4GiB)", "value", s)
		}
	}
	if e.metaWait != "" {
		if d, err := time.ParseDuration(e.metaWait); err == nil {
			o.MetaWait = d
			if d == 0 {
				o.MetaWait = -1 // try once
			}
		}
	}
	if s := os.Getenv("CAIRN_LOCK_TTL"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			o.LockTTL = d
		} else {
			e.log.Warn("ignoring CAIRN_LOCK_TTL", "value", s, "err", err)
		}
	}
	return o
}

// parseSize reads a byte count with an optional binary suffix: 4096,
// 512KiB, 64MiB, 4GiB, 1TiB (K, M, G, T and KB... are read as the same
// powers of 1024).
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.ToUpper(strings.TrimSpace(s[i:]))
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	shift := map[string]uint{"": 0, "B": 0, "K": 10, "KB": 10, "KIB": 10, "M": 20, "MB": 20, "MIB": 20,
		"G": 30, "GB": 30, "GIB": 30, "T": 40, "TB": 40, "TIB": 40}
	sh, ok := shift[unit]
	if !ok || n > (1<<62)>>sh {
		return 0, fmt.Errorf("size %q: unknown unit or too large", s)
	}
	return n << sh, nil
}

// minPassphrase is the length under which a new passphrase draws a
// warning (it is still accepted: the keyring's KDF is slow, but a short
// passphrase is guessed quickly all the same).
const minPassphrase = 8

// passphraseTries bounds the prompts for a new passphrase whose two
// entries differ.
const passphraseTries = 3

// passphrase reads CAIRN_PASSPHRASE or prompts on the terminal. With
// confirm (a new keyring) it asks twice, again if the two differ, and
// warns about a short passphrase.
func (e *env) passphrase(confirm bool) func() ([]byte, error) {
	return func() ([]byte, error) {
		if p, ok := os.LookupEnv("CAIRN_PASSPHRASE"); ok {
			if confirm {
				e.warnShort([]byte(p))
			}
			return []byte(p), nil
		}
		if e.pass != nil {
			return e.pass, nil
		}
		read := e.readPassword
		if read == nil {
			fd := int(os.Stdin.Fd())
			if !term.IsTerminal(fd) {
				return nil, cairn.E("passphrase", cairn.Permission, "", errors.New("a passphrase is needed: set CAIRN_PASSPHRASE or run on a terminal"))
			}
			read = func() ([]byte, error) { return term.ReadPassword(fd) }
		}
		ask := func(prompt string) ([]byte, error) {
			fmt.Fprint(e.stderr, prompt)
			p, err := read()
			fmt.Fprintln(e.stderr)
			if err != nil {
				return nil, cairn.E("passphrase", cairn.IO, "", err)
			}
			return p, nil
		}
		if !confirm {
			p, err := ask("cairn passphrase: ")
			if err != nil {
				return nil, err
			}
			e.pass = p
			return p, nil
		}
		for try := 1; ; try++ {
			p, err := ask("new cairn passphrase: ")
			if err != nil {
				return nil, err
			}
			e.warnShort(p)
			q, err := ask("again: ")
			if err != nil {
				return nil, err
			}
			if string(p) == string(q) {
				e.pass = p
				return p, nil
			}
			if try == passphraseTries {
				return nil, cairn.E("passphrase", cairn.Invalid, "", fmt.Errorf("the two passphrases differ (%d tries)", try))
			}
			fmt.Fprintln(e.stderr, "the two passphrases differ: try again")
		}
	}
}

// warnShort warns on stderr about a new passphrase that is short.
func (e *env) warnShort(p []byte) {
	if n := len([]rune(string(p))); n > 0 && n < minPassphrase {
		fmt.Fprintf(e.stderr, "warning: a passphrase of %d characters is easy to guess; %d or more are better\n", n, minPassphrase)
	}
}

// open opens the realm once per command.
func (e *env) open(ctx context.Context) (*realm.Realm, error) {
	if e.realm != nil {
		return e.realm, nil
	}
	r, err := realm.Open(ctx, e.home, e.options())
	if err != nil {
		return nil, err
	}
	e.realm = r
	return r, nil
}

// parseOpen parses a cairn path and opens the realm.
func (e *env) parseOpen(ctx context.Context, s string) (*realm.Realm, vpath.Path, error) {
	p, err := vpath.Parse(s)
	if err != nil {
		return nil, p, err
	}
	r, err := e.open(ctx)
	return r, p, err
}

// vol parses a cairn path and opens its volume (keys included).
func (e *env) vol(ctx context.Context, s string) (*fs.Volume, vpath.Path, error) {
	r, p, err := e.parseOpen(ctx, s)
	if err != nil {
		return nil, p, err
	}
	v, err := r.Volume(ctx, p.Volume)
	return v, p, err
}

func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal (progress bars go only there).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// wakeFlag adds --wake-timeout to a command that reads (get, cat, mount,
// dav).
func (e *env) wakeFlag(c *cobra.Command) {
	c.Flags().DurationVar(&e.wakeTimeout, "wake-timeout", director.DefaultWakeTimeout, "how long a read waits for a sleeping device that alone holds its data, which it wakes (Wake-on-LAN, through the device's wake proxy); negative: never wake a device")
}

// showWake shows on stderr how a wake a read asked for goes: "waking
// desktop… 4 s", then whether it woke.
func (e *env) showWake(node string, waited time.Duration, done bool, err error) {
	if e.quiet {
		return
	}
	switch {
	case !done:
		fmt.Fprintf(e.stderr, "waking %s… %d s\n", node, int(waited.Seconds()))
	case err == nil:
		fmt.Fprintf(e.stderr, "%s is awake (%.1f s)\n", node, waited.Seconds())
	}
}
