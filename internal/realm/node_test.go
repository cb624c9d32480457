package realm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// The serving rate is a moving average over the intervals in which the
// node served; an idle interval keeps it.
func TestServingRate(t *testing.T) {
	ctx := context.Background()
	m := &meteredStore{Store: memstore.New()}
	id, data := storetest.Blob(1, 1000)
	if err := m.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if r := m.rate(t0); r != 0 {
		t.Fatalf("first rate %v", r)
	}
	for range 2 {
		if _, err := m.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if r := m.rate(t0.Add(time.Second)); r != 2000 {
		t.Fatalf("rate after 2000 bytes in 1 s: %v", r)
	}
	if r := m.rate(t0.Add(2 * time.Second)); r != 2000 {
		t.Fatalf("idle interval changed the rate: %v", r)
	}
	if _, err := m.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	if r := m.rate(t0.Add(3 * time.Second)); r != 0.7*2000+0.3*1000 {
		t.Fatalf("averaged rate: %v", r)
	}
	if m.served.Load() != 3000 {
		t.Fatalf("served %d", m.served.Load())
	}
	if _, err := m.Stats(ctx); err != nil {
		t.Fatalf("Stats passes through: %v", err)
	}
}

func TestDefaultNodeName(t *testing.T) {
	if err := pki.ValidName(DefaultNodeName()); err != nil {
		t.Fatal(err)
	}
}

// A node whose certificate is revoked stops at its next report, with
// Permission, although its registry record does not say it was removed: a
// device that reaches the metadata through a gateway is cut off there at
// once and never reads that record again; the revocation list it watches
// is what tells it.
func TestServeStopsWhenRevoked(t *testing.T) {
	ctx := context.Background()
	home := t.TempDir()
	t.Setenv(etcdsvc.EnvLinger, "1s")
	r, err := Init(ctx, home, Options{NoPassphrase: true, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		etcdsvc.StopDaemon(home)
	})
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- r.Serve(sctx, ServeOptions{Listen: "127.0.0.1:0", Lease: 1500 * time.Millisecond, NoGateway: true, Ready: func(string, bool) { close(ready) }})
	}()
	select {
	case <-ready:
	case err2 := <-served:
		t.Fatalf("serve: %v", err2)
	}
	creds, err := r.Credentials(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Meta.RevokeSerial(ctx, creds.Leaf.SerialNumber); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("serve of a revoked node ended with %v, want Permission (revoked)", err)
		}
	case <-time.After(5 * time.Second):
		cancel()
		<-served
		t.Fatal("a revoked node still serves 5 s later")
	}
}
