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
// pack's first one).
//
// One span at a time still left a large read latency-bound: the reader
// reaches the end of a span before the next is asked for (a 1 GiB get from
// MinIO ran at 0.37× rclone's 4 parallel streams). So once a run has gone
// a quarter of the way into a span (a short file's few objects never do),
// the next Options.ReadAheadSpans-1 spans of the same pack are read too, in
// the background: a sequential reader keeps that many ranged reads in
// flight, each started as its predecessor is entered.
//
// Spans live in memory only while they are being consumed: a span is
// dropped once each of its objects was taken, and the oldest are dropped
// beyond max(4, 2·ReadAheadSpans)·ReadAhead bytes. Every object is
// verified against its ID by Get as before.
//
// An object is handed out of its span without a copy (a 1 GiB read used
// to copy every byte once more): the Get that takes it first receives the
// span's own bytes for it, capacity cut at its end, so whatever the caller
// does with them touches no other object. Those bytes are never handed out
// again: a second Get of the same object while the span lives reads it
// alone.
//
// A span's buffer is reused for a later span (Store.spans, spanbuf.go) when the
// backing store can read into a given buffer (store.RangeFiller) and every
// object handed out of it was lent (store.Lend) and given back: a 1 GiB
// get through the pipeline then touches a few spans' worth of memory
// instead of 1 GiB of fresh heap. The span is recycled once it is out of
// the read-ahead list, its read is over, and no Get uses it (users: Gets
// waiting on it or taking from it, and loans not given back yet). An
// object handed to a Get that cannot give it back keeps the buffer from
// reuse (the garbage collector frees it).

