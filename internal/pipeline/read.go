package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/store"
	"golang.org/x/sync/errgroup"
)

// Read fetches the chunks of refs, verifies and decodes them, and writes
// the plaintext to w in order. Up to Readahead chunks are fetched and
// decoded in parallel ahead of the one being written. A chunk missing from
// the store fails with an error matching cairn.ErrNotFound, a damaged one
// with cairn.ErrCorrupt; both name the chunk. On error, w may have received
// a prefix of the data.
func (e *Engine) Read(ctx context.Context, refs []manifest.Ref, w io.Writer) error {
	return e.ReadAhead(ctx, refs, 0, w)
}

// ReadAhead is Read fetching up to ahead chunks ahead instead of
// Config.Readahead (ahead < 1: Config.Readahead, at most 65536), for a
// caller that knows where the chunks come from: a cloud bucket's packs
// need more in flight than this device's store.
func (e *Engine) ReadAhead(ctx context.Context, refs []manifest.Ref, ahead int, w io.Writer) error {
	spans := make([]span, len(refs))
	for i, r := range refs {
		spans[i] = span{ref: r, lo: 0, hi: int(r.Size)}
	}
	// A whole file, in order: a store that reads ahead may read large
	// spans from the first Get (store.WithSequential).
	return e.read(store.WithSequential(ctx), spans, ahead, w)
}

