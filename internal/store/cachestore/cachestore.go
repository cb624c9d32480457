// Package cachestore is a read cache in front of a cairn.Store: a wrapper
// that keeps recently read objects in a second, local store (the cache) and
// serves reads from it, so that reading a chunk already held makes no
// transfer (LBFS §3.2: fetch only what the reader's chunk cache lacks).
//
// The backing store is the truth. Put writes through to it (and, by default,
// also into the cache: the writer will likely read it back); Has, List and
// Delete answer from it. Get tries the cache first, verifying what it reads:
// a damaged cache entry is dropped and refetched, never returned. A miss is
// fetched from the backing store once however many callers want it
// (singleflight), verified, handed to the callers, and inserted into the
// cache (after the Gets return, up to a few at a time; Gets meanwhile are
// served from the fetched copy), which is kept under Options.MaxBytes by
// evicting the least recently used objects. Once MaxBytes have been evicted
// a cache that can compact (store.Compacter) is compacted in the
// background, so a localstore cache's disk use stays bounded too.
//
// The cache is any cairn.Store the caller opens: a localstore directory on
// the reader's disk (Options.TrustIDs, since the wrapper has verified what
// it inserts; NoSync is fine too, a cache needs no durability), or a
// memstore in tests. Recency is kept in memory only: at New the wrapper
// lists the cache to learn what it holds and their sizes, in no particular
// order, and evicts down to MaxBytes if the cache holds more.
//
// Known looseness, by design: an object deleted from the backing store by
// someone else (another process, another node's GC) can still be served
// from the cache. The bytes are right (they hash to the ID) and Has, which
// callers use to decide what exists, answers from the backing store.
package cachestore

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/store"
)

// Options configure a Store. The zero value gives the defaults.
type Options struct {
	// MaxBytes bounds the payload bytes of the objects kept in the cache.
	// An object larger than MaxBytes is never cached. Default 1 GiB.
	MaxBytes int64

	// TrustBacking skips checking what the backing store returns against
	// its ID, for a backing store that checks it itself (remotestore
	// does). Objects read from the cache are always checked.
	TrustBacking bool

	// NoCacheOnPut stops Put from also inserting into the cache (by default
	// it does: whoever writes a chunk is likely to read it back soon).
	NoCacheOnPut bool

	// Logger receives notes on damaged cache entries and failed cache
	// writes (which never fail the operation). nil discards them.
	Logger *slog.Logger
}

// DefaultMaxBytes is the cache bound when Options.MaxBytes is 0.
const DefaultMaxBytes = 1 << 30

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.MaxBytes == 0:
		o.MaxBytes = DefaultMaxBytes
	case o.MaxBytes < 0:
		return o, errors.New("MaxBytes is negative")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Stats counts what the cache did since New. Hits and Misses count Gets;
// Fetches and FetchedBytes count the backing store's Gets (one per missing
// object however many Gets waited for it), so "a read made no transfer" is
// Fetches (or FetchedBytes) unchanged.
type Stats struct {
	Hits         int64 // Gets served from the cache (or a fetch just completed)
	Misses       int64 // Gets that had to wait for the backing store (or failed there)
	Fetches      int64 // backing-store Gets made by Get
	FetchedBytes int64 // bytes those Gets returned
	Evictions    int64 // objects evicted to stay under MaxBytes
	EvictedBytes int64
	Dropped      int64 // damaged or unreadable cache entries thrown away
	Objects      int64 // objects in the cache now
	Bytes        int64 // their bytes (at most MaxBytes)
}

// Store is the caching wrapper. It owns both stores: Close closes them.
type Store struct {
	backing, cache cairn.Store
	opts           Options
	log            *slog.Logger

	mu      sync.Mutex
	lru     lru                  // what the cache holds, most recent first
	flights map[cairn.ID]*flight // backing Gets under way
	pending map[cairn.ID]*insert // cache insertions under way
	slots   chan struct{}        // asynchronous insertions (asyncInserts)
	compact bool                 // a background Compact of the cache runs
	freed   int64                // bytes evicted since the last Compact started
	wg      sync.WaitGroup       // fetches and background compactions

	hits, misses, fetches, fetched, evictions, evicted, dropped atomic.Int64
}

var _ cairn.Store = (*Store)(nil)

