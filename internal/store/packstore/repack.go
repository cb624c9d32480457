package packstore

// Repacking (garbage collection of packs) and verification.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// RepackReport says what Repack did.
type RepackReport struct {
	PacksRewritten int   // old packs deleted after their live content was stored anew
	PacksWritten   int   // new packs stored
	ObjectsMoved   int   // live objects copied into new packs
	Duplicates     int   // live objects dropped because another pack holds them too
	TombstonesKept int   // tombstones copied into new packs (their target still exists)
	PacksDamaged   int   // packs left as they are: an object in them failed verification
	BytesBefore    int64 // bytes of the packs deleted
	BytesAfter     int64 // bytes of the packs written
	BytesReclaimed int64 // BytesBefore - BytesAfter
}

// Compact repacks with DefaultRepackThreshold and returns the bytes
// reclaimed (store.Compacter; `cairn gc` calls it after deleting).
func (s *Store) Compact(ctx context.Context) (int64, error) {
	rep, err := s.Repack(ctx, DefaultRepackThreshold)
	return rep.BytesReclaimed, err
}

// Repack rewrites every pack whose useful fraction (bytes of live objects
// plus tombstones that still name a pack, over the pack's size) is below
// threshold: the live objects and those tombstones go into new packs, which
// are stored and indexed before the old packs are deleted. A crash at any
// point loses nothing: an object is in an old pack, a new one or both
// (both is a duplicate, which the next Repack drops). A tombstone dropped
// because its target pack is being deleted can, after a crash, leave that
// target's dead copy live again: a deleted object comes back, never a live
// one lost. Repack first flushes (so tombstones are stored) and lists the
// backing store. Deletes wait while it runs; Put, Get and Has do not.
// Only one Repack may run at a time across every device sharing the
// backing store.
func (s *Store) Repack(ctx context.Context, threshold float64) (RepackReport, error) {
	const op = "repack"
	var rep RepackReport
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return rep, err
	}
	if !(threshold >= 0 && threshold <= 1) {
		return rep, cairn.E(op, cairn.Invalid, "", fmt.Errorf("threshold %v is not a fraction", threshold))
	}
	s.delMu.Lock()
	defer s.delMu.Unlock()
	if err := s.Flush(ctx); err != nil {
		return rep, err
	}
	if err := s.refresh(ctx, s.refreshMark()); err != nil {
		return rep, err
	}

	// Select until nothing changes: deleting a pack makes the tombstones
	// naming it useless, which may bring their packs below threshold.
	s.mu.Lock()
	var sel []*pack
	selected := map[cairn.ID]bool{}
	for more := true; more; {
		more = false
		for _, p := range s.idx.packs {
			if !selected[p.id] && float64(s.usefulLocked(p, selected)) < threshold*float64(p.size) {
				sel = append(sel, p)
				selected[p.id] = true
				more = true
			}
		}
	}
	s.mu.Unlock()
	slices.SortFunc(sel, func(a, b *pack) int { return cmp.Compare(a.seq, b.seq) })

	w := &packWriter{s: s}
	var rewritten []*pack
	copied := map[cairn.ID]bool{}
	for _, p := range sel {
		// What of p is worth keeping.
		s.mu.Lock()
		var keep []int
		for i, o := range p.objs {
			if p.dead[i] {
				continue
			}
			if copied[o.id] || s.heldElsewhereLocked(o.id, selected) {
				rep.Duplicates++
				continue
			}
			keep = append(keep, i)
		}
		s.mu.Unlock()
		if len(keep) > 0 {
			data, err := s.bGet(ctx, p.id)
			switch {
			case cairn.KindOf(err) == cairn.NotFound:
				continue // deleted meanwhile (by another device's repack): nothing to do
			case err != nil:
				return rep, err
			}
			if err := checkObjects(data, p, keep); err != nil {
				s.log.Warn("repack: pack left as it is", "pack", p.id.String(), "err", err)
				rep.PacksDamaged++
				continue
			}
			for _, i := range keep {
				o := p.objs[i]
				if err := w.add(ctx, o.id, data[o.off:o.off+o.n]); err != nil {
					return rep, err
				}
				copied[o.id] = true
				rep.ObjectsMoved++
			}
		}
		rewritten = append(rewritten, p)
	}
	// Tombstones whose target stays (known, and not deleted below) are
	// still needed. A pack of tombstones only, all still needed, is left
	// as it is (its target was selected, but could not be rewritten).
	deleting := map[cairn.ID]bool{}
	for _, p := range rewritten {
		deleting[p.id] = true
	}
	s.mu.Lock()
	kept := rewritten[:0]
	for _, p := range rewritten {
		if len(p.objs) == 0 && len(p.tombs) > 0 && s.usefulLocked(p, deleting) == int64(len(p.tombs))*tombSize {
			delete(deleting, p.id) // no tombstone names it: it holds no copies
			continue
		}
		kept = append(kept, p)
	}
	rewritten = kept
	var carry []tomb
	for _, p := range rewritten {
		for _, t := range p.tombs {
			if _, ok := s.idx.packs[t.target]; ok && !deleting[t.target] {
				carry = append(carry, t)
			}
		}
	}
	s.mu.Unlock()
	for _, t := range slicesCompact(carry) {
		if err := w.addTomb(ctx, t); err != nil {
			return rep, err
		}
		rep.TombstonesKept++
	}
	if err := w.flush(ctx); err != nil {
		return rep, err
	}
	rep.PacksWritten, rep.BytesAfter = w.packs, w.bytes
	if err := s.step("stored"); err != nil {
		return rep, err
	}

	// Packs holding tombstones go last, so that a crash between deletes
	// leaves tombstones whose target is gone rather than live dead copies.
	slices.SortStableFunc(rewritten, func(a, b *pack) int { return min(len(a.tombs), 1) - min(len(b.tombs), 1) })
	for _, p := range rewritten {
		if err := s.bDelete(ctx, p.id); err != nil {
			return rep, err
		}
		s.mu.Lock()
		s.gone[p.id] = struct{}{}
		if cur := s.idx.packs[p.id]; cur != nil {
			s.forgetPackLocked(cur)
		}
		s.mu.Unlock()
		rep.PacksRewritten++
		rep.BytesBefore += p.size
		rep.BytesReclaimed = rep.BytesBefore - rep.BytesAfter
		if err := s.step("deleted"); err != nil {
			return rep, err
		}
	}
	s.mu.Lock()
	if s.disk != nil && s.disk.worthCompacting() {
		s.noteLogErr(s.disk.rewrite(&s.idx))
	}
	s.mu.Unlock()
	return rep, nil
}

