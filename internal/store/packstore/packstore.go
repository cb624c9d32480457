// Package packstore packs small objects into large pack objects in front of
// any cairn.Store, so that a cloud bucket, where every request is billed
// and slow, sees one PUT per pack rather than one per chunk: 10,000 small
// files make a number of PUTs proportional to the packs, not the files.
//
// Objects smaller than Options.Threshold (1 MiB) are appended to an open
// pack buffer; larger ones go to the backing store as themselves. A pack is
// sealed and stored when it reaches Options.PackSize (16 MiB), when
// Options.Linger (10 ms) has passed since its first object, or on Flush. It
// is an ordinary object of the backing store, named by the BLAKE3 hash of
// its bytes, so any Store can hold it, and it describes itself: a trailer
// at its end lists each packed object's ID, offset and length
// (doc/format.md, "Pack objects (version 1)"), so a device that has never
// seen a pack learns its contents from one ranged read of its end.
//
// # Durability of Put: group commit
//
// Put returns only once the pack holding the object is stored in the
// backing store, as the cairn.Store contract requires, so every caller
// (the pipeline, the file layer that commits a version to etcd after its
// data is stored) stays correct without change. Concurrent Puts share one
// pack: each waits for the pack it joined. A pack is sealed as soon as
// every Put under way is waiting for it (nobody else could join: a lone
// sequential writer waits only for its own PUT), otherwise at the latest
// Linger after its first object, so that Puts still on their way can join;
// while every upload slot (Options.MaxUploads) is busy an open pack keeps
// growing instead. How many objects share a pack is then about how many
// Puts run at once: 256 concurrent Puts of 4 KiB make about one PUT per
// 150 objects; the pipeline's 4 Puts per file, one PUT per 4 chunks. A
// caller that can flush before it commits metadata can use
// PutDeferred, which returns once the object is buffered, and Flush, which
// returns once everything buffered before it is stored (or reports what
// failed); that packs a whole import into few full packs.
//
// # Reads, the index and other devices
//
// Get reads an object out of its pack with one ranged read
// (store.RangeReader, or a whole Get of the pack when the backing store
// cannot read ranges; once the reads of a pack look sequential, one ranged
// read of Options.ReadAhead bytes serves the objects in it: readahead.go)
// and checks it against its own ID (Kind Corrupt
// otherwise). The index (object ID → pack, offset, length) is in memory and
// cached in a log under Options.Dir; it is only a cache. At New, and
// whenever an object is missed, the wrapper lists the backing store: packs
// it does not know yet (written by another device, or by this one before a
// crash) are learned from their trailers, packs that are gone are
// forgotten. Get refreshes on every miss (coalesced: concurrent misses
// share one listing), Has at most once per Options.HasRefresh, since a
// stale "absent" only costs a duplicate copy. List yields the packed and
// plain objects, never the packs.
//
// # Deletes, tombstones and repacking
//
// Delete of a packed object writes a tombstone (object ID, pack ID) into
// the open pack: that is how other devices, and this one after a restart,
// learn of the deletion. Tombstones are stored with the next pack, normally
// within Linger; Delete does not wait for it (a collector deletes
// thousands of objects one by one), so, unlike the cairn.Store contract
// says, a crash up to that moment, or before Flush, Compact or Close,
// undoes the Delete: the object comes back, which is harmless for cairn's
// mark-and-sweep collector (the next run deletes it again) and never loses
// data. A tombstone that could not be stored undoes its Delete at once
// (Flush reports it), so that no later repack here drops an object another
// device, which never learned of the deletion, may have used since. A
// collector must Flush (or Compact) before it releases its fence, on its
// error paths too, so that writers that refresh after it see every
// tombstone. Repack (Compact, called by `cairn gc` under the GC fence) rewrites
// packs whose useful fraction is below a threshold: live objects and
// still-needed tombstones go into new packs, which are stored and indexed
// before the old packs are deleted, so a crash in between leaves
// duplicates, never a loss. Only one Repack may run at a time across all
// devices sharing the backing store (gc's fence ensures it).
//
// The backing store's listing must show what was written before the
// listing began (S3, GCS and Azure Blob are strongly consistent for
// listings; anchorstore covers a store whose reads lag). Requests made to
// the backing store are counted (Requests).
package packstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/sync/semaphore"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Options configure a Store. The zero value gives the defaults.
type Options struct {
	// Dir is a local directory for the index log (a cache of what the
	// packs hold). "" keeps the index in memory only: every New then
	// reads each pack's trailer again. One process at a time may use a
	// directory (New fails with Kind Conflict otherwise).
	Dir string

	// Threshold: objects smaller than this many bytes are packed, others
	// stored as themselves. Default 1 MiB; at most PackSize.
	Threshold int

	// PackSize is the size at which a pack is sealed and stored. Default
	// 16 MiB.
	PackSize int

	// Linger is how long a pack stays open after its first object so that
	// concurrent Puts can join it. Default 10 ms; negative means none (a
	// pack is sealed as soon as an upload slot is free).
	Linger time.Duration

	// MaxUploads bounds the packs being stored at once. Default 4.
	MaxUploads int

	// MaxBuffered bounds the bytes of objects waiting in packs not yet
	// stored; Puts beyond it wait. Default 4·PackSize; at least
	// PackSize + Threshold.
	MaxBuffered int64

	// HasRefresh is the least time between two listings of the backing
	// store made because Has missed. Default 30 s; negative: Has never
	// lists.
	HasRefresh time.Duration

	// ReadAhead is how many bytes of a pack one read fetches once the
	// reads of that pack look sequential (see readahead.go), so that a
	// file read in order costs one request per span, not per object.
	// Default 4 MiB; negative: every object is read alone.
	ReadAhead int

	// ReadAheadSpans is how many spans of a pack a sequential run keeps
	// read or in flight: the one being consumed and those after it,
	// started in the background once the run is a quarter of the way
	// into a span (readahead.go). Default 4; 1: one span at a time.
	ReadAheadSpans int

	// ProbeBytes is how much of a pack's end one read fetches to learn
	// its index (more is read when the index is larger). Default 64 KiB.
	ProbeBytes int

	// Logger receives notes on damaged packs and index write failures.
	// nil discards them.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultThreshold      = 1 << 20
	DefaultPackSize       = 16 << 20
	DefaultLinger         = 10 * time.Millisecond
	DefaultMaxUploads     = 4
	DefaultHasRefresh     = 30 * time.Second
	DefaultProbeBytes     = 64 << 10
	DefaultReadAhead      = 4 << 20
	DefaultReadAheadSpans = 4

	// DefaultRepackThreshold is the useful fraction below which Compact
	// rewrites a pack.
	DefaultRepackThreshold = 0.5
)

