package director

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
)

// peer is another node this device reads from.
type peer struct {
	name string
	addr string
	st   cairn.Store
	// shared is set for a registered store (the realm owns and closes it)
	// and a policy wrapper (the director closes it).
	shared bool
	// rtt is the last measured round trip (0: not measured); downUntil
	// keeps a node that failed out of the first places for a while.
	rtt       time.Duration
	downUntil time.Time
}

// router is the chunk cache's backing store: it reads from other nodes.
// Only Get is used by the cache; the rest answer as a store with nothing
// of its own would.
type router struct {
	d *Director

	mu     sync.Mutex
	nodes  map[string]*peer
	listed []meta.NodeStatus
	listAt time.Time
	closed bool
}

// ErrNotHere is the cause of a read, offline, of a chunk this device's
// store and chunk cache lack (Options.Offline).
var ErrNotHere = errors.New("offline: not on this device")

// registryTTL is how long the router trusts its copy of the registry.
const registryTTL = 5 * time.Second

// downFor keeps a node that failed a request behind the others.
const downFor = 30 * time.Second

func (rt *router) Put(ctx context.Context, id cairn.ID, data []byte) error {
	return cairn.E("put", cairn.Invalid, id.String(), errors.New("the chunk cache's router does not store"))
}

func (rt *router) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	return make([]bool, len(ids)), nil
}

func (rt *router) Delete(ctx context.Context, id cairn.ID) error {
	return cairn.E("delete", cairn.NotFound, id.String(), errors.New("not in the chunk cache's router"))
}

func (rt *router) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	return nil
}

func (rt *router) Close() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, p := range rt.nodes {
		if !p.shared {
			p.st.Close()
		}
	}
	rt.nodes = map[string]*peer{}
	rt.closed = true
	return nil
}

// Get fetches id from the nodes that may hold it, in order (see order),
// and returns the first copy; the cache in front verifies it. When none
// of them has it and the version names nodes that sleep and that the
// director was told to wake (Decision Wake), it wakes the first, waits for
// it (shared with every other read that needs it meanwhile) and asks
// again: a node is never woken while an awake copy answers.
func (rt *router) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if off := rt.d.opts.Offline; off != nil && off() {
		return nil, cairn.E("fetch", cairn.Unavailable, id.String(), ErrNotHere)
	}
	woken := map[string]bool{}
	for {
		data, sleepers, err := rt.get(ctx, id)
		if err == nil || len(sleepers) == 0 || ctx.Err() != nil {
			return data, err
		}
		i := slices.IndexFunc(sleepers, func(n meta.NodeStatus) bool { return !woken[n.Name] })
		if i < 0 {
			return nil, err
		}
		n := sleepers[i]
		woken[n.Name] = true
		if werr := rt.d.wakeWait(ctx, n); werr != nil {
			if ctx.Err() != nil {
				return nil, store.CtxErr(ctx, "get", id.String())
			}
			return nil, errNoAwakeStore(id, n, werr)
		}
		rt.mu.Lock()
		rt.listed = nil // read the registry again: the node is awake
		rt.mu.Unlock()
	}
}

