// Package faultstore wraps a cairn.Store and injects the faults a cloud
// store shows, for tests of the wrappers that must survive them
// (replicastore, ecstore): the store is down (every call fails with Kind
// Unavailable, as a refused connection does), slow (every call waits), held
// (calls block until released: a hung server, without timing in the test),
// or an object's stored bytes are damaged (Get returns them with a bit
// flipped, as a store that does not verify would, or fails with Kind
// Corrupt, as one that does).
//
// Damage is modelled the way a content-addressed store behaves: Put of an
// object already held (damaged or not) changes nothing, so the only way to
// mend a damaged object is Delete, then Put.
package faultstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// Store is the fault-injecting wrapper. Its methods for injecting faults
// may be called at any time, from any goroutine.
type Store struct {
	inner cairn.Store

	mu         sync.Mutex
	down       bool
	delay      time.Duration
	hold       chan struct{} // non-nil: calls wait until it is closed
	damaged    map[cairn.ID]bool
	corruptErr bool

	puts, gets, ranges, hases, deletes, lists atomic.Int64
}

var (
	_ cairn.Store       = (*Store)(nil)
	_ store.RangeReader = (*Store)(nil)
)

// New wraps inner. Closing the wrapper closes inner.
func New(inner cairn.Store) *Store {
	return &Store{inner: inner, damaged: map[cairn.ID]bool{}}
}

// SetDown makes every call fail with Kind Unavailable (true) or work
// again (false). Objects are kept while down: restarting loses nothing.
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// SetDelay makes every call wait d first (or until its ctx ends).
func (s *Store) SetDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// Hold makes calls block, from now on, until Release (or their ctx ends).
func (s *Store) Hold() {
	s.mu.Lock()
	if s.hold == nil {
		s.hold = make(chan struct{})
	}
	s.mu.Unlock()
}

// Release lets held calls, and later ones, go on.
func (s *Store) Release() {
	s.mu.Lock()
	if s.hold != nil {
		close(s.hold)
		s.hold = nil
	}
	s.mu.Unlock()
}

// Damage marks the stored copy of id as damaged: Get returns it with one
// bit flipped (or, after CorruptAsError, fails with Kind Corrupt), until
// the object is deleted. It reports whether the store holds id.
func (s *Store) Damage(id cairn.ID) bool {
	found, err := s.inner.Has(context.Background(), []cairn.ID{id})
	if err != nil || !found[0] {
		return false
	}
	s.mu.Lock()
	s.damaged[id] = true
	s.mu.Unlock()
	return true
}

// CorruptAsError makes Get of a damaged object fail with Kind Corrupt (a
// store that verifies what it reads) instead of returning flipped bytes.
func (s *Store) CorruptAsError(v bool) {
	s.mu.Lock()
	s.corruptErr = v
	s.mu.Unlock()
}

// Damaged reports whether id is marked damaged.
func (s *Store) Damaged(id cairn.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.damaged[id]
}

// Lose deletes id from the inner store behind the wrapper's back, whatever
// the faults set (an object lost by the provider).
func (s *Store) Lose(id cairn.ID) error {
	s.mu.Lock()
	delete(s.damaged, id)
	s.mu.Unlock()
	return s.inner.Delete(context.Background(), id)
}

// Inner returns the wrapped store (to inspect it without faults).
func (s *Store) Inner() cairn.Store { return s.inner }

// Calls counts the calls made to the wrapper, faulty ones included.
type Calls struct{ Puts, Gets, Ranges, Hases, Deletes, Lists int64 }

// Calls returns the counts so far.
func (s *Store) Calls() Calls {
	return Calls{s.puts.Load(), s.gets.Load(), s.ranges.Load(), s.hases.Load(), s.deletes.Load(), s.lists.Load()}
}

// ErrDown is the cause of the errors a down store returns.
var ErrDown = errors.New("store is down (fault injected)")

