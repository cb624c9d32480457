package metrics

import (
	"context"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Store wraps a cairn.Store and counts, per operation, its requests (with
// their result), their latency and the bytes read and written, under the
// label store=Name. Put, Get, Has, Delete and List are counted; Close is
// not.
type Store struct {
	cairn.Store
	name string
	m    *Metrics
}

// The abilities of a local store (internal/store/localstore) that the file
// layer finds by type assertion; a wrapped store keeps them.
type localAbilities interface {
	cairn.StoreStats
	Verify(ctx context.Context, fn func(id cairn.ID, err error)) error
	Compact(ctx context.Context) (freed int64, err error)
	Refresh(ctx context.Context) error
	Check(ctx context.Context, ids []cairn.ID) ([]bool, error)
	Quarantined(ids []cairn.ID) []bool
}

// Local is a Store over a store with every ability of a local store
// (stats, verify, compact, refresh, check, quarantine), which it passes on.
type Local struct {
	*Store
	inner localAbilities
}

// WrapStore returns st counted as store name in m. A store with all the
// abilities of a local store comes back as a *Local that keeps them; any
// other store as a *Store that has only the cairn.Store methods (so wrap
// only stores whose optional abilities nobody above asks for).
func (m *Metrics) WrapStore(name string, st cairn.Store) cairn.Store {
	s := &Store{Store: st, name: name, m: m}
	if l, ok := st.(localAbilities); ok {
		return &Local{Store: s, inner: l}
	}
	return s
}

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() cairn.Store { return s.Store }

func (s *Store) done(op string, t0 time.Time, err error) {
	s.m.StoreRequests.WithLabelValues(s.name, op, Result(err)).Inc()
	s.m.StoreDuration.WithLabelValues(s.name, op).Observe(time.Since(t0).Seconds())
}

// Put counts a put and the bytes it wrote.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	t0 := time.Now()
	err := s.Store.Put(ctx, id, data)
	s.done("put", t0, err)
	if err == nil {
		s.m.StoreWritten.WithLabelValues(s.name).Add(float64(len(data)))
	}
	return err
}

// Get counts a get and the bytes it read.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	t0 := time.Now()
	b, err := s.Store.Get(ctx, id)
	s.done("get", t0, err)
	if err == nil {
		s.m.StoreRead.WithLabelValues(s.name).Add(float64(len(b)))
	}
	return b, err
}

// Has counts one request, however many IDs it asks about.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	t0 := time.Now()
	f, err := s.Store.Has(ctx, ids)
	s.done("has", t0, err)
	return f, err
}

// Delete counts a delete.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	t0 := time.Now()
	err := s.Store.Delete(ctx, id)
	s.done("delete", t0, err)
	return err
}

// List counts a whole listing as one request.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	t0 := time.Now()
	err := s.Store.List(ctx, fn)
	s.done("list", t0, err)
	return err
}

// Stats passes on the local store's Stats.
func (l *Local) Stats(ctx context.Context) (cairn.StoreUsage, error) { return l.inner.Stats(ctx) }

// Verify passes on the local store's Verify.
func (l *Local) Verify(ctx context.Context, fn func(id cairn.ID, err error)) error {
	return l.inner.Verify(ctx, fn)
}

// Compact passes on the local store's Compact.
func (l *Local) Compact(ctx context.Context) (int64, error) { return l.inner.Compact(ctx) }

// Refresh passes on the local store's Refresh.
func (l *Local) Refresh(ctx context.Context) error { return l.inner.Refresh(ctx) }

// Check counts a check (a has that reads the objects) and passes it on.
func (l *Local) Check(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	t0 := time.Now()
	f, err := l.inner.Check(ctx, ids)
	l.done("check", t0, err)
	return f, err
}

// Quarantined passes on the local store's Quarantined.
func (l *Local) Quarantined(ids []cairn.ID) []bool { return l.inner.Quarantined(ids) }
