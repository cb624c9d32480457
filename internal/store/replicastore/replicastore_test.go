package replicastore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/faultstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/replicastore"
	"cairn.dev/cairn/internal/store/storeset"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// members makes n fault-injecting memstores named s0, s1, ...
func members(n int) ([]replicastore.Named, []*faultstore.Store) {
	var named []replicastore.Named
	var fs []*faultstore.Store
	for i := range n {
		f := faultstore.New(memstore.New())
		fs = append(fs, f)
		named = append(named, replicastore.Named{Name: fmt.Sprintf("s%d", i), Store: f})
	}
	return named, fs
}

func open(t testing.TB, n int, named []replicastore.Named, o replicastore.Options) *replicastore.Store {
	t.Helper()
	if o.ProbeInterval == 0 {
		o.ProbeInterval = -1 // always try a down store: tests flip them
	}
	s, err := replicastore.New(n, named, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name          string
		copies, count int
		quorum        int
	}{
		{"copies2of2", 2, 2, 0},
		{"copies2of3", 2, 3, 0},
		{"copies2of2/quorum2", 2, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) cairn.Store {
				named, _ := members(tc.count)
				return open(t, tc.copies, named, replicastore.Options{Quorum: tc.quorum})
			})
		})
	}
}

func mustGet(t *testing.T, s cairn.Store, id cairn.ID, want []byte) {
	t.Helper()
	got, err := s.Get(bg, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id.Short(), err)
	}
	if string(got) != string(want) {
		t.Fatalf("Get %s: wrong bytes", id.Short())
	}
}

func holds(t *testing.T, f *faultstore.Store, id cairn.ID) bool {
	t.Helper()
	found, err := f.Inner().Has(bg, []cairn.ID{id})
	if err != nil {
		t.Fatal(err)
	}
	return found[0]
}

func flush(t *testing.T, s *replicastore.Store) {
	t.Helper()
	if err := s.Flush(bg); err != nil {
		t.Fatal(err)
	}
}

func TestOneDown(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	fs[1].SetDown(true)
	id, data := storetest.Blob(1, 5000)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatalf("Put with one of two stores down (quorum 1): %v", err)
	}
	flush(t, s)
	mustGet(t, s, id, data)
	if q := s.Queued(); len(q) != 1 || q[0] != (storeset.Task{Op: storeset.OpPut, ID: id, Store: "s1"}) {
		t.Fatalf("queue = %v, want one put for s1", q)
	}
	if h := s.Health(); h[1].Up || h[1].Queued != 1 || h[1].LastError == "" || !h[0].Up {
		t.Fatalf("health = %+v", h)
	}
	fs[1].SetDown(false)
	r, err := s.Repair(bg, replicastore.RepairOptions{QueueOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Missing != 1 || r.Rebuilt != 1 || r.Failed != 0 {
		t.Fatalf("repair = %v", r)
	}
	if !holds(t, fs[1], id) || len(s.Queued()) != 0 {
		t.Fatal("repair did not write the copy, or left it queued")
	}
	if h := s.Health(); !h[1].Up || h[1].Repaired != 1 {
		t.Fatalf("health after repair = %+v", h[1])
	}
}

func TestAllDown(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	id, data := storetest.Blob(2, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	fs[0].SetDown(true)
	fs[1].SetDown(true)
	other, odata := storetest.Blob(3, 100)
	err := s.Put(bg, other, odata)
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "store s0") || !strings.Contains(err.Error(), "store s1") {
		t.Fatalf("Put with every store down: %v; want Unavailable naming s0 and s1", err)
	}
	_, err = s.Get(bg, id)
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "store s1") {
		t.Fatalf("Get with every store down: %v", err)
	}
	if _, err := s.Has(bg, []cairn.ID{id}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Has with every store down: %v", err)
	}
	fs[0].SetDown(false)
	fs[1].SetDown(false)
	mustGet(t, s, id, data)
	if len(s.Queued()) != 0 {
		t.Fatalf("a failed Put left repairs queued: %v", s.Queued())
	}
}

// With one copy's store down, a missing object is not certainly missing.
func TestGetMissingWithOneDown(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	id, _ := storetest.Blob(4, 10)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get of a missing object: %v", err)
	}
	fs[0].SetDown(true)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Get of a missing object with one store down (quorum 1): %v, want Unavailable", err)
	}
}

func TestQuorumAll(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{Quorum: 2})
	defer s.Close()
	fs[0].SetDown(true)
	id, data := storetest.Blob(5, 100)
	err := s.Put(bg, id, data)
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "1 of 2 stores failed, 2 must be written: store s0: ") {
		t.Fatalf("Put with quorum 2 and a store down: %v", err)
	}
	fs[0].SetDown(false)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	// Quorum N: both copies are there when Put returns, no Flush needed.
	if !holds(t, fs[0], id) || !holds(t, fs[1], id) {
		t.Fatal("Put with quorum 2 returned before both copies were stored")
	}
}

