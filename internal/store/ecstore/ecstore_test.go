package ecstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/faultstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// nopClose keeps a memstore open when the wrapper closes it, so a test can
// reopen a wrapper over the same contents.
type nopClose struct{ *memstore.Store }

func (nopClose) Close() error { return nil }

// cluster is N memstores behind fault injectors, named s0, s1, ...
type cluster struct {
	inner []*memstore.Store
	fs    []*faultstore.Store
}

func newCluster(n int) *cluster {
	c := &cluster{}
	for range n {
		m := memstore.New()
		c.inner = append(c.inner, m)
		c.fs = append(c.fs, faultstore.New(nopClose{m}))
	}
	return c
}

func (c *cluster) named() []ecstore.Named {
	var out []ecstore.Named
	for i, f := range c.fs {
		out = append(out, ecstore.Named{Name: fmt.Sprintf("s%d", i), Store: f})
	}
	return out
}

// down sets members down (true) or back up.
func (c *cluster) down(v bool, which ...int) {
	for _, i := range which {
		c.fs[i].SetDown(v)
	}
}

// objects returns how many objects member i holds.
func (c *cluster) objects(t testing.TB, i int) int64 {
	t.Helper()
	u, err := c.inner[i].Stats(bg)
	if err != nil {
		t.Fatal(err)
	}
	return u.Objects
}

func openEC(t testing.TB, k, m int, named []ecstore.Named, o ecstore.Options) *ecstore.Store {
	t.Helper()
	if o.ProbeInterval == 0 {
		o.ProbeInterval = -1 // tests flip members up and down: always try them
	}
	s, err := ecstore.New(k, m, named, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name   string
		k, m   int
		quorum int
	}{
		{"ec2+2", 2, 2, 0},
		{"ec2+2/quorum4", 2, 2, 4},
		{"ec1+1", 1, 1, 0},
		{"ec3+2", 3, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) cairn.Store {
				var named []ecstore.Named
				for i := range tc.k + tc.m {
					named = append(named, ecstore.Named{Name: fmt.Sprintf("s%d", i), Store: memstore.New()})
				}
				return openEC(t, tc.k, tc.m, named, ecstore.Options{Quorum: tc.quorum})
			})
		})
	}
}

func TestNewRejects(t *testing.T) {
	named := newCluster(4).named()
	for _, tc := range []struct {
		k, m int
		o    ecstore.Options
	}{
		{0, 4, ecstore.Options{}},
		{4, 0, ecstore.Options{}},
		{2, 1, ecstore.Options{}},             // 3 shards, 4 stores
		{2, 2, ecstore.Options{Quorum: 1}},    // below K: unreadable when acknowledged
		{2, 2, ecstore.Options{Quorum: 5}},    // above N
		{200, 57, ecstore.Options{Quorum: 0}}, // above 256 shards
	} {
		if _, err := ecstore.New(tc.k, tc.m, named, tc.o); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("New(%d, %d, %+v): %v, want Invalid", tc.k, tc.m, tc.o, err)
		}
	}
}

func mustGet(t testing.TB, s cairn.Store, id cairn.ID, want []byte) {
	t.Helper()
	got, err := s.Get(bg, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id.Short(), err)
	}
	if string(got) != string(want) {
		t.Fatalf("Get %s: wrong bytes", id.Short())
	}
}

func flush(t testing.TB, s *ecstore.Store) {
	t.Helper()
	if err := s.Flush(bg); err != nil {
		t.Fatal(err)
	}
}

type blob struct {
	id   cairn.ID
	data []byte
}

func putSome(t testing.TB, s cairn.Store, seed, n int) []blob {
	t.Helper()
	var out []blob
	for i := range n {
		id, data := storetest.Blob(uint64(seed+i), 1+(seed+i)*977%50000)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
		out = append(out, blob{id, data})
	}
	return out
}

func getAll(t testing.TB, s cairn.Store, blobs []blob) {
	t.Helper()
	for _, b := range blobs {
		mustGet(t, s, b.id, b.data)
	}
}

