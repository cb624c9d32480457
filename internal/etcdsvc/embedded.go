// Package etcdsvc provides cairn's metadata service: etcd, either embedded in
// the cairn binary (a single-node server, shared between the cairn processes
// of one realm by a lazily started daemon, see Connect) or an external cluster
// (ConnectExternal).
//
// Security: the embedded server listens on nothing but a unix socket inside
// its own 0700 directory, and opens no peer (raft) listener at all, so only
// its owner's processes (and root) can reach it. (Up to format 1 of the
// endpoint file it listened on 127.0.0.1, which every local user can reach;
// see doc/format.md.) Other machines reach it only through the metadata
// gateway (internal/metagw), which admits devices of the realm by mutual TLS.
package etcdsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cairn.dev/cairn/internal/cairn"
)

// Options configure an embedded server. The zero value is usable.
type Options struct {
	// Log receives etcd's own log lines at level error and above, as JSON.
	// Nil discards them: etcd's start-up chatter (and its harmless
	// "missing term information" / "mux: server closed" errors) must not
	// reach a user's terminal.
	Log io.Writer
	// QuotaBytes is the backend size limit; beyond it etcd refuses writes
	// (alarm NOSPACE) until space is reclaimed. Default 4 GiB.
	QuotaBytes int64
	// CompactionRetention is how much MVCC history etcd keeps, as a duration
	// (periodic auto-compaction). Watches that fall further behind must
	// re-list. Default 1h.
	CompactionRetention time.Duration
	// NoFsync disables fsync. Unsafe: a power loss loses committed writes.
	// For tests only.
	NoFsync bool
	// Socket is the path of the client unix socket. Default "sock" in the
	// data dir. Its directory must be private (0700): the socket is the
	// server's only door, and anyone who can reach it can read and write
	// everything.
	Socket string
	// Loopback makes the server listen on a free 127.0.0.1 TCP port instead
	// of the socket, reachable by every user of the machine: only for tests
	// in which it stands in for an external cluster.
	Loopback bool
	// Peer, if set, makes the server a member of a cluster that may have
	// others (cairn meta move, cairn meta add): it listens for raft peers
	// over mutual TLS. Nil: a lone member with no peer listener at all.
	Peer *PeerOptions
}

// PeerOptions configure an embedded member's raft peers (DESIGN decision
// 13: the metadata service moves between the realm's devices).
//
// etcd itself cannot tell a realm's devices from its benefactors and
// surrogates (their certificates have the same CA, and etcd checks peers
// by common name or host only), and a peer that can send raft messages can
// rewrite the log. So the member's own peer listener is a unix socket in
// its 0700 data dir (Server.PeerSocket), and the peer address it
// advertises, https://Listen, is the caller's to serve: a metadata gateway
// (internal/metagw, devices only, revocations checked) in front of that
// socket. A member dials its peers with its node certificate, and checks
// nothing of theirs (realm certificates name nodes, not hosts, and etcd
// verifies servers by host): whoever takes a member's peer address
// receives what the cluster sends that member (doc/threat-model.md).
type PeerOptions struct {
	// Name is the member's name: its node name. Default "cairn" (the
	// name of the member a realm starts with).
	Name string
	// Listen is the advertised peer address (host:port), where the
	// caller's gateway to PeerSocket listens. A member that exists already
	// may leave it empty: the cluster's membership records its peer URL
	// (etcd's MemberUpdate changes it).
	Listen string
	// CertFile and KeyFile are the node's certificate and key (PEM;
	// pki.NodeCertFile, pki.NodeKeyFile), presented to peers.
	CertFile, KeyFile string
	// InitialCluster is etcd's initial cluster ("name=https://host:port,...").
	// Default: this member alone. Ignored by a data dir that already holds
	// a member.
	InitialCluster string
	// Join starts a new member of an existing cluster (one that added it,
	// see AddLearner); InitialCluster must name every member then.
	Join bool
}

// PeerURL is the member's advertised peer URL.
func (p *PeerOptions) PeerURL() string { return "https://" + p.Listen }

// maxSocketPath is the longest path a unix socket may have (sun_path is 108
// bytes on Linux, with its terminating NUL).
const maxSocketPath = 107

