package ecstore

import (
	"context"
	"fmt"
	"slices"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// RepairOptions choose what Repair does. The zero value retries the queue
// and then walks every object, checking that each member holds its shard
// and the map (from the members' listings: no data read) and rebuilding
// what is missing.
type RepairOptions struct {
	// Store restricts the repair to the shards that belong on this member
	// (`cairn repair --store NAME`).
	Store string
	// Replacement, with Store, is a store that takes Store's place (Store
	// is gone for good): Store's shards are rebuilt onto Replacement, and
	// Store is not read. Reopen the wrapper with Replacement at Store's
	// position afterwards: shard maps name shards, not stores, so nothing
	// else changes.
	Replacement *Named
	// Scrub reads every shard the repair checks and verifies its hash and
	// header, so damaged shards are found too (and rebuilt). It reads all
	// the data.
	Scrub bool
	// QueueOnly retries the queued repairs and skips the walk.
	QueueOnly bool
	// Progress, if set, is called as the walk goes: objects checked of
	// the objects listed.
	Progress func(done, total int)
}

// Repair retries the queued repairs, then (unless QueueOnly) scans the
// members and walks every object, rebuilding each missing or (with Scrub)
// damaged shard from K good ones onto its member (or onto Replacement). It
// returns what it did; its error is for what stopped it (ctx, no member
// listed), not for the repairs that failed, which are counted and queued.
func (s *Store) Repair(ctx context.Context, o RepairOptions) (storeset.RepairReport, error) {
	scanned := false // by repairPut: at most one scan for the queue
	return s.set.Repair(ctx, storeset.Repair{
		Policy: "ec", Store: o.Store, Replacement: o.Replacement, QueueOnly: o.QueueOnly,
		Queue: s.q,
		Put: func(ctx context.Context, t storeset.Task, i int, r *storeset.RepairReport) error {
			return s.repairPut(ctx, t, i, &scanned, r)
		},
		Walk: func(ctx context.Context, target int, r *storeset.RepairReport) error {
			return s.walk(ctx, o, target, r)
		},
	})
}

// repairPut carries out the queued OpPut task t of member i. A task for an
// object the index does not know starts a scan, unless *scanned says one
// was made already.
func (s *Store) repairPut(ctx context.Context, t storeset.Task, i int, scanned *bool, r *storeset.RepairReport) error {
	om := s.idx.get(t.ID)
	if om == nil && !*scanned {
		*scanned = true
		if _, err := s.scan(ctx); err != nil && cairn.KindOf(err) == cairn.Canceled {
			return err
		}
		om = s.idx.get(t.ID)
	}
	if om == nil {
		s.q.Done(t) // deleted meanwhile: nothing to repair
		return nil
	}
	// The shard may have landed after all, be missing, or be damaged:
	// look before rebuilding.
	_, err := s.fetchShard(ctx, om, i, nil)
	switch cairn.KindOf(err) {
	case cairn.Other:
		if err != nil {
			r.Failed++
			return nil
		}
		// Present and good: make sure the map is there too.
		if err = s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
			return st.Put(ctx, om.mapID, om.encode())
		}); err != nil {
			r.Failed++
			return nil
		}
		s.q.Done(t)
	case cairn.NotFound:
		r.Missing++
		s.rebuild(ctx, om, []badShard{{i, cairn.NotFound, err}}, -1, nil, r)
	case cairn.Corrupt:
		r.Corrupt++
		s.rebuild(ctx, om, []badShard{{i, cairn.Corrupt, err}}, -1, nil, r)
	default:
		r.Failed++
	}
	return nil
}

