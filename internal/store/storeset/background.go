package storeset

import (
	"context"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// Flush waits until wg, the wrapper's background writes (the copies or
// shards still being written after a Put returned, and the rebuilds a Get
// started), is done, or ctx ends (Kind Canceled, op "flush"). It is the
// wrappers' Flush.
func Flush(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return cairn.E("flush", cairn.Canceled, "", ctx.Err())
	}
}