func errNames(t *testing.T, err error, kind error, stores ...string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("err = %v, want %v", err, kind)
	}
	for _, name := range stores {
		if !strings.Contains(err.Error(), "store "+name+":") {
			t.Fatalf("err = %v; does not name store %s", err, name)
		}
	}
}

// The scenario under ec:2+2: one store down, then two, then three;
// then restart them: nothing is lost, and Repair restores every shard.
func TestStoresDown(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	before := putSome(t, s, 0, 20)
	flush(t, s)

	// One down: reads and writes work.
	c.down(true, 0)
	getAll(t, s, before)
	one := putSome(t, s, 100, 10)
	flush(t, s)
	getAll(t, s, one)
	if h := s.Health(); h[0].Up || h[0].Queued != 10 || !h[1].Up {
		t.Fatalf("health with s0 down: %+v", h)
	}

	// Two down: reads work (both data shards' holders down for objects
	// read from parity). With the default quorum K = 2, writes are
	// acknowledged with 2 shards; with quorum 3 they fail, naming s0 and
	// s1 (TestQuorumRefusesTwoDown).
	c.down(true, 1)
	getAll(t, s, before)
	getAll(t, s, one)
	two := putSome(t, s, 200, 5)
	flush(t, s)
	getAll(t, s, two)

	// Three down: clear errors, naming the stores.
	c.down(true, 2)
	id, data := storetest.Blob(999, 1000)
	errNames(t, s.Put(bg, id, data), cairn.ErrUnavailable, "s0", "s1", "s2")
	_, err := s.Get(bg, before[0].id)
	errNames(t, err, cairn.ErrUnavailable, "s0", "s1", "s2")
	if !strings.Contains(err.Error(), "1 of 4 shards readable, 2 needed") {
		t.Fatalf("Get with three down: %v", err)
	}

	// Restart: nothing lost.
	c.down(false, 0, 1, 2)
	getAll(t, s, before)
	getAll(t, s, one)
	getAll(t, s, two)

	// Repair restores every missing shard: s0 lacks 15 (one and two), s1
	// lacks 5 (two). The Put that failed with three down left its shard
	// and map on s3: an object with one shard of the two needed, which
	// Repair reports as unrecoverable (and List shows, for GC to delete).
	r, err := s.Repair(bg, ecstore.RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Rebuilt != 20 || r.Failed != 0 || r.Unrecoverable != 1 || r.Objects != 36 {
		t.Fatalf("repair = %v; want 36 objects, 20 shards rebuilt, 1 unrecoverable", r)
	}
	if q := s.Queued(); len(q) != 0 {
		t.Fatalf("queue after repair: %v", q)
	}
	if _, gerr := s.Get(bg, id); !errors.Is(gerr, cairn.ErrNotFound) {
		t.Fatalf("Get of the failed Put's remains: %v, want NotFound", gerr)
	}
	if derr := s.Delete(bg, id); derr != nil {
		t.Fatal(derr)
	}
	for i := range 4 {
		if n := c.objects(t, i); n != 2*35 {
			t.Fatalf("s%d holds %d objects after repair, want 70 (35 shards, 35 maps)", i, n)
		}
	}
	r, err = s.Repair(bg, ecstore.RepairOptions{})
	if err != nil || r.Rebuilt != 0 || r.Missing != 0 || r.Objects != 35 || r.Unrecoverable != 0 {
		t.Fatalf("second repair = %v, %v; want nothing to do", r, err)
	}
	// Every object now survives any two members going away.
	c.down(true, 2, 3)
	getAll(t, s, two)
	c.down(false, 2, 3)
	c.down(true, 0, 1)
	getAll(t, s, one)
}

func TestQuorumRefusesTwoDown(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{Quorum: 3})
	defer s.Close()
	c.down(true, 0)
	putSome(t, s, 0, 3)
	c.down(true, 1)
	id, data := storetest.Blob(1, 100)
	err := s.Put(bg, id, data)
	errNames(t, err, cairn.ErrUnavailable, "s0", "s1")
	if !strings.Contains(err.Error(), "2 of 4 stores failed, 3 must be written") {
		t.Fatalf("Put: %v", err)
	}
	// s2 and s3 took their shards: once s0 and s1 are back, Repair
	// completes the write rather than leaving it half there.
	flush(t, s)
	c.down(false, 0, 1)
	r, err := s.Repair(bg, ecstore.RepairOptions{})
	if err != nil || r.Rebuilt != 2+3 || r.Failed != 0 {
		t.Fatalf("repair = %v, %v; want 5 shards rebuilt (3 from s0's time down, 2 of the failed Put)", r, err)
	}
	mustGet(t, s, id, data)
}

