package director

import (
	"context"
	"errors"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Pinned data (issue 18, "pinning"; doc/offline.md "Pins").
//
// What a device keeps because its owner pinned it lives in a store of its
// own, the pin store (PinStorer), beside this device's store and the chunk
// cache. Reads look there after this device's store and before the chunk
// cache (deviceStore.Get), online and offline alike. The chunk cache never
// sees it, so no process's eviction (each process sharing the cache keeps
// its own recency list and evicts by it) can drop pinned data; what stops
// being pinned is handed to the chunk cache (Unhoard), where it is evicted
// as anything read.

// PinStorer is an optional ability of an Env: the store pinned data is
// kept in. With create false it returns nil and no error when there is
// none yet (nothing was ever pinned on this device: reads do not make
// one). The director keeps what it opened and closes it.
type PinStorer interface {
	PinStore(ctx context.Context, create bool) (cairn.Store, error)
}

// errNoPinStore: the Env has no pin store (a benefactor, a test Env).
var errNoPinStore = errors.New("this device keeps no pinned data")

// pinStore opens the pin store on first need; nil with no error when the
// Env has none, or (create false) has none yet: asked again next time, as
// another process (the node's pin keeper) may make it meanwhile.
func (d *Director) pinStore(ctx context.Context, create bool) (cairn.Store, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errClosed
	}
	if d.pins != nil {
		return d.pins, nil
	}
	ps, ok := d.env.(PinStorer)
	if !ok {
		return nil, nil
	}
	st, err := ps.PinStore(ctx, create)
	if err != nil || st == nil {
		return nil, err
	}
	d.pins = st
	return st, nil
}

// HoardStats says what Hoard did.
type HoardStats struct {
	Here         int   // objects already on this device (its store or the pin store)
	Fetched      int   // objects copied into the pin store
	FetchedBytes int64 // their stored bytes
}

// Here reports, for each id, whether it is on this device for good: in
// this device's store or in the pin store (not the chunk cache, which
// may evict it). It asks no other node.
func (d *Director) Here(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	here := make([]bool, len(ids))
	if len(ids) == 0 {
		return here, nil
	}
	local, err := d.env.Local(ctx)
	if err != nil {
		return nil, err
	}
	in, err := local.Has(ctx, ids)
	if err != nil {
		return nil, err
	}
	copy(here, in)
	ps, err := d.pinStore(ctx, false)
	if err != nil || ps == nil {
		return here, err
	}
	var rest []cairn.ID
	var at []int
	for i, ok := range here {
		if !ok {
			rest, at = append(rest, ids[i]), append(at, i)
		}
	}
	if len(rest) == 0 {
		return here, nil
	}
	in, err = ps.Has(ctx, rest)
	if err != nil {
		return nil, err
	}
	for j, ok := range in {
		here[at[j]] = ok
	}
	return here, nil
}

// GetHere reads id from this device alone: its store, the pin store, the
// chunk cache's copy. A miss is Kind NotFound; no other node is asked.
func (d *Director) GetHere(ctx context.Context, id cairn.ID) ([]byte, error) {
	local, err := d.env.Local(ctx)
	if err != nil {
		return nil, err
	}
	if data, errIn := local.Get(ctx, id); errIn == nil || !errors.Is(errIn, cairn.ErrNotFound) {
		return data, errIn
	}
	if ps, errIn := d.pinStore(ctx, false); errIn != nil {
		return nil, errIn
	} else if ps != nil {
		if data, errIn2 := ps.Get(ctx, id); errIn2 == nil || !errors.Is(errIn2, cairn.ErrNotFound) {
			return data, errIn2
		}
	}
	if _, errIn := d.chunkCache(ctx); errIn != nil {
		return nil, errIn
	}
	d.mu.Lock()
	cst := d.cacheStore
	d.mu.Unlock()
	data, err := cst.Get(ctx, id)
	if err == nil && cairn.ID(blake3.Sum256(data)) != id {
		return nil, cairn.E("get", cairn.NotFound, id.String(), errors.New("the cached copy is damaged"))
	}
	return data, err
}

// Hoard makes ids (a pinned version's manifest and chunks) be on this
// device for good: each one neither in this device's store nor in the pin
// store is copied into the pin store, from the chunk cache's copy if it
// has one, else from the nodes and stores that hold it (the version's,
// store.Sources of ctx), checked against its ID. Idempotent: what is
// here already costs a Has. Offline it copies what the chunk cache has
// and fails (director.ErrNotHere) for the rest.
func (d *Director) Hoard(ctx context.Context, ids []cairn.ID) (HoardStats, error) {
	var st HoardStats
	ps, err := d.pinStore(ctx, true)
	if err != nil {
		return st, err
	}
	if ps == nil {
		return st, cairn.E("pin", cairn.Invalid, "", errNoPinStore)
	}
	here, err := d.Here(ctx, ids)
	if err != nil {
		return st, err
	}
	rt, err := d.routerOnly(ctx)
	if err != nil {
		return st, err
	}
	if _, err := d.chunkCache(ctx); err != nil {
		return st, err
	}
	d.mu.Lock()
	cst := d.cacheStore
	d.mu.Unlock()
	for i, id := range ids {
		if here[i] {
			st.Here++
			continue
		}
		data, err := cst.Get(ctx, id)
		if err != nil || cairn.ID(blake3.Sum256(data)) != id {
			if data, err = rt.Get(ctx, id); err != nil {
				return st, err
			}
			if cairn.ID(blake3.Sum256(data)) != id {
				return st, cairn.E("pin", cairn.Corrupt, id.String(), errors.New("fetched data does not hash to its ID"))
			}
		}
		if err := ps.Put(ctx, id, data); err != nil {
			return st, err
		}
		st.Fetched++
		st.FetchedBytes += int64(len(data))
	}
	return st, nil
}

// Unhoard hands every object of the pin store that keep does not want to
// the chunk cache (where it is evicted as anything read) and deletes it
// from the pin store; it returns how many and their bytes. A pin store
// that can compact is compacted once something was deleted.
func (d *Director) Unhoard(ctx context.Context, keep func(cairn.ID) bool) (n int, bytes int64, err error) {
	ps, err := d.pinStore(ctx, false)
	if err != nil || ps == nil {
		return 0, 0, err
	}
	var drop []cairn.ID
	if err := ps.List(ctx, func(id cairn.ID, _ int64) error {
		if !keep(id) {
			drop = append(drop, id)
		}
		return nil
	}); err != nil {
		return 0, 0, err
	}
	c, cerr := d.chunkCache(ctx)
	for _, id := range drop {
		data, gerr := ps.Get(ctx, id)
		if gerr == nil && cerr == nil {
			c.Keep(ctx, id, data)
		}
		if derr := ps.Delete(ctx, id); derr != nil && !errors.Is(derr, cairn.ErrNotFound) {
			return n, bytes, derr
		}
		n++
		bytes += int64(len(data))
	}
	if n > 0 {
		if cp, ok := ps.(store.Compacter); ok {
			if _, err := cp.Compact(ctx); err != nil {
				d.log.Warn("pin store: compaction", "err", err)
			}
		}
	}
	return n, bytes, nil
}