import (
	"context"
	"slices"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// span is a byte range of one pack read (or being read) in one request.
type span struct {
	pack     cairn.ID
	p        *pack
	off, end int64  // [off, end) of the pack
	first    int    // index of the span's first object
	next     int    // index of the first object after the span
	left     int    // objects in it not taken yet
	taken    []bool // per object from first: handed to a Get already
	ahead    bool   // the spans after it were started (aheadLocked)
	done     chan struct{}
	data     []byte // set with err under raMu by readSpan, before done is closed
	err      error

	// Reuse of the buffer (see the package comment above), under raMu.
	buf     *spanBuf // from Store.spans; nil: not to be reused
	users   int      // Gets waiting on or taking from it, loans out
	read    bool     // the read is over (data or err set)
	dropped bool     // out of readAhead.spans
	keep    bool     // bytes went to a Get that gives nothing back
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
//
// giveBack is nil unless the bytes were lent (see the package comment):
// the caller then either hands them on with store.Lend or, if it does not
// return them, calls giveBack itself.
func (s *Store) readObject(ctx context.Context, r ref) (data []byte, giveBack func(), err error) {
	o := r.p.objs[r.i]
	ra := int64(s.opts.ReadAhead)
	if ra <= 0 || s.rr == nil || o.n >= ra {
		data, err := s.readRange(ctx, r.p.id, o.off, o.n)
		return data, nil, err
	}
	s.raMu.Lock()
	if sp := s.ra.covering(r.p.id, o.off, o.n); sp != nil {
		sp.users++ // before aheadLocked: the spans it adds may push sp out
		ahead := s.aheadLocked(sp, o.off)
		s.raMu.Unlock()
		s.readSpans(ahead)
		return s.fromSpan(ctx, sp, r)
	}
	if s.ra.last == nil || len(s.ra.last) > 4096 {
		s.ra.last = map[cairn.ID]int{}
	}
	prev, seen := s.ra.last[r.p.id]
	s.ra.last[r.p.id] = r.i
	// One of a pack's first seqWindow objects starts a run too, with a
	// span from the pack's first object: a file read in order enters each
	// of its packs there, a little out of order (its chunks were packed by
	// concurrent Puts), and the objects before the one asked for are asked
	// for next. A random read lands there seqWindow times in the objects
	// per pack (1,000 for 16 KiB chunks).
	// A Get that says it is part of a read in order (store.WithSequential)
	// starts a span wherever it lands: from the pack's first object when it
	// is the first to enter the pack (its chunks were packed up to a few
	// hundred places out of order), else from its own.
	first := r.i
	switch {
	case seen && r.i > prev && r.i <= prev+seqWindow:
	case !seen && (r.i <= seqWindow || store.Sequential(ctx)):
		first = 0
	case store.Sequential(ctx):
	default:
		s.raMu.Unlock()
		data, err := s.readRange(ctx, r.p.id, o.off, o.n)
		return data, nil, err
	}
	sp := s.spanLocked(r.p, first)
	var before []*span
	if sp.next <= r.i { // a span from 0 that does not reach r.i: read it too
		before = append(before, sp)
		sp = s.spanLocked(r.p, r.i)
	}
	sp.users++
	s.raMu.Unlock()
	s.readSpans(before)
	s.readSpan(ctx, sp)
	if sp.err != nil {
		s.unuse(sp)
		return nil, nil, sp.err
	}
	return s.fromSpan(ctx, sp, r)
}

// spanLocked adds a span of pack p from object i on: whole objects, up to
// ReadAhead bytes, stopping before a span already read or in flight
// further on in the pack. The caller reads it (then calls spanRead).
func (s *Store) spanLocked(p *pack, i int) *span {
	ra := int64(s.opts.ReadAhead)
	o := p.objs[i]
	limit := o.off + ra
	for _, sp := range s.ra.spans {
		if sp.pack == p.id && sp.off > o.off {
			limit = min(limit, sp.off)
		}
	}
	end, j := o.off+o.n, i+1
	for ; j < len(p.objs); j++ {
		x := p.objs[j]
		if x.off != end || x.off+x.n > limit {
			break
		}
		end = x.off + x.n
	}
	sp := &span{pack: p.id, p: p, off: o.off, end: end, first: i, next: j, left: j - i, taken: make([]bool, j-i), done: make(chan struct{})}
	if s.ra.last == nil {
		s.ra.last = map[cairn.ID]int{}
	}
	if last, ok := s.ra.last[p.id]; !ok || last < j-1 {
		s.ra.last[p.id] = j - 1 // the object after the span continues the run
	}
	s.ra.spans = append(s.ra.spans, sp)
	s.ra.bytes += end - o.off
	hold := ra * int64(max(4, 2*s.opts.ReadAheadSpans))
	for s.ra.bytes > hold && len(s.ra.spans) > 1 {
		s.dropLocked(s.ra.spans[0])
	}
	return sp
}

// readSpan reads sp's bytes and publishes them: into a buffer of
// Store.spans when the backing store can fill one, else into the fresh
// bytes a ranged read returns.
func (s *Store) readSpan(ctx context.Context, sp *span) {
	n := sp.end - sp.off
	var (
		data []byte
		buf  *spanBuf
		err  error
	)
	if f, ok := s.rr.(store.RangeFiller); ok && n <= int64(s.opts.ReadAhead) {
		buf = s.spans.get()
		s.nRange.Add(1)
		if err = f.GetRangeInto(ctx, sp.pack, sp.off, buf.b[:n]); err != nil {
			s.spans.put(buf) // seen by no one
			buf = nil
		} else {
			data = buf.b[:n:n]
		}
	} else {
		data, err = s.readRange(ctx, sp.pack, sp.off, n)
	}
	s.raMu.Lock()
	sp.data, sp.buf, sp.err, sp.read = data, buf, err, true
	if err != nil {
		s.dropLocked(sp)
	}
	s.recycleLocked(sp)
	s.raMu.Unlock()
	close(sp.done)
}

// dropLocked takes sp out of the read-ahead list (Gets already holding it
// still use its bytes).
func (s *Store) dropLocked(sp *span) {
	s.ra.drop(sp)
	sp.dropped = true
	s.recycleLocked(sp)
}

// unuse ends one use of sp (a Get that waited on it, or a loan).
func (s *Store) unuse(sp *span) {
	s.raMu.Lock()
	s.unuseLocked(sp)
	s.raMu.Unlock()
}

func (s *Store) unuseLocked(sp *span) {
	sp.users--
	s.recycleLocked(sp)
}

// recycleLocked gives sp's buffer back to Store.spans once nothing can
// touch it any more.
func (s *Store) recycleLocked(sp *span) {
	if !sp.read || sp.buf == nil || sp.keep || !sp.dropped || sp.users > 0 {
		return
	}
	b := sp.buf
	sp.buf, sp.data = nil, nil
	s.spans.put(b)
}

// aheadLocked is called when a Get finds its object at off in sp: once the
// run is a quarter of the way into sp, it adds the ReadAheadSpans-1 spans
// that follow sp in its pack and are not there yet, for readSpans.
func (s *Store) aheadLocked(sp *span, off int64) []*span {
	n := s.opts.ReadAheadSpans
	if n <= 1 || sp.ahead || 4*(off-sp.off) < sp.end-sp.off {
		return nil
	}
	sp.ahead = true
	var out []*span
	cur := sp
	for range n - 1 {
		if cur.next >= len(cur.p.objs) {
			break
		}
		x := cur.p.objs[cur.next]
		if x.n >= int64(s.opts.ReadAhead) {
			break // read alone by its Get
		}
		nxt := s.ra.covering(cur.pack, x.off, x.n)
		if nxt == nil {
			nxt = s.spanLocked(cur.p, cur.next)
			out = append(out, nxt)
		}
		cur = nxt
	}
	return out
}

// readSpans reads spans in the background (under the store's lifetime, not
// a Get's: they serve the Gets to come).
func (s *Store) readSpans(spans []*span) {
	for _, sp := range spans {
		s.bgReads.Go(func() { s.readSpan(s.life, sp) })
	}
}

// fromSpan waits for sp and returns object r's bytes in it (see the
// package comment above: not copied, handed out once); if the span's read
// failed, or the object was taken from it already, it reads the object
// alone. The caller counted itself in sp.users; fromSpan ends that use,
// or turns it into a loan that giveBack ends (non-nil when ctx takes
// loans and sp's buffer is to be reused).
func (s *Store) fromSpan(ctx context.Context, sp *span, r ref) (data []byte, giveBack func(), err error) {
	select {
	case <-sp.done:
	case <-ctx.Done():
		s.unuse(sp)
		return nil, nil, store.CtxErr(ctx, "get", "")
	}
	o := r.p.objs[r.i]
	s.raMu.Lock()
	k := r.i - sp.first
	if sp.err != nil || sp.taken[k] {
		s.unuseLocked(sp)
		s.raMu.Unlock()
		data2, err := s.readRange(ctx, r.p.id, o.off, o.n)
		return data2, nil, err
	}
	sp.taken[k] = true
	if sp.left--; sp.left <= 0 {
		s.dropLocked(sp)
	}
	lo, hi := o.off-sp.off, o.off-sp.off+o.n
	data = sp.data[lo:hi:hi]
	if sp.buf != nil && store.CanLend(ctx) {
		giveBack = sync.OnceFunc(func() { s.unuse(sp) })
	} else {
		sp.keep = true
		s.unuseLocked(sp)
	}
	s.raMu.Unlock()
	return data, giveBack, nil
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