// Put returns after the quorum; the held member's copy lands later.
func TestPutReturnsAtQuorum(t *testing.T) {
	named, fs := members(3)
	s := open(t, 3, named, replicastore.Options{Quorum: 2})
	defer s.Close()
	fs[2].Hold()
	id, data := storetest.Blob(6, 1000)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if holds(t, fs[2], id) {
		t.Fatal("held store has the copy")
	}
	if q := s.Queued(); len(q) != 1 || q[0].Store != "s2" {
		t.Fatalf("queue while the third copy is under way = %v", q)
	}
	for i := range data {
		data[i] = 0 // Put must not keep the caller's buffer
	}
	fs[2].Release()
	flush(t, s)
	if !holds(t, fs[2], id) || len(s.Queued()) != 0 {
		t.Fatalf("after release: held=%v queue=%v", holds(t, fs[2], id), s.Queued())
	}
	_, want := storetest.Blob(6, 1000)
	got, err := fs[2].Inner().Get(bg, id)
	if err != nil || string(got) != string(want) {
		t.Fatalf("background copy: %v", err)
	}
}

// A Delete waits for copies still being written, so none comes back.
func TestDeleteWaitsForBackgroundCopies(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	fs[1].Hold()
	id, data := storetest.Blob(7, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- s.Delete(bg, id) }()
	select {
	case err := <-done:
		t.Fatalf("Delete returned (%v) while a copy was still being written", err)
	case <-time.After(20 * time.Millisecond):
	}
	fs[1].Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if holds(t, fs[0], id) || holds(t, fs[1], id) {
		t.Fatal("a copy survived Delete")
	}
}

func TestCorruptCopy(t *testing.T) {
	for _, asErr := range []bool{false, true} {
		t.Run(fmt.Sprintf("asError=%v", asErr), func(t *testing.T) {
			named, fs := members(2)
			var got faultstore.Faults
			s := open(t, 2, named, replicastore.Options{OnFault: got.Add})
			defer s.Close()
			fs[1].SetDelay(10 * time.Millisecond) // s0 is read first
			id, data := storetest.Blob(8, 3000)
			if err := s.Put(bg, id, data); err != nil {
				t.Fatal(err)
			}
			flush(t, s)
			fs[1].SetDelay(0)
			for _, f := range fs {
				f.CorruptAsError(asErr)
			}
			if !fs[0].Damage(id) {
				t.Fatal("s0 lacks the object")
			}
			mustGet(t, s, id, data)
			flush(t, s)
			fl := got.Take()
			if len(fl) != 1 || fl[0].Store != "s0" || fl[0].Kind != cairn.Corrupt || fl[0].ID != id {
				t.Fatalf("faults = %v, want s0 corrupt", fl)
			}
			if fs[0].Damaged(id) {
				t.Fatal("s0's damaged copy was not rewritten after the read")
			}
			if c, err := fs[0].Inner().Get(bg, id); err != nil || string(c) != string(data) {
				t.Fatalf("s0's copy after the rebuild: %v", err)
			}
			if h := s.Health(); h[0].Corrupt != 1 || h[0].Repaired != 1 {
				t.Fatalf("health of s0 = %+v", h[0])
			}

			// s1, never read, is found by a scrub.
			fs[1].Damage(id)
			r, err := s.Repair(bg, replicastore.RepairOptions{Scrub: true})
			if err != nil || r.Corrupt != 1 || r.Rebuilt != 1 || fs[1].Damaged(id) {
				t.Fatalf("scrub = %v, %v; s1 damaged %v", r, err, fs[1].Damaged(id))
			}

			// Every copy damaged: Corrupt, naming both.
			fs[0].Damage(id)
			fs[1].Damage(id)
			_, err = s.Get(bg, id)
			if !errors.Is(err, cairn.ErrCorrupt) || !strings.Contains(err.Error(), "store s0") || !strings.Contains(err.Error(), "store s1") {
				t.Fatalf("Get with every copy damaged: %v", err)
			}
		})
	}
}

