package remotestore

import (
	"context"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// hasCall is one small Has waiting to travel with others. Writers of many
// small files each ask about a chunk or two; over a slow link the HTTP/2
// frame and header bytes of one request per file would cost more than the
// IDs themselves (32 bytes each), so concurrent small Has calls share a
// request, up to Options.HasBatch IDs, like Gets do.
type hasCall struct {
	ctx   context.Context
	ids   []cairn.ID
	found []bool
	done  chan error
}

// coalesceHasBelow is the largest Has that waits for company; a larger one
// fills requests of its own.
func (s *Store) coalesceHasBelow() int { return s.o.HasBatch / 4 }

// hasCoalesced queues a small Has and waits for its answer.
func (s *Store) hasCoalesced(ctx context.Context, ids []cairn.ID, found []bool) error {
	c := &hasCall{ctx: ctx, ids: ids, found: found, done: make(chan error, 1)}
	if s.hases.add(c) {
		go s.runHases()
	}
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return store.CtxErr(ctx, "has", "")
	}
}

// runHases sends what has queued as has requests of up to HasBatch IDs,
// until the queue is empty.
func (s *Store) runHases() {
	for {
		total := 0
		batch, ok := s.hases.take(func(c *hasCall, n int) bool {
			if total+len(c.ids) > s.o.HasBatch {
				return false
			}
			total += len(c.ids)
			return true
		})
		if !ok {
			return
		}
		live := batch[:0]
		var ids []cairn.ID
		for _, c := range batch {
			if c.ctx.Err() == nil {
				live = append(live, c)
				ids = append(ids, c.ids...)
			}
		}
		if len(live) == 0 {
			continue
		}
		found := make([]bool, len(ids))
		err := s.hasBatch(s.ctx, "has", "", ids, found)
		off := 0
		for _, c := range live {
			if err == nil {
				copy(c.found, found[off:off+len(c.ids)])
			}
			off += len(c.ids)
			c.done <- err
		}
	}
}