// New wraps backing with a read cache kept in cache. It lists cache to
// rebuild the size bookkeeping and evicts down to MaxBytes. On error the
// caller keeps ownership of both stores.
func New(ctx context.Context, backing, cache cairn.Store, opts Options) (*Store, error) {
	const op = "cachestore open"
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, "", err)
	}
	s := &Store{
		backing: backing,
		cache:   cache,
		opts:    opts,
		log:     opts.Logger,
		flights: map[cairn.ID]*flight{},
		pending: map[cairn.ID]*insert{},
		slots:   make(chan struct{}, asyncInserts),
	}
	s.lru.init()
	var listed []*entry
	err = cache.List(ctx, func(id cairn.ID, size int64) error {
		listed = append(listed, &entry{id: id, size: size})
		return nil
	})
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), "", err)
	}
	s.mu.Lock()
	for _, e := range listed {
		s.lru.pushBack(e) // recency unknown: listing order
	}
	victims := s.trimLocked()
	s.mu.Unlock()
	if err := s.evict(ctx, victims); err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), "", err)
	}
	return s, nil
}

// Stats returns the counters and the cache's current content.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	objects, bytes := int64(s.lru.n), s.lru.bytes
	s.mu.Unlock()
	return Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(),
		Fetches: s.fetches.Load(), FetchedBytes: s.fetched.Load(),
		Evictions: s.evictions.Load(), EvictedBytes: s.evicted.Load(),
		Dropped: s.dropped.Load(), Objects: objects, Bytes: bytes,
	}
}

// Put writes through to the backing store; once that succeeded it also
// inserts the object into the cache unless Options.NoCacheOnPut. A failure
// of the cache is logged, never returned.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := store.CtxErr(ctx, "put", id.String()); err != nil {
		return err
	}
	if err := s.backing.Put(ctx, id, data); err != nil {
		return err
	}
	if !s.opts.NoCacheOnPut {
		s.Keep(ctx, id, data)
	}
	return nil
}

// Keep puts into the cache an object the caller has stored in the backing
// store by another way (a device writing to a cloud store keeps what it
// wrote, so reading it back costs no request). Like Put's insertion, a
// failure is logged, never returned. The caller vouches for id.
func (s *Store) Keep(ctx context.Context, id cairn.ID, data []byte) {
	if ctx.Err() != nil || int64(len(data)) > s.opts.MaxBytes {
		return
	}
	var p *insert
	s.mu.Lock()
	if s.lru.m[id] == nil {
		p = s.reserveLocked(id)
	}
	s.mu.Unlock()
	if p != nil {
		s.insert(ctx, id, data, p)
	}
}

// Get returns the object from the cache when it holds a good copy, and
// otherwise from the backing store (verified, then cached). Errors of the
// backing store are returned as they are, Kind kept.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	// A fetch is shared by concurrent Gets and inserted into the cache
	// after it returns: the backing store must not lend (store.LoanNote).
	ctx = store.WithoutLoans(ctx)
	if err := store.CtxErr(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	if data, ok, err := s.getCached(ctx, id); ok || err != nil {
		return data, err
	}
	return s.fetch(ctx, id)
}

// getCached returns the cached object, or ok false when the cache has no
// good copy (a bad one is dropped on the way). err is only cancellation.
func (s *Store) getCached(ctx context.Context, id cairn.ID) (data []byte, ok bool, err error) {
	s.mu.Lock()
	e := s.lru.m[id]
	if e != nil {
		s.lru.moveToFront(e)
	}
	s.mu.Unlock()
	if e == nil {
		return nil, false, nil
	}
	data, err = s.cache.Get(ctx, id)
	switch {
	case err == nil && cairn.ID(blake3.Sum256(data)) == id:
		s.hits.Add(1)
		metrics.Default().CacheHits.Inc()
		store.NoteVerified(ctx, id, data)
		return data, true, nil
	case err == nil:
		err = cairn.E("get", cairn.Corrupt, id.String(), errors.New("cached copy does not hash to its ID"))
	case cairn.KindOf(err) == cairn.Canceled || ctx.Err() != nil:
		return nil, false, store.CtxErr(ctx, "get", id.String())
	}
	s.mu.Lock()
	if s.lru.m[id] == e {
		s.lru.remove(e)
	}
	s.mu.Unlock()
	if !errors.Is(err, cairn.ErrNotFound) { // NotFound: evicted under us
		s.dropped.Add(1)
		s.log.Warn("cachestore: dropping damaged cache entry", "id", id.String(), "err", err)
		if err := s.cache.Delete(context.WithoutCancel(ctx), id); err != nil {
			s.log.Warn("cachestore: delete of damaged cache entry", "id", id.String(), "err", err)
		}
	}
	return nil, false, nil
}

// flight is one backing-store Get that several Gets may wait for.
type flight struct {
	done    chan struct{}
	data    []byte
	err     error
	waiters int // guarded by Store.mu
	cancel  context.CancelFunc
}

