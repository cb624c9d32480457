package pipeline

import (
	"context"
	"sync"
	"sync/atomic"

	"cairn.dev/cairn/internal/cairn"
	"github.com/zeebo/blake3"
)

// mapStore is a minimal cairn.Store for these tests (the real in-memory
// store lives in internal/store/memstore, which this package must not
// depend on). It copies on Put and Get, like a real store, and counts calls.
type mapStore struct {
	mu      sync.RWMutex
	m       map[cairn.ID][]byte
	verify  bool // check BLAKE3(data) == id on Put
	puts    atomic.Int64
	hasIDs  atomic.Int64
	hasCall atomic.Int64
	gets    atomic.Int64
	putErr  error // returned by every Put when set
}

func newMapStore() *mapStore { return &mapStore{m: map[cairn.ID][]byte{}, verify: true} }

func (s *mapStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := ctx.Err(); err != nil {
		return cairn.E("put", cairn.Canceled, id.Short(), err)
	}
	if s.putErr != nil {
		return s.putErr
	}
	if s.verify && blake3.Sum256(data) != id {
		return cairn.E("put", cairn.Corrupt, id.Short(), nil)
	}
	s.puts.Add(1)
	c := append([]byte(nil), data...)
	s.mu.Lock()
	s.m[id] = c
	s.mu.Unlock()
	return nil
}

func (s *mapStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, cairn.E("get", cairn.Canceled, id.Short(), err)
	}
	s.gets.Add(1)
	s.mu.RLock()
	b, ok := s.m[id]
	s.mu.RUnlock()
	if !ok {
		return nil, cairn.E("get", cairn.NotFound, id.Short(), nil)
	}
	return append([]byte(nil), b...), nil
}

func (s *mapStore) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, cairn.E("has", cairn.Canceled, "", err)
	}
	s.hasCall.Add(1)
	s.hasIDs.Add(int64(len(ids)))
	found := make([]bool, len(ids))
	s.mu.RLock()
	for i, id := range ids {
		_, found[i] = s.m[id]
	}
	s.mu.RUnlock()
	return found, nil
}

func (s *mapStore) Delete(ctx context.Context, id cairn.ID) error {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
	return nil
}

func (s *mapStore) List(ctx context.Context, fn func(cairn.ID, int64) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for id, b := range s.m {
		if err := fn(id, int64(len(b))); err != nil {
			return err
		}
	}
	return nil
}

func (s *mapStore) Close() error { return nil }

// set replaces an object's bytes without any check (to simulate damage).
func (s *mapStore) set(id cairn.ID, b []byte) {
	s.mu.Lock()
	s.m[id] = b
	s.mu.Unlock()
}

func (s *mapStore) len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.m)
}
