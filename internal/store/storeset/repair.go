package storeset

import (
	"context"
	"errors"
	"iter"

	"cairn.dev/cairn/internal/cairn"
)

// Repair describes one repair of a wrapper (replicastore, ecstore): what
// the caller asked for (its RepairOptions) and the wrapper's own steps.
type Repair struct {
	Policy      string // names the policy in errors: "copies", "ec"
	Store       string // restrict the repair to this member ("": all)
	Replacement *Named // with Store: the store taking Store's place
	QueueOnly   bool   // retry the queue, skip the walk

	// Queue holds the tasks Repair retries (not when Replacement is set).
	Queue *Queue
	// Put carries out a queued OpPut task t of member i, keeping the queue
	// and r in step (Repair carries out OpDelete tasks itself). An error
	// stops the repair.
	Put func(ctx context.Context, t Task, i int, r *RepairReport) error
	// Walk checks every object (only what belongs on member target when
	// target ≥ 0) and repairs what is missing or damaged.
	Walk func(ctx context.Context, target int, r *RepairReport) error
}

// Repair runs w: it checks Store and Replacement, retries the queued
// repairs (those of Store only, when given; none when Replacement is set),
// then, unless QueueOnly, walks. It returns what it did; its error is for
// what stopped it (ctx, or an error from Put or Walk), not for the repairs
// that failed, which are counted.
func (s *Set) Repair(ctx context.Context, w Repair) (RepairReport, error) {
	const op = "repair"
	var r RepairReport
	if err := ctx.Err(); err != nil {
		return r, cairn.E(op, cairn.Canceled, "", err)
	}
	target := -1
	if w.Store != "" {
		if target = s.Index(w.Store); target < 0 {
			return r, cairn.E(op, cairn.Invalid, w.Store, errors.New("no such store in this "+w.Policy+" policy"))
		}
	}
	if w.Replacement != nil && (target < 0 || w.Replacement.Store == nil) {
		return r, cairn.E(op, cairn.Invalid, "", errors.New("a replacement needs the store it replaces (Store)"))
	}
	if w.Replacement == nil {
		if err := s.retryQueue(ctx, w, target, &r); err != nil {
			return r, err
		}
	}
	if w.QueueOnly {
		return r, nil
	}
	return r, w.Walk(ctx, target, &r)
}

// retryQueue carries out the queued tasks (those of member target only,
// when target ≥ 0).
func (s *Set) retryQueue(ctx context.Context, w Repair, target int, r *RepairReport) error {
	for _, t := range w.Queue.Tasks() {
		if err := ctx.Err(); err != nil {
			return cairn.E("repair", cairn.Canceled, "", err)
		}
		i := s.Index(t.Store)
		if i < 0 || (target >= 0 && i != target) {
			continue
		}
		if t.Op == OpDelete {
			err := s.Call(ctx, i, func(ctx context.Context, st cairn.Store) error { return st.Delete(ctx, t.ID) })
			if err != nil {
				r.Failed++
				continue
			}
			r.Deleted++
			w.Queue.Done(t)
			continue
		}
		if err := w.Put(ctx, t, i, r); err != nil {
			return err
		}
	}
	return nil
}

// HasAll asks st which of ids it holds, in batches of 1,000 (a repair
// onto a replacement store learns what it holds already).
func HasAll(ctx context.Context, st cairn.Store, ids iter.Seq[cairn.ID]) (map[cairn.ID]bool, error) {
	const batch = 1000
	out := map[cairn.ID]bool{}
	b := make([]cairn.ID, 0, batch)
	flush := func() error {
		if len(b) == 0 {
			return nil
		}
		found, err := st.Has(ctx, b)
		if err != nil {
			return err
		}
		for j, f := range found {
			if f {
				out[b[j]] = true
			}
		}
		b = b[:0]
		return nil
	}
	for id := range ids {
		b = append(b, id)
		if len(b) == batch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}
