package storeset

import (
	"context"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// refresher is store.Refresher (a store whose answers come from an index
// it keeps, brought up to date by Refresh).
type refresher interface {
	Refresh(ctx context.Context) error
}

// Refresh refreshes every member that is a refresher (store.Refresher), at
// once: the file layer calls it after a garbage collection, which may have
// deleted objects a member's index still lists. A member whose refresh
// fails is stale: HasEach refreshes it before it asks it again, and takes
// no answer from it until a refresh succeeds (its index could say present
// of an object that is gone). Refresh fails only when ctx ends.
func (s *Set) Refresh(ctx context.Context) error {
	var wg sync.WaitGroup
	for i, m := range s.m {
		if _, ok := m.st.(refresher); !ok {
			continue
		}
		m.mu.Lock()
		m.stale = true
		m.mu.Unlock()
		wg.Go(func() { _ = s.refreshMember(ctx, i) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return cairn.E("refresh", cairn.Canceled, "", err)
	}
	return nil
}

// refreshMember refreshes member i if it is stale. A stale member that
// is down is refreshed only when a probe is due (Skip): a store that does
// not answer is not waited for at every Has.
func (s *Set) refreshMember(ctx context.Context, i int) error {
	m := s.m[i]
	m.mu.Lock()
	stale := m.stale
	m.mu.Unlock()
	if !stale {
		return nil
	}
	if err := s.Skip(i); err != nil {
		return err
	}
	err := s.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
		return st.(refresher).Refresh(ctx)
	})
	if err == nil {
		m.mu.Lock()
		m.stale = false
		m.mu.Unlock()
	}
	return err
}