func (o Options) withDefaults() (Options, error) {
	if o.Threshold == 0 {
		o.Threshold = DefaultThreshold
	}
	if o.PackSize == 0 {
		o.PackSize = DefaultPackSize
	}
	switch {
	case o.Linger == 0:
		o.Linger = DefaultLinger
	case o.Linger < 0:
		o.Linger = 0
	}
	if o.MaxUploads == 0 {
		o.MaxUploads = DefaultMaxUploads
	}
	if o.MaxBuffered == 0 {
		o.MaxBuffered = 4 * int64(o.PackSize)
	}
	if o.HasRefresh == 0 {
		o.HasRefresh = DefaultHasRefresh
	}
	if o.ProbeBytes == 0 {
		o.ProbeBytes = DefaultProbeBytes
	}
	if o.ReadAhead == 0 {
		o.ReadAhead = DefaultReadAhead
	}
	if o.ReadAheadSpans <= 0 {
		o.ReadAheadSpans = DefaultReadAheadSpans
	}
	switch {
	case o.Threshold < 0 || o.PackSize <= 0 || o.MaxUploads < 0:
		return o, errors.New("negative Threshold, PackSize or MaxUploads")
	case o.Threshold > o.PackSize:
		return o, fmt.Errorf("Threshold %d is larger than PackSize %d", o.Threshold, o.PackSize)
	case o.MaxBuffered < int64(o.PackSize)+int64(o.Threshold):
		return o, fmt.Errorf("MaxBuffered %d is less than PackSize + Threshold", o.MaxBuffered)
	case o.ProbeBytes < headerSize+trailerSize:
		return o, fmt.Errorf("ProbeBytes %d is less than %d", o.ProbeBytes, headerSize+trailerSize)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Requests counts the requests the wrapper made to the backing store, by
// method: one per call of the backing store's method (a List is one call
// however many pages the backing store reads).
type Requests struct {
	Put, Get, GetRange, Has, List, Delete int64
}

// Total is the sum of all requests.
func (r Requests) Total() int64 { return r.Put + r.Get + r.GetRange + r.Has + r.List + r.Delete }

// Sub returns r minus an earlier snapshot.
func (r Requests) Sub(o Requests) Requests {
	return Requests{r.Put - o.Put, r.Get - o.Get, r.GetRange - o.GetRange, r.Has - o.Has, r.List - o.List, r.Delete - o.Delete}
}

// Store is the packing wrapper. It owns the backing store: Close closes it.
type Store struct {
	backing cairn.Store
	rr      store.RangeReader // nil when the backing store cannot read ranges
	opts    Options
	log     *slog.Logger
	budget  *semaphore.Weighted

	life   context.Context // background work (uploads); canceled by Close
	cancel context.CancelFunc

	nPut, nGet, nRange, nHas, nList, nDelete atomic.Int64

	active atomic.Int64 // Puts of small objects under way

	raMu    sync.Mutex // guards ra
	ra      readAhead
	bgReads sync.WaitGroup // background span reads (readSpans); Close waits
	spans   *spanPool      // span buffers for reuse (readahead.go)

	delMu  sync.RWMutex  // Delete (shared) against Repack (exclusive)
	refSem chan struct{} // one refresh at a time

	mu      sync.Mutex
	closed  bool
	idx     index
	bad     map[ref]struct{}      // copies that failed verification on read (skipped by Get and Has)
	gone    map[cairn.ID]struct{} // packs this process deleted: never learned again
	disk    *diskIndex            // nil without Options.Dir
	open    *batch                // the pack being filled, or nil
	queue   []*batch              // sealed packs waiting for an upload slot
	flying  map[*batch]struct{}   // every batch not yet finished
	pending map[cairn.ID]*batch   // objects in unfinished batches
	uploads int                   // uploads under way
	lost    error                 // a batch holding deferred objects or tombstones failed (reported by Flush)

	refStarted uint64    // refreshes started
	refOK      bool      // the last refresh succeeded
	lastList   time.Time // when the last refresh began

	hook func(step string) error // tests: called between repack steps
}

var (
	_ cairn.Store       = (*Store)(nil)
	_ cairn.StoreStats  = (*Store)(nil)
	_ store.Verifier    = (*Store)(nil)
	_ store.Compacter   = (*Store)(nil)
	_ store.Refresher   = (*Store)(nil)
	_ store.RangeReader = (*Store)(nil)
)

var errClosed = errors.New("pack store is closed")

// New wraps backing. It loads the index log from opts.Dir, then lists the
// backing store and learns the packs the log does not know. On error the
// caller keeps ownership of backing.
func New(ctx context.Context, backing cairn.Store, opts Options) (*Store, error) {
	const op = "packstore open"
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, "", err)
	}
	s := &Store{
		backing: backing,
		opts:    opts,
		log:     opts.Logger,
		budget:  semaphore.NewWeighted(opts.MaxBuffered),
		refSem:  make(chan struct{}, 1),
		idx:     newIndex(),
		bad:     map[ref]struct{}{},
		gone:    map[cairn.ID]struct{}{},
		flying:  map[*batch]struct{}{},
		pending: map[cairn.ID]*batch{},
	}
	s.rr, _ = backing.(store.RangeReader)
	s.spans = &spanPool{size: max(opts.ReadAhead, 0), maxFree: max(4, 2*opts.ReadAheadSpans), idle: spanIdle}
	s.life, s.cancel = context.WithCancel(context.Background())
	if opts.Dir != "" {
		d, err := openDisk(opts.Dir)
		if err != nil {
			return nil, err
		}
		if err := d.load(&s.idx); err != nil {
			d.close()
			return nil, err
		}
		s.disk = d
	}
	if err := s.refresh(ctx, 0); err != nil {
		if s.disk != nil {
			s.disk.close()
		}
		s.cancel()
		return nil, cairn.E(op, cairn.KindOf(err), "", err)
	}
	s.mu.Lock()
	if s.disk != nil && s.disk.worthCompacting() {
		s.noteLogErr(s.disk.rewrite(&s.idx))
	}
	s.mu.Unlock()
	return s, nil
}