// Put returns once the quorum holds its shards; the others land later.
func TestPutReturnsAtQuorum(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	c.fs[2].Hold()
	c.fs[3].Hold()
	blobs := putSome(t, s, 0, 3)
	if n := c.objects(t, 2) + c.objects(t, 3); n != 0 {
		t.Fatalf("held members hold %d objects", n)
	}
	if q := s.Queued(); len(q) != 6 {
		t.Fatalf("queue while shards are under way: %v", q)
	}
	getAll(t, s, blobs) // from s0 and s1
	c.fs[2].Release()
	c.fs[3].Release()
	flush(t, s)
	if q := s.Queued(); len(q) != 0 {
		t.Fatalf("queue after the shards landed: %v", q)
	}
	for i := range 4 {
		if n := c.objects(t, i); n != 6 {
			t.Fatalf("s%d holds %d objects, want 6", i, n)
		}
	}
}

// A member that hangs does not hang reads: the read asks another.
func TestHedge(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{Hedge: 10 * time.Millisecond})
	defer s.Close()
	blobs := putSome(t, s, 0, 2)
	flush(t, s)
	for _, f := range c.fs {
		f.Hold()
	}
	c.fs[2].Release()
	c.fs[3].Release()
	getAll(t, s, blobs)
	for _, f := range c.fs {
		f.Release()
	}
}

func TestFastestFirst(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	blobs := putSome(t, s, 0, 2)
	flush(t, s)
	c.fs[0].SetDelay(5 * time.Millisecond)
	c.fs[1].SetDelay(5 * time.Millisecond)
	// Measure every member: until then, unmeasured ones go first.
	for i := range 4 {
		s.Repair(bg, ecstore.RepairOptions{Store: fmt.Sprintf("s%d", i), Scrub: true})
	}
	g0, g1 := c.fs[0].Calls().Gets, c.fs[1].Calls().Gets
	for range 10 {
		getAll(t, s, blobs)
	}
	if n := c.fs[0].Calls().Gets - g0 + c.fs[1].Calls().Gets - g1; n != 0 {
		t.Fatalf("slow members read %d times; health %+v", n, s.Health())
	}
}

