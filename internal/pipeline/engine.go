package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/chunker"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/store"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
)

// Config configures an Engine. Conv and Gear are a volume's derived keys
// (volkey.Master.Convergence and Gear). Zero optional fields take defaults.
type Config struct {
	Conv    [32]byte       // convergence key: keys the chunk-key hash
	Gear    [32]byte       // seeds the FastCDC gear table
	Params  chunker.Params // chunk sizes; zero fields take chunker defaults
	Workers int            // encoding workers shared by all Writes; 0 = GOMAXPROCS
	Logger  *slog.Logger   // nil = discard

	// WindowBytes bounds the chunk bytes one Write holds: plaintext waiting
	// to be encoded plus stored bytes waiting for Has and Put. 0 = 16 MiB;
	// it is raised to at least 4×Params.Max.
	WindowBytes int
	// HasBatch is how many chunk IDs one Has call asks about. 0 = 128.
	HasBatch int
	// PutConcurrency bounds the Puts one Write runs at once. 0 = 4.
	PutConcurrency int
	// Readahead is how many chunks one Read fetches ahead. 0 = 2×Workers.
	Readahead int
	// KnownIDs bounds the IDs the engine remembers having Put (and so
	// does not ask the store about again). 0 = 65536; negative disables.
	KnownIDs int
}

func (c Config) withDefaults() Config {
	c.Params = c.Params.WithDefaults()
	if c.Workers == 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.WindowBytes == 0 {
		c.WindowBytes = 16 << 20
	}
	c.WindowBytes = max(c.WindowBytes, 4*(c.Params.Max+Overhead))
	if c.HasBatch == 0 {
		c.HasBatch = 128
	}
	if c.PutConcurrency == 0 {
		c.PutConcurrency = 4
	}
	if c.Readahead == 0 {
		c.Readahead = 2 * c.Workers
	}
	if c.KnownIDs == 0 {
		c.KnownIDs = 1 << 16
	}
	return c
}

// Validate checks c after applying defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Params.Validate(); err != nil {
		return err
	}
	if c.Params.Max > manifest.MaxChunkSize {
		return cairn.E("pipeline config", cairn.Invalid, "", fmt.Errorf("max chunk size %d above %d", c.Params.Max, manifest.MaxChunkSize))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"Workers", c.Workers}, {"HasBatch", c.HasBatch}, {"PutConcurrency", c.PutConcurrency}, {"Readahead", c.Readahead}} {
		if f.v < 1 || f.v > 1<<16 {
			return cairn.E("pipeline config", cairn.Invalid, "", fmt.Errorf("%s = %d, want 1..65536", f.name, f.v))
		}
	}
	return nil
}

// Engine runs the chunk pipeline for one volume against one store. Its
// encoding workers are shared by every Write, so many small concurrent
// Writes and one large Write use the same number of goroutines and cores.
// All methods are safe for concurrent use. Close stops the workers.
type Engine struct {
	cfg      Config
	st       cairn.Store
	cutter   *chunker.Cutter
	hp       *hasherPool
	log      *slog.Logger
	known    *knownSet
	jobs     chan *job
	chunkers sync.Pool

	closeOnce sync.Once
	closing   chan struct{}
	workers   sync.WaitGroup
	mu        sync.RWMutex // held for reading while a job may be sent
	closed    bool
}

// WriteStats describes one Write.
type WriteStats struct {
	LogicalBytes     int64 // plaintext bytes read
	Chunks           int   // chunks in the result
	NewChunks        int   // chunks Put to the store
	NewStoredBytes   int64 // stored bytes Put
	DupChunks        int   // chunks the store (or this engine) already had
	DupBytes         int64 // plaintext bytes of DupChunks
	CompressedChunks int   // chunks stored zstd-compressed
	DeltaChunks      int   // chunks stored as deltas against a base (WriteDelta)
	StoredBytes      int64 // stored size of all chunks, new or not
	// HealedChunks counts chunks the store said it had but whose stored
	// copy failed its check (store.Checker) under store.WithCheckPresent,
	// and that were written afresh (also counted in NewChunks).
	HealedChunks int
}

