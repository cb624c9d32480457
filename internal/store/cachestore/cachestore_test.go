package cachestore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/store/cachestore"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// counting wraps a store, counts its Gets, can be taken down (every method
// then fails with Kind Unavailable) and can hold Gets until released.
type counting struct {
	cairn.Store
	gets atomic.Int64
	down atomic.Bool
	hold chan struct{} // if non-nil, Get waits for it to be closed
}

var errDown = cairn.E("backing", cairn.Unavailable, "", errors.New("node unreachable"))

func (c *counting) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	c.gets.Add(1)
	if c.hold != nil {
		select {
		case <-c.hold:
		case <-ctx.Done():
			return nil, cairn.E("get", cairn.Canceled, id.String(), ctx.Err())
		}
	}
	if c.down.Load() {
		return nil, errDown
	}
	return c.Store.Get(ctx, id)
}

func (c *counting) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if c.down.Load() {
		return nil, errDown
	}
	return c.Store.Has(ctx, ids)
}

func open(t *testing.T, backing, cache cairn.Store, max int64) *cachestore.Store {
	t.Helper()
	s, err := cachestore.New(bg, backing, cache, cachestore.Options{MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openLocal(t testing.TB, dir string) *localstore.Store {
	t.Helper()
	ls, err := localstore.Open(bg, dir, localstore.Options{NoSync: true, TrustIDs: true, PackSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func TestConformanceMemCache(t *testing.T) {
	storetest.Run(t, func(t *testing.T) cairn.Store {
		s, err := cachestore.New(bg, memstore.New(), memstore.New(), cachestore.Options{MaxBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestConformanceLocalCache(t *testing.T) {
	storetest.Run(t, func(t *testing.T) cairn.Store {
		s, err := cachestore.New(bg, memstore.New(), openLocal(t, t.TempDir()), cachestore.Options{MaxBytes: 2 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// Small cache, no caching on Put: every object read goes through the miss
// path and evictions happen throughout the suite.
func TestConformanceTinyCache(t *testing.T) {
	storetest.Run(t, func(t *testing.T) cairn.Store {
		s, err := cachestore.New(bg, memstore.New(), memstore.New(), cachestore.Options{MaxBytes: 20 << 10, NoCacheOnPut: true})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func mustGet(t *testing.T, s cairn.Store, id cairn.ID, want []byte) {
	t.Helper()
	got, err := s.Get(bg, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id.Short(), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get %s: wrong content", id.Short())
	}
	if cs, ok := s.(*cachestore.Store); ok {
		cs.Quiesce() // the insertion into the cache may finish after Get
	}
}

func TestHitMakesNoBackingGet(t *testing.T) {
	for _, onPut := range []bool{true, false} {
		back := &counting{Store: memstore.New()}
		s, err := cachestore.New(bg, back, memstore.New(), cachestore.Options{MaxBytes: 1 << 20, NoCacheOnPut: !onPut})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		id, data := storetest.Blob(1, 100<<10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		misses0 := testutil.ToFloat64(metrics.Default().CacheMisses)
		mustGet(t, s, id, data) // cached on Put, or fetched here
		want := int64(0)
		if !onPut {
			want = 1
		}
		if d := testutil.ToFloat64(metrics.Default().CacheMisses) - misses0; d != float64(want) {
			t.Errorf("cache on Put %v: the first Get moved cairn_chunk_cache_misses_total by %v, want %d", onPut, d, want)
		}
		if g := back.gets.Load(); g != want {
			t.Errorf("cache on Put %v: first Get made %d backing Gets, want %d", onPut, g, want)
		}
		st0 := s.Stats()
		hits0 := testutil.ToFloat64(metrics.Default().CacheHits)
		for range 5 {
			mustGet(t, s, id, data)
		}
		st := s.Stats()
		if d := testutil.ToFloat64(metrics.Default().CacheHits) - hits0; d != 5 {
			t.Errorf("5 cached Gets moved cairn_chunk_cache_hits_total by %v", d)
		}
		if back.gets.Load() != want || st.Fetches != st0.Fetches || st.FetchedBytes != st0.FetchedBytes {
			t.Errorf("5 cached Gets: %d backing Gets, stats %+v -> %+v; want no transfer", back.gets.Load()-want, st0, st)
		}
		if st.Hits != st0.Hits+5 || st.Objects != 1 || st.Bytes != int64(len(data)) {
			t.Errorf("stats %+v -> %+v", st0, st)
		}
	}
}

func TestLRUOrderAndBound(t *testing.T) {
	const size, max = 10 << 10, 64 << 10 // room for 6 objects
	back := &counting{Store: memstore.New()}
	cache := memstore.New()
	s := open(t, back, cache, max)
	var ids []cairn.ID
	blobs := map[cairn.ID][]byte{}
	for i := range 40 {
		id, data := storetest.Blob(uint64(100+i), size)
		if err := back.Store.Put(bg, id, data); err != nil { // behind the cache's back
			t.Fatal(err)
		}
		ids = append(ids, id)
		blobs[id] = data
	}
	cached := func() map[cairn.ID]bool {
		m := map[cairn.ID]bool{}
		_ = cache.List(bg, func(id cairn.ID, n int64) error { m[id] = true; return nil })
		u, _ := cache.Stats(bg)
		if u.Bytes > max {
			t.Fatalf("cache holds %d bytes, bound %d", u.Bytes, max)
		}
		return m
	}
	// Read 0..5 (fills the cache), touch 0, read 6: 1 is the LRU and goes.
	for _, id := range ids[:6] {
		mustGet(t, s, id, blobs[id])
	}
	mustGet(t, s, ids[0], blobs[ids[0]])
	mustGet(t, s, ids[6], blobs[ids[6]])
	m := cached()
	if !m[ids[0]] || m[ids[1]] || !m[ids[6]] || len(m) != 6 {
		t.Fatalf("after touching 0 and reading 6: cache holds 0:%v 1:%v 6:%v, %d objects; want 0 and 6 kept, 1 evicted, 6 objects", m[ids[0]], m[ids[1]], m[ids[6]], len(m))
	}
	// A workload 6x the bound, with a hot set of 2 objects touched
	// between every cold read: the hot set is never evicted.
	hot := ids[:2]
	for _, id := range ids[2:] {
		mustGet(t, s, id, blobs[id])
		for _, h := range hot {
			g := back.gets.Load()
			mustGet(t, s, h, blobs[h])
			if back.gets.Load() != g && id != ids[2] { // ids[1] was evicted above
				t.Fatalf("hot object %s was fetched again", h.Short())
			}
		}
		cached()
	}
	st := s.Stats()
	if st.Bytes > max || st.Objects != 6 || st.Evictions < 30 || st.EvictedBytes != st.Evictions*size {
		t.Fatalf("stats after workload: %+v", st)
	}
	// The 4 most recent cold objects and the hot set are what remains.
	m = cached()
	for _, id := range append(append([]cairn.ID{}, hot...), ids[36:]...) {
		if !m[id] {
			t.Errorf("recent object %s evicted", id.Short())
		}
	}
	// Objects larger than the bound are served but never cached.
	big, bdata := storetest.Blob(999, max+1)
	if err := s.Put(bg, big, bdata); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, big, bdata)
	if cached()[big] {
		t.Error("object larger than MaxBytes was cached")
	}
}

// The bookkeeping is rebuilt from the cache at New; a smaller bound evicts.
func TestReopenRebuildsAndTrims(t *testing.T) {
	dir := t.TempDir()
	back := memstore.New()
	s, err := cachestore.New(bg, back, openLocal(t, dir), cachestore.Options{MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var ids []cairn.ID
	for i := range 20 {
		id, data := storetest.Blob(uint64(200+i), 10<<10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := s.Close(); err != nil { // closes back too: use a fresh one with the same objects
		t.Fatal(err)
	}
	back2 := &counting{Store: memstore.New()}
	for i := range 20 {
		id, data := storetest.Blob(uint64(200+i), 10<<10)
		_ = back2.Store.Put(bg, id, data)
	}
	s = open(t, back2, openLocal(t, dir), 1<<20)
	if st := s.Stats(); st.Objects != 20 || st.Bytes != 200<<10 {
		t.Fatalf("after reopen: %+v, want 20 objects of 10 KiB", st)
	}
	for _, id := range ids {
		if _, err := s.Get(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if back2.gets.Load() != 0 {
		t.Fatalf("reading what the cache held before reopen made %d backing Gets", back2.gets.Load())
	}
	_ = s.Close()
	s = open(t, &counting{Store: memstore.New()}, openLocal(t, dir), 50<<10)
	if st := s.Stats(); st.Objects != 5 || st.Bytes != 50<<10 || st.Evictions != 15 {
		t.Fatalf("reopen with a 50 KiB bound: %+v", st)
	}
}

// tamper is a cache that returns damaged bytes for the IDs in bad.
type tamper struct {
	cairn.Store
	mu  sync.Mutex
	bad map[cairn.ID]bool
}

func (c *tamper) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	data, err := c.Store.Get(ctx, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.bad[id] && len(data) > 0 {
		data[len(data)/2] ^= 1
	}
	return data, err
}

func (c *tamper) Delete(ctx context.Context, id cairn.ID) error {
	c.mu.Lock()
	delete(c.bad, id)
	c.mu.Unlock()
	return c.Store.Delete(ctx, id)
}

func TestCorruptCacheEntryRefetched(t *testing.T) {
	t.Run("wrong bytes", func(t *testing.T) {
		back := &counting{Store: memstore.New()}
		cache := &tamper{Store: memstore.New(), bad: map[cairn.ID]bool{}}
		s := open(t, back, cache, 1<<20)
		id, data := storetest.Blob(300, 50<<10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		cache.mu.Lock()
		cache.bad[id] = true
		cache.mu.Unlock()
		mustGet(t, s, id, data)
		if back.gets.Load() != 1 {
			t.Fatalf("damaged cache entry: %d backing Gets, want 1", back.gets.Load())
		}
		if st := s.Stats(); st.Dropped != 1 || st.Hits != 0 || st.Misses != 1 || st.Objects != 1 {
			t.Fatalf("stats %+v", st)
		}
		mustGet(t, s, id, data) // the refetched copy is cached and good
		if back.gets.Load() != 1 {
			t.Fatal("refetched object not cached again")
		}
	})
	t.Run("damaged on disk", func(t *testing.T) {
		dir := t.TempDir()
		back := &counting{Store: memstore.New()}
		s := open(t, back, openLocal(t, dir), 1<<20)
		id, data := storetest.Blob(301, 50<<10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
		damaged := false
		for _, p := range packs {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if i := bytes.Index(b, data[:256]); i >= 0 {
				b[i+1000] ^= 0x40
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
				damaged = true
			}
		}
		if !damaged {
			t.Fatal("object not found in the cache's packs")
		}
		mustGet(t, s, id, data)
		if back.gets.Load() != 1 || s.Stats().Dropped != 1 {
			t.Fatalf("damaged pack: %d backing Gets, stats %+v", back.gets.Load(), s.Stats())
		}
	})
	t.Run("backing returns wrong bytes", func(t *testing.T) {
		back := &tamper{Store: memstore.New(), bad: map[cairn.ID]bool{}}
		cache := memstore.New()
		s := open(t, back, cache, 1<<20)
		id, data := storetest.Blob(302, 1000)
		if err := back.Store.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		back.bad[id] = true
		if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("Get of damaged backing data: %v, want Corrupt", err)
		}
		if found, _ := cache.Has(bg, []cairn.ID{id}); found[0] {
			t.Fatal("damaged data was cached")
		}
	})
}

func TestConcurrentMissFetchesOnce(t *testing.T) {
	back := &counting{Store: memstore.New(), hold: make(chan struct{})}
	s := open(t, back, memstore.New(), 1<<20)
	id, data := storetest.Blob(400, 64<<10)
	if err := back.Store.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	const n = 32
	var wg sync.WaitGroup
	results := make(chan []byte, n)
	errs := make(chan error, n)
	// One getter gives up early: the others must not be failed by it.
	quitter, quit := context.WithCancel(bg)
	wg.Go(func() {
		if _, err := s.Get(quitter, id); !errors.Is(err, cairn.ErrCanceled) {
			errs <- err
		}
	})
	for range n {
		wg.Go(func() {
			b, err := s.Get(bg, id)
			if err != nil {
				errs <- err
				return
			}
			results <- b
		})
	}
	// Wait until the fetch is under way, then let it go.
	for back.gets.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the getters pile up on the flight
	quit()
	time.Sleep(5 * time.Millisecond)
	close(back.hold)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var first []byte
	for b := range results {
		if !bytes.Equal(b, data) {
			t.Fatal("wrong content")
		}
		if first != nil && &first[0] == &b[0] {
			t.Fatal("two Gets share one buffer")
		}
		first = b
	}
	if g := back.gets.Load(); g != 1 {
		t.Fatalf("%d concurrent Gets of one missing ID made %d backing Gets, want 1", n, g)
	}
	if st := s.Stats(); st.Fetches != 1 || st.Hits+st.Misses != n+1 {
		t.Fatalf("stats %+v", st)
	}
}

// Every getter gives up: the fetch is canceled and nothing is cached; the
// next Get starts a new fetch.
func TestAbandonedFetch(t *testing.T) {
	back := &counting{Store: memstore.New(), hold: make(chan struct{})}
	cache := memstore.New()
	s := open(t, back, cache, 1<<20)
	id, data := storetest.Blob(401, 1000)
	_ = back.Store.Put(bg, id, data)
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	if _, err := s.Get(ctx, id); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("Get with expired ctx: %v", err)
	}
	close(back.hold)
	mustGet(t, s, id, data)
	if g := back.gets.Load(); g != 2 {
		t.Fatalf("backing Gets = %d, want 2 (the abandoned one and a new one)", g)
	}
}

func TestBackingDown(t *testing.T) {
	back := &counting{Store: memstore.New()}
	s := open(t, back, memstore.New(), 1<<20)
	a, da := storetest.Blob(500, 10<<10)
	b, db := storetest.Blob(501, 10<<10)
	if err := s.Put(bg, a, da); err != nil {
		t.Fatal(err)
	}
	if err := back.Store.Put(bg, b, db); err != nil { // in the backing store only
		t.Fatal(err)
	}
	back.down.Store(true)
	mustGet(t, s, a, da)
	_, err := s.Get(bg, b)
	if !errors.Is(err, cairn.ErrUnavailable) || cairn.KindOf(err) != cairn.Unavailable {
		t.Fatalf("Get of an uncached object with the backing store down: %v, want Kind Unavailable", err)
	}
	if _, err := s.Has(bg, []cairn.ID{a}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Has with the backing store down: %v; the cache must not answer", err)
	}
	back.down.Store(false)
	mustGet(t, s, b, db)
}

// Has and List come from the backing store, even when the cache holds
// something the backing store no longer has.
func TestBackingIsAuthoritative(t *testing.T) {
	back := memstore.New()
	cache := memstore.New()
	s := open(t, back, cache, 1<<20)
	id, data := storetest.Blob(600, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if err := back.Delete(bg, id); err != nil { // someone else's GC
		t.Fatal(err)
	}
	found, err := s.Has(bg, []cairn.ID{id})
	if err != nil || found[0] {
		t.Fatalf("Has = %v, %v; want false (backing store lacks it)", found, err)
	}
	n := 0
	_ = s.List(bg, func(cairn.ID, int64) error { n++; return nil })
	if n != 0 {
		t.Fatalf("List reported %d objects the backing store lacks", n)
	}
	// Delete through the wrapper clears the cache too.
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(bg, id); err != nil {
		t.Fatal(err)
	}
	if found, _ := cache.Has(bg, []cairn.ID{id}); found[0] {
		t.Fatal("Delete left the object in the cache")
	}
	if st := s.Stats(); st.Objects != 0 || st.Bytes != 0 {
		t.Fatalf("stats after Delete: %+v", st)
	}
}

func TestOptionsValidated(t *testing.T) {
	_, err := cachestore.New(bg, memstore.New(), memstore.New(), cachestore.Options{MaxBytes: -1})
	if !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("negative MaxBytes: %v, want Invalid", err)
	}
}

// A localstore cache under churn is compacted in the background, so its
// disk use stays near the bound.
func TestLocalCacheCompacts(t *testing.T) {
	dir := t.TempDir()
	cache := openLocal(t, dir)
	const max = 256 << 10
	s := open(t, memstore.New(), cache, max)
	for i := range 200 {
		id, data := storetest.Blob(uint64(700+i), 16<<10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		u, err := cache.Stats(bg)
		if err != nil {
			t.Fatal(err)
		}
		if u.Bytes > max {
			t.Fatalf("cache holds %d bytes, bound %d", u.Bytes, max)
		}
		if u.Disk < 4*max {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cache disk use %d after writing 3.2 MB through a %d-byte cache", u.Disk, max)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slowPut is a cache whose Puts wait until release is closed.
type slowPut struct {
	cairn.Store
	release chan struct{}
}

func (c *slowPut) Put(ctx context.Context, id cairn.ID, data []byte) error {
	<-c.release
	return c.Store.Put(ctx, id, data)
}

// A Get does not wait for the cache insertion, and Gets during it are
// served from the fetched copy, not fetched again.
func TestGetDoesNotWaitForInsert(t *testing.T) {
	back := &counting{Store: memstore.New()}
	cache := &slowPut{Store: memstore.New(), release: make(chan struct{})}
	s := open(t, back, cache, 1<<20)
	var once sync.Once
	release := func() { once.Do(func() { close(cache.release) }) }
	t.Cleanup(release) // before Close, which waits for the insertions
	id, data := storetest.Blob(800, 10<<10)
	_ = back.Store.Put(bg, id, data)
	for range 3 {
		got, err := s.Get(bg, id) // would block forever if Get waited for the insert
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("Get: %v", err)
		}
	}
	if g := back.gets.Load(); g != 1 {
		t.Fatalf("%d backing Gets while the insertion was under way, want 1", g)
	}
	release()
	s.Quiesce()
	if st := s.Stats(); st.Misses != 1 || st.Hits != 2 || st.Objects != 1 {
		t.Fatalf("stats %+v", st)
	}
	mustGet(t, s, id, data)
	if g := back.gets.Load(); g != 1 {
		t.Fatalf("Get after the insertion made a backing Get")
	}
}

// TestKeep: an object kept after the caller stored it elsewhere is served
// from the cache with no backing Get; one larger than the bound is not kept.
func TestKeep(t *testing.T) {
	back := &counting{Store: memstore.New()}
	s, err := cachestore.New(bg, back, memstore.New(), cachestore.Options{MaxBytes: 200 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id, data := storetest.Blob(7, 100<<10)
	if err := back.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	s.Keep(bg, id, data)
	mustGet(t, s, id, data)
	if g := back.gets.Load(); g != 0 {
		t.Fatalf("kept object: %d backing Gets, want 0", g)
	}
	big, bigData := storetest.Blob(8, 300<<10)
	if err := back.Put(bg, big, bigData); err != nil {
		t.Fatal(err)
	}
	s.Keep(bg, big, bigData)
	mustGet(t, s, big, bigData)
	if g := back.gets.Load(); g != 1 {
		t.Fatalf("object over the bound: %d backing Gets, want 1", g)
	}
}
