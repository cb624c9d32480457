package replicastore

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// RepairOptions choose what Repair does. The zero value retries the queue
// and then walks every object, checking that each placement member holds a
// copy (by Has: no data read) and writing the missing ones.
type RepairOptions struct {
	// Store restricts the repair to the copies that belong on this member
	// (`cairn repair --store NAME`).
	Store string
	// Replacement, with Store, is a store that takes Store's place (Store
	// is gone for good): the copies that belong on Store are written to
	// Replacement instead, and Store is neither listed nor read. Reopen
	// the wrapper with Replacement in Store's place afterwards.
	Replacement *Named
	// Scrub reads every copy the repair checks and verifies it against its
	// ID, so damaged copies are found too (and rewritten). It reads all the
	// data.
	Scrub bool
	// QueueOnly retries the queued repairs and skips the walk.
	QueueOnly bool
	// Progress, if set, is called as the walk goes: objects checked of
	// the objects listed.
	Progress func(done, total int)
}

// Repair retries the queued repairs, then (unless QueueOnly) walks every
// object in the members' listings and writes a copy to each placement
// member that lacks a good one, from a member that has one. It returns
// what it did; its error is for what stopped it (ctx, the listing failing),
// not for the repairs that failed, which are counted and left queued.
func (s *Store) Repair(ctx context.Context, o RepairOptions) (storeset.RepairReport, error) {
	return s.set.Repair(ctx, storeset.Repair{
		Policy: "copies", Store: o.Store, Replacement: o.Replacement, QueueOnly: o.QueueOnly,
		Queue: s.q,
		Put:   s.repairPut,
		Walk: func(ctx context.Context, target int, r *storeset.RepairReport) error {
			return s.walk(ctx, o, target, r)
		},
	})
}

// repairPut carries out the queued OpPut task t of member i.
func (s *Store) repairPut(ctx context.Context, t storeset.Task, i int, r *storeset.RepairReport) error {
	// The member may hold a good copy (the write landed after all),
	// none, or a damaged one: look before writing.
	var data []byte
	err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
		var err error
		data, err = st.Get(ctx, t.ID)
		return err
	})
	damaged := false
	switch {
	case err == nil && cairn.ID(blake3.Sum256(data)) == t.ID:
		s.q.Done(t)
		return nil
	case err == nil || cairn.KindOf(err) == cairn.Corrupt:
		damaged = true
		r.Corrupt++
	case cairn.KindOf(err) == cairn.NotFound:
		r.Missing++
	default:
		r.Failed++
		return nil
	}
	s.fix(ctx, i, nil, t.ID, damaged, r)
	return nil
}

// fix writes a good copy of id to member i (or to st, a replacement),
// counting the outcome in r and keeping the queue in step.
func (s *Store) fix(ctx context.Context, i int, st cairn.Store, id cairn.ID, damaged bool, r *storeset.RepairReport) {
	t := storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(i)}
	order := slices.DeleteFunc(s.readOrder(id), func(j int) bool { return j == i })
	data, _, err := s.get(ctx, "repair", id, order, i)
	switch {
	case err == nil:
	case cairn.KindOf(err) == cairn.NotFound:
		// Deleted meanwhile (or never stored): nothing to repair.
		s.q.Done(t)
		return
	case cairn.KindOf(err) == cairn.Corrupt:
		r.Unrecoverable++
		s.log.Error("replicastore: no good copy left", "id", id.String(), "err", err)
		return
	default:
		r.Failed++
		if st == nil {
			s.q.Add(t)
		}
		return
	}
	if err := s.writeCopy(ctx, i, st, id, data, damaged); err != nil {
		r.Failed++
		if st == nil {
			s.q.Add(t)
		}
		s.log.Warn("replicastore: repair write failed", "store", s.set.Name(i), "id", id.String(), "err", err)
		return
	}
	r.Rebuilt++
	if st == nil {
		s.q.Done(t)
	}
}

// walk checks every listed object's placement members.
func (s *Store) walk(ctx context.Context, o RepairOptions, target int, r *storeset.RepairReport) error {
	skip := -1
	if o.Replacement != nil {
		skip = target
	}
	all, listed, err := s.listing(ctx, skip)
	if err != nil {
		return err
	}
	var onReplacement map[cairn.ID]bool
	if o.Replacement != nil {
		if onReplacement, err = storeset.HasAll(ctx, o.Replacement.Store, maps.Keys(all)); err != nil {
			return cairn.E("repair", cairn.KindOf(err), "", fmt.Errorf("replacement %s: %w", o.Replacement.Name, err))
		}
	}
	checked := 0
	for id, h := range all {
		if err := store.CtxErr(ctx, "repair", ""); err != nil {
			return err
		}
		r.Objects++
		checked++
		if o.Progress != nil {
			o.Progress(checked, len(all))
		}
		for _, i := range s.placement(id)[:s.n] {
			if target >= 0 && i != target {
				continue
			}
			var st cairn.Store
			has := slices.Contains(h.on, i)
			if o.Replacement != nil {
				st, has = o.Replacement.Store, onReplacement[id]
			} else if !listed[i] {
				r.Failed++ // cannot tell what it holds
				continue
			}
			damaged := false
			if has && o.Scrub {
				var data []byte
				read := func(ctx context.Context, st cairn.Store) error {
					var err error
					data, err = st.Get(ctx, id)
					return err
				}
				err := s.set.CallOn(ctx, i, st, read)
				switch {
				case err == nil && cairn.ID(blake3.Sum256(data)) == id:
				case err == nil || cairn.KindOf(err) == cairn.Corrupt:
					damaged = true
				case cairn.KindOf(err) == cairn.NotFound:
					has = false // deleted under us, or listed but lost
				default:
					r.Failed++
					continue
				}
			}
			switch {
			case damaged:
				r.Corrupt++
				s.set.Report(storeset.Fault{Store: s.nameOr(i, o), ID: id, Stored: id, Kind: cairn.Corrupt})
			case !has:
				r.Missing++
				s.set.Report(storeset.Fault{Store: s.nameOr(i, o), ID: id, Stored: id, Kind: cairn.NotFound})
			default:
				continue
			}
			s.fix(ctx, i, st, id, damaged, r)
		}
	}
	return nil
}

func (s *Store) nameOr(i int, o RepairOptions) string {
	if o.Replacement != nil {
		return o.Replacement.Name
	}
	return s.set.Name(i)
}

// listing lists every member but skip (a store being replaced, or -1),
// and reports which members could be listed. It fails only when none
// could.
func (s *Store) listing(ctx context.Context, skip int) (map[cairn.ID]*held, []bool, error) {
	all := map[cairn.ID]*held{}
	ok := make([]bool, s.set.Len())
	var errs storeset.StoreErrors
	tried := 0
	for i := range s.set.Len() {
		if i == skip {
			continue
		}
		tried++
		mine, err := s.listMember(ctx, i)
		if err != nil {
			errs.Add(s.set.Name(i), err)
			continue
		}
		ok[i] = true
		addHeld(all, mine, i)
	}
	if err := store.CtxErr(ctx, "repair", ""); err != nil {
		return nil, nil, err
	}
	if errs.Len() == tried {
		return nil, nil, errs.Err("repair", cairn.Unavailable, "", "no store could be listed")
	}
	return all, ok, nil
}