// New starts an Engine writing to and reading from st. The engine reuses
// the buffer it passes to st.Put once Put returns, so st must not retain
// it (io.Writer's rule); memstore and localstore do not.
func New(cfg Config, st cairn.Store) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st == nil {
		return nil, cairn.E("pipeline", cairn.Invalid, "", errors.New("nil store"))
	}
	cfg = cfg.withDefaults()
	cutter, err := chunker.NewCutter(cfg.Gear, cfg.Params)
	if err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:     cfg,
		st:      st,
		cutter:  cutter,
		hp:      newHasherPool(cfg.Conv),
		log:     cfg.Logger,
		known:   newKnownSet(cfg.KnownIDs),
		jobs:    make(chan *job, cfg.Workers),
		closing: make(chan struct{}),
	}
	e.chunkers.New = func() any { return cutter.NewChunker(nil) }
	e.workers.Add(cfg.Workers)
	for range cfg.Workers {
		go e.worker()
	}
	return e, nil
}

// With returns a new engine with e's configuration (keys, chunking,
// limits) writing to and reading from st instead: a repair uses one to cut
// files exactly as e would, over a store that keeps only the chunks it
// needs. The caller closes it.
func (e *Engine) With(st cairn.Store) (*Engine, error) { return New(e.cfg, st) }

// Close stops the workers after the jobs already queued. Writes running
// or started after Close fail; Close does not close the store.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		close(e.jobs)
		e.mu.Unlock()
		e.workers.Wait()
	})
	return nil
}

// Params returns the chunk size params in use.
func (e *Engine) Params() chunker.Params { return e.cfg.Params }

// job is one chunk going through a worker.
type job struct {
	plain  []byte  // input; with plainB, one scratch byte and the plaintext
	plainB *[]byte // pooled copy of the plaintext, or nil
	stored *[]byte // pooled output buffer
	ref    manifest.Ref
	zstd   bool
	charge int64         // window bytes held until the chunk is settled
	done   chan struct{} // receives once the worker has finished
}

var jobPool = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

func (e *Engine) worker() {
	defer e.workers.Done()
	for j := range e.jobs {
		head := 0
		if j.plainB != nil {
			head = 1
		}
		j.stored = getBuf(len(j.plain) - head + Overhead)
		var out []byte
		j.ref, out, j.zstd = encodeChunk(e.hp, j.plain, head, *j.stored)
		*j.stored = out
		putBuf(j.plainB)
		j.plainB, j.plain = nil, nil
		j.done <- struct{}{}
	}
}

// submit hands j to the workers. It fails if the engine is closed or ctx ends.
func (e *Engine) submit(ctx context.Context, j *job) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.closed {
		return cairn.E("write", cairn.Unavailable, "", errors.New("engine closed"))
	}
	select {
	case e.jobs <- j:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx, "write", "")
	}
}

func ctxErr(ctx context.Context, op, path string) error {
	return cairn.E(op, cairn.Canceled, path, context.Cause(ctx))
}

// Write cuts r into chunks, encodes them on the shared workers, puts the
// chunks the store lacks and returns the refs in file order. It holds at
// most WindowBytes of chunk data at a time whatever the size of r. On
// error, chunks already put stay in the store (they are unreferenced
// garbage until collected).
func (e *Engine) Write(ctx context.Context, r io.Reader) ([]manifest.Ref, WriteStats, error) {
	ch := e.chunkers.Get().(*chunker.Chunker)
	ch.Reset(r)
	defer func() {
		ch.Reset(nil)
		e.chunkers.Put(ch)
	}()
	return e.write(ctx, func() ([]byte, error) {
		b, err := ch.Next()
		if err != nil && err != io.EOF {
			kind := cairn.KindOf(err)
			if kind == cairn.Other {
				kind = cairn.IO
			}
			err = cairn.E("write", kind, "", fmt.Errorf("reading input: %w", err))
		}
		return b, err
	}, true)
}

