package localstore

import (
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestDeleteSeenAfterRefresh: a Delete another process completed before a
// Refresh started is seen once the Refresh returns, even while that process
// (and the next ones) compact, close and reopen the store, and while the
// writer keeps refreshing from other goroutines. A writer that still finds
// a deleted object would skip its upload and commit a version naming it.
func TestDeleteSeenAfterRefresh(t *testing.T) {
	dir := t.TempDir()
	opts := Options{PackSize: 64 << 10, NoSync: true, CompactBelow: 0.9}
	a := open(t, dir, opts)
	defer a.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := a.Refresh(bg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() { // more writes meanwhile, filling and rotating packs
		for i := uint64(0); i < 4000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id, data := storetest.Blob(1<<40+i, 3000)
			if err := a.Put(bg, id, data); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	seed := uint64(1)
	for round := range 40 {
		objs := putN(t, a, seed, 40, 1500+round)
		seed += 1000
		b := open(t, dir, opts)
		var gone []cairn.ID
		for i, o := range objs {
			if i%3 != 0 {
				if err := b.Delete(bg, o.id); err != nil {
					t.Fatal(err)
				}
				gone = append(gone, o.id)
			}
		}
		if _, err := b.Compact(bg); err != nil {
			t.Fatal(err)
		}
		if round%2 == 0 {
			b.crash()
		} else if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Refresh(bg); err != nil {
			t.Fatal(err)
		}
		found, err := a.Has(bg, gone)
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range found {
			if f {
				t.Fatalf("round %d: the writer still has %s after another process deleted it and a refresh", round, gone[i].Short())
			}
		}
		for i, o := range objs {
			if i%3 == 0 {
				mustGet(t, a, o)
			}
		}
	}
}

// pauseInWrite opens a store on dir whose next direct write, once arm is
// called, runs during between writing its batch to the file and
// publishing it. ran reports whether it did.
func pauseInWrite(t *testing.T, dir string, during func()) (s *Store, arm func(), ran func() bool) {
	var armed, done atomic.Bool
	s = open(t, dir, Options{testDirectWrite: func(f *os.File, buf []byte, off int64) (int, error) {
		n, err := f.WriteAt(buf, off)
		if err == nil && armed.CompareAndSwap(true, false) {
			during()
			done.Store(true)
		}
		return n, err
	}})
	return s, func() { armed.Store(true) }, done.Load
}

// blockEndVictim returns an object whose record, put next in s, ends on a
// block boundary: the direct write a pauseInWrite hook sees (whole blocks
// only) then holds all of it.
func blockEndVictim(t *testing.T, s *Store) (cairn.ID, []byte) {
	t.Helper()
	s.mu.RLock()
	var end int64
	for _, p := range s.packs {
		if p != nil && p.state == stateOwn {
			end = p.end
		}
	}
	s.mu.RUnlock()
	if end == 0 || s.direct != directOn {
		t.Fatalf("no pack being appended with O_DIRECT (end %d, direct %d)", end, s.direct)
	}
	align := int64(s.align)
	return storetest.Blob(4242, int(2*align-end%align-recHeaderSize))
}

// TestDeleteBeforePublish: another process can read a record from the
// file, delete it and have that tombstone applied here, all between the
// write of the record and its Put returning. The object must then be gone
// here too: a writer that still found it would skip storing it again and
// commit a version naming a deleted object.
func TestDeleteBeforePublish(t *testing.T) {
	dir := t.TempDir()
	if !directWorks(t, dir) {
		t.Skip("no O_DIRECT here: the test pauses the writer in its direct write")
	}
	b := open(t, dir, Options{})
	defer b.Close()
	var victim cairn.ID
	var a *Store
	a, arm, ran := pauseInWrite(t, dir, func() {
		// The record is in the file, not yet published in A.
		if found, _ := b.Has(bg, []cairn.ID{victim}); !found[0] {
			t.Error("B does not see A's record")
		}
		if derr := b.Delete(bg, victim); derr != nil {
			t.Error(derr)
		}
		if rerr := a.Refresh(bg); rerr != nil {
			t.Error(rerr)
		}
	})
	defer a.Close()
	putN(t, a, 1, 3, 2000) // the pack exists and B knows it
	victim, data := blockEndVictim(t, a)
	if found, _ := b.Has(bg, []cairn.ID{victim}); found[0] {
		t.Fatal("victim present before its Put")
	}
	arm()
	if err := a.Put(bg, victim, data); err != nil {
		t.Fatal(err)
	}
	if !ran() {
		t.Fatal("the hook did not run")
	}
	found, err := a.Has(bg, []cairn.ID{victim})
	if err != nil {
		t.Fatal(err)
	}
	if found[0] {
		t.Fatal("A still has an object B deleted (its tombstone arrived before A published the record)")
	}
	mustMissing(t, a, victim)
	// Put again: stored anew, and both see it.
	if err := a.Put(bg, victim, data); err != nil {
		t.Fatal(err)
	}
	mustGet(t, a, obj{victim, data})
	mustGet(t, b, obj{victim, data})
	verifyClean(t, a)
}

// TestPutJoiningBornDead: a Put that starts after another process's Delete
// completed (and after a Refresh here applied it) may join the pending Put
// of the same object, whose record is born dead: it must store the object
// anew, not return the dead record's success.
func TestPutJoiningBornDead(t *testing.T) {
	dir := t.TempDir()
	if !directWorks(t, dir) {
		t.Skip("no O_DIRECT here: the test pauses the writer in its direct write")
	}
	b := open(t, dir, Options{})
	defer b.Close()
	var victim cairn.ID
	var data []byte
	var a *Store
	second := make(chan error, 1)
	a, arm, ran := pauseInWrite(t, dir, func() {
		if derr := b.Delete(bg, victim); derr != nil {
			t.Error(derr)
		}
		// After the Delete completed: a writer refreshes (as after a gc
		// generation change), finds the object missing, puts it.
		if rerr := a.Refresh(bg); rerr != nil {
			t.Error(rerr)
		}
		if found, _ := a.Has(bg, []cairn.ID{victim}); found[0] {
			t.Error("A has the victim before publishing it")
		}
		go func() { second <- a.Put(bg, victim, data) }()
		// Give the second Put time to find the pending request (if it
		// comes later, it writes anew and the test passes without
		// covering the join).
		time.Sleep(100 * time.Millisecond)
	})
	defer a.Close()
	putN(t, a, 1, 3, 2000)
	victim, data = blockEndVictim(t, a)
	arm()
	if err := a.Put(bg, victim, data); err != nil {
		t.Fatal(err)
	}
	if !ran() {
		t.Fatal("the hook did not run")
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	found, err := a.Has(bg, []cairn.ID{victim})
	if err != nil {
		t.Fatal(err)
	}
	if !found[0] {
		t.Fatal("a Put that began after the Delete returned success, and the object is absent")
	}
}
