package metagw

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/pki"
)

// A device gets the whole etcd API through the gateway: KV, transactions,
// watches, leases kept alive.
func TestDevice(t *testing.T) {
	f := start(t, nil)
	cli := f.device(t, "laptop")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	if r, err := f.etcd.Get(ctx, "k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v1" {
		t.Fatalf("direct read of the put: %v %v", r, err)
	}
	if _, err := f.etcd.Put(ctx, "k2", "direct"); err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Get(ctx, "k2"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "direct" {
		t.Fatalf("get through the gateway: %v %v", r, err)
	}
	tx, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("k"), "=", "v1")).Then(clientv3.OpPut("k", "v2")).Commit()
	if err != nil || !tx.Succeeded {
		t.Fatalf("txn: %v %v", tx, err)
	}

	// A watch through the gateway sees a write made directly.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "w/", clientv3.WithPrefix())
	if rerr := cli.RequestProgress(ctx); rerr != nil { // the watch is registered once this returns
		t.Fatal(rerr)
	}
	if _, perr := f.etcd.Put(ctx, "w/1", "x"); perr != nil {
		t.Fatal(perr)
	}
	select {
	case wr := <-wch:
		for wr.IsProgressNotify() {
			wr = <-wch
		}
		if eerr := wr.Err(); eerr != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "w/1" {
			t.Fatalf("watch: %+v %v", wr.Events, eerr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10 s")
	}

	// A lease kept alive through the gateway outlives its TTL.
	lease, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, perr := cli.Put(ctx, "leased", "x", clientv3.WithLease(lease.ID)); perr != nil {
		t.Fatal(perr)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	for n := 0; n < 3 || time.Since(granted) < 3*time.Second; n++ {
		select {
		case r, ok := <-ka:
			if !ok || r == nil {
				t.Fatalf("keepalive channel closed after %d answers", n)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no keepalive answer within 5 s (after %d)", n)
		}
	}
	if r, err := f.etcd.Get(ctx, "leased"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("leased key gone %v after grant (TTL 2 s) though kept alive: %v %v", time.Since(granted), r, err)
	}
	if f.live() != 1 {
		t.Errorf("%d live connections, want 1", f.live())
	}
}

// Only a device certificate of the realm CA, not revoked, gets through.
// Each refusal is reported at once with Kind Permission, never reaches
// etcd, and is logged with who and why.
func TestRefused(t *testing.T) {
	f := start(t, nil)
	other, err := pki.CreateCA(t.TempDir(), realm) // same realm ID, another CA
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.NewCredentials(pki.NodeIdentity{Realm: realm, Name: "stranger", Role: pki.Device}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	revoked := f.creds(t, "stolen", pki.Device)
	if err := f.rev.RevokeName("stolen"); err != nil {
		t.Fatal(err)
	}
	noCert := clientTLS(t, f.creds(t, "anon", pki.Device))
	noCert.Certificates = nil
	// A client that trusts any server, to show the gateway's own check.
	strangerConf := clientTLS(t, stranger)
	strangerConf.VerifyConnection = nil

	for _, tc := range []struct {
		name string
		conf *tls.Config
		log  []string // what the gateway's refusal line must say
	}{
		{"no certificate", noCert, []string{"refused", "certificate"}},
		{"another CA", strangerConf, []string{"refused", "claimed_name=stranger", "unknown authority"}},
		{"surrogate", clientTLS(t, f.creds(t, "cafe-box", pki.Surrogate)), []string{"refused", "node=cafe-box", "role=surrogate", "not allowed"}},
		{"benefactor", clientTLS(t, f.creds(t, "lab-desk", pki.Benefactor)), []string{"refused", "node=lab-desk", "role=benefactor", "not allowed"}},
		{"revoked device", clientTLS(t, revoked), []string{"refused", "node=stolen", "revoked"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Now()
			_, err := f.connect(t, tc.conf)
			if !errors.Is(err, cairn.ErrPermission) {
				t.Fatalf("got %v, want Kind Permission", err)
			}
			if d := time.Since(t0); d > time.Second {
				t.Errorf("refusal took %v to report", d)
			}
			t.Logf("%v", err)
			waitFor(t, 15*time.Second, "gateway logs the refusal: "+strings.Join(tc.log, ", "), func() bool {
				return len(f.logs.lines(tc.log...)) > 0
			})
		})
	}
	if n := f.dials.Load(); n != 0 {
		t.Errorf("refused clients made %d upstream connections", n)
	}
	for _, secret := range []string{"PRIVATE KEY", "BEGIN"} {
		if strings.Contains(f.logs.String(), secret) {
			t.Errorf("log contains %q", secret)
		}
	}

	// The client checks the gateway too: one of another CA, or another
	// node than the one expected, is refused before any request leaves.
	t.Run("gateway of another CA", func(t *testing.T) {
		_, err := f.connect(t, clientTLS(t, stranger))
		if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "server's certificate was refused") {
			t.Fatalf("got %v, want Kind Permission (server refused)", err)
		}
		waitFor(t, 15*time.Second, "gateway logs the client's refusal", func() bool {
			return len(f.logs.lines("client refused the gateway", "bad certificate")) > 0
		})
	})
	t.Run("unexpected gateway node", func(t *testing.T) {
		conf, err := pki.ClientTLS(f.creds(t, "laptop", pki.Device), pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireNode("elsewhere")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.connect(t, conf); !errors.Is(err, cairn.ErrPermission) {
			t.Fatalf("got %v, want Kind Permission", err)
		}
	})
	// And a device still gets through after all that.
	if _, err := f.device(t, "laptop").Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
}

// A device revoked while connected loses its connection within moments
// (its next request fails, and so does reconnecting); another device's
// connection is untouched.
func TestRevokedWhileConnected(t *testing.T) {
	f := start(t, func(_ *fixture, c *Config) { c.RecheckInterval = 0 }) // the default, 1 s
	bad, good := f.device(t, "lost-phone"), f.device(t, "desktop")
	ctx := context.Background()
	for _, c := range []*clientv3.Client{bad, good} {
		if _, err := c.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	// An open watch is cut with the rest.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	_ = bad.Watch(wctx, "w")

	if err := f.rev.RevokeName("lost-phone"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// Cut at the next recheck (1 s). A failed request does not say so:
	// on a loaded machine a read of the device still admitted timed out
	// before the cut, and the write below then went through (1 run in 6).
	waitFor(t, 15*time.Second, "the revoked device's connection cut", func() bool {
		return len(f.logs.lines("connection cut", "node=lost-phone", "revoked")) > 0
	})
	t.Logf("connection cut %v after the revocation", time.Since(t0))
	// It stays out: reconnecting is refused.
	for range 3 {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := bad.Put(rctx, "k", "after")
		cancel()
		if err == nil {
			t.Fatal("revoked device wrote after its revocation")
		}
	}
	if _, err := good.Put(ctx, "k", "still here"); err != nil {
		t.Fatalf("the other device: %v", err)
	}
	if r, _ := f.etcd.Get(ctx, "k"); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "still here" {
		t.Errorf("k = %v", r.Kvs)
	}
	waitFor(t, 15*time.Second, "one live connection (the other device's)", func() bool { return f.live() == 1 })
}

// Revocation checking fails closed: when the list cannot be read, live
// connections are cut too.
func TestRevocationsUnavailable(t *testing.T) {
	rev := &switchable{Revocations: pki.NoRevocations{}}
	f := start(t, func(_ *fixture, c *Config) { c.Revocations = rev })
	cli := f.device(t, "laptop")
	ctx := context.Background()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	rev.broken.Store(true)
	waitFor(t, 15*time.Second, "connection cut", func() bool { return f.live() == 0 })
	if len(f.logs.lines("connection cut", "node=laptop", errRevocationsDown.Error())) == 0 {
		t.Error("no log line for the cut connection")
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := cli.Get(rctx, "k"); err == nil {
		t.Error("read while the revocation list is down")
	}
	// A new connection gets through the handshake (it is not revoked) and
	// is closed before etcd: Unavailable, not Permission, which would say
	// the device was removed.
	if _, err := f.connect(t, clientTLS(t, f.creds(t, "desk", pki.Device))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Errorf("connect while the revocation list is down: %v, want Unavailable", err)
	}
	rev.broken.Store(false)
	if _, err := f.device(t, "laptop").Get(ctx, "k"); err != nil {
		t.Fatalf("after the list is back: %v", err)
	}
}

// Bytes that are not TLS, a cleartext gRPC client, a stalled or truncated
// handshake: each connection is dropped, nothing reaches etcd, and the
// gateway keeps serving.
func TestGarbage(t *testing.T) {
	f := start(t, func(_ *fixture, c *Config) { c.HandshakeTimeout = 500 * time.Millisecond })
	junk := make([]byte, 64<<10)
	rand.Read(junk)
	hello := clientHello(t)
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"random bytes", junk},
		{"http/1.1", []byte("GET /v3/kv/range HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"cleartext http/2", []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")},
		{"half a client hello", hello[:len(hello)/2]},
		{"a client hello, then garbage", append(append([]byte(nil), hello...), junk[:1000]...)},
		{"nothing", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			go c.Write(tc.send) // the gateway may close before reading it all
			t0 := time.Now()
			n, err := io.Copy(io.Discard, c)
			if isTimeout(err) {
				t.Fatalf("connection still open after %v", time.Since(t0))
			}
			if d := time.Since(t0); d > 2*time.Second {
				t.Errorf("dropped after %v (handshake timeout 500ms)", d)
			}
			t.Logf("dropped after %v, %d bytes back (%v)", time.Since(t0), n, err)
		})
	}
	t.Run("cleartext etcd client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := etcdsvc.ConnectExternal(ctx, []string{f.addr}, etcdsvc.ConnectOptions{DialTimeout: time.Second})
		if !errors.Is(err, cairn.ErrUnavailable) {
			t.Fatalf("got %v, want Unavailable", err)
		}
	})
	if n := f.dials.Load(); n != 0 {
		t.Errorf("%d upstream connections for garbage", n)
	}
	if _, err := f.device(t, "laptop").Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
}

// isTimeout reports whether err is a deadline error.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// clientHello returns the first flight of a TLS client.
func clientHello(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}).Handshake()
	buf := make([]byte, 16<<10)
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// The caps: connections still handshaking beyond MaxHandshakes, and any
// beyond MaxConns, are closed at once; stalled handshakes free their slots
// after HandshakeTimeout.
func TestLimits(t *testing.T) {
	f := start(t, func(_ *fixture, c *Config) {
		c.HandshakeTimeout = 700 * time.Millisecond
		c.MaxHandshakes = 2
		c.MaxConns = 3
	})
	dialIdle := func() net.Conn {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	closedAtOnce := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !isTimeout(err)
	}
	dialIdle()
	dialIdle()
	waitFor(t, 15*time.Second, "two handshakes pending", func() bool { return f.gw.handshakes.Load() == 2 })
	if !closedAtOnce(dialIdle()) {
		t.Error("a third pending handshake was not closed at once")
	}
	if _, err := f.connect(t, clientTLS(t, f.creds(t, "laptop", pki.Device))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Errorf("device while the handshake slots are taken: %v, want Unavailable", err)
	}
	if len(f.logs.lines("refused", "handshake limit reached")) == 0 {
		t.Error("the limit is not logged")
	}
	// The stalled ones time out; devices get in, up to MaxConns.
	waitFor(t, 15*time.Second, "stalled handshakes dropped", func() bool { return f.gw.conns.Load() == 0 })
	for i, name := range []string{"a", "b", "c"} {
		f.device(t, name)
		// A client can hold a second connection for a moment while it
		// connects; the next device waits for it to go (CI once saw c
		// refused with b's two connections and a's open).
		waitFor(t, 15*time.Second, "the devices' extra connections closed", func() bool { return f.live() <= i+1 })
	}
	if !closedAtOnce(dialIdle()) {
		t.Error("a connection beyond MaxConns was not closed at once")
	}
	if _, err := f.connect(t, clientTLS(t, f.creds(t, "d", pki.Device))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Errorf("fourth device: %v, want Unavailable", err)
	}
}

// When its context ends, Serve closes the listener and every connection,
// and returns nil.
func TestShutdown(t *testing.T) {
	f := start(t, nil)
	cli := f.device(t, "laptop")
	ctx := context.Background()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	pending, err := net.Dial("tcp", f.addr) // a handshake in progress
	if err != nil {
		t.Fatal(err)
	}
	defer pending.Close()
	waitFor(t, 15*time.Second, "pending handshake", func() bool { return f.gw.handshakes.Load() == 1 })
	t0 := time.Now()
	f.stop(t)
	t.Logf("Serve returned %v after cancel", time.Since(t0))
	if n := f.gw.conns.Load(); n != 0 {
		t.Errorf("%d connections left after Serve returned", n)
	}
	_ = pending.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := pending.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("pending connection not closed: %v", err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := cli.Get(rctx, "k"); err == nil {
		t.Error("read through a stopped gateway")
	}
	if c, err := net.DialTimeout("tcp", f.addr, time.Second); err == nil {
		c.Close()
		t.Error("listener still open")
	}
}

func TestConfig(t *testing.T) {
	ca, err := pki.CreateCA(t.TempDir(), realm)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.NewCredentials(pki.NodeIdentity{Realm: realm, Name: "gw", Role: pki.Device}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"no credentials": {Revocations: pki.NoRevocations{}, Upstream: []string{"127.0.0.1:2379"}},
		"no revocations": {Credentials: c, Upstream: []string{"127.0.0.1:2379"}},
		"no upstream":    {Credentials: c, Revocations: pki.NoRevocations{}},
		"url upstream":   {Credentials: c, Revocations: pki.NoRevocations{}, Upstream: []string{"http://127.0.0.1:2379"}},
	} {
		if _, err := New(cfg); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("%s: %v, want Invalid", name, err)
		}
	}
	if _, err := New(Config{Credentials: c, Revocations: pki.NoRevocations{}, Upstream: []string{"127.0.0.1:2379"}}); err != nil {
		t.Error(err)
	}
}

// Upstream endpoints are tried in order; an admitted client whose etcd
// cannot be reached is disconnected (and the failure logged).
func TestUpstream(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	f := start(t, func(f *fixture, c *Config) {
		c.Dial = nil
		c.Upstream = []string{dead, f.etcd.Endpoints()[0]}
	})
	if _, err := f.device(t, "laptop").Put(context.Background(), "k", "v"); err != nil {
		t.Fatal(err)
	}
	f = start(t, func(f *fixture, c *Config) {
		c.Dial = nil
		c.Upstream = []string{dead}
	})
	if _, err := f.connect(t, clientTLS(t, f.creds(t, "desk", pki.Device))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Errorf("etcd down: %v, want Unavailable", err)
	}
	if len(f.logs.lines("upstream etcd unreachable", "node=desk")) == 0 {
		t.Error("upstream failure not logged")
	}
}
