// Package memstore is an in-memory cairn.Store for tests: a map behind a
// read-write mutex. It verifies IDs on Put and copies data in and out, so it
// behaves like every other store (see storetest) except that nothing survives
// the process.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Store is an in-memory cairn.Store. The zero value is not usable; call New.
type Store struct {
	mu    sync.RWMutex
	m     map[cairn.ID][]byte
	bytes int64
}

var (
	_ cairn.Store       = (*Store)(nil)
	_ cairn.StoreStats  = (*Store)(nil)
	_ store.Verifier    = (*Store)(nil)
	_ store.RangeReader = (*Store)(nil)
)

// New returns an empty store.
func New() *Store { return &Store{m: make(map[cairn.ID][]byte)} }

// Put stores a copy of data under id after checking that id is its BLAKE3-256
// hash (Kind Corrupt otherwise).
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := store.CtxErr(ctx, "put", id.String()); err != nil {
		return err
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E("put", cairn.Corrupt, id.String(), errHashMismatch)
	}
	s.mu.RLock()
	_, ok := s.m[id]
	s.mu.RUnlock()
	if ok {
		return nil
	}
	c := append(make([]byte, 0, len(data)), data...)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; !ok {
		s.m[id] = c
		s.bytes += int64(len(c))
	}
	return nil
}

// Get returns a copy of the object.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := store.CtxErr(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	s.mu.RLock()
	data, ok := s.m[id]
	s.mu.RUnlock()
	if !ok {
		return nil, cairn.E("get", cairn.NotFound, id.String(), nil)
	}
	return append(make([]byte, 0, len(data)), data...), nil
}

// GetRange returns a copy of n bytes of the object from off
// (store.RangeReader).
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	if err := store.CtxErr(ctx, "get range", id.String()); err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	data, ok := s.m[id]
	switch {
	case !ok:
		return nil, cairn.E("get range", cairn.NotFound, id.String(), nil)
	case off < 0 || n < 0 || off > int64(len(data)) || n > int64(len(data))-off:
		return nil, cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, len(data)))
	}
	return append(make([]byte, 0, n), data[off:off+n]...), nil
}

// Has reports, in order, which of ids are present.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := store.CtxErr(ctx, "has", ""); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i, id := range ids {
		_, found[i] = s.m[id]
	}
	return found, nil
}

// Delete removes the object; deleting a missing object is not an error.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	if err := store.CtxErr(ctx, "delete", id.String()); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if data, ok := s.m[id]; ok {
		s.bytes -= int64(len(data))
		delete(s.m, id)
	}
	return nil
}

// List calls fn for each object present when List started (a snapshot), from
// the caller's goroutine, without holding any lock.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	type entry struct {
		id   cairn.ID
		size int64
	}
	s.mu.RLock()
	snap := make([]entry, 0, len(s.m))
	for id, data := range s.m {
		snap = append(snap, entry{id, int64(len(data))})
	}
	s.mu.RUnlock()
	for _, e := range snap {
		if err := store.CtxErr(ctx, "list", ""); err != nil {
			return err
		}
		if err := fn(e.id, e.size); err != nil {
			return err
		}
	}
	return store.CtxErr(ctx, "list", "")
}

// Stats reports the number and size of objects; Disk equals Bytes.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if err := store.CtxErr(ctx, "stats", ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return cairn.StoreUsage{Objects: int64(len(s.m)), Bytes: s.bytes, Disk: s.bytes}, nil
}

// Verify re-hashes every object. Objects can only be damaged in memory by a
// bug, so this mostly exists so that wrappers can be tested over memstore.
func (s *Store) Verify(ctx context.Context, fn func(id cairn.ID, err error)) error {
	var ids []cairn.ID
	s.mu.RLock()
	for id := range s.m {
		ids = append(ids, id)
	}
	s.mu.RUnlock()
	for _, id := range ids {
		if err := store.CtxErr(ctx, "verify", ""); err != nil {
			return err
		}
		s.mu.RLock()
		data, ok := s.m[id]
		s.mu.RUnlock()
		if ok && cairn.ID(blake3.Sum256(data)) != id {
			fn(id, cairn.E("verify", cairn.Corrupt, id.String(), errHashMismatch))
		}
	}
	return store.CtxErr(ctx, "verify", "")
}

// Close releases the objects.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = nil
	s.bytes = 0
	return nil
}

var errHashMismatch = errors.New("data does not hash to its ID")