func TestRepairWalk(t *testing.T) {
	named, fs := members(3)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	want := map[cairn.ID][]byte{}
	for i := range 40 {
		id, data := storetest.Blob(uint64(100+i), 200+i)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		want[id] = data
	}
	flush(t, s)
	// Each object has 2 copies over 3 stores.
	total := 0
	for _, f := range fs {
		u, _ := f.Stats(bg)
		total += int(u.Objects)
	}
	if total != 80 {
		t.Fatalf("%d copies over 3 stores, want 80", total)
	}
	var ids []cairn.ID
	fs[2].Inner().List(bg, func(id cairn.ID, _ int64) error {
		ids = append(ids, id)
		return nil
	})
	lost := len(ids)
	if lost == 0 || lost == 40 {
		t.Fatalf("s2 holds %d of 40 objects: placement does not spread", lost)
	}
	for _, id := range ids {
		if err := fs[2].Lose(id); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.Repair(bg, replicastore.RepairOptions{Store: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Objects != 40 || r.Missing != int64(lost) || r.Rebuilt != int64(lost) || r.Failed != 0 {
		t.Fatalf("repair --store s2 = %v, want %d missing and rebuilt of 40", r, lost)
	}
	r, err = s.Repair(bg, replicastore.RepairOptions{})
	if err != nil || r.Missing != 0 || r.Rebuilt != 0 {
		t.Fatalf("second repair = %v, %v; want nothing to do", r, err)
	}
	for id, data := range want {
		mustGet(t, s, id, data)
	}
}

func TestRepairReplacement(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	var ids []cairn.ID
	for i := range 20 {
		id, data := storetest.Blob(uint64(200+i), 300)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	flush(t, s)
	fs[1].SetDown(true) // gone for good
	repl := memstore.New()
	r, err := s.Repair(bg, replicastore.RepairOptions{Store: "s1", Replacement: &replicastore.Named{Name: "new", Store: repl}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Rebuilt != 20 || r.Failed != 0 {
		t.Fatalf("repair onto a replacement = %v", r)
	}
	found, _ := repl.Has(bg, ids)
	for i, f := range found {
		if !f {
			t.Fatalf("replacement lacks object %d", i)
		}
	}
}

func TestPersistentQueue(t *testing.T) {
	dir := t.TempDir()
	inner0, inner1 := memstore.New(), memstore.New()
	fs := []*faultstore.Store{faultstore.New(nopClose{inner0}), faultstore.New(nopClose{inner1})}
	named := []replicastore.Named{{Name: "s0", Store: fs[0]}, {Name: "s1", Store: fs[1]}}
	s := open(t, 2, named, replicastore.Options{Dir: dir})
	fs[1].SetDown(true)
	id, data := storetest.Blob(9, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	// Reopen over the same stores, s1 back up.
	named2 := []replicastore.Named{
		{Name: "s0", Store: faultstore.New(nopClose{inner0})},
		{Name: "s1", Store: faultstore.New(nopClose{inner1})},
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, 2, named2, replicastore.Options{Dir: dir})
	defer s2.Close()
	if q := s2.Queued(); len(q) != 1 || q[0].Store != "s1" || q[0].ID != id {
		t.Fatalf("reopened queue = %v", q)
	}
	r, err := s2.Repair(bg, replicastore.RepairOptions{QueueOnly: true})
	if err != nil || r.Rebuilt != 1 {
		t.Fatalf("repair after reopen = %v, %v", r, err)
	}
	found, _ := inner1.Has(bg, []cairn.ID{id})
	if !found[0] {
		t.Fatal("queued copy not written after reopen")
	}
}

// nopClose keeps a store open when the wrapper closes it (memstore.Close
// drops the objects).
type nopClose struct{ cairn.Store }

func (nopClose) Close() error { return nil }

// Reads go to the fastest member once latencies are known.
func TestFastestFirst(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	id, data := storetest.Blob(10, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	fs[0].SetDelay(5 * time.Millisecond)
	for range 4 { // measure both
		mustGet(t, s, id, data)
		if _, err := s.Has(bg, []cairn.ID{id}); err != nil {
			t.Fatal(err)
		}
	}
	before := fs[0].Calls().Gets
	for range 20 {
		mustGet(t, s, id, data)
	}
	if n := fs[0].Calls().Gets - before; n != 0 {
		t.Fatalf("slow store read %d times of 20; health %+v", n, s.Health())
	}
}

// copies:2 stores every byte twice: bytes stored / bytes put = 2.
func TestOverhead(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	var put int64
	for i := range 200 {
		id, data := storetest.Blob(uint64(300+i), 1+i*331%40000)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		put += int64(len(data))
	}
	flush(t, s)
	var stored int64
	for _, f := range fs {
		u, err := f.Stats(bg)
		if err != nil {
			t.Fatal(err)
		}
		stored += u.Bytes
	}
	t.Logf("copies:2: %d bytes put, %d stored: overhead %.3f", put, stored, float64(stored)/float64(put))
	if stored != 2*put {
		t.Fatalf("stored %d bytes for %d put, want exactly twice", stored, put)
	}
	u, err := s.Stats(bg)
	if err != nil || u.Bytes != put || u.Disk != stored || u.Objects != 200 {
		t.Fatalf("Stats = %+v, %v", u, err)
	}
}

func TestGetRange(t *testing.T) {
	named, fs := members(2)
	s := open(t, 2, named, replicastore.Options{})
	defer s.Close()
	id, data := storetest.Blob(11, 10000)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	flush(t, s)
	for _, down := range []int{0, 1} {
		fs[down].SetDown(true)
		got, err := s.GetRange(bg, id, 1000, 2000)
		if err != nil || string(got) != string(data[1000:3000]) {
			t.Fatalf("GetRange with s%d down: %v", down, err)
		}
		fs[down].SetDown(false)
	}
	if _, err := s.GetRange(bg, id, 9000, 2000); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("GetRange past the end: %v", err)
	}
	fs[0].SetDown(true)
	fs[1].SetDown(true)
	if _, err := s.GetRange(bg, id, 0, 1); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("GetRange with both down: %v", err)
	}
}