// Requests returns how many requests the wrapper made to the backing store.
func (s *Store) Requests() Requests {
	return Requests{s.nPut.Load(), s.nGet.Load(), s.nRange.Load(), s.nHas.Load(), s.nList.Load(), s.nDelete.Load()}
}

// ---- The backing store, counted.

func (s *Store) bPut(ctx context.Context, id cairn.ID, data []byte) error {
	s.nPut.Add(1)
	return s.backing.Put(ctx, id, data)
}

// bPutHashed stores a pack this store named by hashing it: without the
// backing store's own check of the ID when it can skip it
// (store.HashedPutter).
func (s *Store) bPutHashed(ctx context.Context, id cairn.ID, data []byte) error {
	if hp, ok := s.backing.(store.HashedPutter); ok {
		s.nPut.Add(1)
		return hp.PutHashed(ctx, id, data)
	}
	return s.bPut(ctx, id, data)
}

func (s *Store) bGet(ctx context.Context, id cairn.ID) ([]byte, error) {
	s.nGet.Add(1)
	return s.backing.Get(ctx, id)
}

func (s *Store) bDelete(ctx context.Context, id cairn.ID) error {
	s.nDelete.Add(1)
	return s.backing.Delete(ctx, id)
}

func (s *Store) bList(ctx context.Context, fn func(cairn.ID, int64) error) error {
	s.nList.Add(1)
	return s.backing.List(ctx, fn)
}

