package storeset

import (
	"context"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// Flights tracks, per object, the writes still under way after a Put
// returned (the copies or shards beyond the quorum), so that a Delete can
// wait for them: a write landing after the Delete would bring the object
// back on one member. The zero value is ready to use.
type Flights struct {
	mu sync.Mutex
	m  map[cairn.ID]*flight
}

type flight struct {
	n    int
	done chan struct{}
}

// Begin records a write of id under way; call the returned func when it
// has finished (either way).
func (f *Flights) Begin(id cairn.ID) (end func()) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[cairn.ID]*flight{}
	}
	fl := f.m[id]
	if fl == nil {
		fl = &flight{done: make(chan struct{})}
		f.m[id] = fl
	}
	fl.n++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			fl.n--
			if fl.n == 0 {
				delete(f.m, id)
				close(fl.done)
			}
			f.mu.Unlock()
		})
	}
}

// Wait returns once no write of id is under way, or with ctx's error
// (Kind Canceled).
func (f *Flights) Wait(ctx context.Context, id cairn.ID) error {
	for {
		f.mu.Lock()
		fl := f.m[id]
		f.mu.Unlock()
		if fl == nil {
			return nil
		}
		select {
		case <-fl.done:
		case <-ctx.Done():
			return cairn.E("wait for writes", cairn.Canceled, id.String(), ctx.Err())
		}
	}
}