// get is one pass of Get over the nodes awake now; sleepers are the
// nodes to wake if it fails.
func (rt *router) get(ctx context.Context, id cairn.ID) ([]byte, []meta.NodeStatus, error) {
	cands, skipped, sleepers, err := rt.order(ctx, store.Sources(ctx))
	if err != nil {
		return nil, nil, err
	}
	// tried: nodes that answered they do not have it; failed: the
	// others, each with its error, so that a failure names its cause
	// (a policy's wrapper says which of its stores failed and why).
	var tried, failed []string
	unavailable := false
	for _, p := range cands {
		t0 := time.Now()
		data, err := p.st.Get(ctx, id)
		if err == nil {
			rt.observe(p, time.Since(t0), nil)
			return data, nil, nil
		}
		if ctx.Err() != nil {
			return nil, nil, store.CtxErr(ctx, "get", id.String())
		}
		// Any other error, Permission included (one node's word, maybe
		// on a stale list: this device learns it was removed from its
		// revocation watch), moves on to the next node.
		notFound := errors.Is(err, cairn.ErrNotFound)
		if !notFound {
			unavailable = true
			rt.observe(p, 0, err)
			rt.d.log.Warn("fetch from node failed; trying the next", "node", p.name, "err", err)
		}
		if notFound && !p.shared {
			tried = append(tried, p.name)
		} else {
			failed = append(failed, p.name+": "+err.Error())
		}
	}
	kind := cairn.NotFound
	if unavailable || len(skipped) > 0 {
		kind = cairn.Unavailable
	}
	var why []string
	if len(tried) > 0 {
		why = append(why, "not on "+strings.Join(tried, ", "))
	}
	why = append(why, failed...)
	if len(why) == 0 {
		why = append(why, "no other node is online")
	}
	if len(skipped) > 0 {
		why = append(why, "held by "+strings.Join(skipped, ", "))
	}
	return nil, sleepers, cairn.E("fetch", kind, id.String(), errors.New(strings.Join(why, "; ")))
}

// observe records a request's outcome: a round-trip sample, or a failure.
func (rt *router) observe(p *peer, d time.Duration, err error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if err != nil {
		p.downUntil = time.Now().Add(downFor)
		return
	}
	p.downUntil = time.Time{}
	if p.rtt == 0 || d < p.rtt {
		p.rtt = d // the fastest answer is the best guess of distance
	}
}

// order returns what to read from: the registered stores and placement
// wrappers the version names (hint), in its order, then the online nodes it
// names, nearest first (smallest measured round trip, nodes never measured
// probed now), then by reported serving rate, nodes that failed recently
// last. No other node is asked: a request tells its node what this device
// reads (and under which name), and each miss costs a round trip. Only
// when the hint names no node or store but this device (a version written
// before versions named nodes says "local", or none at all) are the
// realm's other online devices asked, never a benefactor or surrogate.
// skipped names hinted nodes that are not awake, "NAME (STATE)", for which
// Options.Decide said UseOther, and hinted
// stores that could not be opened, "NAME (why)".
func (rt *router) order(ctx context.Context, hint []string) (cands []*peer, skipped []string, sleepers []meta.NodeStatus, err error) {
	nodes, err := rt.registry(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	self := rt.d.self(ctx)
	hinted := map[string]bool{}
	for _, n := range hint {
		hinted[n] = true
	}
	isNode := func(name string) bool {
		return slices.ContainsFunc(nodes, func(n meta.NodeStatus) bool { return n.Name == name })
	}
	named := false // the hint names a node or store other than this device
	// Hinted names that are no node: registered stores (cloud buckets,
	// directories), read first, in the version's order.
	var stores []*peer
	for _, name := range hint {
		if name == self {
			continue
		}
		if isNode(name) {
			named = true
			continue
		}
		p, err := rt.storePeer(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, nil, ctx.Err()
			}
			rt.d.log.Warn("opening a store the version names", "store", name, "err", err)
			skipped = append(skipped, name+" ("+err.Error()+")")
			named = true
			continue
		}
		if p != nil {
			stores = append(stores, p)
			named = true
		}
	}
	type cand struct {
		p    *peer
		rate float64
	}
	var cs []cand
	for _, n := range nodes {
		if n.Name == self || n.Removed != 0 {
			continue
		}
		if !hinted[n.Name] && (named || n.Role != string(pki.Device)) {
			continue
		}
		if n.State != meta.NodeOnline || n.Addr == "" {
			if !hinted[n.Name] {
				continue
			}
			// A node the version names is not awake: what to do is
			// the director's decision (UseOther by default). Wake
			// waits until the awake copies were asked (Get).
			if rt.d.opts.Wake != nil && rt.d.opts.Decide(ctx, n, ForRead) == Wake {
				sleepers = append(sleepers, n)
			} else if err := rt.d.decide(ctx, "fetch", n, ForRead); err != nil {
				return nil, nil, nil, err
			}
			state := n.State
			if state == meta.NodeOnline {
				state = "no address"
			}
			skipped = append(skipped, n.Name+" ("+state+")")
			continue
		}
		p, err := rt.peer(ctx, n.Name, n.Addr)
		if err != nil {
			return nil, nil, nil, err
		}
		cs = append(cs, cand{p: p, rate: n.Rate})
	}
	ps := make([]*peer, len(cs))
	for i, c := range cs {
		ps[i] = c.p
	}
	rt.probe(ctx, ps)
	now := time.Now()
	rt.mu.Lock()
	slices.SortStableFunc(cs, func(a, b cand) int {
		if da, db := now.Before(a.p.downUntil), now.Before(b.p.downUntil); da != db {
			if db {
				return -1
			}
			return 1
		}
		ra, rb := a.p.rtt, b.p.rtt
		if ra == 0 {
			ra = time.Hour
		}
		if rb == 0 {
			rb = time.Hour
		}
		if c := cmp.Compare(ra, rb); c != 0 {
			return c
		}
		return cmp.Compare(b.rate, a.rate)
	})
	rt.mu.Unlock()
	for _, c := range cs {
		cands = append(cands, c.p)
	}
	return append(stores, cands...), skipped, sleepers, nil
}

