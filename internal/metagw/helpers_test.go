package metagw

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/pki"
)

const realm = "r1"

// fixture is a gateway on loopback in front of a real etcd, in realm r1.
type fixture struct {
	ca    *pki.CA
	rev   *pki.RevocationList
	etcd  *clientv3.Client // direct, plain: the test's view of the data
	gw    *Gateway
	addr  string
	logs  *logBuffer
	dials atomic.Int64 // upstream connections made

	cancel context.CancelFunc
	done   chan error
}

// start runs a gateway named "gw" (a device) with cfg tuned by tune.
func start(t *testing.T, tune func(*fixture, *Config)) *fixture {
	t.Helper()
	ca, err := pki.CreateCA(t.TempDir(), realm)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca, rev: pki.NewRevocationList(), etcd: etcdtest.New(t), logs: &logBuffer{}}
	upstream := f.etcd.Endpoints()[0]
	cfg := Config{
		Credentials: f.creds(t, "gw", pki.Device),
		Revocations: f.rev,
		Dial: func(ctx context.Context) (net.Conn, error) {
			f.dials.Add(1)
			return etcdsvc.DialEndpoint(ctx, upstream, 5*time.Second)
		},
		Logger:          slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		RecheckInterval: 200 * time.Millisecond,
	}
	if tune != nil {
		tune(f, &cfg)
	}
	f.gw, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan error, 1)
	go func() { f.done <- f.gw.Serve(ctx, ln) }()
	t.Cleanup(func() {
		f.stop(t)
		if t.Failed() {
			t.Logf("gateway log:\n%s", f.logs)
		}
	})
	return f
}

// stop ends Serve and checks that it returns nil promptly.
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	f.cancel()
	select {
	case err, ok := <-f.done:
		if ok && err != nil {
			t.Errorf("Serve: %v", err)
		}
		if ok {
			close(f.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return 10 s after its context ended")
	}
}

func (f *fixture) creds(t *testing.T, name string, role pki.Role) *pki.Credentials {
	t.Helper()
	c, err := f.ca.NewCredentials(pki.NodeIdentity{Realm: realm, Name: name, Role: role}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clientTLS is what a device dialing the gateway uses.
func clientTLS(t *testing.T, c *pki.Credentials) *tls.Config {
	t.Helper()
	conf, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireNode("gw")})
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// connect connects to etcd through the gateway with conf. Its handshake
// and first read may take seconds on a loaded machine: 2 s failed there.
func (f *fixture) connect(t *testing.T, conf *tls.Config) (*etcdsvc.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := etcdsvc.ConnectExternal(ctx, []string{f.addr}, etcdsvc.ConnectOptions{TLS: conf, DialTimeout: 10 * time.Second})
	if err == nil {
		t.Cleanup(func() { conn.Close() })
	}
	return conn, err
}

// device connects as a new device named name.
func (f *fixture) device(t *testing.T, name string) *clientv3.Client {
	t.Helper()
	conn, err := f.connect(t, clientTLS(t, f.creds(t, name, pki.Device)))
	if err != nil {
		t.Fatalf("device %s through the gateway: %v", name, err)
	}
	return conn.Client()
}

// live returns the number of admitted connections open.
func (f *fixture) live() int {
	return int(f.gw.conns.Load() - f.gw.handshakes.Load())
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logBuffer is a log destination safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines returns the log lines that contain every one of subs.
func (l *logBuffer) lines(subs ...string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// errRevocationsDown is what a broken revocation source returns.
var errRevocationsDown = errors.New("revocation list unavailable")

// switchable is a pki.Revocations that can be made to fail.
type switchable struct {
	pki.Revocations
	broken atomic.Bool
}

func (s *switchable) Revoked(c *x509.Certificate) (bool, error) {
	if s.broken.Load() {
		return true, errRevocationsDown
	}
	return s.Revocations.Revoked(c)
}