// fetch gets id from the backing store, joining a fetch under way if any.
// The fetch runs on its own goroutine under a context that is canceled only
// when every waiter has given up, so one caller's cancellation does not
// fail the others.
func (s *Store) fetch(ctx context.Context, id cairn.ID) ([]byte, error) {
	s.mu.Lock()
	f := s.flights[id]
	started := f == nil
	if started {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{done: make(chan struct{}), cancel: cancel}
		s.flights[id] = f
		s.wg.Add(1)
		go s.run(fctx, id, f)
	}
	f.waiters++
	s.mu.Unlock()
	done := false
	if !started {
		select {
		case <-f.done:
			done = true
		default:
		}
	}
	if done {
		s.hits.Add(1) // fetched already, still being inserted into the cache
		metrics.Default().CacheHits.Inc()
	} else {
		s.misses.Add(1)
		metrics.Default().CacheMisses.Inc()
		select {
		case <-f.done:
		case <-ctx.Done():
			s.mu.Lock()
			f.waiters--
			select {
			case <-f.done:
			default:
				if f.waiters == 0 {
					f.cancel()
					if s.flights[id] == f {
						delete(s.flights, id) // later Gets start afresh
					}
				}
			}
			s.mu.Unlock()
			return nil, store.CtxErr(ctx, "get", id.String())
		}
	}
	if f.err != nil {
		return nil, f.err
	}
	return append(make([]byte, 0, len(f.data)), f.data...), nil
}

// asyncInserts bounds the cache insertions that run after their Gets have
// returned; beyond it a fetch inserts before it returns (back-pressure when
// the cache is slower than the backing store).
const asyncInserts = 4

// run is one fetch. Its waiters get the data as soon as it is verified; the
// flight stays registered while the object is inserted into the cache, so
// Gets meanwhile are served from it, not fetched again.
func (s *Store) run(ctx context.Context, id cairn.ID, f *flight) {
	defer s.wg.Done()
	defer f.cancel()
	data, err := s.backing.Get(ctx, id)
	if err == nil {
		s.fetches.Add(1)
		s.fetched.Add(int64(len(data)))
		if !s.opts.TrustBacking && cairn.ID(blake3.Sum256(data)) != id {
			data, err = nil, cairn.E("get", cairn.Corrupt, id.String(), errors.New("backing store returned data that does not hash to its ID"))
		}
	}
	f.data, f.err = data, err
	var p *insert
	s.mu.Lock()
	if s.flights[id] == f { // not abandoned, nor deleted meanwhile
		if err == nil && int64(len(data)) <= s.opts.MaxBytes {
			p = s.reserveLocked(id)
		} else {
			delete(s.flights, id)
		}
	}
	s.mu.Unlock()
	if p == nil {
		close(f.done)
		return
	}
	select {
	case s.slots <- struct{}{}:
		close(f.done)
		s.insert(ctx, id, data, p)
		<-s.slots
	default:
		s.insert(ctx, id, data, p)
		close(f.done)
	}
	s.mu.Lock()
	if s.flights[id] == f {
		delete(s.flights, id)
	}
	s.mu.Unlock()
}

// insert is a cache insertion under way; a Delete of its ID meanwhile marks
// it dead, and a dead insertion takes its object out of the cache again.
type insert struct {
	refs int
	dead bool
}

// reserveLocked registers an insertion of id, so that a Delete from now on
// cancels it. Caller holds s.mu and calls insert next.
func (s *Store) reserveLocked(id cairn.ID) *insert {
	p := s.pending[id]
	if p == nil {
		p = &insert{}
		s.pending[id] = p
	}
	p.refs++
	return p
}

// insert puts a verified object into the cache and evicts what no longer
// fits. Failures are logged: the cache is an optimisation.
func (s *Store) insert(ctx context.Context, id cairn.ID, data []byte, p *insert) {
	err := s.cache.Put(ctx, id, data)

	s.mu.Lock()
	if p.refs--; p.refs == 0 && s.pending[id] == p {
		delete(s.pending, id)
	}
	var victims []*entry
	if err == nil && !p.dead && s.lru.m[id] == nil {
		s.lru.pushFront(&entry{id: id, size: int64(len(data))})
		victims = s.trimLocked()
	}
	dead := p.dead
	s.mu.Unlock()
	bg := context.WithoutCancel(ctx)
	switch {
	case err != nil:
		s.log.Warn("cachestore: cache put", "id", id.String(), "err", err)
	case dead:
		if err := s.cache.Delete(bg, id); err != nil {
			s.log.Warn("cachestore: cache delete", "id", id.String(), "err", err)
		}
	}
	if err := s.evict(bg, victims); err != nil {
		s.log.Warn("cachestore: eviction", "err", err)
	}
}