// readRange reads n bytes of backing object id from off: a ranged read when
// the backing store can, else a whole Get.
func (s *Store) readRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	if s.rr != nil {
		s.nRange.Add(1)
		b, err := s.rr.GetRange(ctx, id, off, n)
		if err == nil && int64(len(b)) != n {
			return nil, cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("asked for %d bytes, got %d", n, len(b)))
		}
		return b, err
	}
	data, err := s.bGet(ctx, id)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off > int64(len(data)) || n > int64(len(data))-off {
		return nil, cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, len(data)))
	}
	return data[off : off+n : off+n], nil
}

// hashers are BLAKE3 hashers on the heap, reused: blake3.Sum256 keeps a
// 10 KiB hasher on the stack, and a Get runs in a fresh goroutine of the
// reader's (one per chunk), whose stack then grew, copied, every time.
var hashers = sync.Pool{New: func() any { return blake3.New() }}

// sum256 is blake3.Sum256 with a pooled hasher.
func sum256(data []byte) cairn.ID {
	h := hashers.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(data)
	var id cairn.ID
	h.Sum(id[:0])
	hashers.Put(h)
	return id
}

// ---- Writing.

// Put stores data under id and returns once it is stored in the backing
// store: packed (when smaller than Options.Threshold) in a pack shared with
// concurrent Puts, or as itself. With a context from store.WithDeferred it
// is PutDeferred.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	return s.put(ctx, id, data, !store.Deferred(ctx))
}

// Defers reports that Puts with a store.WithDeferred context are
// deferred (store.Deferrer).
func (s *Store) Defers() bool { return true }

// PutDeferred is Put without waiting for a small object's pack to be
// stored: it returns once the object is buffered (large objects are stored
// before it returns, as by Put). The object is durable only once a later
// Flush has returned nil; Flush reports a failure to store it. Until then
// Get finds it but Has and List do not.
func (s *Store) PutDeferred(ctx context.Context, id cairn.ID, data []byte) error {
	return s.put(ctx, id, data, false)
}

func (s *Store) put(ctx context.Context, id cairn.ID, data []byte, wait bool) error {
	const op = "put"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	if !store.HashedIDs(ctx) && sum256(data) != id {
		return cairn.E(op, cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	if len(data) >= s.opts.Threshold {
		return s.putPlain(ctx, id, data)
	}
	s.active.Add(1)
	defer s.active.Add(-1)
	var reserved int64
	defer func() {
		if reserved > 0 {
			s.budget.Release(reserved)
		}
	}()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return cairn.E(op, cairn.Invalid, id.String(), errClosed)
		}
		if s.presentLocked(id) {
			s.mu.Unlock()
			return nil
		}
		if b := s.pending[id]; b != nil {
			if !wait {
				b.keep = true
				s.mu.Unlock()
				return nil
			}
			if b == s.open {
				b.waiters++
				s.filledLocked(b, lingerWaiter)
			}
			s.mu.Unlock()
			return b.wait(ctx, op, id)
		}
		if reserved == 0 && len(data) > 0 {
			s.mu.Unlock()
			if err := s.budget.Acquire(ctx, int64(len(data))); err != nil {
				return store.CtxErr(ctx, op, id.String())
			}
			reserved = int64(len(data))
			continue
		}
		b := s.openLocked()
		b.addObject(id, data, s.opts.PackSize)
		b.reserved += reserved
		reserved = 0
		if !wait {
			b.keep = true
		}
		s.pending[id] = b
		if wait {
			b.waiters++
			s.filledLocked(b, lingerWaiter)
		} else {
			s.filledLocked(b, lingerNo)
		}
		s.mu.Unlock()
		if !wait {
			return nil
		}
		return b.wait(ctx, op, id)
	}
}