// WriteBytes is Write for data already in memory; it does not copy b, which
// must not change until WriteBytes returns.
func (e *Engine) WriteBytes(ctx context.Context, b []byte) ([]manifest.Ref, WriteStats, error) {
	return e.write(ctx, func() ([]byte, error) {
		if len(b) == 0 {
			return nil, io.EOF
		}
		n := e.cutter.Cut(b)
		c := b[:n:n]
		b = b[n:]
		return c, nil
	}, false)
}

// write is the producer: it cuts chunks with next, charges them to the
// window, submits them to the workers and queues them, in order, for the
// collector (see collect).
func (e *Engine) write(parent context.Context, next func() ([]byte, error), copyChunks bool) ([]manifest.Ref, WriteStats, error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	w := &writeRun{
		e:      e,
		ctx:    ctx,
		cancel: cancel,
		window: semaphore.NewWeighted(int64(e.cfg.WindowBytes)),
		queue:  make(chan *job, queueLen),
	}
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		w.collect()
	}()

	// err is the producer's own failure; ctxFailed says it only reflects a
	// canceled context (perhaps canceled by the collector after its own
	// failure, which is then the error to report).
	var err error
	ctxFailed := false
	for {
		var b []byte
		b, err = next()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			break
		}
		j := jobPool.Get().(*job)
		j.charge = int64(2*len(b) + Overhead)
		if err = w.window.Acquire(ctx, j.charge); err != nil {
			jobPool.Put(j)
			err, ctxFailed = ctxErr(ctx, "write", ""), true
			break
		}
		if copyChunks {
			j.plainB = getBuf(1 + len(b))
			copy((*j.plainB)[1:], b)
			j.plain = *j.plainB
		} else {
			j.plain = b
		}
		if err = e.submit(ctx, j); err != nil {
			ctxFailed = cairn.KindOf(err) == cairn.Canceled
			putBuf(j.plainB)
			j.plainB, j.plain = nil, nil
			jobPool.Put(j)
			break
		}
		w.queue <- j
	}
	if err != nil {
		cancel(err)
	}
	close(w.queue)
	<-collected
	if w.err != nil && (err == nil || ctxFailed) {
		err = w.err
	}
	if err != nil {
		return nil, w.stats, err
	}
	e.log.Debug("write", "chunks", w.stats.Chunks, "bytes", w.stats.LogicalBytes,
		"new", w.stats.NewChunks, "newStored", w.stats.NewStoredBytes, "dup", w.stats.DupChunks)
	return w.refs, w.stats, nil
}

// queueLen is how many encoded or encoding chunks a Write queues for its
// collector before the producer waits; the window bounds the bytes.
const queueLen = 64

// writeRun is the state of one Write.
type writeRun struct {
	e      *Engine
	ctx    context.Context
	cancel context.CancelCauseFunc
	window *semaphore.Weighted
	queue  chan *job

	// Owned by the collector until it returns.
	refs  []manifest.Ref
	stats WriteStats
	err   error
}

