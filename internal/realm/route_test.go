package realm

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// countingStore counts the Gets it is asked.
type countingStore struct {
	cairn.Store
	gets atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, id)
}

// A read asks only the nodes the version names: a miss there is not
// broadcast to the other online nodes (benefactors, surrogates, devices).
// A version that names no node but this device ("local", written before
// versions named nodes) asks the other devices only.
func TestReadAsksOnlyTheNamedNodes(t *testing.T) {
	ctx := context.Background()
	a, err := Init(ctx, t.TempDir(), Options{Etcd: etcdtest.New(t).Endpoints(), NoPassphrase: true, NodeName: "desk", Logger: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	id, data := storetest.Blob(3, 5000)

	rt := &router{r: a, nodes: map[string]*peer{}}
	defer rt.Close()
	fakes := map[string]*countingStore{}
	for i, n := range []struct {
		name string
		role pki.Role
		has  bool
	}{{"donor", pki.Benefactor, true}, {"cafe", pki.Surrogate, true}, {"laptop", pki.Device, true}, {"spare", pki.Benefactor, false}} {
		addr := "127.0.0.1:" + string(rune('1'+i))
		reg, err := a.Meta.Register(ctx, meta.NodeRecord{Name: n.name, Role: string(n.role), Addr: addr}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close(ctx)
		c := &countingStore{Store: memstore.New()}
		if n.has {
			if err := c.Put(ctx, id, data); err != nil {
				t.Fatal(err)
			}
		}
		fakes[n.name] = c
		rt.nodes[n.name] = &peer{name: n.name, addr: addr, st: c, rtt: time.Millisecond}
	}
	gets := func() map[string]int64 {
		m := map[string]int64{}
		for n, c := range fakes {
			m[n] = c.gets.Swap(0)
		}
		return m
	}

	// Named and held: one request, to it.
	if got, err := rt.Get(store.WithSources(ctx, []string{"donor"}), id); err != nil || string(got) != string(data) {
		t.Fatalf("read from the named node: %v", err)
	}
	if g := gets(); g["donor"] != 1 || g["cafe"]+g["laptop"]+g["spare"] != 0 {
		t.Fatalf("requests: %v", g)
	}
	// Named and missing: NotFound, nobody else asked.
	if _, err := rt.Get(store.WithSources(ctx, []string{"spare"}), id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("read from a node without it: %v", err)
	}
	if g := gets(); g["spare"] != 1 || g["donor"]+g["cafe"]+g["laptop"] != 0 {
		t.Fatalf("requests after a miss: %v", g)
	}
	// Named "local" (an old version): the other devices only.
	if got, err := rt.Get(store.WithSources(ctx, []string{"local"}), id); err != nil || string(got) != string(data) {
		t.Fatalf("read of an old version: %v", err)
	}
	if g := gets(); g["laptop"] != 1 || g["donor"]+g["cafe"]+g["spare"] != 0 {
		t.Fatalf("requests for an old version: %v", g)
	}
}
