package director

import (
	"context"

	"cairn.dev/cairn/internal/store"
)

// A policy volume's writes ask the policy's wrapper which objects are
// stored, and the wrapper asks its members, whose answers for a cloud
// bucket come from a pack index kept in memory. After a garbage
// collection (fs writeGen sees the generation change) the whole chain is
// refreshed (store.Refresher), or a fenced writer would skip storing an
// object the collection deleted and commit a version without it.

var (
	_ store.Refresher = (*bounded)(nil)
	_ store.Refresher = (*member)(nil)
)

// Refresh refreshes the policy's wrapper.
func (b *bounded) Refresh(ctx context.Context) error {
	if r, ok := b.Store.(store.Refresher); ok {
		return r.Refresh(ctx)
	}
	return nil
}

// Refresh refreshes the member's store if it is open (one not opened yet
// lists the store when it opens).
func (m *member) Refresh(ctx context.Context) error {
	m.mu.Lock()
	st := m.st
	m.mu.Unlock()
	if r, ok := st.(store.Refresher); ok {
		return r.Refresh(ctx)
	}
	return nil
}