// collect takes finished jobs in file order, records their refs and, in
// batches, asks the store which chunks it lacks and puts those. A batch is
// flushed when it has HasBatch chunks, when it holds half the window, or at
// the end. After an error it keeps draining the queue so every job is
// accounted for and every buffer returned.
func (w *writeRun) collect() {
	e := w.e
	puts := new(errgroup.Group)
	puts.SetLimit(e.cfg.PutConcurrency)
	var putErr atomic.Pointer[error]
	failed := func(err error) {
		if w.err == nil {
			w.err = err
			w.cancel(err)
		}
	}
	var newChunks, dupChunks atomic.Int64
	var newStored, dupBytes atomic.Int64
	var healed atomic.Int64
	recheck := store.CheckPresent(w.ctx)
	inWrite := map[cairn.ID]bool{} // scheduled for Put (or Put) by this Write

	batch := make([]*job, 0, e.cfg.HasBatch)
	var batchCharge int64
	ids := make([]cairn.ID, 0, e.cfg.HasBatch)
	settle := func(j *job) {
		putBuf(j.stored)
		j.stored = nil
		w.window.Release(j.charge)
		jobPool.Put(j)
	}
	flush := func() {
		defer func() { batch, batchCharge = batch[:0], 0 }()
		if w.err != nil {
			for _, j := range batch {
				settle(j)
			}
			return
		}
		ids = ids[:0]
		var ask []*job
		for _, j := range batch {
			if inWrite[j.ref.ID] || !recheck && e.known.has(j.ref.ID) {
				dupChunks.Add(1)
				dupBytes.Add(int64(j.ref.Size))
				settle(j)
				continue
			}
			if len(inWrite) >= maxInWrite {
				// Completed Puts are in e.known; forgetting the rest only
				// risks a second, harmless Put of the same object.
				clear(inWrite)
			}
			inWrite[j.ref.ID] = true
			ids = append(ids, j.ref.ID)
			ask = append(ask, j)
		}
		if len(ask) == 0 {
			return
		}
		found, err := e.st.Has(w.ctx, ids)
		if err == nil && len(found) != len(ids) {
			err = cairn.E("has", cairn.Other, "", fmt.Errorf("store answered %d of %d ids", len(found), len(ids)))
		}
		if err != nil {
			failed(cairn.E("write", cairn.KindOf(err), "", err))
			for _, j := range ask {
				settle(j)
			}
			return
		}
		// Under store.WithCheckPresent a store that can check cheaply
		// (a local directory: store.Checker) verifies what it claims to
		// hold; what fails is written afresh, healing every version that
		// names it.
		heal := make([]bool, len(ask))
		if c, ok := e.st.(store.Checker); ok && recheck {
			var pres []cairn.ID
			var at []int
			for i := range ask {
				if found[i] {
					pres, at = append(pres, ids[i]), append(at, i)
				}
			}
			if len(pres) > 0 {
				good, cerr := c.Check(w.ctx, pres)
				if cerr == nil && len(good) != len(pres) {
					cerr = cairn.E("check", cairn.Other, "", fmt.Errorf("store answered %d of %d ids", len(good), len(pres)))
				}
				if cerr != nil {
					failed(cairn.E("write", cairn.KindOf(cerr), "", cerr))
					for _, j := range ask {
						settle(j)
					}
					return
				}
				for k, i := range at {
					if !good[k] {
						found[i], heal[i] = false, true
					}
				}
			}
		}
		for i, j := range ask {
			if found[i] {
				dupChunks.Add(1)
				dupBytes.Add(int64(j.ref.Size))
				settle(j)
				continue
			}
			healing := heal[i]
			puts.Go(func() error {
				// The pooled buffer is reused once Put returns: like
				// io.Writer, a store must not retain data after Put
				// returns (memstore copies; localstore never touches
				// data once Put has returned, even on cancellation).
				// Copying here instead costs about 30% of the write
				// path's CPU on new data.
				data := *j.stored
				id := j.ref.ID
				epoch := e.known.epochNow()
				// id was computed from data just now: the store need
				// not hash it again.
				err := e.st.Put(store.WithHashedIDs(w.ctx), id, data)
				putBuf(j.stored)
				j.stored = nil
				if err == nil {
					if !store.Deferred(w.ctx) { // buffered, not yet durable: not known stored
						e.known.add(id, epoch)
					}
					newChunks.Add(1)
					newStored.Add(int64(len(data)))
					if healing {
						healed.Add(1)
					}
				} else {
					err = cairn.E("put chunk", cairn.KindOf(err), id.Short(), err)
					putErr.CompareAndSwap(nil, &err)
					w.cancel(err)
				}
				w.window.Release(j.charge)
				jobPool.Put(j)
				return err
			})
		}
	}

	for j := range w.queue {
		<-j.done
		w.refs = append(w.refs, j.ref)
		w.stats.Chunks++
		w.stats.LogicalBytes += int64(j.ref.Size)
		w.stats.StoredBytes += int64(len(*j.stored))
		if j.zstd {
			w.stats.CompressedChunks++
		}
		if p := putErr.Load(); p != nil {
			failed(*p)
		}
		batch = append(batch, j)
		batchCharge += j.charge
		if len(batch) == cap(batch) || 2*batchCharge >= int64(e.cfg.WindowBytes) {
			flush()
		}
	}
	flush()
	if err := puts.Wait(); err != nil {
		failed(err)
	}
	w.stats.NewChunks = int(newChunks.Load())
	w.stats.NewStoredBytes = newStored.Load()
	w.stats.DupChunks = int(dupChunks.Load())
	w.stats.DupBytes = dupBytes.Load()
	w.stats.HealedChunks = int(healed.Load())
}

