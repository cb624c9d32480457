package packstore

// Group commit: Puts append to the open batch, which becomes a pack when it
// is sealed (full, lingered, flushed) and stored by an upload goroutine.

import (
	"context"
	"fmt"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// batch is a pack being filled or stored. Its fields are guarded by
// Store.mu until done is closed; err is set before.
type batch struct {
	buf      []byte // header, then the objects' bytes
	objs     []obj
	at       map[cairn.ID]int // index in objs
	tombs    []tomb
	reserved int64 // bytes of Store.budget held until the batch is done
	waiters  int   // Puts waiting for it
	keep     bool  // holds deferred objects or tombstones: a failure goes to Store.lost
	ready    bool  // lingered while every upload slot was busy: seal at the next free slot
	timer    *time.Timer
	done     chan struct{}
	err      error
}

// size is the size of the pack the batch would make now.
func (b *batch) size() int {
	return len(b.buf) + len(b.objs)*entrySize + len(b.tombs)*tombSize + trailerSize
}

// addObject appends an object. A batch starts with 1 MiB of room; the
// first object that does not fit grows it at once to a whole pack's size
// (packSize: the objects, the index and the trailer of a pack sealed when
// full), so a full pack is copied once more at most, not at every doubling
// (growslice copied about a pack's size per pack of a 1 GiB put), and
// appending the index does not copy it again.
func (b *batch) addObject(id cairn.ID, data []byte, packSize int) {
	if need := len(b.buf) + len(data); need > cap(b.buf) {
		index := (len(b.objs)+1)*entrySize + len(b.tombs)*tombSize + trailerSize
		grown := make([]byte, len(b.buf), max(need+index, packSize+packSize/64))
		copy(grown, b.buf)
		b.buf = grown
	}
	b.at[id] = len(b.objs)
	b.objs = append(b.objs, obj{id: id, off: int64(len(b.buf)), n: int64(len(data))})
	b.buf = append(b.buf, data...)
}

// object returns a copy of a pending object's bytes. Store.mu held.
func (b *batch) object(id cairn.ID) []byte {
	o := b.objs[b.at[id]]
	return append([]byte(nil), b.buf[o.off:o.off+o.n]...)
}

// wait waits until the batch is stored, for a Put of id.
func (b *batch) wait(ctx context.Context, op string, id cairn.ID) error {
	select {
	case <-b.done:
		if b.err != nil {
			return cairn.E(op, cairn.KindOf(b.err), id.String(), b.err)
		}
		return nil
	case <-ctx.Done():
		return store.CtxErr(ctx, op, id.String())
	}
}

// openLocked returns the open batch, making one if needed.
func (s *Store) openLocked() *batch {
	if s.open == nil {
		s.open = &batch{
			buf:  append(make([]byte, 0, min(s.opts.PackSize, 1<<20)), newHeader()...),
			at:   map[cairn.ID]int{},
			done: make(chan struct{}),
		}
		s.flying[s.open] = struct{}{}
	}
	return s.open
}

// How long a batch may stay open once something was added to it.
type lingerMode int

const (
	lingerNo         lingerMode = iota // deferred objects: until full or flushed
	lingerWaiter                       // a Put waits: linger if other Puts are under way
	lingerTombstones                   // tombstones: linger, so a collector's deletes share packs
)

// filledLocked is called after something was added to the open batch b (or
// a Put began waiting for it): it seals b when full, and otherwise may start
// its linger timer. A batch that every Put under way waits for does not
// linger: nobody else could join it (so a lone sequential writer never
// waits Linger for nothing); it is sealed as soon as an upload slot is free.
func (s *Store) filledLocked(b *batch, mode lingerMode) {
	switch {
	case b.size() >= s.opts.PackSize:
		s.sealLocked(b)
	case b.ready:
	case mode == lingerWaiter && int64(b.waiters) >= s.active.Load():
		s.lingeredLocked(b)
	case mode == lingerNo || b.timer != nil:
	case s.opts.Linger == 0:
		s.lingeredLocked(b)
	default:
		b.timer = time.AfterFunc(s.opts.Linger, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.lingeredLocked(b)
		})
	}
}

// lingeredLocked seals b if it is still open and an upload slot is free;
// otherwise b stays open, growing, until a slot frees.
func (s *Store) lingeredLocked(b *batch) {
	if s.open != b {
		return
	}
	if s.uploads < s.opts.MaxUploads {
		s.sealLocked(b)
	} else {
		b.ready = true
	}
}

// sealLocked closes b (the open batch) to new objects and starts storing it,
// or queues it while every upload slot is busy.
func (s *Store) sealLocked(b *batch) {
	if s.open == b {
		s.open = nil
	}
	if b.timer != nil {
		b.timer.Stop()
	}
	if s.uploads < s.opts.MaxUploads {
		s.uploads++
		go s.upload(b)
	} else {
		s.queue = append(s.queue, b)
	}
}

// upload stores b, then the next batch waiting for a slot, until none is.
func (s *Store) upload(b *batch) {
	for b != nil {
		data := appendIndex(b.buf, int64(len(b.buf)), b.objs, b.tombs)
		id := cairn.ID(blake3.Sum256(data))
		err := s.bPutHashed(s.life, id, data)
		if err != nil {
			err = fmt.Errorf("storing a pack of %d objects and %d tombstones: %w", len(b.objs), len(b.tombs), err)
		}
		s.mu.Lock()
		if err == nil {
			s.learnPackLocked(&pack{id: id, size: int64(len(data)), objs: b.objs, tombs: b.tombs})
		} else {
			if b.keep && s.lost == nil {
				s.lost = cairn.E("flush", cairn.KindOf(err), "", err)
			}
			// Those deletes did not happen: another device may go on
			// using the objects, so a later repack here must keep them.
			for _, t := range b.tombs {
				s.idx.unkill(t)
			}
		}
		for _, o := range b.objs {
			if s.pending[o.id] == b {
				delete(s.pending, o.id)
			}
		}
		delete(s.flying, b)
		b.err = err
		b.buf = nil
		close(b.done)
		s.budget.Release(b.reserved)
		b = s.nextLocked()
		s.mu.Unlock()
	}
}

// nextLocked hands the caller's upload slot to the next batch waiting for
// one, or frees it.
func (s *Store) nextLocked() *batch {
	if len(s.queue) > 0 {
		b := s.queue[0]
		s.queue = s.queue[1:]
		return b
	}
	if b := s.open; b != nil && b.ready {
		s.open = nil
		if b.timer != nil {
			b.timer.Stop()
		}
		return b
	}
	s.uploads--
	return nil
}
