package realm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/cachestore"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/remotestore"
)

// DefaultCacheBytes bounds the chunk cache (home/cache) that holds what this
// device read from other nodes.
const DefaultCacheBytes = 1 << 30

// cacheDir is the chunk cache's directory in the home.
const cacheDir = "cache"

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
	r      *Realm
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
		if c, err := d.r.chunkCache(ctx); err == nil {
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
	if d.r.opts.NoCache {
		return d.getNoCache(ctx, id)
	}
	data, err := d.local.Get(ctx, id)
	if err == nil || !errors.Is(err, cairn.ErrNotFound) {
		return data, err
	}
	c, cerr := d.r.chunkCache(ctx)
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
	self := d.r.nodeName(ctx)
	if len(src) == 0 || slices.Contains(src, self) || slices.Contains(src, "local") {
		return d.local.Get(ctx, id)
	}
	rt, err := d.r.routerOnly(ctx)
	if err != nil {
		return nil, err
	}
	// Every store the router reads from verifies what it returns
	// against the ID (as for the chunk cache's TrustBacking).
	return rt.Get(ctx, id)
}

// routerOnly returns the router without the chunk cache in front (for
// NoCache reads), made on first need.
func (r *Realm) routerOnly(ctx context.Context) (*router, error) {
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	if r.remoteClosed {
		return nil, errRealmClosed
	}
	if r.router == nil {
		r.router = &router{r: r, nodes: map[string]*peer{}}
	}
	return r.router, nil
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

// Close closes nothing: the realm owns the stores.
func (d *deviceStore) Close() error { return nil }

var errRealmClosed = cairn.E("fetch", cairn.Canceled, "", errors.New("the realm is closed"))

// chunkCache opens the chunk cache on first need: a localstore in
// home/cache kept under Options.CacheBytes, in front of the router.
func (r *Realm) chunkCache(ctx context.Context) (*cachestore.Store, error) {
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	if r.remoteClosed {
		return nil, errRealmClosed
	}
	if r.cache != nil {
		return r.cache, nil
	}
	cst, err := localstore.Open(ctx, filepath.Join(r.Home, cacheDir), localstore.Options{
		// A cache needs no durability, and smaller packs let eviction
		// give space back sooner.
		NoSync: true, TrustIDs: true, PackSize: 16 << 20, Logger: r.log})
	if err != nil {
		return nil, err
	}
	max := r.opts.CacheBytes
	if max == 0 {
		max = DefaultCacheBytes
	}
	rt := r.router
	if rt == nil {
		rt = &router{r: r, nodes: map[string]*peer{}}
	}
	c, err := cachestore.New(ctx, rt, cst, cachestore.Options{MaxBytes: max, NoCacheOnPut: true,
		// The router's remote stores check every object they fetch.
		TrustBacking: true, Logger: r.log})
	if err != nil {
		cst.Close()
		return nil, err
	}
	r.cacheStore, r.cache, r.router = cst, c, rt
	return c, nil
}

// CacheStats reports what the chunk cache did in this process (zero if it
// was never opened).
func (r *Realm) CacheStats() cachestore.Stats {
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	if r.cache == nil {
		return cachestore.Stats{}
	}
	return r.cache.Stats()
}

// peer is another node this device reads from.
type peer struct {
	name string
	addr string
	st   cairn.Store
	// shared is set for a registered store: the realm owns and closes it.
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
	r *Realm

	mu     sync.Mutex
	nodes  map[string]*peer
	listed []meta.NodeStatus
	listAt time.Time
	closed bool
}

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
// and returns the first copy; the cache in front verifies it.
func (rt *router) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	cands, skipped, err := rt.order(ctx, store.Sources(ctx))
	if err != nil {
		return nil, err
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
			return data, nil
		}
		if ctx.Err() != nil {
			return nil, store.CtxErr(ctx, "get", id.String())
		}
		// Any other error, Permission included (one node's word, maybe
		// on a stale list: this device learns it was removed from its
		// revocation watch), moves on to the next node.
		notFound := errors.Is(err, cairn.ErrNotFound)
		if !notFound {
			unavailable = true
			rt.observe(p, 0, err)
			rt.r.log.Warn("fetch from node failed; trying the next", "node", p.name, "err", err)
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
	return nil, cairn.E("fetch", kind, id.String(), errors.New(strings.Join(why, "; ")))
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
// skipped names hinted nodes that are offline, "NAME (offline)", and hinted
// stores that could not be opened, "NAME (why)".
func (rt *router) order(ctx context.Context, hint []string) (cands []*peer, skipped []string, err error) {
	nodes, err := rt.registry(ctx)
	if err != nil {
		return nil, nil, err
	}
	self := rt.r.nodeName(ctx)
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
				return nil, nil, ctx.Err()
			}
			rt.r.log.Warn("opening a store the version names", "store", name, "err", err)
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
			if hinted[n.Name] {
				skipped = append(skipped, n.Name+" (offline)")
			}
			continue
		}
		p, err := rt.peer(ctx, n.Name, n.Addr)
		if err != nil {
			return nil, nil, err
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
	return append(stores, cands...), skipped, nil
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
	nodes, err := rt.r.Meta.Nodes(ctx)
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
	n, err := rt.r.namedStore(ctx, name)
	if err != nil || n == nil {
		return nil, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p = rt.nodes["store:"+name]; p != nil {
		return p, nil
	}
	p = &peer{name: name, addr: n.rec.URL, st: n.st, shared: true}
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
	st, err := rt.r.remoteStore(ctx, name, addr)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		st.Close()
		return nil, errRealmClosed
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

// remoteStore returns a client of node name's chunk service at addr,
// authenticated with this device's credentials; it accepts only that
// node's certificate, and none the realm revoked.
func (r *Realm) remoteStore(ctx context.Context, name, addr string) (*remotestore.Store, error) {
	creds, err := r.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	rev, err := r.revocations(ctx)
	if err != nil {
		return nil, err
	}
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: rev, Peer: pki.RequireNode(name)})
	if err != nil {
		return nil, err
	}
	return remotestore.New(remotestore.Options{Addr: addr, TLS: tlsConf, Logger: r.log})
}

// revocations starts the realm's revocation watch on first need; it lives
// until Close.
func (r *Realm) revocations(ctx context.Context) (*meta.Revocations, error) {
	r.revMu.Lock()
	defer r.revMu.Unlock()
	if r.rev == nil {
		rev, err := r.Meta.WatchRevocations(ctx)
		if err != nil {
			return nil, err
		}
		r.rev = rev
	}
	return r.rev, nil
}

// nodeName is this device's node name ("" if it has no credentials).
func (r *Realm) nodeName(ctx context.Context) string {
	n, _ := r.selfName(ctx)
	return n
}

// selfName is this device's node name: "" with no error if it has no
// credentials yet, an error if they cannot be read.
func (r *Realm) selfName(ctx context.Context) (string, error) {
	r.revMu.Lock()
	defer r.revMu.Unlock()
	if r.name == "" {
		c, err := r.Credentials(ctx)
		switch {
		case err == nil:
			r.name = c.Identity.Name
		case errors.Is(err, cairn.ErrNotFound):
		default:
			return "", err
		}
	}
	return r.name, nil
}

// targetStore returns the store writes go to and the name versions record
// for it: this device's store, or Options.Target's node.
func (r *Realm) targetStore(ctx context.Context) (cairn.Store, string, error) {
	local, err := r.Store(ctx)
	if err != nil {
		return nil, "", err
	}
	self, err := r.selfName(ctx)
	if err != nil {
		// Versions must name where their data is: never guess.
		return nil, "", err
	}
	if self == "" {
		self = "local" // a realm whose device has no credentials yet
	}
	t := r.opts.Target
	if t == "" || t == self {
		return local, self, nil
	}
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	if r.remoteClosed {
		return nil, "", errRealmClosed
	}
	if r.target != nil {
		return r.target, t, nil
	}
	// A registered store (cloud bucket, directory) or else a node.
	n, err := r.namedStoreLocked(ctx, t)
	if err != nil {
		return nil, "", err
	}
	if n != nil {
		if n.rec.Draining {
			return nil, "", cairn.E("open store", cairn.Permission, t, errors.New("the store is being removed: no new data goes to it"))
		}
		r.target = n.st
		return n.st, t, nil
	}
	st, err := r.Meta.Node(ctx, t)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, "", cairn.E("open store", cairn.NotFound, t, errors.New("no such node in the realm (see 'cairn devices')"))
		}
		return nil, "", err
	}
	switch {
	case st.Removed != 0:
		return nil, "", cairn.E("open store", cairn.Permission, t, errors.New("the node was removed from the realm"))
	case st.Role == string(pki.Surrogate):
		return nil, "", errSurrogate(t)
	case st.State != meta.NodeOnline || st.Addr == "":
		return nil, "", cairn.E("open store", cairn.Unavailable, t, fmt.Errorf("the node is %s (last seen %s)", st.State, lastSeen(st.LastSeen)))
	}
	rs, err := r.remoteStore(ctx, t, st.Addr)
	if err != nil {
		return nil, "", err
	}
	r.target = rs
	return rs, t, nil
}

func lastSeen(ns int64) string {
	if ns == 0 {
		return "never"
	}
	return time.Unix(0, ns).Format(time.DateTime)
}

// errSurrogate refuses a surrogate as a place to write.
func errSurrogate(name string) error {
	return cairn.E("open store", cairn.Permission, name, errors.New("the node is a surrogate: it holds staged copies only, writes go to a device, benefactor or store"))
}
