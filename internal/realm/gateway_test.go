package realm

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/pki"
)

func TestMain(m *testing.M) {
	etcdsvc.RunDaemonIfRequested()
	os.Exit(m.Run())
}

// A realm on the embedded etcd serves it to its other devices through the
// metadata gateway: a joined device works through it; a surrogate's
// certificate is refused, and so is a device once removed.
func TestMetadataGateway(t *testing.T) {
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
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- a.Serve(sctx, ServeOptions{Listen: "127.0.0.1:0", Lease: 2 * time.Second, Ready: func(string, bool) { close(ready) }})
	}()
	t.Cleanup(func() { cancel(); <-served })
	select {
	case <-ready:
	case err2 := <-served:
		t.Fatalf("serve: %v", err2)
	}
	st, err := a.Meta.Node(ctx, "a")
	if err != nil || st.Gateway == "" {
		t.Fatalf("a's record names no gateway: %+v, %v", st, err)
	}

	tok, err := a.Invite(ctx, InviteOptions{Role: pki.Device, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	homeB := t.TempDir()
	if _, jerr := Join(ctx, homeB, tok, JoinOptions{NoPassphrase: true}); jerr != nil {
		t.Fatal(jerr)
	}
	b, err := Open(ctx, homeB, Options{NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(b.Config.Gateway) != 1 || b.Config.Gateway[0] != st.Gateway || len(b.Config.Etcd) != 0 {
		t.Fatalf("b's config: etcd %v, gateway %v", b.Config.Etcd, b.Config.Gateway)
	}
	// b runs its node too (registered through the gateway), so a can
	// fetch what b writes.
	bctx, bcancel := context.WithCancel(ctx)
	bready := make(chan struct{})
	bserved := make(chan error, 1)
	go func() {
		bserved <- b.Serve(bctx, ServeOptions{Listen: "127.0.0.1:0", Lease: 2 * time.Second, Ready: func(string, bool) { close(bready) }})
	}()
	defer func() { bcancel(); <-bserved }()
	select {
	case <-bready:
	case err2 := <-bserved:
		t.Fatalf("b serve: %v", err2)
	}
	if bs, nerr := a.Meta.Node(ctx, "b"); nerr != nil || bs.Gateway != "" || bs.State != "awake" {
		t.Fatalf("b's record: %+v, %v (a device reaching the metadata through a gateway relays none)", bs, nerr)
	}
	writeFile(t, b, "from-b", []byte("written through the gateway"))
	got, stores, err := readFile(a, "from-b")
	if err != nil || string(got) != "written through the gateway" || stores[0] != "b" {
		t.Fatalf("a reads b's file: %q %v %v", got, stores, err)
	}

	// A surrogate has a certificate of the realm, but no metadata access.
	tok, err = a.Invite(ctx, InviteOptions{Role: pki.Surrogate, Name: "s"})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := Join(ctx, t.TempDir(), tok, JoinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf, _ := pki.ClientTLS(sc, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if c, err := etcdsvc.ConnectExternal(ctx, []string{st.Gateway}, etcdsvc.ConnectOptions{TLS: conf}); !errors.Is(err, cairn.ErrPermission) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("a surrogate reached the metadata: %v", err)
	}

	// Removed: b is cut off, and its node stops.
	if err := a.Meta.RemoveNode(ctx, "b", time.Now()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		qctx, qcancel := context.WithTimeout(ctx, time.Second)
		_, err := b.Meta.Node(qctx, "a")
		qcancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a removed device still reads the metadata")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := Open(ctx, homeB, Options{NoPassphrase: true}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("a removed device opened the realm: %v", err)
	}
	// Its node stops, whether its next report saw the removal or its
	// revocation list did (cut off, its reports would only time out).
	select {
	case err := <-bserved:
		bserved <- err // for the deferred wait
		if !errors.Is(err, cairn.ErrPermission) {
			t.Fatalf("removed b's serve ended with %v, want Permission", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("removed b's node still serves")
	}
}
