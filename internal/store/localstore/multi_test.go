package localstore

import (
	"sync"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/storetest"
)

// Two Stores on one directory in one process hold separate open file
// descriptions, so flock treats them as two processes: these tests exercise
// the multi-process scheme without forking (TestCrash forks).

func TestTwoOpenersSeeEachOther(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir, Options{})
	b := open(t, dir, Options{})
	defer b.Close()

	// Every Put acknowledged by A is visible to B at once, while A keeps
	// appending to its open pack.
	var wg sync.WaitGroup
	var objs [4][]obj
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				id, data := storetest.Blob(uint64(w*1000+i), 3000+i)
				if err := a.Put(bg, id, data); err != nil {
					t.Error(err)
					return
				}
				found, err := b.Has(bg, []cairn.ID{id})
				if err != nil || !found[0] {
					t.Errorf("B does not see %s right after A's Put: %v %v", id.Short(), found, err)
					return
				}
				objs[w] = append(objs[w], obj{id, data})
			}
		})
	}
	wg.Wait()
	all := append(append(append(objs[0], objs[1]...), objs[2]...), objs[3]...)
	for _, o := range all {
		mustGet(t, b, o)
	}

	// A Delete by B: A learns it at its next refresh (List refreshes).
	if err := b.Delete(bg, all[0].id); err != nil {
		t.Fatal(err)
	}
	mustMissing(t, b, all[0].id)
	n := 0
	a.List(bg, func(id cairn.ID, _ int64) error {
		if id == all[0].id {
			t.Errorf("A lists an object B deleted")
		}
		n++
		return nil
	})
	if n != len(all)-1 {
		t.Errorf("A lists %d objects, want %d", n, len(all)-1)
	}
	mustMissing(t, a, all[0].id)

	// Both put the same object: each keeps it, once deleted it is gone for both.
	id, data := storetest.Blob(99999, 1234)
	if err := a.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if err := b.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(bg, id); err != nil {
		t.Fatal(err)
	}
	mustMissing(t, a, id)
	b.List(bg, func(cairn.ID, int64) error { return nil }) // refresh B
	mustMissing(t, b, id)

	// A closes (seals its pack); B switches to the index.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	more, _ := storetest.Blob(123456, 10)
	b.Has(bg, []cairn.ID{more}) // a miss refreshes
	b.mu.RLock()
	for _, p := range b.packs {
		if p != nil && p.state == stateForeign {
			t.Errorf("B still treats pack %s as being written", p.id)
		}
	}
	b.mu.RUnlock()
	for _, o := range all[1:] {
		mustGet(t, b, o)
	}
	verifyClean(t, b)
}

func TestTakeOverCrashedWriter(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir, Options{})
	b := open(t, dir, Options{})
	defer b.Close()
	objs := putN(t, a, 1, 50, 2000)
	found, _ := b.Has(bg, []cairn.ID{objs[49].id})
	if !found[0] {
		t.Fatal("B does not see A's objects")
	}
	a.crash()
	// B notices at its next refresh that A's pack has no writer any more and
	// recovers it (writes its index).
	missing, _ := storetest.Blob(777, 1)
	b.Has(bg, []cairn.ID{missing})
	if n := len(files(t, dir, ".idx")); n != 1 {
		t.Fatalf("B did not seal A's pack: %d indexes", n)
	}
	for _, o := range objs {
		mustGet(t, b, o)
	}
	verifyClean(t, b)
}

func TestCompactWhileAnotherReads(t *testing.T) {
	dir := t.TempDir()
	opts := Options{PackSize: 64 << 10, NoSync: true}
	a := open(t, dir, opts)
	objs := putN(t, a, 1, 300, 1000)
	a.Close()
	a = open(t, dir, opts)
	defer a.Close()
	b := open(t, dir, opts)
	defer b.Close()
	for i, o := range objs {
		if i%4 != 0 {
			if err := b.Delete(bg, o.id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.Compact(bg); err != nil {
		t.Fatal(err)
	}
	// A still has the old packs in memory, some of them removed from disk
	// (and never opened by A): its reads find the moved objects.
	for i, o := range objs {
		if i%4 == 0 {
			mustGet(t, a, o)
		} else {
			mustMissing(t, a, o.id)
		}
	}
	verifyClean(t, a)
	ua, _ := a.Stats(bg)
	ub, _ := b.Stats(bg)
	if ua != ub || ua.Objects != 75 {
		t.Fatalf("A sees %+v, B sees %+v", ua, ub)
	}
}