const (
	defaultQuota     = 4 << 30
	defaultRetention = time.Hour
	// Single-node raft timing: a node elects itself after one election
	// timeout, so a short one is most of the start time (the defaults,
	// 100 ms / 1 s, take ≈0.7 s to start; 700 ms ≈0.45 s).
	//
	// Side effect on leases: etcd raises a granted TTL to at least
	// 1.5 × election timeout rounded up to whole seconds, i.e. 2 s with
	// default timing but 1 s here, so a 1 s lease stays 1 s. clientv3
	// sends keep-alives at most every 500 ms, so a lease TTL under ~3 s
	// can be lost on a loaded machine: lease users should ask for more.
	tickMs     = 10
	electionMs = 100
	// snapshotCount is how many raft entries etcd applies between two
	// snapshots recorded in its WAL (etcd's default: 10000). It must stay
	// below 100, etcd's in-memory snapshot interval. On restart raft takes
	// every entry after the last WAL snapshot as not yet applied, and etcd
	// replays them; once the replay passes 100 entries etcd's apply loop
	// compacts its in-memory raft log: from index 1 on if no snapshot was
	// ever taken (a realm's first 10000 entries, with the default), and past
	// the snapshot if the replay is longer than 5000. An election tick that raft handles before it hears
	// that the replay was applied then scans compacted entries, and etcd
	// panics: "error scanning unapplied entries [1, N): requested index is
	// unavailable due to compaction". The data dir is intact (the next start
	// usually succeeds), but any start may hit it. With a WAL snapshot at
	// most snapshotCount entries back, a restart replays too little to
	// compact anything. The cost: an extra backend commit and snapshot
	// record every 50 writes.
	snapshotCount = 50
	// startAttempts bounds retries when a picked free port is taken by
	// someone else before etcd binds it (Options.Loopback).
	startAttempts = 5
)

// Server is a running embedded single-node etcd.
type Server struct {
	e        *embed.Etcd
	endpoint string
	peerSock string
	started  time.Duration
	dirLock  *os.File
	once     sync.Once
}

