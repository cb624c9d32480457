package packstore

// Read-ahead: a file read in order asks for the objects of a pack in about
// the order they were packed, many at once (the pipeline's read-ahead). One
// ranged read per object made a 64 MiB get through MinIO 3,600 GETs of 16
// KiB, ten times slower than rclone's one large read. So once the reads of a
// pack look sequential (an object a little after the last one asked for in
// the same pack, or its first object), Get reads a span of the pack,
// Options.ReadAhead bytes from the object it wants, in one ranged read; the
// Gets for objects inside a span (in flight or read) take their bytes from
// it. A lone or random Get still reads just its object (unless it is a
// pack's first one). Spans live in memory only while they are being consumed: a
// span is dropped once each of its objects was taken, and the oldest are
// dropped beyond 4·ReadAhead bytes. Every object is verified against its
// ID by Get as before.

import (
	"context"
	"slices"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// span is a byte range of one pack read (or being read) in one request.
type span struct {
	pack     cairn.ID
	off, end int64 // [off, end) of the pack
	left     int   // objects in it not taken yet
	done     chan struct{}
	data     []byte
	err      error
}

// readAhead is the state of span reads. Guarded by Store.raMu.
type readAhead struct {
	spans []*span          // oldest first
	bytes int64            // of the spans held
	last  map[cairn.ID]int // per pack, the last object index asked for
}

// seqWindow: an object whose index is at most this many after the last one
// asked for in its pack (concurrent readers arrive a little out of order)
// counts as a sequential read.
const seqWindow = 16

// readObject returns the bytes of object r.i of pack r.p: from a span
// covering it, or by a span read when the pack is read sequentially, or by
// a ranged read of the object alone.
func (s *Store) readObject(ctx context.Context, r ref) ([]byte, error) {
	o := r.p.objs[r.i]
	ra := int64(s.opts.ReadAhead)
	if ra <= 0 || s.rr == nil || o.n >= ra {
		return s.readRange(ctx, r.p.id, o.off, o.n)
	}
	s.raMu.Lock()
	if sp := s.ra.covering(r.p.id, o.off, o.n); sp != nil {
		s.raMu.Unlock()
		return s.fromSpan(ctx, sp, r)
	}
	if s.ra.last == nil || len(s.ra.last) > 4096 {
		s.ra.last = map[cairn.ID]int{}
	}
	prev, seen := s.ra.last[r.p.id]
	s.ra.last[r.p.id] = r.i
	// A pack's first object starts a run too: a file read in order enters
	// each of its packs there (a random read lands there 1 time in the
	// objects per pack).
	if !(seen && r.i > prev && r.i <= prev+seqWindow) && r.i != 0 {
		s.raMu.Unlock()
		return s.readRange(ctx, r.p.id, o.off, o.n)
	}
	// Whole objects from r.i on, up to ra bytes, stopping before a span
	// already read or in flight further on in the pack.
	limit := o.off + ra
	for _, sp := range s.ra.spans {
		if sp.pack == r.p.id && sp.off > o.off {
			limit = min(limit, sp.off)
		}
	}
	end, j := o.off+o.n, r.i+1
	for ; j < len(r.p.objs); j++ {
		x := r.p.objs[j]
		if x.off != end || x.off+x.n > limit {
			break
		}
		end = x.off + x.n
	}
	sp := &span{pack: r.p.id, off: o.off, end: end, left: j - r.i, done: make(chan struct{})}
	s.ra.last[r.p.id] = j - 1 // the object after the span continues the run
	s.ra.spans = append(s.ra.spans, sp)
	s.ra.bytes += end - o.off
	for s.ra.bytes > 4*ra && len(s.ra.spans) > 1 {
		s.ra.drop(s.ra.spans[0])
	}
	s.raMu.Unlock()
	sp.data, sp.err = s.readRange(ctx, r.p.id, sp.off, sp.end-sp.off)
	close(sp.done)
	if sp.err != nil {
		s.raMu.Lock()
		s.ra.drop(sp)
		s.raMu.Unlock()
		return nil, sp.err
	}
	return s.fromSpan(ctx, sp, r)
}

// fromSpan waits for sp and copies object r out of it; if the span's read
// failed, it reads the object alone.
func (s *Store) fromSpan(ctx context.Context, sp *span, r ref) ([]byte, error) {
	select {
	case <-sp.done:
	case <-ctx.Done():
		return nil, store.CtxErr(ctx, "get", "")
	}
	o := r.p.objs[r.i]
	if sp.err != nil {
		return s.readRange(ctx, r.p.id, o.off, o.n)
	}
	data := slices.Clone(sp.data[o.off-sp.off : o.off-sp.off+o.n])
	s.raMu.Lock()
	if sp.left--; sp.left <= 0 {
		s.ra.drop(sp)
	}
	s.raMu.Unlock()
	return data, nil
}

// covering returns a span of pack that holds [off, off+n), or nil.
func (a *readAhead) covering(pack cairn.ID, off, n int64) *span {
	for _, sp := range a.spans {
		if sp.pack == pack && sp.off <= off && off+n <= sp.end {
			return sp
		}
	}
	return nil
}

// drop forgets sp (readers already holding it still use its bytes).
func (a *readAhead) drop(sp *span) {
	if i := slices.Index(a.spans, sp); i >= 0 {
		a.spans = slices.Delete(a.spans, i, i+1)
		a.bytes -= sp.end - sp.off
	}
}
