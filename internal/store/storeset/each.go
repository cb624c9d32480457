package storeset

import (
	"context"
	"fmt"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// CallOn runs fn on st when st is not nil (a replacement for member i,
// outside the Set), else on member i through Call.
func (s *Set) CallOn(ctx context.Context, i int, st cairn.Store, fn func(ctx context.Context, st cairn.Store) error) error {
	if st != nil {
		return fn(ctx, st)
	}
	return s.Call(ctx, i, fn)
}

// RepairOn is CallOn for a repair's write: a success on member i (not on
// st) counts as an object Repaired there.
func (s *Set) RepairOn(ctx context.Context, i int, st cairn.Store, fn func(ctx context.Context, st cairn.Store) error) error {
	if err := s.CallOn(ctx, i, st, fn); err != nil || st != nil {
		return err
	}
	s.Repaired(i, 1)
	return nil
}

// HasEach asks every member at once which of ask(i) it holds (called on
// member i's goroutine). It returns each member's answers, nil for a
// member that failed (a member that gives another number of answers than
// it was asked about fails with Kind IO). It fails with Kind Canceled when ctx
// ended, and with Kind Unavailable, naming each member and why, when no
// member answered.
func (s *Set) HasEach(ctx context.Context, op string, ask func(i int) []cairn.ID) ([][]bool, error) {
	answers := make([][]bool, s.Len())
	var errs StoreErrors
	var wg sync.WaitGroup
	for i := range s.Len() {
		wg.Go(func() {
			ids := ask(i)
			if err := s.refreshMember(ctx, i); err != nil {
				errs.Add(s.Name(i), err)
				return
			}
			err := s.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
				f, err := st.Has(ctx, ids)
				if err == nil && len(f) != len(ids) {
					err = cairn.E(op, cairn.IO, "", fmt.Errorf("%d answers for %d objects", len(f), len(ids)))
				}
				answers[i] = f
				return err
			})
			if err != nil {
				answers[i] = nil
				errs.Add(s.Name(i), err)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, cairn.E(op, cairn.Canceled, "", err)
	}
	if errs.Len() == s.Len() {
		return nil, errs.Err(op, cairn.Unavailable, "", "no store answered")
	}
	return answers, nil
}

// DeleteEach deletes object id from every member at once: the queued
// OpPut task of id for the member is done, then the member's objects
// objs(i) (a copy, or a shard and the map) are deleted in turn. A deletion
// that fails is queued (an OpDelete task of that object), unless ctx has
// ended. It returns an error of Kind Unavailable naming each member that
// failed, or nil. It does not look at ctx once done: a caller whose ctx
// ended says so itself.
func (s *Set) DeleteEach(ctx context.Context, op string, q *Queue, id cairn.ID, objs func(i int) []cairn.ID) error {
	var errs StoreErrors
	var wg sync.WaitGroup
	for i := range s.Len() {
		wg.Go(func() {
			name := s.Name(i)
			q.Done(Task{Op: OpPut, ID: id, Store: name})
			for _, obj := range objs(i) {
				err := s.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
					return st.Delete(ctx, obj)
				})
				t := Task{Op: OpDelete, ID: obj, Store: name}
				if err != nil {
					errs.Add(name, err)
					if ctx.Err() == nil {
						q.Add(t)
					}
					continue
				}
				q.Done(t)
			}
		})
	}
	wg.Wait()
	return errs.Err(op, cairn.Unavailable, id.String(), "")
}