// trimLocked unlinks least recently used entries until the cache fits in
// MaxBytes and returns them for evict. Caller holds s.mu.
func (s *Store) trimLocked() []*entry {
	var victims []*entry
	for s.lru.bytes > s.opts.MaxBytes {
		e := s.lru.back()
		s.lru.remove(e)
		victims = append(victims, e)
	}
	return victims
}

// evict deletes victims from the cache, counts them, and starts a
// compaction of the cache in the background once MaxBytes have been
// evicted since the last one (when the cache can compact: a localstore
// only reclaims deleted space then).
func (s *Store) evict(ctx context.Context, victims []*entry) error {
	if len(victims) == 0 {
		return nil
	}
	var freed int64
	var first error
	for _, e := range victims {
		if err := s.cache.Delete(ctx, e.id); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		freed += e.size
		s.evictions.Add(1)
		s.evicted.Add(e.size)
	}
	c, ok := s.cache.(store.Compacter)
	if !ok {
		return first
	}
	s.mu.Lock()
	s.freed += freed
	start := !s.compact && s.freed >= s.opts.MaxBytes
	if start {
		s.compact, s.freed = true, 0
		s.wg.Add(1)
	}
	s.mu.Unlock()
	if start {
		go func() {
			defer s.wg.Done()
			n, err := c.Compact(context.WithoutCancel(ctx))
			s.log.Debug("cachestore: compacted cache", "freed", n, "err", err)
			s.mu.Lock()
			s.compact = false
			s.mu.Unlock()
		}()
	}
	return first
}

// Has answers from the backing store alone: an object in the cache may be
// gone from the backing store, and only the backing store's answer says
// what the realm holds.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	return s.backing.Has(ctx, ids)
}

// Delete deletes from the backing store, then from the cache.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	if err := store.CtxErr(ctx, "delete", id.String()); err != nil {
		return err
	}
	if err := s.backing.Delete(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	if e := s.lru.m[id]; e != nil {
		s.lru.remove(e)
	}
	if p := s.pending[id]; p != nil {
		p.dead = true
	}
	if f := s.flights[id]; f != nil {
		delete(s.flights, id) // its result must not be cached
	}
	s.mu.Unlock()
	if err := s.cache.Delete(context.WithoutCancel(ctx), id); err != nil {
		s.log.Warn("cachestore: cache delete", "id", id.String(), "err", err)
	}
	return nil
}

// List lists the backing store.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	return s.backing.List(ctx, fn)
}

// Refresh implements store.Refresher by refreshing the backing store when it
// can (a backing store without the ability has nothing to catch up on).
func (s *Store) Refresh(ctx context.Context) error {
	if r, ok := s.backing.(store.Refresher); ok {
		return r.Refresh(ctx)
	}
	return store.CtxErr(ctx, "refresh", "")
}

var _ store.Refresher = (*Store)(nil)

// Close waits for fetches that callers gave up on and for a background
// compaction, then closes both stores.
func (s *Store) Close() error {
	s.wg.Wait()
	err := s.backing.Close()
	if cerr := s.cache.Close(); err == nil {
		err = cerr
	}
	return err
}

// entry is one cached object in the recency list.
type entry struct {
	id         cairn.ID
	size       int64
	prev, next *entry
}

// lru is a doubly linked list, most recently used at the front, with an
// index by ID and the total size.
type lru struct {
	root  entry // sentinel
	m     map[cairn.ID]*entry
	n     int
	bytes int64
}

func (l *lru) init() {
	l.root.prev, l.root.next = &l.root, &l.root
	l.m = map[cairn.ID]*entry{}
}

func (l *lru) link(e, at *entry) { // insert e after at
	e.prev, e.next = at, at.next
	at.next.prev = e
	at.next = e
}

func (l *lru) unlink(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (l *lru) pushFront(e *entry) { l.add(e, &l.root) }
func (l *lru) pushBack(e *entry)  { l.add(e, l.root.prev) }

func (l *lru) add(e, at *entry) {
	l.link(e, at)
	l.m[e.id] = e
	l.n++
	l.bytes += e.size
}

func (l *lru) remove(e *entry) {
	l.unlink(e)
	delete(l.m, e.id)
	l.n--
	l.bytes -= e.size
}

func (l *lru) moveToFront(e *entry) {
	l.unlink(e)
	l.link(e, &l.root)
}

func (l *lru) back() *entry { return l.root.prev }