// ReadAheadAt is ReadAhead writing each chunk's plaintext at its offset in
// w as soon as it is verified and decoded, in no particular order, rather
// than in order through one writer: a chunk that arrives late holds up
// nothing but its own slot, and the writes run on every core (a 1 GiB get
// spent a second of CPU in write(2) on one goroutine while the rest of the
// read waited for it). Up to ahead chunks are fetched, decoded or being
// written at once. On error w may hold any subset of the chunks; the error
// is the first one met (naming its chunk, as Read's).
//
// w.WriteAt is called from many goroutines but never two at once: the
// kernel serialises buffered writes to one file anyway (ext4 holds the
// inode lock for each), and threads waiting for it there spin on the
// holder (rwsem_spin_on_owner, osq_lock: about 20% of a 1 GiB get's CPU
// under perf in bench/cloud.sh, where the page cache is busy and the
// holder's vCPU gets preempted). Goroutines waiting here park instead.
func (e *Engine) ReadAheadAt(ctx context.Context, refs []manifest.Ref, ahead int, w io.WriterAt) error {
	if len(refs) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(store.WithSequential(ctx))
	defer cancel()
	if ahead < 1 {
		ahead = e.cfg.Readahead
	}
	ahead = min(ahead, len(refs), 1<<16)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		wmu   sync.Mutex // held for each w.WriteAt
		next  int        // the next chunk to fetch (under mu)
		off   int64      // its offset
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
			cancel()
		}
		mu.Unlock()
	}
	// claim hands out the chunks in file order, with their offsets.
	claim := func() (r manifest.Ref, at int64, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		if next == len(refs) || ctx.Err() != nil {
			return r, 0, false
		}
		r, at = refs[next], off
		next++
		off += int64(r.Size)
		return r, at, true
	}
	// ahead workers, each fetching, decoding and writing one chunk after
	// another (not a goroutine per chunk: 57,000 goroutines for 1 GiB
	// each grew its stack from scratch, copystack and newproc were 3-4%
	// of a get's CPU).
	for range ahead {
		wg.Go(func() {
			for {
				r, at, ok := claim()
				if !ok {
					return
				}
				f := &fetch{span: span{ref: r, lo: 0, hi: int(r.Size)}, done: make(chan struct{})}
				e.fetch(ctx, f)
				err := f.err
				if err == nil {
					wmu.Lock()
					_, werr := w.WriteAt(f.plain[f.lo:f.hi], at)
					wmu.Unlock()
					if werr != nil {
						err = cairn.E("read", cairn.IO, "", fmt.Errorf("writing output: %w", werr))
					}
				}
				f.release()
				if err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if first == nil && ctx.Err() != nil {
		first = ctxErr(ctx, "read", "")
	}
	return first
}

// ReadRange writes to w the bytes [off, off+n) of the file made of refs,
// fetching only the chunks that overlap that range. A range reaching past
// the end of the file is cut short there (so nothing is written when off is
// at or after the end); a negative off or n fails with cairn.Invalid.
func (e *Engine) ReadRange(ctx context.Context, refs []manifest.Ref, off, n int64, w io.Writer) error {
	if off < 0 || n < 0 {
		return cairn.E("read range", cairn.Invalid, "", fmt.Errorf("offset %d, length %d", off, n))
	}
	end := off + n
	if end < off { // overflow: read to the end
		end = 1<<63 - 1
	}
	var spans []span
	var pos int64
	for _, r := range refs {
		next := pos + int64(r.Size)
		if next > off && pos < end {
			spans = append(spans, span{ref: r, lo: int(max(off, pos) - pos), hi: int(min(end, next) - pos)})
		}
		if next >= end {
			break
		}
		pos = next
	}
	return e.read(ctx, spans, 0, w)
}

// span is the part [lo, hi) of one chunk's plaintext to write.
type span struct {
	ref    manifest.Ref
	lo, hi int
}

// fetch is one chunk being fetched and decoded.
type fetch struct {
	span
	plain        []byte // the decoded chunk, aliasing inner, outer or the stored bytes
	inner, outer *[]byte
	giveBack     func() // non-nil: the stored bytes were lent (store.LoanNote)
	err          error
	done         chan struct{}
}

func (f *fetch) release() {
	putBuf(f.inner)
	putBuf(f.outer)
	if f.giveBack != nil {
		f.giveBack()
	}
	f.inner, f.outer, f.plain, f.giveBack = nil, nil, nil, nil
}

func (e *Engine) read(parent context.Context, spans []span, ahead int, w io.Writer) error {
	if len(spans) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	if ahead < 1 {
		ahead = e.cfg.Readahead
	}
	ahead = min(ahead, len(spans), 1<<16)
	queue := make(chan *fetch, ahead)
	slots := make(chan struct{}, ahead)
	go func() {
		defer close(queue)
		for _, s := range spans {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			f := &fetch{span: s, done: make(chan struct{})}
			go e.fetch(ctx, f)
			queue <- f
		}
	}()

	var err error
	for f := range queue {
		<-f.done
		if err == nil {
			err = f.err
			if err == nil {
				if _, werr := w.Write(f.plain[f.lo:f.hi]); werr != nil {
					err = cairn.E("read", cairn.IO, "", fmt.Errorf("writing output: %w", werr))
				}
			}
			if err != nil {
				cancel()
			}
		}
		f.release()
		<-slots
	}
	if err == nil && ctx.Err() != nil {
		err = ctxErr(ctx, "read", "")
	}
	return err
}

// fetch gets, verifies and decodes one chunk, and first its base if it
// is a delta (both Gets run at once).
func (e *Engine) fetch(ctx context.Context, f *fetch) {
	defer close(f.done)
	var base []byte
	var baseErr error
	var baseDone chan struct{} // nil unless a delta (no cost for plain chunks)
	if b := f.ref.Base; b != nil {
		baseDone = make(chan struct{})
		go func() {
			defer close(baseDone)
			base, baseErr = e.fetchBase(ctx, *b)
		}()
	}
	// A store that checks what it returns against the ID notes it, and
	// the chunk is then not hashed a second time here (the AEAD tag is
	// still checked). A store that lends the bytes (a cloud pack's
	// read-ahead span) gets them back at release, and reuses the memory.
	gctx, note := store.WithVerifyNote(ctx)
	gctx, loans := store.WithLoanNote(gctx)
	stored, err := e.st.Get(gctx, f.ref.ID)
	if err == nil {
		f.giveBack = loans.Take(stored)
	}
	if baseDone != nil {
		<-baseDone
	}
	if err == nil && baseErr != nil {
		f.err = baseErr
		return
	}
	if err != nil {
		kind := cairn.KindOf(err)
		if ctx.Err() != nil && kind == cairn.Other {
			kind = cairn.Canceled
		}
		f.err = cairn.E("read chunk", kind, f.ref.ID.Short(), err)
		return
	}
	if len(stored) < Overhead {
		f.err = cairn.E("read chunk", cairn.Corrupt, f.ref.ID.Short(), errors.New("truncated"))
		return
	}
	bufs := decodeBufs{base: base, verified: note.Verified(f.ref.ID, stored)}
	if f.giveBack != nil {
		// Lent bytes are this reader's alone until given back: decrypt
		// in place (no buffer to fill, no memory touched for it).
		bufs.inner = stored[hdrSize:]
	} else {
		f.inner = getBuf(len(stored) - Overhead + 1)
		bufs.inner = *f.inner
	}
	if f.ref.Size <= manifest.MaxChunkSize && len(stored)-Overhead < int(f.ref.Size) {
		// Compressed: decompress into a second buffer.
		f.outer = getBuf(int(f.ref.Size))
		bufs.plain = *f.outer
	}
	f.plain, f.err = decodeChunk(f.ref, stored, &bufs)
	if f.err == nil && f.ref.Base != nil {
		f.err = e.checkDelta(f.ref, f.plain)
	}
	if f.err == nil && f.hi > len(f.plain) {
		f.err = cairn.E("read chunk", cairn.Corrupt, f.ref.ID.Short(), errors.New("shorter than its ref"))
	}
}

// fetchBase gets and decodes the base of a delta chunk (a plain chunk).
func (e *Engine) fetchBase(ctx context.Context, ref manifest.Ref) ([]byte, error) {
	id := ref.ID.Short()
	if ref.Base != nil {
		return nil, cairn.E("read chunk", cairn.Corrupt, id, errors.New("a delta's base is itself a delta"))
	}
	stored, err := e.st.Get(ctx, ref.ID)
	if err != nil {
		kind := cairn.KindOf(err)
		if ctx.Err() != nil && kind == cairn.Other {
			kind = cairn.Canceled
		}
		return nil, cairn.E("read chunk", kind, id, fmt.Errorf("base of a delta: %w", err))
	}
	return DecodeChunk(ref, stored)
}

// Plaintexts fetches, verifies and decodes the chunks of refs (plain or
// delta) at once and returns their plaintexts in order. It is meant for
// the few chunks of a small file (a writer fetching the bases of deltas);
// Read streams large ones.
func (e *Engine) Plaintexts(ctx context.Context, refs []manifest.Ref) ([][]byte, error) {
	out := make([][]byte, len(refs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(e.cfg.Readahead, 1))
	for i := range refs {
		g.Go(func() error {
			f := &fetch{span: span{ref: refs[i], hi: int(refs[i].Size)}, done: make(chan struct{})}
			e.fetch(gctx, f)
			if f.err == nil {
				out[i] = bytes.Clone(f.plain)
			}
			f.release()
			return f.err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkDelta checks a delta's output against its chunk key: the engine
// holds the convergence key, so beyond the AEAD (which authenticates the
// delta) this covers its decoding against the base the manifest names.
func (e *Engine) checkDelta(ref manifest.Ref, plain []byte) error {
	if e.hp.chunkKey(plain) != ref.Key {
		return cairn.E("read chunk", cairn.Corrupt, ref.ID.Short(), errors.New("delta decodes to content that does not match its key"))
	}
	return nil
}

// DecodeDelta is the package's DecodeDelta plus the check of the output
// against the chunk key (for fsck, which reads chunks itself).
func (e *Engine) DecodeDelta(ref manifest.Ref, stored, base []byte) ([]byte, error) {
	plain, err := DecodeDelta(ref, stored, base)
	if err != nil {
		return nil, err
	}
	if err := e.checkDelta(ref, plain); err != nil {
		return nil, err
	}
	return plain, nil
}
