// Package anchorstore reads through a store that may lag behind the
// metadata: the consistency anchor of SCFS (§2.4, Figure 3). etcd, the
// anchor, is strongly consistent, and a version is committed there only
// after its objects are stored; a cloud store (or a pack index another
// device has not listed yet) may still answer "not found" for an object the
// anchor already names. So a Get of a missing object is retried, with
// exponential backoff, for a bounded time (Options.Wait, 10 s) before it
// fails, loudly: an error of Kind NotFound saying that the store still does
// not have the object after N tries over T, and naming the store.
//
// Only reads of one object retry (Get, GetRange): those are reads of IDs
// the metadata names. Has, List, Put and Delete go straight through: a
// caller asking Has wants today's answer, and a stale "absent" only makes
// it store the object again. Put the wrapper where objects named by the
// metadata are read (in front of a cloud store, or of a packstore over
// one), not where a miss is expected and must be fast.
//
// The optional abilities the file layer relies on are passed through:
// Refresh and Compact when the inner store has them (and otherwise do
// nothing, which is right for a store without them), Stats and Verify
// (computed from List and Get when the inner store lacks them).
package anchorstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Options configure a Store. The zero value gives the defaults.
type Options struct {
	// Name names the inner store in errors and logs ("s3://bucket/prefix",
	// a node name). Default "the store".
	Name string

	// Wait bounds the time a read of a missing object keeps retrying.
	// Default 10 s; negative: no retry at all.
	Wait time.Duration

	// FirstDelay is the wait before the first retry; each later one
	// doubles, up to MaxDelay. Defaults 50 ms and 2 s.
	FirstDelay, MaxDelay time.Duration

	// Logger receives a note when a read succeeds only after retrying
	// and when one gives up. nil discards them.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultWait       = 10 * time.Second
	DefaultFirstDelay = 50 * time.Millisecond
	DefaultMaxDelay   = 2 * time.Second
)

// Store is the wrapper. It owns the inner store: Close closes it.
type Store struct {
	inner cairn.Store
	opts  Options
	log   *slog.Logger
}

var (
	_ cairn.Store       = (*Store)(nil)
	_ cairn.StoreStats  = (*Store)(nil)
	_ store.Verifier    = (*Store)(nil)
	_ store.Compacter   = (*Store)(nil)
	_ store.Refresher   = (*Store)(nil)
	_ store.RangeReader = (*Store)(nil)
)

// New wraps inner.
func New(inner cairn.Store, opts Options) *Store {
	if opts.Name == "" {
		opts.Name = "the store"
	}
	switch {
	case opts.Wait == 0:
		opts.Wait = DefaultWait
	case opts.Wait < 0:
		opts.Wait = 0
	}
	if opts.FirstDelay <= 0 {
		opts.FirstDelay = DefaultFirstDelay
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = DefaultMaxDelay
	}
	opts.MaxDelay = max(opts.MaxDelay, opts.FirstDelay)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{inner: inner, opts: opts, log: opts.Logger}
}

// Unwrap returns the inner store.
func (s *Store) Unwrap() cairn.Store { return s.inner }

// retry calls fn until it returns anything but a NotFound error, or
// Options.Wait has passed since the first call.
func (s *Store) retry(ctx context.Context, op string, id cairn.ID, fn func() error) error {
	start := time.Now()
	delay := s.opts.FirstDelay
	var timer *time.Timer
	for tries := 1; ; tries++ {
		err := fn()
		if cairn.KindOf(err) != cairn.NotFound {
			if err == nil && tries > 1 {
				s.log.Info("object appeared in the store after retrying", "store", s.opts.Name, "id", id.String(), "tries", tries, "after", time.Since(start))
			}
			return err
		}
		elapsed := time.Since(start)
		if elapsed >= s.opts.Wait {
			s.log.Warn("object named by the metadata is missing from the store", "store", s.opts.Name, "id", id.String(), "tries", tries, "after", elapsed)
			return cairn.E(op, cairn.NotFound, id.String(), fmt.Errorf(
				"%s still does not have this object after %d tries over %s, though the metadata names it (the store has not caught up with the metadata, or it lost the object)",
				s.opts.Name, tries, elapsed.Round(time.Millisecond)))
		}
		d := min(delay, s.opts.Wait-elapsed)
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return store.CtxErr(ctx, op, id.String())
		}
		delay = min(2*delay, s.opts.MaxDelay)
	}
}

