package etcdsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
)

// Environment variables of the lazy daemon.
const (
	// EnvDaemon, set to a realm home, makes RunDaemonIfRequested serve that
	// realm's embedded etcd instead of returning. Connect sets it on the
	// process it starts; users never set it.
	EnvDaemon = "CAIRN_ETCD_DAEMON"
	// EnvLinger overrides how long an idle daemon stays up after its last
	// client left (a Go duration, e.g. "200ms"). Default 30 s.
	EnvLinger = "CAIRN_ETCD_LINGER"
)

// DefaultLinger is how long the daemon outlives its last client, so that a
// run of short commands (a shell loop of `cairn put`) pays the start once.
const DefaultLinger = 30 * time.Second

// Files under $home/etcd (the directory is 0700, the files 0600).
const (
	clientsLockName = "clients.lock" // LOCK_SH by every client for its life
	serverLockName  = "server.lock"  // LOCK_EX by the one serving daemon
	endpointName    = "endpoint"     // "addr memberID(hex) pid\n", written by rename
	logName         = "server.log"   // the daemon's stdout and stderr
	socketName      = "sock"         // the server's client socket, its only listener
	dataName        = "data"         // etcd's data dir
)

// ConnectOptions configure Connect and ConnectExternal. The zero value is
// usable.
type ConnectOptions struct {
	// DialTimeout bounds each attempt to reach a server and the health
	// check of an external cluster. Default 3 s.
	DialTimeout time.Duration
	// StartTimeout bounds how long Connect waits for the realm's local
	// server to answer, including starting one. Default 10 s.
	StartTimeout time.Duration
	// Linger is passed to a daemon that Connect starts (see EnvLinger). Zero
	// keeps $CAIRN_ETCD_LINGER if set, else DefaultLinger.
	Linger time.Duration
	// Logger receives debug lines about starting and finding the daemon.
	// Nil discards them.
	Logger *slog.Logger
	// TLS, if set, is the client TLS configuration of ConnectExternal: a
	// device's pki.ClientTLS, to reach a realm's metadata gateway. Its
	// endpoints are then "host:port" or "https://host:port" ("http://" is
	// refused: etcd's client would drop TLS for it). Connect, which talks
	// to the realm's own server over its unix socket, ignores it.
	TLS *tls.Config

	// sw is Connect's dialer, which Conn.Redirect turns to gateways.
	sw *switchDialer
}