// probe measures the round trip to each node not measured yet, all at
// once, each bounded by probeTimeout. A node that does not answer is
// marked down.
func (rt *router) probe(ctx context.Context, ps []*peer) {
	rt.mu.Lock()
	var todo []*peer
	for _, p := range ps {
		if p.rtt == 0 && time.Now().After(p.downUntil) {
			todo = append(todo, p)
		}
	}
	rt.mu.Unlock()
	if len(todo) < 2 {
		return // nothing to compare: the first request measures it
	}
	var wg sync.WaitGroup
	for _, p := range todo {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			h, ok := p.st.(interface{ Health(context.Context) error })
			if !ok {
				return
			}
			t0 := time.Now()
			err := h.Health(pctx)
			if ctx.Err() == nil { // the caller gave up: says nothing of the node
				rt.observe(p, time.Since(t0), err)
			}
		})
	}
	wg.Wait()
}

const probeTimeout = 2 * time.Second

// registry returns the node registry, read at most every registryTTL.
func (rt *router) registry(ctx context.Context) ([]meta.NodeStatus, error) {
	rt.mu.Lock()
	if rt.listed != nil && time.Since(rt.listAt) < registryTTL {
		l := rt.listed
		rt.mu.Unlock()
		return l, nil
	}
	rt.mu.Unlock()
	nodes, err := rt.d.env.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	rt.listed, rt.listAt = nodes, time.Now()
	rt.mu.Unlock()
	return nodes, nil
}

// storePeer returns registered store name as a peer (nil if there is no
// such store).
func (rt *router) storePeer(ctx context.Context, name string) (*peer, error) {
	rt.mu.Lock()
	p := rt.nodes["store:"+name]
	rt.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if meta.IsPolicyName(name) {
		return rt.policyPeer(ctx, name) // a copies or ec wrapper (policy.go)
	}
	n, err := rt.d.env.Store(ctx, name)
	if err != nil || n == nil {
		return nil, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p = rt.nodes["store:"+name]; p != nil {
		return p, nil
	}
	p = &peer{name: name, addr: n.URL, st: n.Store, shared: true}
	rt.nodes["store:"+name] = p
	return p, nil
}

// peer returns the client of node name at addr, made on first use (and
// again when the node moved).
func (rt *router) peer(ctx context.Context, name, addr string) (*peer, error) {
	rt.mu.Lock()
	p := rt.nodes[name]
	rt.mu.Unlock()
	if p != nil && p.addr == addr {
		return p, nil
	}
	st, err := rt.d.env.Dial(ctx, name, addr)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		st.Close()
		return nil, errClosed
	}
	if old := rt.nodes[name]; old != nil {
		if old.addr == addr {
			st.Close()
			return old, nil
		}
		old.st.Close()
	}
	p = &peer{name: name, addr: addr, st: st}
	rt.nodes[name] = p
	return p, nil
}
