package replicastore_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/replicastore"
)

// indexed is a member whose Has answers from an index of what it held at
// its last Refresh (or Put), as a pack store's does: another process's
// deletions show only after a Refresh.
type indexed struct {
	*memstore.Store
	mu      sync.Mutex
	idx     map[cairn.ID]bool
	failing bool // Refresh fails
}

func (s *indexed) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := s.Store.Put(ctx, id, data); err != nil {
		return err
	}
	s.mu.Lock()
	s.idx[id] = true
	s.mu.Unlock()
	return nil
}

func (s *indexed) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]bool, len(ids))
	for i, id := range ids {
		out[i] = s.idx[id]
	}
	return out, nil
}

func (s *indexed) Refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing {
		return cairn.E("refresh", cairn.Unavailable, "", errors.New("down"))
	}
	s.idx = map[cairn.ID]bool{}
	return s.Store.List(ctx, func(id cairn.ID, _ int64) error {
		s.idx[id] = true
		return nil
	})
}

// TestRefreshPassesOn: after objects are deleted behind the members'
// indexes (a garbage collection in another process), Refresh makes Has
// say so; a member whose Refresh fails gives no answer until one
// succeeds, rather than its stale "present".
func TestRefreshPassesOn(t *testing.T) {
	a := &indexed{Store: memstore.New(), idx: map[cairn.ID]bool{}}
	b := &indexed{Store: memstore.New(), idx: map[cairn.ID]bool{}}
	s := open(t, 2, []replicastore.Named{{Name: "a", Store: a}, {Name: "b", Store: b}}, replicastore.Options{})
	defer s.Close()
	data := []byte("an object a gc will delete")
	id := cairn.ID(blake3.Sum256(data))
	for _, m := range []*indexed{a, b} { // as s.Put would, without its background writes
		if err := m.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
	}
	// The collection deletes the copies behind the indexes.
	for _, m := range []*indexed{a, b} {
		if err := m.Store.Delete(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if f, err := s.Has(bg, []cairn.ID{id}); err != nil || !f[0] {
		t.Fatalf("before Refresh: Has = %v, %v (the test's members answer from their index)", f, err)
	}
	b.failing = true
	if err := s.Refresh(bg); err != nil {
		t.Fatalf("Refresh with one member failing: %v", err)
	}
	if f, err := s.Has(bg, []cairn.ID{id}); err != nil || f[0] {
		t.Fatalf("after Refresh, b stale: Has = %v, %v, want not found", f, err)
	}
	b.failing = false
	if f, err := s.Has(bg, []cairn.ID{id}); err != nil || f[0] {
		t.Fatalf("after b refreshed: Has = %v, %v, want not found", f, err)
	}
	b.mu.Lock()
	n := len(b.idx)
	b.mu.Unlock()
	if n != 0 {
		t.Fatalf("b was not refreshed when asked again: %d objects in its index", n)
	}
}

// dedup is an indexed member whose Put skips an object its index lists,
// as packstore's and localstore's Put do.
type dedup struct{ *indexed }

func (s dedup) Put(ctx context.Context, id cairn.ID, data []byte) error {
	s.mu.Lock()
	have := s.idx[id]
	s.mu.Unlock()
	if have {
		return nil
	}
	return s.indexed.Put(ctx, id, data)
}

// TestStaleMemberPut: a member left stale by a failed Refresh is asked no
// Has; a write to it refreshes it first, so that its Put does not trust a
// stale index and store nothing.
func TestStaleMemberPut(t *testing.T) {
	a := &indexed{Store: memstore.New(), idx: map[cairn.ID]bool{}}
	b := &indexed{Store: memstore.New(), idx: map[cairn.ID]bool{}}
	s := open(t, 2, []replicastore.Named{{Name: "a", Store: dedup{a}}, {Name: "b", Store: dedup{b}}}, replicastore.Options{})
	data := []byte("an object a gc will delete")
	id := cairn.ID(blake3.Sum256(data))
	for _, m := range []*indexed{a, b} {
		if err := m.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		if err := m.Store.Delete(bg, id); err != nil { // the gc, behind the index
			t.Fatal(err)
		}
	}
	b.failing = true
	if err := s.Refresh(bg); err != nil {
		t.Fatal(err)
	}
	if f, err := s.Has(bg, []cairn.ID{id}); err != nil || f[0] {
		t.Fatalf("Has = %v, %v", f, err)
	}
	b.failing = false // b is back
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(bg); err != nil { // waits for the copies still being written
		t.Fatal(err)
	}
	ha, _ := a.Store.Has(bg, []cairn.ID{id})
	hb, _ := b.Store.Has(bg, []cairn.ID{id})
	if !ha[0] || !hb[0] {
		t.Fatalf("copies:2 Put succeeded; copies held: a %v, b %v", ha[0], hb[0])
	}
}