// Damaged objects in one store: reads return the right data and name the
// store, the shards read are rebuilt, and a scrub finds and fixes the
// rest.
func TestCorruptShards(t *testing.T) {
	for _, asErr := range []bool{false, true} {
		t.Run(fmt.Sprintf("asError=%v", asErr), func(t *testing.T) {
			c := newCluster(4)
			var got faultstore.Faults
			s := openEC(t, 2, 2, c.named(), ecstore.Options{OnFault: got.Add})
			defer s.Close()
			blobs := putSome(t, s, 0, 12)
			flush(t, s)
			// Make s2 and s3 slow, so reads go to s0 and s1.
			c.fs[2].SetDelay(5 * time.Millisecond)
			c.fs[3].SetDelay(5 * time.Millisecond)
			for i := range 4 {
				s.Repair(bg, ecstore.RepairOptions{Store: fmt.Sprintf("s%d", i), Scrub: true})
			}
			got.Take()

			// Damage every object s1 holds (shards and maps).
			var held []cairn.ID
			c.inner[1].List(bg, func(id cairn.ID, _ int64) error {
				held = append(held, id)
				return nil
			})
			for _, id := range held {
				c.fs[1].CorruptAsError(asErr)
				c.fs[1].Damage(id)
			}
			getAll(t, s, blobs)
			flush(t, s)
			c.fs[2].SetDelay(0)
			c.fs[3].SetDelay(0)
			fl := got.Take()
			if len(fl) != len(blobs) {
				t.Fatalf("%d faults reported for %d damaged shards read: %v", len(fl), len(blobs), fl)
			}
			for _, f := range fl {
				if f.Store != "s1" || f.Kind != cairn.Corrupt {
					t.Fatalf("fault %v, want s1 corrupt", f)
				}
			}
			damaged := 0
			for _, id := range held {
				if c.fs[1].Damaged(id) {
					damaged++
				}
			}
			// The shards were rebuilt; the maps (never read by Get) are still
			// damaged: a map read by a scan is verified and skipped.
			if damaged != len(blobs) {
				t.Fatalf("%d objects still damaged on s1, want %d (the maps)", damaged, len(blobs))
			}
			if h := s.Health()[1]; h.Corrupt != int64(len(blobs)) || h.Repaired != int64(len(blobs)) {
				t.Fatalf("health of s1 = %+v", h)
			}

			// s3: damaged shards never read; a scrub finds and rebuilds them.
			var shards3 []cairn.ID
			c.inner[3].List(bg, func(id cairn.ID, size int64) error {
				if size != 52+32*4 {
					shards3 = append(shards3, id)
				}
				return nil
			})
			for _, id := range shards3 {
				c.fs[3].CorruptAsError(asErr)
				c.fs[3].Damage(id)
			}
			r, err := s.Repair(bg, ecstore.RepairOptions{Scrub: true, Store: "s3"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Corrupt != int64(len(blobs)) || r.Rebuilt != int64(len(blobs)) || r.Failed != 0 {
				t.Fatalf("scrub of s3 = %v, want %d damaged and rebuilt", r, len(blobs))
			}
			for _, id := range shards3 {
				if c.fs[3].Damaged(id) {
					t.Fatal("a damaged shard on s3 survived the scrub")
				}
			}
			for _, f := range got.Take() {
				if f.Store != "s3" || f.Kind != cairn.Corrupt {
					t.Fatalf("scrub fault %v, want s3 corrupt", f)
				}
			}
			// Reads that need s3 (s0 and s1 down) work.
			c.down(true, 0, 1)
			getAll(t, s, blobs)
		})
	}
}

// Repair restores lost shards, restricted to one store when asked.
func TestRepairMissing(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	blobs := putSome(t, s, 0, 15)
	flush(t, s)
	lose := func(i int) {
		var ids []cairn.ID
		c.inner[i].List(bg, func(id cairn.ID, _ int64) error {
			ids = append(ids, id)
			return nil
		})
		for _, id := range ids {
			if err := c.fs[i].Lose(id); err != nil {
				t.Fatal(err)
			}
		}
	}
	lose(2)
	lose(3)
	r, err := s.Repair(bg, ecstore.RepairOptions{Store: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Missing != 15 || r.Rebuilt != 15 || r.Objects != 15 {
		t.Fatalf("repair --store s2 = %v", r)
	}
	if c.objects(t, 2) != 30 || c.objects(t, 3) != 0 {
		t.Fatalf("after repair of s2: s2 %d objects, s3 %d", c.objects(t, 2), c.objects(t, 3))
	}
	if _, rerr := s.Repair(bg, ecstore.RepairOptions{Store: "nope"}); !errors.Is(rerr, cairn.ErrInvalid) {
		t.Fatalf("repair of an unknown store: %v", rerr)
	}
	r, err = s.Repair(bg, ecstore.RepairOptions{})
	if err != nil || r.Rebuilt != 15 {
		t.Fatalf("repair = %v, %v", r, err)
	}
	c.down(true, 0, 1)
	getAll(t, s, blobs)
}

// A lost member's shards are rebuilt onto a replacement, which then takes
// its place.
func TestRepairReplacement(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	blobs := putSome(t, s, 0, 10)
	flush(t, s)
	c.down(true, 1) // gone for good
	repl := memstore.New()
	r, err := s.Repair(bg, ecstore.RepairOptions{Store: "s1", Replacement: &ecstore.Named{Name: "new", Store: nopClose{repl}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Rebuilt != 10 || r.Failed != 0 {
		t.Fatalf("repair onto a replacement = %v", r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	named := c.named()
	named[1] = ecstore.Named{Name: "new", Store: faultstore.New(nopClose{repl})}
	s2 := openEC(t, 2, 2, named, ecstore.Options{})
	defer s2.Close()
	c.down(false, 1)
	c.down(true, 2, 3) // only s0 and the replacement
	getAll(t, s2, blobs)
}

// Another Store over the same members (another process or device) finds
// objects by scanning; deletions elsewhere are forgotten at a scan.
func TestScan(t *testing.T) {
	c := newCluster(4)
	a := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer a.Close()
	blobs := putSome(t, a, 0, 5)
	flush(t, a)
	b := openEC(t, 2, 2, c.named(), ecstore.Options{MissScan: time.Hour})
	defer b.Close()
	ids := []cairn.ID{blobs[0].id, blobs[1].id}
	if f, err := b.Has(bg, ids); err != nil || f[0] || f[1] {
		t.Fatalf("Has before any scan = %v, %v; want absent (no scan)", f, err)
	}
	mustGet(t, b, blobs[0].id, blobs[0].data) // a miss scans
	if f, err := b.Has(bg, ids); err != nil || !f[0] || !f[1] {
		t.Fatalf("Has after the scan = %v, %v", f, err)
	}
	more := putSome(t, a, 100, 1)
	flush(t, a)
	// Within MissScan of the last scan, a miss does not scan again.
	if _, err := b.Get(bg, more[0].id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get soon after a scan: %v, want NotFound", err)
	}
	if err := b.Rescan(bg); err != nil {
		t.Fatal(err)
	}
	mustGet(t, b, more[0].id, more[0].data)
	if err := a.Delete(bg, blobs[2].id); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := b.List(bg, func(id cairn.ID, size int64) error {
		n++
		if id == blobs[2].id {
			t.Errorf("List reports an object deleted by another Store")
		}
		return nil
	})
	if err != nil || n != 5 {
		t.Fatalf("List: %d objects, %v; want 5", n, err)
	}
}

// With Dir, a new Store starts with the maps of the last (no scan needed),
// and the repair queue survives.
func TestDir(t *testing.T) {
	dir := t.TempDir()
	c := newCluster(4)
	a := openEC(t, 2, 2, c.named(), ecstore.Options{Dir: dir})
	blobs := putSome(t, a, 0, 8)
	flush(t, a)
	if err := a.Delete(bg, blobs[0].id); err != nil {
		t.Fatal(err)
	}
	c.down(true, 3)
	late := putSome(t, a, 100, 2)
	flush(t, a)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c.down(false, 3)
	b := openEC(t, 2, 2, c.named(), ecstore.Options{Dir: dir, MissScan: -1})
	defer b.Close()
	if q := b.Queued(); len(q) != 2 || q[0].Store != "s3" || q[1].Store != "s3" {
		t.Fatalf("queue after reopen: %v, want s3's two", q)
	}
	r, err := b.Repair(bg, ecstore.RepairOptions{QueueOnly: true})
	if err != nil || r.Rebuilt != 2 || len(b.Queued()) != 0 {
		t.Fatalf("repair of the queue = %v, %v", r, err)
	}
	getAll(t, b, blobs[1:])
	getAll(t, b, late)
	if _, err := b.Get(bg, blobs[0].id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get of a deleted object: %v", err)
	}
	for _, f := range c.fs {
		if f.Calls().Lists != 0 {
			t.Fatal("a member was listed: the map cache was not used")
		}
	}
}

// Delete waits for the shards of a Put still being written.
func TestDeleteWaits(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	c.fs[3].Hold()
	id, data := storetest.Blob(1, 5000)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- s.Delete(bg, id) }()
	select {
	case err := <-done:
		t.Fatalf("Delete returned (%v) while a shard was being written", err)
	case <-time.After(20 * time.Millisecond):
	}
	c.fs[3].Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if n := c.objects(t, i); n != 0 {
			t.Fatalf("s%d holds %d objects after Delete", i, n)
		}
	}
}

func TestDeleteWithOneDown(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{})
	defer s.Close()
	blobs := putSome(t, s, 0, 2)
	flush(t, s)
	c.down(true, 2)
	errNames(t, s.Delete(bg, blobs[0].id), cairn.ErrUnavailable, "s2")
	c.down(false, 2)
	r, err := s.Repair(bg, ecstore.RepairOptions{QueueOnly: true})
	if err != nil || r.Deleted != 2 {
		t.Fatalf("repair = %v, %v; want 2 deletions (shard and map)", r, err)
	}
	if n := c.objects(t, 2); n != 2 {
		t.Fatalf("s2 holds %d objects, want 2 (the other object's)", n)
	}
}

// ec:2+2 stores each byte about twice (plus headers and maps).
func TestOverhead(t *testing.T) {
	for _, size := range []int{4 << 10, 16 << 10, 1 << 20} {
		c := newCluster(4)
		s := openEC(t, 2, 2, c.named(), ecstore.Options{})
		var put int64
		for i := range 50 {
			id, data := storetest.Blob(uint64(i), size)
			if err := s.Put(bg, id, data); err != nil {
				t.Fatal(err)
			}
			put += int64(len(data))
		}
		flush(t, s)
		var stored int64
		for i := range 4 {
			u, _ := c.inner[i].Stats(bg)
			stored += u.Bytes
		}
		ratio := float64(stored) / float64(put)
		// 4 shards of size/2 + 52 bytes, 4 maps of 180 bytes.
		want := float64(4*(size/2+52)+4*180) / float64(size)
		t.Logf("ec:2+2, objects of %d bytes: %d put, %d stored: overhead %.4f", size, put, stored, ratio)
		if ratio != want {
			t.Fatalf("overhead %.4f, want %.4f", ratio, want)
		}
		u, err := s.Stats(bg)
		if err != nil || u.Objects != 50 || u.Bytes != put || u.Disk != stored {
			t.Fatalf("Stats = %+v, %v; want 50 objects, %d bytes, disk %d", u, err, put, stored)
		}
		s.Close()
	}
}

// noRange hides a store's ranged reads.
type noRange struct{ cairn.Store }

// GetRange reads only the bytes asked for, from the data shards' members,
// or reconstructs them from the same bytes of K others when those fail.
func TestGetRange(t *testing.T) {
	for _, ranged := range []bool{true, false} {
		t.Run(fmt.Sprintf("ranged=%v", ranged), func(t *testing.T) {
			c := newCluster(4)
			named := c.named()
			if !ranged {
				for i := range named {
					named[i].Store = noRange{named[i].Store}
				}
			}
			s := openEC(t, 2, 2, named, ecstore.Options{})
			defer s.Close()
			id, data := storetest.Blob(1, 100001) // S = 50001
			if err := s.Put(bg, id, data); err != nil {
				t.Fatal(err)
			}
			flush(t, s)
			ranges := [][2]int64{{0, 0}, {0, 1}, {0, 100001}, {50000, 2}, {50001, 10}, {49990, 20}, {100000, 1}, {12345, 67890}}
			check := func(what string) {
				t.Helper()
				for _, r := range ranges {
					got, err := s.GetRange(bg, id, r[0], r[1])
					if err != nil {
						t.Fatalf("%s: GetRange(%d, %d): %v", what, r[0], r[1], err)
					}
					if string(got) != string(data[r[0]:r[0]+r[1]]) {
						t.Fatalf("%s: GetRange(%d, %d): wrong bytes", what, r[0], r[1])
					}
				}
			}
			g := c.fs[0].Calls().Gets + c.fs[1].Calls().Gets + c.fs[2].Calls().Gets + c.fs[3].Calls().Gets
			check("all up")
			if ranged {
				g2 := c.fs[0].Calls().Gets + c.fs[1].Calls().Gets + c.fs[2].Calls().Gets + c.fs[3].Calls().Gets
				if g2 != g || c.fs[2].Calls().Ranges+c.fs[3].Calls().Ranges != 0 {
					t.Fatalf("all up: %d whole Gets, %d ranged reads of parity", g2-g, c.fs[2].Calls().Ranges+c.fs[3].Calls().Ranges)
				}
			}
			c.down(true, 0)
			check("s0 down")
			c.down(true, 1)
			check("s0 and s1 down: from parity")
			c.down(false, 0, 1)
			// A shard lost on s1: reported, queued, read around.
			var gotFault faultstore.Faults
			s2 := openEC(t, 2, 2, c.named(), ecstore.Options{OnFault: gotFault.Add})
			defer s2.Close()
			if err := s2.Rescan(bg); err != nil {
				t.Fatal(err)
			}
			var shard1 cairn.ID
			c.inner[1].List(bg, func(x cairn.ID, size int64) error {
				if size != 180 {
					shard1 = x
				}
				return nil
			})
			if err := c.fs[1].Lose(shard1); err != nil {
				t.Fatal(err)
			}
			got, err := s2.GetRange(bg, id, 60000, 100)
			if err != nil || string(got) != string(data[60000:60100]) {
				t.Fatalf("GetRange with shard 1 lost: %v", err)
			}
			if f := gotFault.Take(); len(f) != 1 || f[0].Store != "s1" || f[0].Kind != cairn.NotFound {
				t.Fatalf("faults %v, want s1 missing", f)
			}
			if q := s2.Queued(); len(q) != 1 || q[0].Store != "s1" {
				t.Fatalf("queue %v", q)
			}
			c.down(true, 0, 2, 3)
			_, err = s2.GetRange(bg, id, 60000, 100)
			errNames(t, err, cairn.ErrUnavailable, "s0", "s1", "s2", "s3")
		})
	}
}

// Writers and readers while a member goes down and comes back, again and
// again: with quorum 3 every write is acknowledged and readable throughout,
// and after Repair every object survives the loss of any two members.
func TestFlapping(t *testing.T) {
	c := newCluster(4)
	s := openEC(t, 2, 2, c.named(), ecstore.Options{Quorum: 3, Hedge: 5 * time.Millisecond})
	defer s.Close()
	stop := make(chan struct{})
	var flapper sync.WaitGroup
	flapper.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			c.down(i%2 == 0, 3) // s3 flaps; the others stay up
		}
	})
	var mu sync.Mutex
	var stored []blob
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 25 {
				id, data := storetest.Blob(uint64(w*1000+i), 1+(w*1000+i)*7919%30000)
				if err := s.Put(bg, id, data); err != nil {
					t.Errorf("Put with at most one member down: %v", err)
					return
				}
				mu.Lock()
				stored = append(stored, blob{id, data})
				mu.Unlock()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 50 {
				mu.Lock()
				var b blob
				if len(stored) > 0 {
					b = stored[len(stored)/2]
				}
				mu.Unlock()
				if b.data == nil {
					continue
				}
				got, err := s.Get(bg, b.id)
				if err != nil || string(got) != string(b.data) {
					t.Errorf("Get with at most one member down: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	flapper.Wait()
	c.down(false, 0, 1, 2, 3)
	flush(t, s)
	if _, err := s.Repair(bg, ecstore.RepairOptions{}); err != nil {
		t.Fatal(err)
	}
	for a := range 4 {
		for b := a + 1; b < 4; b++ {
			c.down(true, a, b)
			getAll(t, s, stored)
			c.down(false, a, b)
		}
	}
}
