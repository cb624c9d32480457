package director

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// pinEnv is fakeEnv with a pin store (PinStorer).
type pinEnv struct {
	*fakeEnv
	pins cairn.Store
}

func (e *pinEnv) PinStore(context.Context, bool) (cairn.Store, error) { return noClose{e.pins}, nil }

// Pinned data (Hoard) is read from this device, offline too, however
// much else the chunk cache takes in and evicts meanwhile; Hoard is
// idempotent; once unpinned (Unhoard) it is an ordinary cache entry,
// evicted as any other, and an offline read of it then fails at once.
func TestHoardSurvivesEvictionUntilUnhoarded(t *testing.T) {
	ctx := context.Background()
	e := &pinEnv{fakeEnv: newEnv(), pins: memstore.New()}
	laptop := memstore.New()
	e.node("laptop", pki.Device, meta.NodeOnline, laptop)
	pinned, pdata := storetest.Blob(1, 5000)
	var others []cairn.ID
	for i := range 8 {
		id, data := storetest.Blob(uint64(10+i), 5000)
		others = append(others, id)
		if err := laptop.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := laptop.Put(ctx, pinned, pdata); err != nil {
		t.Fatal(err)
	}
	var offline atomic.Bool
	d := New(e, Options{CacheBytes: 3 * 5000, Offline: offline.Load})
	defer d.Close()
	w, err := d.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	sctx := store.WithSources(ctx, []string{"laptop"})

	st, err := d.Hoard(sctx, []cairn.ID{pinned})
	if err != nil || st.Fetched != 1 || st.FetchedBytes != 5000 {
		t.Fatalf("hoard: %+v %v", st, err)
	}
	if st, err = d.Hoard(sctx, []cairn.ID{pinned}); err != nil || st.Fetched != 0 || st.Here != 1 {
		t.Fatalf("hoard again: %+v %v", st, err)
	}
	if here, err := d.Here(ctx, []cairn.ID{pinned, others[0]}); err != nil || !here[0] || here[1] {
		t.Fatalf("here: %v %v", here, err)
	}
	readAll := func() {
		t.Helper()
		for _, id := range others {
			if _, err := w.Store.Get(sctx, id); err != nil {
				t.Fatalf("online read: %v", err)
			}
		}
	}
	readAll() // 8 objects through a cache of 3: evictions
	if s := d.CacheStats(); s.Evictions == 0 {
		t.Fatalf("the cache evicted nothing: %+v", s)
	}

	offline.Store(true)
	if got, err := w.Store.Get(sctx, pinned); err != nil || string(got) != string(pdata) {
		t.Fatalf("offline read of pinned data: %v", err)
	}
	// Which of the others the cache kept is its business (once, under
	// -race, others[0] was still there); at least one of them was
	// evicted and is not here, and what is here reads back whole.
	gone := 0
	for i, id := range others {
		got, err := w.Store.Get(sctx, id)
		switch {
		case errors.Is(err, ErrNotHere):
			gone++
		case err != nil:
			t.Fatalf("offline read of others[%d]: %v, want the data or ErrNotHere", i, err)
		case len(got) != 5000:
			t.Fatalf("offline read of others[%d]: %d bytes", i, len(got))
		}
	}
	if gone == 0 {
		t.Fatal("offline, every evicted object was still readable")
	}
	if _, err := d.Hoard(sctx, []cairn.ID{others[0]}); !errors.Is(err, ErrNotHere) {
		t.Fatalf("offline hoard of data not here: %v", err)
	}
	offline.Store(false)

	n, bytes, err := d.Unhoard(ctx, func(cairn.ID) bool { return false })
	if err != nil || n != 1 || bytes != 5000 {
		t.Fatalf("unhoard: %d %d %v", n, bytes, err)
	}
	if here, _ := d.Here(ctx, []cairn.ID{pinned}); here[0] {
		t.Fatal("still pinned after unhoard")
	}
	if got, err := d.GetHere(ctx, pinned); err != nil || string(got) != string(pdata) {
		t.Fatalf("unpinned data not handed to the chunk cache: %v", err)
	}
	readAll() // now it is evicted like the rest
	offline.Store(true)
	if _, err := w.Store.Get(sctx, pinned); !errors.Is(err, ErrNotHere) {
		t.Fatalf("offline read of unpinned, evicted data: %v", err)
	}
}