// Get reads the object, retrying while the inner store says it is missing.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	var data []byte
	err := s.retry(ctx, "get", id, func() error {
		var err error
		data, err = s.inner.Get(ctx, id)
		return err
	})
	return data, err
}

// GetRange reads part of the object, retrying like Get. Over a store that
// cannot read ranges it reads the whole object.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	var data []byte
	err := s.retry(ctx, "get range", id, func() error {
		var err error
		if rr, ok := s.inner.(store.RangeReader); ok {
			data, err = rr.GetRange(ctx, id, off, n)
			return err
		}
		whole, err := s.inner.Get(ctx, id)
		switch {
		case err != nil:
			return err
		case off < 0 || n < 0 || off > int64(len(whole)) || n > int64(len(whole))-off:
			return cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, len(whole)))
		}
		data = whole[off : off+n : off+n]
		return nil
	})
	return data, err
}

// Put, Has, Delete, List and Close go straight to the inner store.

func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	return s.inner.Put(ctx, id, data)
}

func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	return s.inner.Has(ctx, ids)
}

func (s *Store) Delete(ctx context.Context, id cairn.ID) error { return s.inner.Delete(ctx, id) }

func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	return s.inner.List(ctx, fn)
}

func (s *Store) Close() error { return s.inner.Close() }

// Refresh refreshes the inner store if it can (store.Refresher).
func (s *Store) Refresh(ctx context.Context) error {
	if r, ok := s.inner.(store.Refresher); ok {
		return r.Refresh(ctx)
	}
	return store.CtxErr(ctx, "refresh", "")
}

// Defers reports whether the inner store defers Puts made with a
// store.WithDeferred context (Put passes the context on).
func (s *Store) Defers() bool {
	d, ok := s.inner.(store.Deferrer)
	return ok && d.Defers()
}

// Flush makes the inner store's buffered writes and deletes durable, if
// it buffers any (a pack store's tombstones).
func (s *Store) Flush(ctx context.Context) error {
	if f, ok := s.inner.(interface{ Flush(context.Context) error }); ok {
		return f.Flush(ctx)
	}
	return store.CtxErr(ctx, "flush", "")
}

// Compact compacts the inner store if it can (store.Compacter); a store
// that cannot has nothing to reclaim.
func (s *Store) Compact(ctx context.Context) (int64, error) {
	if c, ok := s.inner.(store.Compacter); ok {
		return c.Compact(ctx)
	}
	return 0, store.CtxErr(ctx, "compact", "")
}

// Stats returns the inner store's statistics, or counts its listing.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if st, ok := s.inner.(cairn.StoreStats); ok {
		return st.Stats(ctx)
	}
	var u cairn.StoreUsage
	err := s.inner.List(ctx, func(_ cairn.ID, size int64) error {
		u.Objects++
		u.Bytes += size
		return nil
	})
	u.Disk = u.Bytes
	return u, err
}

// Verify verifies the inner store if it can, else reads every listed
// object and checks it against its ID.
func (s *Store) Verify(ctx context.Context, fn func(id cairn.ID, err error)) error {
	if v, ok := s.inner.(store.Verifier); ok {
		return v.Verify(ctx, fn)
	}
	var ids []cairn.ID
	if err := s.inner.List(ctx, func(id cairn.ID, _ int64) error {
		ids = append(ids, id)
		return nil
	}); err != nil {
		return err
	}
	for _, id := range ids {
		if err := store.CtxErr(ctx, "verify", ""); err != nil {
			return err
		}
		data, err := s.inner.Get(ctx, id)
		switch k := cairn.KindOf(err); {
		case k == cairn.NotFound: // deleted since the listing
		case k == cairn.Canceled:
			return err
		case err != nil:
			fn(id, err)
		case cairn.ID(blake3.Sum256(data)) != id:
			fn(id, cairn.E("verify", cairn.Corrupt, id.String(), errors.New("data does not hash to its ID")))
		}
	}
	return store.CtxErr(ctx, "verify", "")
}