// putPlain stores a large object as itself.
func (s *Store) putPlain(ctx context.Context, id cairn.ID, data []byte) error {
	s.mu.Lock()
	closed, present := s.closed, s.presentLocked(id)
	s.mu.Unlock()
	if closed {
		return cairn.E("put", cairn.Invalid, id.String(), errClosed)
	}
	if present {
		return nil
	}
	if err := s.bPut(ctx, id, data); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idx.plain[id]; !ok && s.idx.packs[id] == nil {
		s.idx.addPlain(id, int64(len(data)))
		s.logLocked(plainRecord(nil, id, int64(len(data))), logRecHeader+40+logRecCRC)
	}
	return nil
}

// presentLocked reports whether id is stored: a live copy that has not
// failed verification, or a plain object.
func (s *Store) presentLocked(id cairn.ID) bool {
	for _, r := range s.idx.copies[id] {
		if _, bad := s.bad[r]; r.live() && !bad {
			return true
		}
	}
	_, ok := s.idx.plain[id]
	return ok
}

// Flush seals the open pack and waits until every pack sealed before it
// has been stored. It returns an error if an object given to PutDeferred,
// or a tombstone written by Delete, could not be stored since the last
// Flush (such a deferred object is then absent: Put it again).
func (s *Store) Flush(ctx context.Context) error {
	if err := store.CtxErr(ctx, "flush", ""); err != nil {
		return err
	}
	s.mu.Lock()
	if s.open != nil {
		s.sealLocked(s.open)
	}
	wait := make([]*batch, 0, len(s.flying))
	for b := range s.flying {
		wait = append(wait, b)
	}
	s.mu.Unlock()
	for _, b := range wait {
		select {
		case <-b.done:
		case <-ctx.Done():
			return store.CtxErr(ctx, "flush", "")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.lost
	s.lost = nil
	return err
}

// ---- Reading.

var (
	errMissing = errors.New("no copy known")
	errGone    = errors.New("a pack the index names is gone")
)

// Get returns the object, read out of its pack (or as itself) and checked
// against id.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	const op = "get"
	if ctx.Err() != nil { // (id.String() only then: a cold 1 GiB read makes 57,000 Gets)
		return nil, store.CtxErr(ctx, op, id.String())
	}
	for attempt := 0; ; attempt++ {
		mark := s.refreshMark()
		data, err := s.get(ctx, id)
		if err == nil || (err != errMissing && err != errGone) {
			return data, err
		}
		if attempt == 1 {
			return nil, cairn.E(op, cairn.NotFound, id.String(), nil)
		}
		// Written or moved by another device (or a crash) since we
		// last looked: list the backing store and look again.
		if err := s.refresh(ctx, mark); err != nil {
			return nil, err
		}
	}
}

func (s *Store) get(ctx context.Context, id cairn.ID) ([]byte, error) {
	const op = "get"
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, cairn.E(op, cairn.Invalid, id.String(), errClosed)
	}
	if b := s.pending[id]; b != nil {
		data := b.object(id)
		s.mu.Unlock()
		return data, nil
	}
	var refs []ref
	for _, r := range s.idx.copies[id] {
		if _, bad := s.bad[r]; r.live() && !bad {
			refs = append(refs, r)
		}
	}
	_, plain := s.idx.plain[id]
	s.mu.Unlock()

	var damaged error
	gone := false
	for _, r := range refs {
		o := r.p.objs[r.i]
		data, giveBack, err := s.readObject(ctx, r)
		switch cairn.KindOf(err) {
		case cairn.Other:
			if err != nil {
				return nil, err
			}
			if sum256(data) == id {
				store.NoteVerified(ctx, id, data)
				if giveBack != nil {
					store.Lend(ctx, data, giveBack) // readObject lends only when ctx takes loans
				}
				return data, nil
			}
			if giveBack != nil {
				giveBack()
			}
			err = errors.New("data does not hash to its ID")
		case cairn.NotFound:
			gone = true
			continue
		case cairn.Invalid: // the pack is shorter than its index says
		default:
			return nil, err
		}
		damaged = cairn.E(op, cairn.Corrupt, id.String(), fmt.Errorf("in pack %s at [%d, +%d): %w", r.p.id.Short(), o.off, o.n, err))
		s.log.Warn("damaged object in a pack", "id", id.String(), "pack", r.p.id.String(), "err", err)
		s.mu.Lock()
		s.bad[r] = struct{}{}
		s.mu.Unlock()
	}
	if plain {
		data, err := s.bGet(ctx, id)
		if cairn.KindOf(err) != cairn.NotFound {
			return data, err
		}
		gone = true
	}
	switch {
	case gone:
		return nil, errGone
	case damaged != nil:
		return nil, damaged
	}
	return nil, errMissing
}