// rebuild reads om from K good shards (never from the members in bad) and
// writes the shards of the members in bad back (member target's onto repl
// when repl is not nil). Failures are counted and, unless onto a
// replacement, queued.
func (s *Store) rebuild(ctx context.Context, om *objMap, bad []badShard, target int, repl cairn.Store, r *storeset.RepairReport) {
	skip := make([]bool, s.n)
	for _, b := range bad {
		skip[b.i] = true
	}
	unknown := 0
	if repl != nil && !skip[target] {
		skip[target] = true
		unknown = 1
	}
	fail := func(b badShard, err error) {
		r.Failed++
		if repl == nil || b.i != target {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)})
		}
		s.log.Warn("ecstore: repair of a shard failed", "store", s.set.Name(b.i), "id", om.id.String(), "err", err)
	}
	shards, more, err := s.read(ctx, "repair", om, skip, unknown)
	if err != nil {
		if k := cairn.KindOf(err); k == cairn.NotFound || k == cairn.Corrupt {
			// Every member answered and fewer than K good shards exist: lost
			// (or the remains of a Put that failed, which said so). Nothing
			// to queue; GC deletes it when nothing refers to it.
			r.Unrecoverable++
			for _, b := range bad {
				s.q.Done(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)})
			}
			s.log.Error("ecstore: object unrecoverable: fewer than K good shards on the stores", "id", om.id.String(), "err", err)
			return
		}
		for _, b := range bad {
			fail(b, err)
		}
		return
	}
	// Shards found bad while reading are rebuilt too, or queued when they
	// are outside this repair's store.
	for _, b := range more {
		if target >= 0 && b.i != target {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)})
			continue
		}
		bad = append(bad, b)
		if b.kind == cairn.Corrupt {
			r.Corrupt++
		} else {
			r.Missing++
		}
	}
	if err := s.enc.Reconstruct(shards); err != nil {
		for _, b := range bad {
			fail(b, err)
		}
		return
	}
	if _, err := s.join("repair", om, shards); err != nil {
		r.Unrecoverable++
		s.log.Error("ecstore: object does not decode to its ID", "id", om.id.String(), "err", err)
		return
	}
	for _, b := range bad {
		var st cairn.Store
		if repl != nil && b.i == target {
			st = repl
		}
		if err := s.writeShard(ctx, om, b.i, st, shards[b.i], b.kind == cairn.Corrupt); err != nil {
			fail(b, err)
			continue
		}
		r.Rebuilt++
		if st == nil {
			s.q.Done(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)})
		}
	}
}

// walk scans the members and checks every object's shards.
func (s *Store) walk(ctx context.Context, o RepairOptions, target int, r *storeset.RepairReport) error {
	l, err := s.scan(ctx)
	if err != nil {
		return err
	}
	all := s.idx.all()
	var onRepl map[cairn.ID]bool
	if o.Replacement != nil {
		var ids []cairn.ID
		for _, om := range all {
			ids = append(ids, om.shards[target], om.mapID)
		}
		if onRepl, err = storeset.HasAll(ctx, o.Replacement.Store, slices.Values(ids)); err != nil {
			return cairn.E("repair", cairn.KindOf(err), "", fmt.Errorf("replacement %s: %w", o.Replacement.Name, err))
		}
	}
	checked := 0
	for _, om := range all {
		if err := store.CtxErr(ctx, "repair", ""); err != nil {
			return err
		}
		r.Objects++
		checked++
		if o.Progress != nil {
			o.Progress(checked, len(all))
		}
		var bad []badShard
		for i := range s.n {
			if target >= 0 && i != target {
				continue
			}
			var st cairn.Store
			var hasShard, hasMap bool
			name := s.set.Name(i)
			switch {
			case o.Replacement != nil && i == target:
				st, name = o.Replacement.Store, o.Replacement.Name
				hasShard, hasMap = onRepl[om.shards[i]], onRepl[om.mapID]
			case !l.ok[i]:
				r.Failed++ // cannot tell what it holds
				continue
			default:
				_, hasShard = l.objs[i][om.shards[i]]
				_, hasMap = l.objs[i][om.mapID]
			}
			kind := cairn.Other
			var ferr error
			if hasShard && o.Scrub {
				_, ferr = s.fetchShard(ctx, om, i, st)
				switch k := cairn.KindOf(ferr); {
				case ferr == nil:
				case k == cairn.NotFound || k == cairn.Corrupt:
					kind = k
				default:
					r.Failed++
					continue
				}
			} else if !hasShard {
				kind = cairn.NotFound
			}
			switch kind {
			case cairn.NotFound:
				r.Missing++
			case cairn.Corrupt:
				r.Corrupt++
			default:
				if !hasMap {
					// The shard is there but not the map: put the map back.
					r.Missing++
					if err := s.putMap(ctx, om, i, st); err != nil {
						r.Failed++
					} else {
						r.Rebuilt++
					}
				}
				continue
			}
			s.set.Report(storeset.Fault{Store: name, ID: om.id, Stored: om.shards[i], Kind: kind, Err: ferr})
			bad = append(bad, badShard{i, kind, ferr})
		}
		if len(bad) > 0 {
			var repl cairn.Store
			if o.Replacement != nil {
				repl = o.Replacement.Store
			}
			s.rebuild(ctx, om, bad, target, repl, r)
		}
	}
	return nil
}

// putMap writes om's map to member i (or to st).
func (s *Store) putMap(ctx context.Context, om *objMap, i int, st cairn.Store) error {
	b := om.encode()
	return s.set.CallOn(ctx, i, st, func(ctx context.Context, st cairn.Store) error {
		return st.Put(ctx, om.mapID, b)
	})
}
