package director

// Primaries (ZZFS §3.3, doc/director.md "Primaries"): a copies policy's
// replica set has a primary device, recorded in the metadata
// (meta.PrimaryRecord) and handed to an awake replica when it announces
// standby. A read through the policy's wrapper asks the primary first
// when it is awake; a primary that the registry shows asleep is not asked
// (nor woken), and one that does not answer within PrimaryGiveUp is given
// up: the record is read again, once, and the new primary asked; then the
// wrapper's own order, as without a primary.

import (
	"context"
	"errors"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/replicastore"
)

// Primaries is an optional ability of an Env: the primary device of a
// copies policy's replica set.
type Primaries interface {
	// Primary returns the primary device of policy (a canonical copies
	// policy), "" with no error if it has none.
	Primary(ctx context.Context, policy string) (string, error)
}

// PrimaryGiveUp is how long a read waits for a primary the registry shows
// awake before it gives up on it and reads the record again.
const PrimaryGiveUp = time.Second

// primaryTTL is how long a read trusts the primary it read (as the
// registry: a handoff shows within it, or at the first give-up).
const primaryTTL = registryTTL

// primaryReread: a give-up reads the record (and the registry) again
// unless it was read less than this ago, so that reads of many chunks
// while a primary sleeps unannounced do not each cost a metadata read.
const primaryReread = 250 * time.Millisecond

// primaryCache is a policy's primary as last read.
type primaryCache struct {
	name string
	at   time.Time
}

// primaryFirst is a copies wrapper's io (bounded) whose Get asks the
// primary first.
type primaryFirst struct {
	*bounded
	d  *Director
	ps *PolicyStore
	rs *replicastore.Store
	pe Primaries
}

// primary returns the policy's primary, read again if the cached one is
// older than primaryTTL, or than primaryReread when fresh (a give-up).
func (p *primaryFirst) primary(ctx context.Context, fresh bool) string {
	p.ps.pmu.Lock()
	c := p.ps.prim
	p.ps.pmu.Unlock()
	ttl := primaryTTL
	if fresh {
		ttl = primaryReread
	}
	if !c.at.IsZero() && time.Since(c.at) < ttl {
		return c.name
	}
	name, err := p.pe.Primary(ctx, p.ps.Policy.String())
	if err != nil {
		p.d.log.Warn("reading a policy's primary", "policy", p.ps.Policy.String(), "err", err)
		return c.name // the last known, if any: the read falls back anyway
	}
	p.ps.pmu.Lock()
	p.ps.prim = primaryCache{name: name, at: time.Now()}
	p.ps.pmu.Unlock()
	if fresh && name != c.name {
		p.d.log.Info("a policy's primary changed", "policy", p.ps.Policy.String(), "from", c.name, "to", name)
	}
	return name
}

// awake reports whether node name is awake in the router's registry
// snapshot (read again when fresh).
func (p *primaryFirst) awake(ctx context.Context, name string, fresh bool) bool {
	rt, err := p.d.routerOnly(ctx)
	if err != nil {
		return false
	}
	if fresh {
		rt.mu.Lock()
		if time.Since(rt.listAt) >= primaryReread {
			rt.listed = nil
		}
		rt.mu.Unlock()
	}
	nodes, err := rt.registry(ctx)
	if err != nil {
		return false
	}
	for _, n := range nodes {
		if n.Name == name {
			return n.Removed == 0 && n.State == meta.NodeOnline && n.Addr != ""
		}
	}
	// Not a node: a registered store the policy names, asked as any.
	return true
}

// Get asks the primary first (see the file comment), then the wrapper.
func (p *primaryFirst) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := p.acquire(ctx, "get", id); err != nil {
		return nil, err
	}
	defer func() { <-p.sem }()
	prim := p.primary(ctx, false)
	if prim == "" || prim == p.d.self(ctx) {
		return p.Store.Get(ctx, id) // this device's copy was read before the router
	}
	gaveUp := false
	if p.awake(ctx, prim, false) {
		data, err := p.rs.GetFrom(ctx, prim, id, PrimaryGiveUp)
		switch {
		case err == nil:
			return data, nil
		case ctx.Err() != nil:
			return nil, store.CtxErr(ctx, "get", id.String())
		case errors.Is(err, cairn.ErrNotFound) || errors.Is(err, cairn.ErrCorrupt):
			// The primary answered: the wrapper reads the others.
		default:
			gaveUp = true
		}
	} else {
		// Asleep: never asked, never woken; and asked last by the
		// wrapper below.
		gaveUp = true
		p.rs.Down(prim, cairn.E("get", cairn.Unavailable, prim, errors.New("the node is not awake")))
	}
	if gaveUp {
		p.d.log.Debug("gave up on a policy's primary; reading the record again", "policy", p.ps.Policy.String(), "primary", prim, "id", id.Short())
		if next := p.primary(ctx, true); next != "" && next != prim && p.awake(ctx, next, true) {
			data, err := p.rs.GetFrom(ctx, next, id, PrimaryGiveUp)
			if err == nil {
				return data, nil
			}
			if ctx.Err() != nil {
				return nil, store.CtxErr(ctx, "get", id.String())
			}
		}
	}
	return p.Store.Get(ctx, id)
}
