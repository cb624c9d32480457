package realm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/metagw"
	"cairn.dev/cairn/internal/pki"
)

// freeAddr is a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// serveGatewayAs runs a metadata gateway in front of a's etcd presenting
// creds, on a fresh loopback port.
func serveGatewayAs(t *testing.T, a *Realm, creds *pki.Credentials) string {
	t.Helper()
	gw, err := metagw.New(metagw.Config{Credentials: creds, Revocations: pki.NoRevocations{}, Upstream: a.conn.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return ln.Addr().String()
}

// The realm records where its metadata service is; a device caches the
// list when it opens the realm, takes any device of the realm as gateway
// (not a surrogate), and, once every gateway it knows is gone, asks
// another device's node where the service went.
func TestMetaServiceDiscovery(t *testing.T) {
	ctx := context.Background()
	homeA := t.TempDir()
	t.Setenv(etcdsvc.EnvLinger, "1s")
	a, err := Init(ctx, homeA, Options{NoPassphrase: true, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		etcdsvc.StopDaemon(homeA)
	})
	nodeA, gw1 := freeAddr(t), freeAddr(t)
	serveA := func(gw string) *served {
		return run(t, func(ctx context.Context, ready func(string)) error {
			return a.Serve(ctx, ServeOptions{Listen: nodeA, GatewayListen: gw, Lease: 2 * time.Second, Ready: func(s string, _ bool) { ready(s) }})
		})
	}
	sa := serveA(gw1)
	rec, err := a.Meta.MetaService(ctx)
	if err != nil || !slices.Equal(rec.Gateways(), []string{gw1}) || rec.Members[0].Node != "a" {
		t.Fatalf("metadata service record: %+v, %v; want a at %s", rec, err, gw1)
	}

	homeB := joinAs(t, a, pki.Device, "b")
	homeC := joinAs(t, a, pki.Device, "c")
	b, err := Open(ctx, homeB, Options{NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if !slices.Equal(b.Config.Gateway, []string{gw1}) || !slices.Equal(b.Config.Nodes, []string{nodeA}) || b.Config.GatewayNode != "" {
		t.Fatalf("b's cached config: gateway %v, nodes %v, gateway node %q; want [%s], [%s]", b.Config.Gateway, b.Config.Nodes, b.Config.GatewayNode, gw1, nodeA)
	}

	// Any device of the realm may serve the metadata: a gateway
	// presenting b's certificate is taken; one presenting a surrogate's
	// is not.
	credsB, err := pki.LoadCredentials(CredentialsDir(homeB))
	if err != nil {
		t.Fatal(err)
	}
	cfgC, err := readConfig(homeC)
	if err != nil {
		t.Fatal(err)
	}
	cfgC.Gateway = []string{serveGatewayAs(t, a, credsB)}
	c, err := connect(ctx, homeC, cfgC, Options{NoPassphrase: true})
	if err != nil {
		t.Fatalf("c refused a gateway of device b: %v", err)
	}
	c.Close()
	homeS := joinAs(t, a, pki.Surrogate, "s")
	credsS, err := pki.LoadCredentials(CredentialsDir(homeS))
	if err != nil {
		t.Fatal(err)
	}
	cfgC.Gateway = []string{serveGatewayAs(t, a, credsS)}
	if c, err := connect(ctx, homeC, cfgC, Options{NoPassphrase: true}); !errors.Is(err, cairn.ErrPermission) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("c took a surrogate for a gateway: %v, want Permission", err)
	}

	// The service moves (here: a serves its gateway at another address);
	// b, which was away, finds it through a's node and caches it.
	if err := sa.stop(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	gw2 := freeAddr(t)
	serveA(gw2)
	b2, err := Open(ctx, homeB, Options{NoPassphrase: true})
	if err != nil {
		t.Fatalf("b lost its gateway and did not find the new one: %v", err)
	}
	t.Cleanup(func() { b2.Close() })
	if !slices.Equal(b2.Config.Gateway, []string{gw2}) {
		t.Fatalf("b's gateways %v, want [%s]", b2.Config.Gateway, gw2)
	}
	if saved, err := readConfig(homeB); err != nil || !slices.Equal(saved.Gateway, []string{gw2}) {
		t.Fatalf("b's realm.json: %+v, %v", saved, err)
	}
	if _, err := b2.Meta.Node(ctx, "a"); err != nil {
		t.Fatal(err)
	}
}

// A device's node answers where the metadata service is from what it
// knows (realm.json's gateways, the last record it saw), without asking
// the metadata: asked while the host's etcd is stopped (SIGSTOP, as a
// sleeping host), it answers at once. It waited on the stopped etcd, and
// the asker gave up after 5 s.
func TestMetaServiceAnswerWithHostAsleep(t *testing.T) {
	ctx := context.Background()
	homeA := t.TempDir()
	t.Setenv(etcdsvc.EnvLinger, "1s")
	a, err := Init(ctx, homeA, Options{NoPassphrase: true, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		etcdsvc.StopDaemon(homeA)
	})
	gwA := freeAddr(t)
	run(t, func(ctx context.Context, ready func(string)) error {
		return a.Serve(ctx, ServeOptions{Listen: "127.0.0.1:0", GatewayListen: gwA, Lease: 2 * time.Second, Ready: func(s string, _ bool) { ready(s) }})
	})
	homeB := joinAs(t, a, pki.Device, "b")
	b, err := Open(ctx, homeB, Options{NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	sb := run(t, func(ctx context.Context, ready func(string)) error {
		return b.Serve(ctx, ServeOptions{Listen: "127.0.0.2:0", Lease: 2 * time.Second, Ready: func(s string, _ bool) { ready(s) }})
	})
	creds, err := pki.LoadCredentials(CredentialsDir(homeB))
	if err != nil {
		t.Fatal(err)
	}
	if gws, err := askMetaService(ctx, creds, []string{sb.addr}); err != nil || !slices.Equal(gws, []string{gwA}) {
		t.Fatalf("b's node says the metadata service is at %v, %v; want [%s]", gws, err, gwA)
	}

	// The host's etcd (its daemon, a process this test started) stops.
	raw, err := os.ReadFile(filepath.Join(homeA, "etcd", "endpoint"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) != 3 {
		t.Fatalf("endpoint file %q", raw)
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil || pid <= 1 {
		t.Fatalf("endpoint file %q: pid %v", raw, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(cont)
	// b's own reads through a's gateway now hang: the node would too.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	_, rerr := b.Meta.MetaService(rctx)
	rcancel()
	if rerr == nil {
		t.Fatal("b read the metadata with a's etcd stopped")
	}
	t0 := time.Now()
	gws, err := askMetaService(ctx, creds, []string{sb.addr})
	if err != nil || !slices.Equal(gws, []string{gwA}) {
		t.Fatalf("b's node, with a's etcd stopped: %v, %v (after %v); want [%s]", gws, err, time.Since(t0), gwA)
	}
	t.Logf("answered in %v with a's etcd stopped", time.Since(t0))
	cont()
}