func (o *ConnectOptions) fill() {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Conn is a connection to a realm's metadata service.
type Conn struct {
	cli       *clientv3.Client
	endpoints []string
	dir       string        // $home/etcd for a local server, "" for external
	clients   *os.File      // shared lock on clients.lock, nil for external
	sw        *switchDialer // a local server's dialer, nil for external
}

// switchDialer dials the client's connections: the local server at addr,
// until Redirect sends them to metadata gateways over TLS.
type switchDialer struct {
	timeout time.Duration
	mu      sync.Mutex
	addr    string
	to      atomic.Pointer[redirect]
}

type redirect struct {
	endpoints []string
	tls       *tls.Config
}

func (d *switchDialer) setAddr(addr string) {
	d.mu.Lock()
	d.addr = addr
	d.mu.Unlock()
}

func (d *switchDialer) dial(ctx context.Context, _ string) (net.Conn, error) {
	rd := d.to.Load()
	if rd == nil {
		d.mu.Lock()
		addr := d.addr
		d.mu.Unlock()
		return DialEndpoint(ctx, addr, d.timeout)
	}
	var errs []error
	for _, ep := range rd.endpoints {
		td := tls.Dialer{NetDialer: &net.Dialer{Timeout: d.timeout}, Config: rd.tls}
		c, err := td.DialContext(ctx, "tcp", strings.TrimPrefix(ep, "https://"))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Redirect sends a local server's client to the realm's metadata
// gateways at endpoints (host:port), over TLS with tlsConf (a device's
// pki.ClientTLS), once its server is gone: the realm's etcd member moved
// to another device (cairn meta move). The connections open now stay
// until they break (the server stops); the client's new ones, its watches
// and leases included, go to the gateways, tried in order. Called again,
// it replaces the gateways. Invalid on a connection to an external
// cluster or a gateway (ConnectExternal): its endpoints are set with the
// client's SetEndpoints.
func (c *Conn) Redirect(endpoints []string, tlsConf *tls.Config) error {
	if c.sw == nil {
		return cairn.E("redirect etcd", cairn.Invalid, strings.Join(endpoints, ","), errors.New("not a connection to the realm's own server"))
	}
	if len(endpoints) == 0 || tlsConf == nil {
		return cairn.E("redirect etcd", cairn.Invalid, "", errors.New("want endpoints and a TLS configuration"))
	}
	c.sw.to.Store(&redirect{endpoints: append([]string(nil), endpoints...), tls: tlsConf})
	return nil
}

// Redirected says whether Redirect sent the client to gateways.
func (c *Conn) Redirected() bool { return c.sw != nil && c.sw.to.Load() != nil }

// Client returns the etcd client. It stays valid until Close.
func (c *Conn) Client() *clientv3.Client { return c.cli }

// Endpoints returns the addresses the client talks to.
func (c *Conn) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Close closes the client and, for a local server, lets the daemon go: once
// no client is left it lingers, then exits.
func (c *Conn) Close() error {
	err := c.cli.Close()
	if c.clients != nil {
		// The daemon counts its linger from the last client's departure.
		now := time.Now()
		_ = os.Chtimes(c.clients.Name(), now, now)
		c.clients.Close() // drops the shared lock
		c.clients = nil
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// Connect returns a connection to the embedded etcd of the realm at home,
// starting a server process if none runs. Any number of processes may call
// Connect on the same home at the same time; they all end up on one server.
//
// How: every client holds a shared flock on $home/etcd/clients.lock until
// Close (or death). The server is this same executable, re-run with
// EnvDaemon set (so the program must call RunDaemonIfRequested first thing
// in main, and tests using Connect in TestMain). The server holds an
// exclusive flock on server.lock while it lives, publishes its address in
// the endpoint file, and shuts down once it can take clients.lock
// exclusively (no client left) and has been idle for the linger time. It
// keeps clients.lock until it is fully gone, so a client arriving during
// shutdown waits, then starts a fresh server. Of servers started by racing
// clients, the one that takes server.lock serves; the others exit at once.
//
// Errors: Kind Unavailable (naming the server log) when no server answers
// within StartTimeout; Kind Canceled when ctx ends first.
func Connect(ctx context.Context, home string, opts ConnectOptions) (*Conn, error) {
	const op = "connect etcd"
	opts.fill()
	home, err := filepath.Abs(home)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, home, err)
	}
	if sock := filepath.Join(home, "etcd", socketName); len(sock) > maxSocketPath {
		return nil, cairn.E(op, cairn.Invalid, home, fmt.Errorf("the metadata server's socket %s would be %d bytes, longer than a unix socket's %d: use a realm directory ($CAIRN_HOME) with a shorter path", sock, len(sock), maxSocketPath))
	}
	dir := filepath.Join(home, "etcd")
	if err = makePrivateDir(dir); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	clients, err := os.OpenFile(filepath.Join(dir, clientsLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	wctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	logPath := filepath.Join(dir, logName)
	fail := func(err error) (*Conn, error) {
		clients.Close()
		if ctx.Err() != nil {
			return nil, cairn.E(op, cairn.Canceled, home, ctx.Err())
		}
		if wctx.Err() != nil {
			err = fmt.Errorf("no etcd server answered within %v (server log: %s)", opts.StartTimeout, logPath)
		}
		return nil, cairn.E(op, cairn.Unavailable, home, err)
	}
	// Blocks only while a server is shutting down.
	if err = lockWait(wctx, clients, syscall.LOCK_SH); err != nil {
		return fail(err)
	}
	opts.sw = &switchDialer{timeout: opts.DialTimeout}
	cli, ep, err := findOrStart(wctx, dir, opts)
	if err != nil {
		return fail(err)
	}
	return &Conn{cli: cli, endpoints: []string{ep.addr}, dir: dir, clients: clients, sw: opts.sw}, nil
}

// findOrStart connects to the running server or starts one and waits for
// it. The caller holds the shared lock on clients.lock, so a server that is
// up stays up.
func findOrStart(ctx context.Context, dir string, opts ConnectOptions) (*clientv3.Client, endpoint, error) {
	const poll = 10 * time.Millisecond
	// Respawn only after this long: an extra server exits at once when
	// another one holds server.lock, which is itself likely still starting.
	const respawnAfter = time.Second
	var (
		running   bool
		exited    <-chan error
		lastSpawn time.Time
		lastErr   error
	)
	for {
		ep, err := readEndpoint(dir)
		switch {
		case err == nil && pidAlive(ep.pid):
			cli, derr := dialLocal(ctx, ep, opts)
			if derr == nil {
				opts.Logger.Debug("etcd: using local server", "addr", ep.addr, "pid", ep.pid)
				return cli, ep, nil
			}
			lastErr = derr
		case err == nil:
			lastErr = fmt.Errorf("stale endpoint: server pid %d is gone", ep.pid)
		case !errors.Is(err, os.ErrNotExist):
			lastErr = err
		}
		if running {
			select {
			case err := <-exited:
				running = false
				if err != nil {
					// A started server that fails (rather than yielding to
					// another one, which exits 0) will fail again: say why.
					return nil, endpoint{}, fmt.Errorf("etcd server failed: %v; %s", err, logTail(filepath.Join(dir, logName)))
				}
			default:
			}
		}
		if !running && time.Since(lastSpawn) >= respawnAfter {
			ch, pid, err := spawnDaemon(dir, opts)
			if err != nil {
				return nil, endpoint{}, err
			}
			opts.Logger.Debug("etcd: started server", "pid", pid, "after", lastErr)
			running, exited, lastSpawn = true, ch, time.Now()
		}
		select {
		case <-ctx.Done():
			if lastErr == nil {
				lastErr = ctx.Err()
			}
			return nil, endpoint{}, lastErr
		case <-time.After(poll):
		}
	}
}

// spawnDaemon starts this executable as the realm's server, detached from
// the caller's session and terminal. The returned channel yields its exit.
func spawnDaemon(dir string, opts ConnectOptions) (<-chan error, int, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, 0, err
	}
	logPath := filepath.Join(dir, logName)
	if fi, serr := os.Stat(logPath); serr == nil && fi.Size() > 1<<20 {
		_ = os.Rename(logPath, logPath+".old")
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, 0, err
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, 0, err
	}
	defer devnull.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), EnvDaemon+"="+filepath.Dir(dir))
	if opts.Linger > 0 {
		cmd.Env = append(cmd.Env, EnvLinger+"="+opts.Linger.String())
	}
	cmd.Dir = "/" // do not pin the caller's working directory
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }() // reap it, whenever it ends
	return ch, cmd.Process.Pid, nil
}

// dialLocal connects to the server named by ep and checks that it is that
// server (its member ID), not some other etcd that reuses the port.
func dialLocal(ctx context.Context, ep endpoint, opts ConnectOptions) (*clientv3.Client, error) {
	// A dead socket refuses at once; do not let gRPC retry it until timeout.
	nc, err := DialEndpoint(ctx, ep.addr, opts.DialTimeout)
	if err != nil {
		return nil, err
	}
	nc.Close()
	if opts.sw != nil {
		opts.sw.setAddr(ep.addr)
	}
	cli, err := newClient([]string{ep.addr}, opts, nil)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	st, err := cli.Status(sctx, ep.addr)
	if err != nil {
		cli.Close()
		return nil, err
	}
	if st.Header.MemberId != ep.member {
		cli.Close()
		return nil, fmt.Errorf("%s is another etcd (member %x, want %x)", ep.addr, st.Header.MemberId, ep.member)
	}
	return cli, nil
}

func newClient(endpoints []string, opts ConnectOptions, tlsConf *tls.Config) (*clientv3.Client, error) {
	// Each round trip, retries included, counts in cairn_etcd_requests_total.
	dopts := []grpc.DialOption{RetryLeaderChanges(), grpc.WithChainUnaryInterceptor(metrics.Default().EtcdInterceptor())}
	if opts.sw != nil {
		// Set after clientv3's own dialer: this one wins.
		dopts = append(dopts, grpc.WithContextDialer(opts.sw.dial))
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsConf,
		DialTimeout: opts.DialTimeout,
		// clientv3's default logger writes retry warnings to stderr.
		Logger: zap.NewNop(),
		// Detect a dead server on an idle connection.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: opts.DialTimeout,
		// A leader change (cairn meta move) fails the requests in
		// flight; they are repeated.
		DialOptions: dopts,
	})
}

