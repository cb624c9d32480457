package director

import (
	"context"
	"errors"
	"slices"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/cachestore"
)

// deviceStore is the store a device's volumes use. Writes (Put, Has) go to
// the target: this device's own store by default, so a file's chunks stay
// where they were written (ZZFS §3.2), or the node the realm was opened to
// write to (Options.Target). Reads try this device's store, then the chunk
// cache, which fetches what it lacks from the nodes that hold it (the
// target among them): only those the version names (store.Sources),
// nearest and fastest first (see router.order).
type deviceStore struct {
	local  cairn.Store
	target cairn.Store // == local unless writing to another node
	d      *Director
}

var _ cairn.Store = (*deviceStore)(nil)

// Put writes to the target. What goes to another node or store is also
// kept in the chunk cache: reading back what this device wrote costs no
// request to the store ("always write, avoid reading", SCFS).
func (d *deviceStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := d.target.Put(ctx, id, data); err != nil {
		return err
	}
	if d.target != d.local {
		if c, err := d.d.chunkCache(ctx); err == nil {
			c.Keep(ctx, id, data)
		}
	}
	return nil
}

func (d *deviceStore) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	return d.target.Has(ctx, ids)
}

// Quarantined asks the store writes go to (store.Quarantiner).
func (d *deviceStore) Quarantined(ids []cairn.ID) []bool {
	if q, ok := d.target.(store.Quarantiner); ok {
		return q.Quarantined(ids)
	}
	return make([]bool, len(ids))
}

// Check asks the store writes go to, when it can check cheaply
// (store.Checker); otherwise (a remote node or store: checking would mean
// downloading) it trusts what the caller believes present, as
// store.Checker allows.
func (d *deviceStore) Check(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if c, ok := d.target.(store.Checker); ok {
		return c.Check(ctx, ids)
	}
	good := make([]bool, len(ids))
	for i := range good {
		good[i] = true
	}
	return good, nil
}

func (d *deviceStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if d.d.opts.NoCache {
		return d.getNoCache(ctx, id)
	}
	data, err := d.local.Get(ctx, id)
	if err == nil || !errors.Is(err, cairn.ErrNotFound) {
		return data, err
	}
	// Pinned data (hoard.go): on this device for good, offline too.
	if ps, perr := d.d.pinStore(ctx, false); perr == nil && ps != nil {
		if data, err := ps.Get(ctx, id); err == nil {
			return data, nil
		}
	}
	c, cerr := d.d.chunkCache(ctx)
	if cerr != nil {
		return nil, cerr
	}
	return c.Get(ctx, id)
}

// getNoCache reads id from where the version being read says its data
// is (store.Sources): this device's store if it is named (or nothing is),
// else the named nodes and stores directly, never the chunk cache.
func (d *deviceStore) getNoCache(ctx context.Context, id cairn.ID) ([]byte, error) {
	src := store.Sources(ctx)
	self := d.d.self(ctx)
	if len(src) == 0 || slices.Contains(src, self) || slices.Contains(src, "local") {
		return d.local.Get(ctx, id)
	}
	rt, err := d.d.routerOnly(ctx)
	if err != nil {
		return nil, err
	}
	// Every store the router reads from verifies what it returns
	// against the ID (as for the chunk cache's TrustBacking).
	return rt.Get(ctx, id)
}

// routerOnly returns the router without the chunk cache in front (for
// NoCache reads), made on first need.
func (d *Director) routerOnly(ctx context.Context) (*router, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	if d.router == nil {
		d.router = &router{d: d, nodes: map[string]*peer{}}
	}
	return d.router, nil
}

func (d *deviceStore) Delete(ctx context.Context, id cairn.ID) error {
	return d.target.Delete(ctx, id)
}

func (d *deviceStore) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	return d.target.List(ctx, fn)
}

// Refresh passes on to the target (see store.Refresher): a write's
// "already stored" answers come from it.
func (d *deviceStore) Refresh(ctx context.Context) error {
	if r, ok := d.target.(store.Refresher); ok {
		return r.Refresh(ctx)
	}
	return nil
}

// Defers reports whether the target buffers Puts made with a
// store.WithDeferred context (a cloud store's pack store does; this
// device's store and nodes do not): Put passes the context on, and Flush
// makes what was buffered durable.
func (d *deviceStore) Defers() bool {
	t, ok := d.target.(store.Deferrer)
	return ok && t.Defers()
}

// Flush returns once every object the target buffered before it is
// stored (nothing to do for a target that does not buffer).
func (d *deviceStore) Flush(ctx context.Context) error {
	if t, ok := d.target.(store.Deferrer); ok && t.Defers() {
		return t.Flush(ctx)
	}
	return store.CtxErr(ctx, "flush", "")
}

// Close closes nothing: the director and the realm own the stores.
func (d *deviceStore) Close() error { return nil }

// chunkCache opens the chunk cache on first need: a localstore in
// Env.CacheStore kept under Options.CacheBytes, in front of the router.
func (d *Director) chunkCache(ctx context.Context) (*cachestore.Store, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	if d.cache != nil {
		return d.cache, nil
	}
	cst, err := d.env.CacheStore(ctx)
	if err != nil {
		return nil, err
	}
	max := d.opts.CacheBytes
	if max == 0 {
		max = DefaultCacheBytes
	}
	rt := d.router
	if rt == nil {
		rt = &router{d: d, nodes: map[string]*peer{}}
	}
	c, err := cachestore.New(ctx, rt, cst, cachestore.Options{MaxBytes: max, NoCacheOnPut: true,
		// The router's remote stores check every object they fetch.
		TrustBacking: true, Logger: d.log})
	if err != nil {
		cst.Close()
		return nil, err
	}
	d.cacheStore, d.cache, d.router = cst, c, rt
	return c, nil
}

// CacheStats reports what the chunk cache did in this process (zero if it
// was never opened).
func (d *Director) CacheStats() cachestore.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cache == nil {
		return cachestore.Stats{}
	}
	return d.cache.Stats()
}

// DropCache closes the chunk cache and the router behind it; the next read
// from another node opens them again (on an emptied directory, if the
// caller removed the cache's files meanwhile). For benchmarks of cold reads.
func (d *Director) DropCache() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cache != nil {
		d.cache.Close()
		d.router.Close()
		d.cacheStore.Close()
		d.cache, d.router, d.cacheStore = nil, nil, nil
	}
}