// enter applies down, delay and hold to one call.
func (s *Store) enter(ctx context.Context, op, path string) error {
	s.mu.Lock()
	down, delay, hold := s.down, s.delay, s.hold
	s.mu.Unlock()
	if err := store.CtxErr(ctx, op, path); err != nil {
		return err
	}
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return store.CtxErr(ctx, op, path)
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return store.CtxErr(ctx, op, path)
		}
	}
	if down {
		return cairn.E(op, cairn.Unavailable, path, ErrDown)
	}
	// A store that went down while this call waited fails it too.
	s.mu.Lock()
	down = s.down
	s.mu.Unlock()
	if down {
		return cairn.E(op, cairn.Unavailable, path, ErrDown)
	}
	return nil
}

func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	s.puts.Add(1)
	if err := s.enter(ctx, "put", id.String()); err != nil {
		return err
	}
	return s.inner.Put(ctx, id, data)
}

func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	s.gets.Add(1)
	if err := s.enter(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	data, err := s.inner.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	bad, asErr := s.damaged[id], s.corruptErr
	s.mu.Unlock()
	if bad {
		if asErr {
			return nil, cairn.E("get", cairn.Corrupt, id.String(), errors.New("stored bytes do not hash to the ID (fault injected)"))
		}
		if len(data) == 0 {
			data = []byte{1} // an empty object damaged: it grew a byte
		} else {
			// A copy: the inner store may have noted the bytes it
			// returned as verified (store.VerifyNote).
			data = slices.Clone(data)
			data[len(data)/2] ^= 0x10
		}
	}
	return data, nil
}

// GetRange passes a ranged read to the inner store (store.RangeReader),
// subject to the faults; a damaged object comes back with a bit of the
// range flipped (a store cannot verify a part of an object, so there is
// no Corrupt error here). It fails with Kind Invalid when the inner store
// cannot read ranges.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	s.ranges.Add(1)
	if err := s.enter(ctx, "get range", id.String()); err != nil {
		return nil, err
	}
	rr, ok := s.inner.(store.RangeReader)
	if !ok {
		return nil, cairn.E("get range", cairn.Invalid, id.String(), errors.New("inner store cannot read ranges"))
	}
	data, err := rr.GetRange(ctx, id, off, n)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	bad := s.damaged[id]
	s.mu.Unlock()
	if bad && len(data) > 0 {
		data[len(data)/2] ^= 0x10
	}
	return data, nil
}

func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	s.hases.Add(1)
	if err := s.enter(ctx, "has", ""); err != nil {
		return nil, err
	}
	return s.inner.Has(ctx, ids)
}

func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	s.deletes.Add(1)
	if err := s.enter(ctx, "delete", id.String()); err != nil {
		return err
	}
	if err := s.inner.Delete(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.damaged, id)
	s.mu.Unlock()
	return nil
}

func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	s.lists.Add(1)
	if err := s.enter(ctx, "list", ""); err != nil {
		return err
	}
	return s.inner.List(ctx, fn)
}

// Stats passes the inner store's Stats through (Kind Invalid if it has
// none), subject to the faults.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if err := s.enter(ctx, "stats", ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	st, ok := s.inner.(cairn.StoreStats)
	if !ok {
		return cairn.StoreUsage{}, cairn.E("stats", cairn.Invalid, "", errors.New("inner store has no Stats"))
	}
	return st.Stats(ctx)
}

func (s *Store) Close() error {
	s.Release()
	return s.inner.Close()
}

// Faults collects the faults a wrapper reports (its Options.OnFault is
// Add). Safe for concurrent use; the zero value is ready.
type Faults struct {
	mu sync.Mutex
	f  []storeset.Fault
}

// Add records x.
func (f *Faults) Add(x storeset.Fault) {
	f.mu.Lock()
	f.f = append(f.f, x)
	f.mu.Unlock()
}

// Take returns the faults recorded since the last Take, and forgets them.
func (f *Faults) Take() []storeset.Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.f
	f.f = nil
	return out
}