// usefulLocked is what repacking p would keep: its live objects' bytes and
// its tombstones that name a pack not about to be deleted.
func (s *Store) usefulLocked(p *pack, deleting map[cairn.ID]bool) int64 {
	n := p.liveB
	for _, t := range p.tombs {
		if _, ok := s.idx.packs[t.target]; ok && !deleting[t.target] {
			n += tombSize
		}
	}
	return n
}

// slicesCompact removes repeated tombstones (two old packs may carry the
// same one after an interrupted repack).
func slicesCompact(ts []tomb) []tomb {
	seen := map[tomb]bool{}
	out := ts[:0]
	for _, t := range ts {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// heldElsewhereLocked reports whether a pack that is not being rewritten
// holds a good live copy of id.
func (s *Store) heldElsewhereLocked(id cairn.ID, selected map[cairn.ID]bool) bool {
	for _, r := range s.idx.copies[id] {
		if _, bad := s.bad[r]; r.live() && !bad && !selected[r.p.id] {
			return true
		}
	}
	_, plain := s.idx.plain[id]
	return plain
}

// step calls the test hook, if any, between repack steps.
func (s *Store) step(name string) error {
	if s.hook != nil {
		return s.hook(name)
	}
	return nil
}

// checkObjects verifies the objects keep of pack p in data, the whole pack.
func checkObjects(data []byte, p *pack, keep []int) error {
	if int64(len(data)) != p.size {
		return fmt.Errorf("pack has %d bytes, its index says %d", len(data), p.size)
	}
	for _, i := range keep {
		o := p.objs[i]
		if cairn.ID(blake3.Sum256(data[o.off:o.off+o.n])) != o.id {
			return fmt.Errorf("object %s does not hash to its ID", o.id.Short())
		}
	}
	return nil
}

// packWriter builds the new packs of a repack and stores each when full.
type packWriter struct {
	s     *Store
	buf   []byte
	objs  []obj
	tombs []tomb
	packs int
	bytes int64
}

func (w *packWriter) size() int {
	return len(w.buf) + len(w.objs)*entrySize + len(w.tombs)*tombSize + trailerSize
}

func (w *packWriter) add(ctx context.Context, id cairn.ID, data []byte) error {
	if w.buf == nil {
		w.buf = newHeader()
	}
	w.objs = append(w.objs, obj{id: id, off: int64(len(w.buf)), n: int64(len(data))})
	w.buf = append(w.buf, data...)
	if w.size() >= w.s.opts.PackSize {
		return w.flush(ctx)
	}
	return nil
}

func (w *packWriter) addTomb(ctx context.Context, t tomb) error {
	if w.buf == nil {
		w.buf = newHeader()
	}
	w.tombs = append(w.tombs, t)
	if w.size() >= w.s.opts.PackSize {
		return w.flush(ctx)
	}
	return nil
}

// flush stores the pack being built, if any, and indexes it.
func (w *packWriter) flush(ctx context.Context) error {
	if w.buf == nil {
		return nil
	}
	data := appendIndex(w.buf, int64(len(w.buf)), w.objs, w.tombs)
	id := cairn.ID(blake3.Sum256(data))
	if err := w.s.bPut(ctx, id, data); err != nil {
		return err
	}
	w.s.mu.Lock()
	w.s.learnPackLocked(&pack{id: id, size: int64(len(data)), objs: w.objs, tombs: w.tombs})
	w.s.mu.Unlock()
	w.packs++
	w.bytes += int64(len(data))
	w.buf, w.objs, w.tombs = nil, nil, nil
	return nil
}

// Verify reads every pack and plain object whole and checks every live
// object against its ID (store.Verifier). A pack whose index cannot be
// read is reported under the pack's own ID.
func (s *Store) Verify(ctx context.Context, fn func(id cairn.ID, err error)) error {
	const op = "verify"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return err
	}
	if err := s.refresh(ctx, s.refreshMark()); err != nil {
		return err
	}
	s.mu.Lock()
	packs := make([]*pack, 0, len(s.idx.packs))
	for _, p := range s.idx.packs {
		packs = append(packs, p)
	}
	var plain, damaged []cairn.ID
	for id := range s.idx.plain {
		plain = append(plain, id)
	}
	for id := range s.idx.damaged {
		damaged = append(damaged, id)
	}
	s.mu.Unlock()
	for _, id := range damaged {
		fn(id, cairn.E(op, cairn.Corrupt, id.String(), errors.New("a pack whose index cannot be read")))
	}
	for _, p := range packs {
		if err := store.CtxErr(ctx, op, ""); err != nil {
			return err
		}
		s.mu.Lock()
		var live []int
		for i := range p.objs {
			if !p.dead[i] {
				live = append(live, i)
			}
		}
		s.mu.Unlock()
		if len(live) == 0 {
			continue
		}
		data, err := s.bGet(ctx, p.id)
		switch k := cairn.KindOf(err); {
		case k == cairn.NotFound:
			continue // repacked meanwhile
		case k == cairn.Canceled:
			return err
		case err != nil:
			for _, i := range live {
				fn(p.objs[i].id, cairn.E(op, k, p.objs[i].id.String(), fmt.Errorf("pack %s: %w", p.id.Short(), err)))
			}
			continue
		}
		for _, i := range live {
			o := p.objs[i]
			if int64(len(data)) < o.off+o.n || cairn.ID(blake3.Sum256(data[o.off:o.off+o.n])) != o.id {
				fn(o.id, cairn.E(op, cairn.Corrupt, o.id.String(), fmt.Errorf("pack %s at [%d, +%d): data does not hash to its ID", p.id.Short(), o.off, o.n)))
			}
		}
	}
	for _, id := range plain {
		if err := store.CtxErr(ctx, op, ""); err != nil {
			return err
		}
		_, err := s.bGet(ctx, id)
		switch k := cairn.KindOf(err); {
		case err == nil, k == cairn.NotFound:
		case k == cairn.Canceled:
			return err
		default:
			fn(id, err)
		}
	}
	return store.CtxErr(ctx, op, "")
}
