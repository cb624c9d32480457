package realm

import (
	"context"
	"testing"
	"time"

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