// maxInWrite bounds the per-Write set of IDs already scheduled for Put.
const maxInWrite = 1 << 16

// knownSet remembers, in two generations, up to max IDs this engine has
// Put, so Writes of the same data need not ask the store again.
type knownSet struct {
	mu       sync.Mutex
	cur, old map[cairn.ID]struct{}
	max      int
	// epoch counts Forgets. A Put that began before a Forget may have
	// stored its object before a garbage collection deleted it, so its ID
	// is remembered only if no Forget came between (see epochNow, add).
	epoch uint64
}

func newKnownSet(max int) *knownSet {
	return &knownSet{max: max, cur: map[cairn.ID]struct{}{}}
}

func (k *knownSet) has(id cairn.ID) bool {
	if k.max <= 0 {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.cur[id]; ok {
		return true
	}
	_, ok := k.old[id]
	return ok
}

// epochNow is read before a Put; add takes it back.
func (k *knownSet) epochNow() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.epoch
}

// add remembers id, Put by a call that began at epoch, unless the set was
// forgotten since: found by TestPutWhileGC, where a Put that returned after
// a Forget put its ID back in the set, a retry trusted it, and the commit
// named a chunk a collection had deleted meanwhile.
func (k *knownSet) add(id cairn.ID, epoch uint64) {
	if k.max <= 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.epoch != epoch {
		return
	}
	if len(k.cur) >= k.max/2 {
		k.old, k.cur = k.cur, make(map[cairn.ID]struct{}, k.max/2)
	}
	k.cur[id] = struct{}{}
}

// Forget empties the set of IDs the engine remembers having Put, so the
// next Writes ask the store again (after garbage collection, for example).
func (e *Engine) Forget() {
	e.known.mu.Lock()
	e.known.cur, e.known.old = map[cairn.ID]struct{}{}, nil
	e.known.epoch++
	e.known.mu.Unlock()
}

// Refs returns the refs WriteBytes(b) would return, without storing
// anything: it cuts and encodes b on the caller's goroutine. A writer that
// already holds a file's previous chunk list compares them to learn,
// before any store round trip, that the content has not changed.
func (e *Engine) Refs(b []byte) []manifest.Ref {
	var refs []manifest.Ref
	for len(b) > 0 {
		n := e.cutter.Cut(b)
		buf := getBuf(n + Overhead)
		ref, _, _ := encodeChunk(e.hp, b[:n], 0, *buf)
		putBuf(buf)
		refs = append(refs, ref)
		b = b[n:]
	}
	return refs
}

// Hint tells WriteDelta how it may store one chunk.
type Hint struct {
	// Same, if not nil, is a stored chunk with this chunk's plaintext
	// (equal Key and Size), perhaps a delta, that the caller knows stays
	// stored (a chunk of the file's current version): it is used as is.
	Same *manifest.Ref
	// Base, if not nil, is a plain stored chunk (Base.Base == nil) that
	// likewise stays stored, and BasePlain its plaintext: the chunk is
	// stored as a delta against it when that is smaller than its plain
	// encoding.
	Base      *manifest.Ref
	BasePlain []byte
}

