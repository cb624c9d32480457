package replicastore

import (
	"context"

	"cairn.dev/cairn/internal/store"
)

var _ store.Refresher = (*Store)(nil)

// Refresh refreshes the members that keep an index (store.Refresher): the
// file layer calls it after a garbage collection, which may have deleted
// objects a member's index still lists; without it Has would answer from
// those indexes and a writer would skip storing an object that is gone.
// A member that cannot be refreshed is asked nothing until it can
// (storeset.Set.Refresh).
func (s *Store) Refresh(ctx context.Context) error { return s.set.Refresh(ctx) }
