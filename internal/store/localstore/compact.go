package localstore

import (
	"context"
	"fmt"
	"os"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/store"
)

// Compact rewrites the sealed packs whose live records take less than
// Options.CompactBelow of their size, and removes them. It is crash-safe:
// the new packs are fsync'd and indexed before any old pack is removed, so a
// crash leaves each live object in an old pack, a new one, or both (a
// harmless duplicate, reclaimed later). Tombstones move along with the live
// records while the pack they target exists; deleted objects are not copied.
//
// Compact excludes Delete (in every process sharing the directory, through
// an flock on dir/lock) and List and Verify in this process; Put, Get and Has
// go on. The pack this process is appending to is sealed first so that it
// can be compacted too. It returns the bytes freed on disk.
func (s *Store) Compact(ctx context.Context) (int64, error) {
	const op = "compact"
	if err := store.CtxErr(ctx, op, s.dir); err != nil {
		return 0, err
	}
	if s.closed.Load() {
		return 0, cairn.E(op, cairn.Invalid, s.dir, errClosed)
	}
	s.layoutMu.Lock()
	defer s.layoutMu.Unlock()
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	if err := lockWait(ctx, s.lockF, lockEX); err != nil {
		if ctx.Err() != nil {
			return 0, store.CtxErr(ctx, op, s.dir)
		}
		return 0, cairn.E(op, cairn.IO, s.dir, err)
	}
	defer unlock(s.lockF)

	// Seal the pack we are appending to, so that its garbage counts too.
	r := &writeReq{kind: kindRotate, done: make(chan struct{})}
	s.reqs <- r
	<-r.done
	if r.err != nil {
		return 0, cairn.E(op, cairn.IO, s.dir, r.err)
	}
	if err := s.refresh(ctx, s.refreshStarted.Load()); err != nil {
		return 0, err
	}

	cands := s.candidates()
	if len(cands) == 0 {
		return 0, nil
	}
	inSet := map[uint32]bool{}
	for _, p := range cands {
		inSet[p.slot] = true
	}
	out := &packOut{s: s}
	keep := map[*pack]bool{}
	for _, p := range cands {
		if err := s.copyLive(ctx, p, inSet, out, keep); err != nil {
			out.abandon()
			return 0, err
		}
	}
	if err := out.finish(); err != nil {
		out.abandon()
		return 0, cairn.E(op, cairn.IO, s.dir, err)
	}

	// The copies are durable and indexed: switch over, then remove.
	var freed int64
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	s.mu.Lock()
	for _, o := range out.done {
		s.installFrom(o, 0, 0)
		freed -= o.packSize + o.idxSize
	}
	var gone []*pack
	for _, p := range cands {
		if !keep[p] {
			s.uninstall(p)
			gone = append(gone, p)
			freed += p.packSize + p.idxSize
		}
	}
	s.mu.Unlock()
	var err error
	for _, p := range gone {
		// Pack first: an index without its pack is recognised as a leftover.
		if e := os.Remove(s.packPath(p.id)); e != nil && err == nil {
			err = e
		}
		if e := os.Remove(s.idxPath(p.id)); e != nil && !os.IsNotExist(e) && err == nil {
			err = e
		}
	}
	if s.sync {
		if e := durable.SyncDir(s.packDir); e != nil && err == nil {
			err = e
		}
	}
	s.mu.Lock()
	for _, p := range gone {
		delete(s.killed, p.id)
		s.closePack(p)
	}
	s.mu.Unlock()
	s.log.Info("compacted", "packs", len(gone), "new_packs", len(out.done), "freed", freed)
	if err != nil {
		return freed, cairn.E(op, cairn.IO, s.dir, err)
	}
	return freed, nil
}

// candidates returns the sealed packs worth rewriting.
func (s *Store) candidates() []*pack {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var c []*pack
	for _, p := range s.packs {
		if p == nil || p.state != stateSealed {
			continue
		}
		live := p.live + packHeaderSize
		for _, t := range p.tombs {
			if s.byID[t.target] != nil {
				live += recHeaderSize + tombSize
			}
		}
		if float64(live) < s.opts.CompactBelow*float64(p.packSize) {
			c = append(c, p)
		}
	}
	return c
}

