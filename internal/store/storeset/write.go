package storeset

import (
	"context"
	"fmt"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Write describes one quorum write: the same logical write made to several
// members (a copy each, or a shard each), acknowledged once Quorum of them
// succeeded (SCFS §2.4, DepSky: return after a quorum, not after the
// slowest cloud).
type Write struct {
	Targets []int // members written to at once
	Spares  []int // tried in order when one fails, until Want have succeeded (or none are left)
	Want    int   // writes wanted in the end
	Quorum  int   // writes that must succeed before Write returns nil (1 ≤ Quorum ≤ Want)

	// Timeout bounds the writes still running once Write has returned.
	Timeout time.Duration

	// Fn makes the write to member i. It must not keep data the caller of
	// Write may reuse: the writes left running outlive Write.
	Fn func(ctx context.Context, st cairn.Store, i int) error

	// After is called once every write launched is over, with the members
	// written and those that failed (and why). When Write has returned
	// before, After runs on a background goroutine counted in Write's wg.
	After func(written []int, failed map[int]error)
}

type writeResult struct {
	i   int
	err error
}

// Write runs w. It returns nil once w.Quorum writes succeeded; pending then
// lists the members whose write was still under way, which go on under bg
// (the wrapper's background context) for at most w.Timeout. It fails with
// Kind Unavailable, naming each member that failed and why, as soon as the
// quorum cannot be reached any more, and with Kind Canceled when ctx ends
// first (the writes under way are then canceled). Members that are down
// (Skip) count as failed without a request, unless a probe is due. Write
// first waits for room at each target (Set.room): a member slower than the
// quorum holds writers back instead of having writes refused.
func (s *Set) Write(ctx, bg context.Context, wg *sync.WaitGroup, op, path string, w Write) (pending []int, err error) {
	var opCtx context.Context
	var cancel context.CancelFunc
	if w.Timeout > 0 {
		opCtx, cancel = context.WithTimeout(bg, w.Timeout)
	} else {
		opCtx, cancel = context.WithCancel(bg)
	}
	results := make(chan writeResult, len(w.Targets)+len(w.Spares))
	running := map[int]bool{}
	spares := w.Spares
	var written []int
	failed := map[int]error{}
	var errs StoreErrors

	launch := func(i int) {
		running[i] = true
		if err := s.Skip(i); err != nil {
			results <- writeResult{i, err}
			return
		}
		go func() {
			// A member left stale by a failed Refresh may list objects
			// a gc deleted, and its Put skip them: refresh it first, or
			// count its write as failed (repaired later).
			if err := s.refreshMember(opCtx, i); err != nil {
				results <- writeResult{i, err}
				return
			}
			results <- writeResult{i, s.Call(opCtx, i, func(ctx context.Context, st cairn.Store) error {
				return w.Fn(ctx, st, i)
			})}
		}()
	}
	// take records one result; it launches a spare when a write failed and
	// Want can no longer be met by what runs.
	take := func(r writeResult) {
		delete(running, r.i)
		if r.err == nil {
			written = append(written, r.i)
			return
		}
		failed[r.i] = r.err
		errs.Add(s.Name(r.i), r.err)
		if len(written)+len(running) < w.Want && len(spares) > 0 {
			i := spares[0]
			spares = spares[1:]
			launch(i)
		}
	}
	// finish collects the writes still running, in the background.
	finish := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			for len(running) > 0 {
				take(<-results)
			}
			if w.After != nil {
				w.After(written, failed)
			}
		}()
	}

	// Room first (Set.room): a member the writes before this one left
	// behind paces the writer rather than lose this write.
	for _, i := range w.Targets {
		if err := s.room(ctx, i); err != nil {
			cancel()
			return nil, cairn.E(op, cairn.Canceled, path, ctx.Err())
		}
	}
	for _, i := range w.Targets {
		launch(i)
	}
	for len(written) < w.Quorum {
		if len(written)+len(running)+len(spares) < w.Quorum {
			err := errs.Err(op, cairn.Unavailable, path,
				fmt.Sprintf("%d of %d stores failed, %d must be written", len(failed), len(w.Targets)+len(w.Spares), w.Quorum))
			finish() // from here on, only finish's goroutine touches the results
			return nil, err
		}
		select {
		case r := <-results:
			take(r)
		case <-ctx.Done():
			cancel()
			finish()
			return nil, cairn.E(op, cairn.Canceled, path, ctx.Err())
		}
	}
	for i := range running {
		pending = append(pending, i)
	}
	finish()
	return pending, nil
}