// WriteDelta is WriteBytes for a small file (all of it is encoded before
// anything is stored) whose chunks are plain, as Refs(b) returned them, with
// a hint per chunk. It returns the refs to record in the manifest: a
// delta's ref names its base. A delta's ID differs from the plain chunk's,
// so content digests should be computed from plain, not from the result.
func (e *Engine) WriteDelta(ctx context.Context, b []byte, plain []manifest.Ref, hints []Hint) ([]manifest.Ref, WriteStats, error) {
	if len(hints) != len(plain) {
		return nil, WriteStats{}, cairn.E("write", cairn.Invalid, "", fmt.Errorf("%d hints for %d chunks", len(hints), len(plain)))
	}
	var st WriteStats
	refs := make([]manifest.Ref, len(plain))
	stored := make([][]byte, len(plain))
	off := 0
	for i, p := range plain {
		if off+int(p.Size) > len(b) {
			return nil, st, cairn.E("write", cairn.Invalid, "", errors.New("chunk list longer than the data"))
		}
		c := b[off : off+int(p.Size)]
		off += int(p.Size)
		st.Chunks++
		st.LogicalBytes += int64(p.Size)
		h := hints[i]
		if h.Same != nil && h.Same.Key == p.Key && h.Same.Size == p.Size {
			refs[i] = *h.Same
			st.DupChunks++
			st.DupBytes += int64(p.Size)
			continue
		}
		ref, enc, z := encodeChunk(e.hp, c, 0, make([]byte, 0, len(c)+Overhead))
		if h.Base != nil {
			if dref, denc, ok := encodeDelta(e.hp, c, *h.Base, h.BasePlain); ok && len(denc) < len(enc) {
				ref, enc, z = dref, denc, false
				st.DeltaChunks++
			}
		}
		if z {
			st.CompressedChunks++
		}
		refs[i], stored[i] = ref, enc
		st.StoredBytes += int64(len(enc))
	}
	if off != len(b) {
		return nil, st, cairn.E("write", cairn.Invalid, "", errors.New("chunk list shorter than the data"))
	}

	var ask []int
	var ids []cairn.ID
	asked := map[cairn.ID]bool{}
	for i := range refs {
		if stored[i] == nil {
			continue
		}
		id := refs[i].ID
		if asked[id] || e.known.has(id) {
			st.DupChunks++
			st.DupBytes += int64(refs[i].Size)
			continue
		}
		asked[id] = true
		ask = append(ask, i)
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return refs, st, nil
	}
	found, err := e.st.Has(ctx, ids)
	if err == nil && len(found) != len(ids) {
		err = cairn.E("has", cairn.Other, "", fmt.Errorf("store answered %d of %d ids", len(found), len(ids)))
	}
	if err != nil {
		return nil, st, cairn.E("write", cairn.KindOf(err), "", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(e.cfg.PutConcurrency)
	var newChunks atomic.Int64
	var newStored atomic.Int64
	for k, i := range ask {
		if found[k] {
			st.DupChunks++
			st.DupBytes += int64(refs[i].Size)
			continue
		}
		g.Go(func() error {
			id := refs[i].ID
			epoch := e.known.epochNow()
			if perr := e.st.Put(store.WithHashedIDs(gctx), id, stored[i]); perr != nil {
				return cairn.E("put chunk", cairn.KindOf(perr), id.Short(), perr)
			}
			if !store.Deferred(gctx) { // buffered, not yet durable: not known stored
				e.known.add(id, epoch)
			}
			newChunks.Add(1)
			newStored.Add(int64(len(stored[i])))
			return nil
		})
	}
	err = g.Wait()
	st.NewChunks = int(newChunks.Load())
	st.NewStoredBytes = newStored.Load()
	if err != nil {
		return nil, st, err
	}
	e.log.Debug("write delta", "chunks", st.Chunks, "bytes", st.LogicalBytes,
		"new", st.NewChunks, "newStored", st.NewStoredBytes, "deltas", st.DeltaChunks)
	return refs, st, nil
}