// copyLive copies the records of p that must survive into out. A record is
// copied if it is its object's canonical copy and no other live copy lies
// outside the packs being compacted; a tombstone is copied if the pack it
// targets still exists. If no good copy of a live object can be read, p is
// kept.
func (s *Store) copyLive(ctx context.Context, p *pack, inSet map[uint32]bool, out *packOut, keep map[*pack]bool) error {
	s.mu.RLock()
	n := p.n()
	tombs := p.tombs
	s.mu.RUnlock()
	for ord := range n {
		if ord%1024 == 0 {
			if err := store.CtxErr(ctx, "compact", s.dir); err != nil {
				return err
			}
		}
		s.mu.RLock()
		e := p.entries[ord*idxEntrySize:]
		id, val := *entryID(e), loc(p.slot, ord)
		var locs []uint64
		if s.isCanonical(&id, val) {
			locs = s.locations(&id)
		}
		s.mu.RUnlock()
		if locs == nil {
			continue // dead, or a duplicate of a copy elsewhere
		}
		survives := false
		for _, l := range locs[1:] {
			if !inSet[uint32(l>>32)] {
				survives = true
			}
		}
		if survives {
			continue
		}
		data, ok := s.readGood(id, locs)
		if !ok {
			s.log.Error("no good copy of a live object; keeping its pack", "id", id.String(), "pack", p.id.String())
			keep[p] = true
			continue
		}
		if err := out.add(kindData, id, data, packID{}, 0); err != nil {
			return cairn.E("compact", cairn.IO, s.dir, err)
		}
	}
	for _, t := range tombs {
		s.mu.RLock()
		exists := s.byID[t.target] != nil
		s.mu.RUnlock()
		if !exists {
			if _, err := os.Stat(s.packPath(t.target)); err == nil {
				exists = true
			}
		}
		if exists {
			if err := out.add(kindTomb, t.id, nil, t.target, t.tOff); err != nil {
				return cairn.E("compact", cairn.IO, s.dir, err)
			}
		}
	}
	return nil
}

// readGood returns the first copy among locs that verifies.
func (s *Store) readGood(id cairn.ID, locs []uint64) ([]byte, bool) {
	for _, l := range locs {
		s.mu.RLock()
		if !s.isLive(&id, l) {
			s.mu.RUnlock()
			continue
		}
		buf, err := s.readAt(id, l)
		s.mu.RUnlock()
		if err == nil {
			if err = checkRecord(id, buf); err == nil {
				return buf[recHeaderSize:], true
			}
		}
		s.log.Warn("damaged copy skipped by compaction", "id", id.String(), "err", err)
	}
	return nil, false
}

// packOut writes the packs a compaction produces. Its packs are registered
// (so that discovery leaves them alone) but their entries are installed only
// once they are sealed.
type packOut struct {
	s    *Store
	p    *pack
	buf  []byte
	done []*pack
}

func (o *packOut) add(kind byte, id cairn.ID, data []byte, target packID, tOff int64) error {
	s := o.s
	size := int64(recHeaderSize + len(data))
	if kind == kindTomb {
		size = recHeaderSize + tombSize
	}
	if o.p != nil && o.p.records > 0 && o.p.end+int64(len(o.buf))+size > s.opts.PackSize {
		if err := o.seal(); err != nil {
			return err
		}
	}
	if o.p == nil {
		p, err := s.createPack()
		if err != nil {
			return err
		}
		o.p = p
	}
	p := o.p
	off := p.end + int64(len(o.buf))
	s.mu.Lock()
	if kind == kindData {
		o.buf = appendRecHeader(o.buf, kindData, id, len(data))
		o.buf = append(o.buf, data...)
		var e [idxEntrySize]byte
		putEntry(e[:], id, off, uint32(len(data)))
		p.entries = append(p.entries, e[:]...)
	} else {
		o.buf = appendRecHeader(o.buf, kindTomb, id, tombSize)
		o.buf = appendTombPayload(o.buf, target, tOff)
		p.tombs = append(p.tombs, tomb{id: id, off: off, target: target, tOff: tOff})
	}
	s.mu.Unlock()
	p.records++
	if len(o.buf) >= 4<<20 {
		return o.flush()
	}
	return nil
}

func (o *packOut) flush() error {
	if len(o.buf) == 0 {
		return nil
	}
	p := o.p
	if _, err := p.f.WriteAt(o.buf, p.end); err != nil {
		return fmt.Errorf("pack %s: %w", p.id, err)
	}
	o.s.mu.Lock()
	p.end += int64(len(o.buf))
	p.packSize = p.end
	o.s.mu.Unlock()
	o.buf = o.buf[:0]
	return nil
}

func (o *packOut) seal() error {
	if err := o.flush(); err != nil {
		return err
	}
	if err := o.s.seal(o.p); err != nil {
		return err
	}
	o.done = append(o.done, o.p)
	o.p = nil
	return nil
}

func (o *packOut) finish() error {
	if o.p == nil {
		return nil
	}
	return o.seal()
}

// abandon removes the packs of a compaction that failed before switching
// over; nothing refers to them.
func (o *packOut) abandon() {
	s := o.s
	if o.p != nil {
		o.done = append(o.done, o.p)
	}
	for _, p := range o.done {
		s.mu.Lock()
		s.uninstall(p)
		s.closePack(p)
		s.mu.Unlock()
		os.Remove(s.packPath(p.id))
		os.Remove(s.idxPath(p.id))
	}
}