// GetRange reads n bytes of object id from off (store.RangeReader). A
// packed object's bytes are read out of its pack and not verified, like
// any GetRange.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	const op = "get range"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		mark := s.refreshMark()
		s.mu.Lock()
		var r ref
		found := false
		if rs := s.idx.liveRefs(id); len(rs) > 0 {
			r, found = rs[0], true
		}
		_, plain := s.idx.plain[id]
		s.mu.Unlock()
		var data []byte
		var err error
		switch {
		case found:
			o := r.p.objs[r.i]
			if off < 0 || n < 0 || off > o.n || n > o.n-off {
				return nil, cairn.E(op, cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, o.n))
			}
			data, err = s.readRange(ctx, r.p.id, o.off+off, n)
		case plain:
			data, err = s.readRange(ctx, id, off, n)
		default:
			err = cairn.E(op, cairn.NotFound, id.String(), nil)
		}
		if cairn.KindOf(err) != cairn.NotFound || attempt == 1 {
			return data, err
		}
		if err := s.refresh(ctx, mark); err != nil {
			return nil, err
		}
	}
}

// Has answers from the index. When some IDs are missing it lists the
// backing store first, at most once per Options.HasRefresh.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := store.CtxErr(ctx, "has", ""); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	mark := s.refreshMark()
	missing := s.has(ids, found)
	if missing > 0 && s.opts.HasRefresh > 0 {
		s.mu.Lock()
		due := time.Since(s.lastList) >= s.opts.HasRefresh
		s.mu.Unlock()
		if due {
			if err := s.refresh(ctx, mark); err != nil {
				return nil, err
			}
			s.has(ids, found)
		}
	}
	return found, nil
}

func (s *Store) has(ids []cairn.ID, found []bool) (missing int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range ids {
		found[i] = s.presentLocked(id)
		if !found[i] {
			missing++
		}
	}
	return missing
}

// ---- Deleting.

// Delete deletes the object: a plain object from the backing store at
// once, a packed one by a tombstone stored with the next pack (see the
// package comment: durable at the next Flush, Compact or Close).
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	const op = "delete"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	s.delMu.RLock()
	defer s.delMu.RUnlock()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return cairn.E(op, cairn.Invalid, id.String(), errClosed)
		}
		b := s.pending[id]
		if b == nil {
			break
		}
		s.mu.Unlock()
		select { // let the Put under way finish, then delete what it stored
		case <-b.done:
		case <-ctx.Done():
			return store.CtxErr(ctx, op, id.String())
		}
	}
	var tombs []tomb
	for _, r := range s.idx.copies[id] {
		if r.live() {
			tombs = append(tombs, tomb{id, r.p.id})
		}
	}
	if len(tombs) > 0 {
		b := s.openLocked()
		for _, t := range tombs {
			// Dead here at once; for everyone once the pack holding
			// the tombstone is stored (upload undoes this if it fails).
			s.idx.markDead(s.idx.copyIn(t))
			b.tombs = append(b.tombs, t)
		}
		b.keep = true
		s.filledLocked(b, lingerTombstones)
	}
	_, plain := s.idx.plain[id]
	s.mu.Unlock()
	if !plain {
		return nil
	}
	if err := s.bDelete(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.idx.plain[id]; ok {
		delete(s.idx.plain, id)
		s.logLocked(goneRecord(nil, id), -(logRecHeader + 40 + logRecCRC))
	}
	return nil
}