// StartEmbedded starts a single-node etcd keeping its data in dir (created
// 0700 if missing; an existing data dir is reopened with its contents,
// including one made by an older version that listened on loopback TCP). It
// listens on the unix socket Options.Socket only (no TCP, no peer port), and
// returns once the server serves requests. Only one server may open dir at
// a time: a second StartEmbedded on the same dir, from this process or
// another, fails at once with Kind Conflict. Callers that share a realm
// between processes use Connect.
func StartEmbedded(ctx context.Context, dir string, opts Options) (*Server, error) {
	const op = "start embedded etcd"
	if err := ctx.Err(); err != nil {
		return nil, cairn.E(op, cairn.Canceled, dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	// etcd's bbolt open blocks forever on a data dir held by another
	// server, even in this process: lock the directory first, and fail fast.
	lock, err := os.Open(dir)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	if ok, err := tryLock(lock, syscall.LOCK_EX); err != nil || !ok {
		lock.Close()
		if err == nil {
			err = errors.New("data dir in use by another etcd server")
		}
		return nil, cairn.E(op, cairn.Conflict, dir, err)
	}
	var lastErr error
	for range startAttempts {
		s, err := startOnce(ctx, dir, opts)
		if err == nil {
			s.dirLock = lock
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil || !isAddrInUse(err) {
			break
		}
	}
	lock.Close()
	if ctx.Err() != nil {
		return nil, cairn.E(op, cairn.Canceled, dir, errors.Join(ctx.Err(), lastErr))
	}
	return nil, cairn.E(op, cairn.Unavailable, dir, lastErr)
}

func startOnce(ctx context.Context, dir string, opts Options) (*Server, error) {
	t0 := time.Now()
	var curl url.URL
	endpoint := ""
	if opts.Loopback {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		curl = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
		endpoint = curl.Host
	} else {
		sock := opts.Socket
		if sock == "" {
			sock = filepath.Join(dir, "sock")
		}
		sock, err := filepath.Abs(sock)
		if err != nil {
			return nil, err
		}
		if len(sock) > maxSocketPath {
			return nil, fmt.Errorf("socket path %s is %d bytes, longer than a unix socket's %d: use a realm directory with a shorter path", sock, len(sock), maxSocketPath)
		}
		curl = url.URL{Scheme: "unix", Path: sock}
		endpoint = curl.String() // unix:///abs/path
	}
	// No peer listener: a single member never hears from peers, and a raft
	// port would let anyone who reaches it inject entries. The advertised
	// peer URL only names the member (its ID derives from it).
	purl := url.URL{Scheme: "http", Host: "127.0.0.1:2380"}
	peerSock := ""

	cfg := embed.NewConfig()
	cfg.Name = "cairn"
	cfg.ListenPeerUrls = nil
	if p := opts.Peer; p != nil {
		if p.Name != "" {
			cfg.Name = p.Name
		}
		if p.Listen != "" {
			if _, _, err := net.SplitHostPort(p.Listen); err != nil {
				return nil, fmt.Errorf("peer listen address %q: %w", p.Listen, err)
			}
			purl = url.URL{Scheme: "https", Host: p.Listen}
		}
		peerSock = filepath.Join(dir, "peer.sock")
		if len(peerSock) > maxSocketPath {
			return nil, fmt.Errorf("peer socket path %s is %d bytes, longer than a unix socket's %d", peerSock, len(peerSock), maxSocketPath)
		}
		_ = os.Remove(peerSock) // left by a member that was killed
		cfg.ListenPeerUrls = []url.URL{{Scheme: "unix", Host: peerSock}}
		cfg.PeerTLSInfo = transport.TLSInfo{
			CertFile: p.CertFile, KeyFile: p.KeyFile,
			// Realm certificates name nodes, not hosts (see PeerOptions).
			InsecureSkipVerify: true,
			MinVersion:         tls.VersionTLS13,
		}
	}
	cfg.Dir = dir
	cfg.TickMs = tickMs
	cfg.ElectionMs = electionMs
	cfg.ListenClientUrls = []url.URL{curl}
	cfg.AdvertiseClientUrls = []url.URL{curl}
	cfg.AdvertisePeerUrls = []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if p := opts.Peer; p != nil && p.InitialCluster != "" {
		cfg.InitialCluster = p.InitialCluster
	}
	if p := opts.Peer; p != nil && p.Join {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.ListenMetricsUrls = nil
	cfg.EnableGRPCGateway = false
	cfg.QuotaBackendBytes = opts.QuotaBytes
	if cfg.QuotaBackendBytes == 0 {
		cfg.QuotaBackendBytes = defaultQuota
	}
	ret := opts.CompactionRetention
	if ret == 0 {
		ret = defaultRetention
	}
	cfg.SnapshotCount = snapshotCount
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = ret.String()
	cfg.UnsafeNoFsync = opts.NoFsync
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(opts.Log))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-e.Server.StopNotify():
		err := errors.New("etcd stopped during start")
		select {
		case err = <-e.Err():
		default:
		}
		e.Close()
		return nil, err
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, ctx.Err()
	}
	return &Server{e: e, endpoint: endpoint, peerSock: peerSock, started: time.Since(t0)}, nil
}

// Endpoint returns the client address: "unix:///path/to/sock" (a clientv3
// endpoint; see DialEndpoint for a raw connection), or "127.0.0.1:port"
// with Options.Loopback.
func (s *Server) Endpoint() string { return s.endpoint }

// PeerSocket is the unix socket of the member's raft peer listener
// (Options.Peer; see PeerOptions), "" for a lone member.
func (s *Server) PeerSocket() string { return s.peerSock }

// MemberID returns the server's raft member ID. Connect compares it with the
// ID a server at a recorded address reports, so that a port reused by some
// other etcd is never mistaken for the realm's.
func (s *Server) MemberID() uint64 { return uint64(s.e.Server.MemberID()) }

// StartTime reports how long StartEmbedded's successful attempt took, from
// choosing ports to serving.
func (s *Server) StartTime() time.Duration { return s.started }

// Done is closed when the server stops, whether through Close or because
// etcd failed (a full disk, a corrupt backend).
func (s *Server) Done() <-chan struct{} { return s.e.Server.StopNotify() }

// Close stops the server and waits until its data dir is released. Clients
// connected to it see their requests fail. Close is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.e.Close()
		s.dirLock.Close()
	})
	return nil
}

// newLogger returns a zap logger that writes error-level JSON lines to w, or
// a no-op logger when w is nil.
func newLogger(w io.Writer) *zap.Logger {
	if w == nil {
		return zap.NewNop()
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), zapcore.ErrorLevel)
	return zap.New(core)
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago. Another process may take one before the caller binds it; callers retry.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) ||
		err != nil && strings.Contains(err.Error(), "address already in use")
}
