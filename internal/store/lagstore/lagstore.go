// Package lagstore is a test helper: a store wrapper that behaves like an
// eventually consistent object store, where a new object stays invisible
// for a while after the Put that wrote it returned. For Options.Delay after
// an object is first stored, Get and GetRange of it fail with Kind
// NotFound, Has reports it absent and List leaves it out. Deletes are
// immediate. Tests use it to show that readers retry (anchorstore) and
// that a pack index learned by listing catches up (packstore).
package lagstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Options configure a Store.
type Options struct {
	// Delay is how long each new object stays invisible.
	Delay time.Duration

	// OnHidden, if set, is called (from the reading goroutine) each time
	// a Get or GetRange is refused because the object is not visible yet.
	OnHidden func(id cairn.ID)
}

// Store is the lagging wrapper. It owns the inner store: Close closes it.
type Store struct {
	inner  cairn.Store
	opts   Options
	mu     sync.Mutex
	until  map[cairn.ID]time.Time // invisible until then
	hidden atomic.Int64
}

var _ store.RangeReader = (*Store)(nil)

// New wraps inner.
func New(inner cairn.Store, opts Options) *Store {
	return &Store{inner: inner, opts: opts, until: map[cairn.ID]time.Time{}}
}

// Hidden returns how many reads were refused because of the lag (Get and
// GetRange that failed, Has answers turned to false, objects left out of
// a List).
func (s *Store) Hidden() int64 { return s.hidden.Load() }

func (s *Store) invisible(id cairn.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.until[id]
	if ok && !time.Now().Before(t) {
		delete(s.until, id)
		return false
	}
	return ok
}

func (s *Store) refuse(op string, id cairn.ID) error {
	s.hidden.Add(1)
	if s.opts.OnHidden != nil {
		s.opts.OnHidden(id)
	}
	return cairn.E(op, cairn.NotFound, id.String(), nil)
}

// Put stores the object; a new one stays invisible for Options.Delay.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	found, err := s.inner.Has(ctx, []cairn.ID{id})
	if err != nil {
		return err
	}
	if err := s.inner.Put(ctx, id, data); err != nil {
		return err
	}
	if !found[0] {
		s.mu.Lock()
		if _, ok := s.until[id]; !ok {
			s.until[id] = time.Now().Add(s.opts.Delay)
		}
		s.mu.Unlock()
	}
	return nil
}

func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := store.CtxErr(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	if s.invisible(id) {
		return nil, s.refuse("get", id)
	}
	return s.inner.Get(ctx, id)
}

// GetRange reads a range (through the inner store's GetRange, or a whole
// Get).
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	if err := store.CtxErr(ctx, "get range", id.String()); err != nil {
		return nil, err
	}
	if s.invisible(id) {
		return nil, s.refuse("get range", id)
	}
	if rr, ok := s.inner.(store.RangeReader); ok {
		return rr.GetRange(ctx, id, off, n)
	}
	data, err := s.inner.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off > int64(len(data)) || n > int64(len(data))-off {
		return nil, cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, len(data)))
	}
	return data[off : off+n : off+n], nil
}

func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	found, err := s.inner.Has(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i, id := range ids {
		if found[i] && s.invisible(id) {
			s.hidden.Add(1)
			found[i] = false
		}
	}
	return found, nil
}

func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	if err := s.inner.Delete(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.until, id)
	s.mu.Unlock()
	return nil
}

func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	return s.inner.List(ctx, func(id cairn.ID, size int64) error {
		if s.invisible(id) {
			s.hidden.Add(1)
			return nil
		}
		return fn(id, size)
	})
}

func (s *Store) Close() error { return s.inner.Close() }