// ---- Listing and statistics.

// List lists the backing store (learning new packs), then calls fn for each
// live packed or plain object; packs themselves are never listed.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	const op = "list"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return err
	}
	if err := s.refresh(ctx, s.refreshMark()); err != nil {
		return err
	}
	type entry struct {
		id   cairn.ID
		size int64
	}
	s.mu.Lock()
	snap := make([]entry, 0, len(s.idx.copies)+len(s.idx.plain))
	for id := range s.idx.copies {
		if s.livePackedLocked(id) {
			n, _ := s.idx.has(id)
			snap = append(snap, entry{id, n})
		}
	}
	for id, p := range s.idx.plain {
		if !s.livePackedLocked(id) {
			snap = append(snap, entry{id, p.size})
		}
	}
	s.mu.Unlock()
	for _, e := range snap {
		if err := store.CtxErr(ctx, op, ""); err != nil {
			return err
		}
		if err := fn(e.id, e.size); err != nil {
			return err
		}
	}
	return store.CtxErr(ctx, op, "")
}

// Stats reports the live objects and their bytes; Disk is what the backing
// store holds for them: packs (garbage included) and plain objects.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if err := store.CtxErr(ctx, "stats", ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var u cairn.StoreUsage
	for id := range s.idx.copies {
		if s.livePackedLocked(id) {
			n, _ := s.idx.has(id)
			u.Objects++
			u.Bytes += n
		}
	}
	for id, p := range s.idx.plain {
		if !s.livePackedLocked(id) {
			u.Objects++
			u.Bytes += p.size
		}
		u.Disk += p.size
	}
	for _, p := range s.idx.packs {
		u.Disk += p.size
	}
	for _, n := range s.idx.damaged {
		u.Disk += n
	}
	return u, nil
}

func (s *Store) livePackedLocked(id cairn.ID) bool {
	for _, r := range s.idx.copies[id] {
		if _, bad := s.bad[r]; r.live() && !bad {
			return true
		}
	}
	return false
}

// Close stores what is buffered (Flush), saves the index and closes the
// backing store.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	err := s.Flush(s.life)
	s.mu.Lock()
	s.closed = true
	if s.disk != nil {
		if s.disk.worthCompacting() {
			s.noteLogErr(s.disk.rewrite(&s.idx))
		}
		if e := s.disk.close(); err == nil && e != nil {
			err = cairn.E("packstore close", cairn.IO, s.opts.Dir, e)
		}
		s.disk = nil
	}
	s.mu.Unlock()
	s.cancel()
	s.bgReads.Wait()
	s.spans.close()
	if e := s.backing.Close(); err == nil {
		err = e
	}
	return err
}

// ---- The index log.

// logLocked appends records to the index log; live is what they add to
// (or, negative, take from) a fresh snapshot.
func (s *Store) logLocked(rec []byte, live int64) {
	if s.disk != nil {
		s.noteLogErr(s.disk.write(rec, live))
	}
}

func (s *Store) noteLogErr(err error) {
	if err != nil {
		s.log.Warn("pack index log: kept in memory only from now on", "err", err)
	}
}

// learnPackLocked installs p in the index and the log.
func (s *Store) learnPackLocked(p *pack) {
	if s.idx.packs[p.id] != nil {
		return
	}
	delete(s.idx.plain, p.id)
	delete(s.idx.damaged, p.id)
	s.idx.addPack(p)
	s.logLocked(packRecord(nil, p), logRecHeader+48+int64(len(p.objs))*entrySize+int64(len(p.tombs))*tombSize+logRecCRC)
}

// forgetPackLocked removes p from the index and the log.
func (s *Store) forgetPackLocked(p *pack) {
	s.idx.removePack(p)
	for i := range p.objs {
		delete(s.bad, ref{p, i})
	}
	s.logLocked(goneRecord(nil, p.id), -(logRecHeader + 48 + int64(len(p.objs))*entrySize + int64(len(p.tombs))*tombSize + logRecCRC))
}