// DialEndpoint opens a raw connection to a local server's endpoint as
// Endpoint and Conn.Endpoints give it: "unix:///path" (the embedded
// server), or "host:port" / "http://host:port" (TCP).
func DialEndpoint(ctx context.Context, ep string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if p, ok := strings.CutPrefix(ep, "unix://"); ok {
		return d.DialContext(ctx, "unix", p)
	}
	ep = strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://")
	return d.DialContext(ctx, "tcp", ep)
}

// HomeFormat is the format of the embedded etcd's files under $home/etcd
// (the endpoint file, its locks and socket): 2 since the server listens on
// a unix socket only (doc/format.md, "Embedded etcd").
const HomeFormat = 2

// endpoint is the content of $home/etcd/endpoint (format 2, see
// doc/format.md): "unix:///path/to/sock MEMBER PID". Format 1, written by
// older versions, named a loopback port ("127.0.0.1:port MEMBER PID"); it is
// still read, so that a client can use an older server until that exits;
// the next server started listens on the socket.
type endpoint struct {
	addr   string
	member uint64
	pid    int
}

func (e endpoint) String() string { return fmt.Sprintf("%s %x %d\n", e.addr, e.member, e.pid) }

func readEndpoint(dir string) (endpoint, error) {
	b, err := os.ReadFile(filepath.Join(dir, endpointName))
	if err != nil {
		return endpoint{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return endpoint{}, fmt.Errorf("malformed endpoint file %q", b)
	}
	member, err1 := strconv.ParseUint(f[1], 16, 64)
	pid, err2 := strconv.Atoi(f[2])
	var err3 error
	if p, ok := strings.CutPrefix(f[0], "unix://"); ok {
		if !filepath.IsAbs(p) {
			err3 = errors.New("relative socket path")
		}
	} else {
		_, _, err3 = net.SplitHostPort(f[0]) // format 1
	}
	if err1 != nil || err2 != nil || err3 != nil || pid <= 0 {
		return endpoint{}, fmt.Errorf("malformed endpoint file %q", b)
	}
	return endpoint{addr: f[0], member: member, pid: pid}, nil
}

// writeEndpoint publishes ep atomically: readers see the old file, no file,
// or the whole new one.
func writeEndpoint(dir string, ep endpoint) error {
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d", endpointName, ep.pid))
	if err := os.WriteFile(tmp, []byte(ep.String()), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, endpointName)); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// pidAlive reports whether process pid exists and is not a zombie (a dead
// process that its parent, or init, has not reaped yet).
func pidAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}

// makePrivateDir creates dir (and parents) and makes dir itself 0700.
func makePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// logTail returns the last lines of the log at path, for an error message.
func logTail(path string) string {
	const limit = 2048
	f, err := os.Open(path)
	if err != nil {
		return "server log " + path + " unreadable: " + err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "server log " + path
	}
	off := max(0, fi.Size()-limit)
	b := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(b, off)
	tail := strings.TrimSpace(string(b[:n]))
	if off > 0 {
		if i := strings.IndexByte(tail, '\n'); i >= 0 {
			tail = tail[i+1:]
		}
	}
	return fmt.Sprintf("server log %s ends:\n%s", path, tail)
}
