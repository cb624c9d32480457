package realm

// Placement policies (meta/policy.go, DESIGN.md "placement policy"): a
// copies:N@... or ec:K+M@... policy is a replicastore or ecstore wrapper
// over the stores it names (registered stores and nodes, opened as
// stores.go and fetch.go open them). One wrapper per policy string per
// process, shared by the writes of every volume under that policy and by
// the reads of every version that names it: a version records the policy
// string itself as where its data is, so any device rebuilds the same
// wrapper (the order of the stores is part of the string) and reads the
// version back from K shards, fastest first.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/replicastore"
	"cairn.dev/cairn/internal/store/storeset"
)

// policyDir is the home's directory of the wrappers' repair queues and
// shard-map caches, one subdirectory per policy.
const policyDir = "policy"

// policyMissScan: a Get of an object a wrapper's index does not know
// (written by another device) scans the members at most this often.
const policyMissScan = 5 * time.Second

// memberRetry is how long a member that could not be opened is not
// tried again.
const memberRetry = 2 * time.Second

// policyState is what the realm keeps of the policies in use.
type policyState struct {
	mu     sync.Mutex
	closed bool
	stores map[string]*PolicyStore // by canonical policy string
	vols   map[string]*fs.Volume   // by volume name + "\x00" + policy
}

// PolicyStore is an open copies or ec wrapper.
type PolicyStore struct {
	Policy meta.Policy
	Store  cairn.Store // *ecstore.Store or *replicastore.Store
	// io is Store with at most policyInFlight Puts and Gets at once, for
	// the file layer and the router: a put of many large files keeps
	// thousands of chunk Puts in flight, and a wrapper refuses requests
	// beyond a bound per member (storeset: too many waiting), counting
	// the member as down.
	io cairn.Store
}

// policyInFlight bounds the Puts and Gets under way through one policy's
// wrapper (its members take 8 requests each at a time, and let 256 wait).
const policyInFlight = 64

// bounded is a store with a bound on the Puts and Gets in flight.
type bounded struct {
	cairn.Store
	sem chan struct{}
}

func (b *bounded) acquire(ctx context.Context, op string, id cairn.ID) error {
	select {
	case b.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return store.CtxErr(ctx, op, id.String())
	}
}

func (b *bounded) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := b.acquire(ctx, "put", id); err != nil {
		return err
	}
	defer func() { <-b.sem }()
	return b.Store.Put(ctx, id, data)
}

func (b *bounded) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := b.acquire(ctx, "get", id); err != nil {
		return nil, err
	}
	defer func() { <-b.sem }()
	return b.Store.Get(ctx, id)
}

// Health returns the members' health, in the policy's order.
func (p *PolicyStore) Health() []storeset.Health {
	switch s := p.Store.(type) {
	case *ecstore.Store:
		return s.Health()
	case *replicastore.Store:
		return s.Health()
	}
	return nil
}

// Repair runs the wrapper's repair (see ecstore and replicastore
// RepairOptions): store, if not "", restricts it to that member; scrub
// reads and verifies everything.
func (p *PolicyStore) Repair(ctx context.Context, store string, scrub bool) (storeset.RepairReport, error) {
	switch s := p.Store.(type) {
	case *ecstore.Store:
		return s.Repair(ctx, ecstore.RepairOptions{Store: store, Scrub: scrub})
	case *replicastore.Store:
		return s.Repair(ctx, replicastore.RepairOptions{Store: store, Scrub: scrub})
	}
	return storeset.RepairReport{}, nil
}

// CheckPolicy parses a policy and checks that every store it names is a
// registered store (not being removed) or a node of the realm (not
// removed). It returns the policy in canonical form.
func (r *Realm) CheckPolicy(ctx context.Context, s string) (meta.Policy, error) {
	pol, err := meta.ParsePolicy(s)
	if err != nil {
		return pol, err
	}
	for _, name := range pol.Stores {
		rec, err := r.Meta.Store(ctx, name)
		if err == nil {
			if rec.Draining {
				return pol, cairn.E("policy", cairn.Permission, name, errors.New("the store is being removed: no new data goes to it"))
			}
			continue
		}
		if !errors.Is(err, cairn.ErrNotFound) {
			return pol, err
		}
		if pol.Kind == meta.PolicyEC {
			// gc sweeps a node's store with the chunks' mark, which
			// would delete shards: until it sweeps them through the
			// wrapper, ec members are registered stores only.
			if _, nerr := r.Meta.Node(ctx, name); nerr == nil {
				return pol, cairn.E("policy", cairn.Invalid, name, errors.New("an ec policy names registered stores only (see 'cairn store add'), not nodes: use node://NAME as a store, or copies:N"))
			}
		}
		n, err := r.Meta.Node(ctx, name)
		if err != nil {
			if errors.Is(err, cairn.ErrNotFound) {
				return pol, cairn.E("policy", cairn.NotFound, name, errors.New("no such store or node in the realm (see 'cairn store ls', 'cairn devices')"))
			}
			return pol, err
		}
		if n.Removed != 0 {
			return pol, cairn.E("policy", cairn.Permission, name, errors.New("the node was removed from the realm"))
		}
		if n.Role == string(pki.Surrogate) {
			return pol, errSurrogate(name)
		}
	}
	return pol, nil
}

// SetPolicy checks policy and sets it on path ("/" or "/a/b") of volume
// vol. It returns the canonical form recorded.
func (r *Realm) SetPolicy(ctx context.Context, vol, path, policy string) (string, error) {
	pol, err := r.CheckPolicy(ctx, policy)
	if err != nil {
		return "", err
	}
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return "", err
	}
	rec := meta.PolicyRecord{Path: path, Policy: pol.String(), Set: time.Now().UnixNano(), SetBy: r.nodeName(ctx)}
	return rec.Policy, v.Meta.SetPolicy(ctx, rec)
}

// policyStore returns the wrapper of policy s (copies or ec), opened on
// first use. Its members open on first need, and again after a failure,
// so a store that is down when the wrapper is made is only a member down.
func (r *Realm) policyStore(ctx context.Context, s string) (*PolicyStore, error) {
	pol, err := meta.ParsePolicy(s)
	if err != nil {
		return nil, err
	}
	if pol.Kind == meta.PolicyLocal {
		return nil, cairn.E("open policy", cairn.Invalid, s, errors.New("local is not a wrapper"))
	}
	key := pol.String()
	r.pol.mu.Lock()
	defer r.pol.mu.Unlock()
	if r.pol.closed {
		return nil, errRealmClosed
	}
	if ps := r.pol.stores[key]; ps != nil {
		return ps, nil
	}
	members := make([]storeset.Named, len(pol.Stores))
	for i, name := range pol.Stores {
		members[i] = storeset.Named{Name: name, Store: &member{name: name, r: r}}
	}
	sum := blake3.Sum256([]byte(key))
	dir := filepath.Join(r.Home, policyDir, hex.EncodeToString(sum[:8]))
	ps := &PolicyStore{Policy: pol}
	switch pol.Kind {
	case meta.PolicyEC:
		ps.Store, err = ecstore.New(pol.K, pol.M, members, ecstore.Options{Dir: dir, MissScan: policyMissScan, Logger: r.log})
	case meta.PolicyCopies:
		ps.Store, err = replicastore.New(pol.N, members, replicastore.Options{Dir: dir, Logger: r.log})
	}
	if err != nil {
		return nil, err
	}
	ps.io = &bounded{Store: ps.Store, sem: make(chan struct{}, policyInFlight)}
	if r.pol.stores == nil {
		r.pol.stores = map[string]*PolicyStore{}
	}
	r.pol.stores[key] = ps
	return ps, nil
}

// PolicyStoreOf is policyStore, for commands that show or repair a policy.
func (r *Realm) PolicyStoreOf(ctx context.Context, policy string) (*PolicyStore, error) {
	return r.policyStore(ctx, policy)
}

// PolicyVolume returns volume name opened to write under policy: its
// writes (chunks, delta bases, manifests) go to the policy's wrapper, and
// its versions record the policy string as where their data is. "" and
// "local" give Volume(name), as does any policy while Options.Target is
// set (put --store overrides policies). Reads through it work for any
// version, as through Volume. Not for use by several goroutines at once
// with Volume.
func (r *Realm) PolicyVolume(ctx context.Context, name, policy string) (*fs.Volume, error) {
	if policy == "" || policy == meta.PolicyLocal || r.opts.Target != "" {
		return r.Volume(ctx, name)
	}
	def, err := r.Volume(ctx, name)
	if err != nil {
		return nil, err
	}
	ps, err := r.policyStore(ctx, policy)
	if err != nil {
		return nil, err
	}
	key := name + "\x00" + ps.Policy.String()
	r.pol.mu.Lock()
	defer r.pol.mu.Unlock()
	if v := r.pol.vols[key]; v != nil {
		return v, nil
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, err
	}
	master, err := kr.Key(def.Meta.V.ID, name) // Volume made sure it is there
	if err != nil {
		return nil, err
	}
	local, err := r.Store(ctx)
	if err != nil {
		return nil, err
	}
	ds := &deviceStore{local: local, target: ps.io, r: r}
	v, err := fs.Open(r.Meta, def.Meta, master, ds, fs.Options{StoreName: ps.Policy.String(), Workers: r.opts.Workers, Readahead: readahead, Logger: r.log})
	if err != nil {
		return nil, err
	}
	if r.pol.vols == nil {
		r.pol.vols = map[string]*fs.Volume{}
	}
	r.pol.vols[key] = v
	return v, nil
}

// policyPeer is the router's peer for a version that names a policy
// (router.storePeer).
func (rt *router) policyPeer(ctx context.Context, name string) (*peer, error) {
	ps, err := rt.r.policyStore(ctx, name)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p := rt.nodes["store:"+name]; p != nil {
		return p, nil
	}
	p := &peer{name: name, addr: name, st: ps.io, shared: true}
	rt.nodes["store:"+name] = p
	return p, nil
}

// closePolicies closes the policy volumes, then the wrappers (which wait
// for their background writes and save their repair queues), before the
// stores they write to close.
func (r *Realm) closePolicies() {
	r.pol.mu.Lock()
	defer r.pol.mu.Unlock()
	r.pol.closed = true
	for _, v := range r.pol.vols {
		v.Close()
	}
	for _, ps := range r.pol.stores {
		if err := ps.Store.Close(); err != nil {
			r.log.Warn("closing a policy's stores", "policy", ps.Policy.String(), "err", err)
		}
	}
}

// member is one store of a policy, opened on first need: a registered
// store (the realm owns it), this device's own store, or another node's
// chunk service (the member owns that client). When it cannot be opened it
// fails with Kind Unavailable, so the wrapper counts it as down, and is
// tried again after memberRetry.
type member struct {
	name string
	r    *Realm

	mu      sync.Mutex
	st      cairn.Store
	owned   bool
	err     error
	tried   time.Time
	opening chan struct{} // closed when the open under way ends; nil if none
}

var (
	_ cairn.Store       = (*member)(nil)
	_ store.RangeReader = (*member)(nil)
)

// open opens the member on first need. The open runs without m.mu held:
// while a member that failed is tried again (a cloud store's open retries
// its listing for a second or more when the server is stopped), other
// requests fail at once with the last error instead of queueing behind it;
// only before the first outcome do they wait for it.
func (m *member) open(ctx context.Context) (cairn.Store, error) {
	m.mu.Lock()
	for {
		if m.st != nil {
			st := m.st
			m.mu.Unlock()
			return st, nil
		}
		if m.err != nil && (m.opening != nil || time.Since(m.tried) < memberRetry) {
			err := m.err
			m.mu.Unlock()
			return nil, err
		}
		if m.opening == nil {
			break
		}
		ch := m.opening
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, store.CtxErr(ctx, "open store", m.name)
		}
		m.mu.Lock()
	}
	ch := make(chan struct{})
	m.opening = ch
	m.mu.Unlock()

	st, owned, err := m.r.openMember(ctx, m.name)

	m.mu.Lock()
	defer m.mu.Unlock()
	m.opening = nil
	close(ch)
	if err != nil {
		if ctx.Err() != nil {
			return nil, store.CtxErr(ctx, "open store", m.name)
		}
		m.tried = time.Now()
		kind := cairn.Unavailable
		if errors.Is(err, cairn.ErrPermission) {
			kind = cairn.Permission
		}
		m.err = cairn.E("open store", kind, m.name, err)
		return nil, m.err
	}
	m.tried = time.Now()
	m.st, m.owned, m.err = st, owned, nil
	return st, nil
}

// openMember opens store or node name for a policy.
func (r *Realm) openMember(ctx context.Context, name string) (cairn.Store, bool, error) {
	if self, err := r.selfName(ctx); err == nil && self == name {
		st, err := r.Store(ctx)
		return st, false, err
	}
	n, err := r.namedStore(ctx, name)
	if err != nil {
		return nil, false, err
	}
	if n != nil {
		// Not through the consistency anchor: a shard or copy missing
		// from a member is an expected answer the wrapper handles at
		// once (reading another member, rebuilding), not a lag to wait
		// out; the wrapper itself is read through the router, like any
		// store a version names.
		if n.member != nil {
			return n.member, false, nil
		}
		return n.st, false, nil
	}
	st, err := r.nodeStore(ctx, name)
	return st, true, err
}

func (m *member) Put(ctx context.Context, id cairn.ID, data []byte) error {
	st, err := m.open(ctx)
	if err != nil {
		return err
	}
	return st.Put(ctx, id, data)
}

func (m *member) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	st, err := m.open(ctx)
	if err != nil {
		return nil, err
	}
	return st.Get(ctx, id)
}

// GetRange reads a range with the store's own ranged read, or cuts it out
// of the whole object.
func (m *member) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	st, err := m.open(ctx)
	if err != nil {
		return nil, err
	}
	if rr, ok := st.(store.RangeReader); ok {
		return rr.GetRange(ctx, id, off, n)
	}
	b, err := st.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || off+n > int64(len(b)) {
		return nil, cairn.E("get range", cairn.Invalid, id.String(), fmt.Errorf("range %d+%d past the end (%d bytes)", off, n, len(b)))
	}
	return slices.Clone(b[off : off+n]), nil
}

func (m *member) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	st, err := m.open(ctx)
	if err != nil {
		return nil, err
	}
	return st.Has(ctx, ids)
}

func (m *member) Delete(ctx context.Context, id cairn.ID) error {
	st, err := m.open(ctx)
	if err != nil {
		return err
	}
	return st.Delete(ctx, id)
}

func (m *member) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	st, err := m.open(ctx)
	if err != nil {
		return err
	}
	return st.List(ctx, fn)
}

// Close closes a node client the member opened; shared stores stay open.
func (m *member) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.st != nil && m.owned {
		return m.st.Close()
	}
	return nil
}

// PoliciesInUse returns the distinct copies and ec policies named by the
// versions of every volume (trash included) and set on paths, sorted.
func (r *Realm) PoliciesInUse(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	list, err := r.Meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	for _, mv := range list {
		v, err := r.Volume(ctx, mv.Name)
		if err != nil {
			return nil, err
		}
		err = v.Meta.Walk(ctx, func(e *meta.Entry, _ bool) error {
			for _, ver := range e.Versions {
				for _, s := range ver.Stores {
					if meta.IsPolicyName(s) {
						seen[s] = true
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		recs, err := v.Meta.Policies(ctx)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			if meta.IsPolicyName(rec.Policy) {
				seen[rec.Policy] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

// RepairResult is what Repair did for one policy.
type RepairResult struct {
	Policy string                `json:"policy"`
	Report storeset.RepairReport `json:"report"`
	Error  string                `json:"error,omitempty"`
	Health []storeset.Health     `json:"health"`
	Queued int                   `json:"queued"` // repairs still waiting after the run
}

// Repair repairs every copies and ec policy in use (PoliciesInUse): the
// queued repairs, then a walk of every object, rebuilding missing (with
// scrub, also damaged) copies and shards onto their stores. store, if not
// "", restricts it to the policies naming that store and to that store's
// copies and shards. An error is for what stopped it; each policy's
// failures are in its result.
func (r *Realm) Repair(ctx context.Context, storeName string, scrub bool, progress func(RepairResult)) ([]RepairResult, error) {
	pols, err := r.PoliciesInUse(ctx)
	if err != nil {
		return nil, err
	}
	var out []RepairResult
	for _, s := range pols {
		pol, err := meta.ParsePolicy(s)
		if err != nil {
			return out, err
		}
		if storeName != "" && !slices.Contains(pol.Stores, storeName) {
			continue
		}
		ps, err := r.policyStore(ctx, s)
		if err != nil {
			return out, err
		}
		res := RepairResult{Policy: s}
		res.Report, err = ps.Repair(ctx, storeName, scrub)
		if err != nil {
			if ctx.Err() != nil {
				return out, err
			}
			res.Error = err.Error()
		}
		res.Health = ps.Health()
		for _, h := range res.Health {
			res.Queued += h.Queued
		}
		out = append(out, res)
		if progress != nil {
			progress(res)
		}
	}
	if storeName != "" && len(out) == 0 {
		return nil, cairn.E("repair", cairn.NotFound, storeName, errors.New("no policy in use names this store"))
	}
	return out, nil
}

// FilePlacement is where one file's current version is.
type FilePlacement struct {
	Path    string   `json:"path"`
	Size    int64    `json:"size"`
	Version uint64   `json:"version"`
	Stores  []string `json:"stores"`
	// Policy is the policy in force for the path now (new versions go
	// there); Stores say where the current version went.
	Policy string `json:"policy"`
	// Readable: for a version under a copies or ec policy, whether the
	// wrapper finds its manifest stored with enough copies or shards
	// ("" when not checked).
	Readable string `json:"readable,omitempty"`
}

// PolicyReport is what `cairn policy get` shows.
type PolicyReport struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
	// InForce is the policy for Path, and From the path it is set on
	// ("" for the default, local).
	InForce string `json:"policy"`
	From    string `json:"from,omitempty"`
	// Set lists the policies set on Path and below it.
	Set   []meta.PolicyRecord `json:"set"`
	Files []FilePlacement     `json:"files"`
	// Health of the stores of each copies or ec policy the files use.
	Health map[string][]storeset.Health `json:"health"`
}

// placementTTL is how long Placement trusts the policies it read: a
// policy set while a volume is mounted or served applies to the files
// written from then on, within this delay.
const placementTTL = 2 * time.Second

// Placement is the fs.Placement of volume name, for writers that know each
// file's path (the mount, the WebDAV gateway): a file is written under the
// policy set on its nearest ancestor, as put does (put --store has no
// counterpart there). The policies are read again at most every
// placementTTL.
func (r *Realm) Placement(name string) fs.Placement {
	var (
		mu   sync.Mutex
		recs []meta.PolicyRecord
		read time.Time
		vols = map[string]*fs.Volume{}
	)
	return func(ctx context.Context, path string) (*fs.Volume, error) {
		mu.Lock()
		defer mu.Unlock()
		if read.IsZero() || time.Since(read) > placementTTL {
			rs, err := r.Policies(ctx, name)
			if err != nil {
				return nil, err
			}
			recs, read = rs, time.Now()
		}
		rec := meta.PolicyFor(recs, path)
		if rec == nil || rec.Policy == meta.PolicyLocal {
			return nil, nil
		}
		if v := vols[rec.Policy]; v != nil {
			return v, nil
		}
		v, err := r.PolicyVolume(ctx, name, rec.Policy)
		if err != nil {
			return nil, fmt.Errorf("policy %s of %s:%s: %w", rec.Policy, name, rec.Path, err)
		}
		vols[rec.Policy] = v
		return v, nil
	}
}

// Policies returns the policies set on volume vol.
func (r *Realm) Policies(ctx context.Context, vol string) ([]meta.PolicyRecord, error) {
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return nil, err
	}
	return v.Meta.Policies(ctx)
}

// PolicyReport reports the policy in force at path of volume vol and, for
// every file at or under it, where its current version is; each copies or
// ec policy those versions name is asked whether it holds their manifests
// (Has: no data read), which also gives its stores' health.
func (r *Realm) PolicyReport(ctx context.Context, vol string, parts []string) (*PolicyReport, error) {
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return nil, err
	}
	recs, err := v.Meta.Policies(ctx)
	if err != nil {
		return nil, err
	}
	path := "/" + strings.Join(parts, "/")
	rep := &PolicyReport{Volume: vol, Path: path, InForce: meta.PolicyLocal, Set: []meta.PolicyRecord{}, Health: map[string][]storeset.Health{}}
	if rec := meta.PolicyFor(recs, path); rec != nil {
		rep.InForce, rep.From = rec.Policy, rec.Path
	}
	for _, rec := range recs {
		if path == "/" || rec.Path == path || strings.HasPrefix(rec.Path, path+"/") {
			rep.Set = append(rep.Set, rec)
		}
	}
	e, err := v.Meta.Lookup(ctx, parts)
	if err != nil {
		return nil, err
	}
	rescanned := map[string]bool{}
	var walk func(e *meta.Entry, p string) error
	walk = func(e *meta.Entry, p string) error {
		if !e.IsDir() {
			if e.Type != meta.TypeFile {
				return nil
			}
			fp := FilePlacement{Path: p, Size: e.Size, Policy: meta.PolicyLocal}
			if rec := meta.PolicyFor(recs, p); rec != nil {
				fp.Policy = rec.Policy
			}
			if cur := e.Current(); cur != nil {
				fp.Version, fp.Stores = cur.N, cur.Stores
				for _, s := range cur.Stores {
					if !meta.IsPolicyName(s) {
						continue
					}
					fp.Readable = "no"
					ps, err := r.policyStore(ctx, s)
					if err != nil {
						fp.Readable = err.Error()
						continue
					}
					if ec, ok := ps.Store.(*ecstore.Store); ok && !rescanned[s] {
						// Learn the shard maps other devices wrote.
						rescanned[s] = true
						if err := ec.Rescan(ctx); err != nil {
							r.log.Warn("listing a policy's stores", "policy", s, "err", err)
						}
					}
					if has, err := ps.Store.Has(ctx, []cairn.ID{cur.Manifest}); err != nil {
						fp.Readable = err.Error()
					} else if has[0] {
						fp.Readable = "yes"
					}
				}
			}
			rep.Files = append(rep.Files, fp)
			return nil
		}
		kids, err := v.Meta.ReadDir(ctx, e.Ino)
		if err != nil {
			return err
		}
		for i := range kids {
			if err := walk(&kids[i], strings.TrimSuffix(p, "/")+"/"+kids[i].Name); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(e, path); err != nil {
		return nil, err
	}
	for _, f := range rep.Files {
		for _, s := range f.Stores {
			if _, ok := rep.Health[s]; ok || !meta.IsPolicyName(s) {
				continue
			}
			if ps, err := r.policyStore(ctx, s); err == nil {
				rep.Health[s] = ps.Health()
			}
		}
	}
	if rep.Files == nil {
		rep.Files = []FilePlacement{}
	}
	return rep, nil
}

// policyGCStores adjusts the stores gc sweeps (GCStores): a store that is
// a member of an ec policy holds shards and shard maps, whose IDs are no
// chunk's, so sweeping it with the chunks' mark would delete them all; it
// is left out, and each ec policy in use is swept through its wrapper
// instead (its List names the objects it holds, Delete removes their
// shards and maps). Members of copies policies hold objects under their own
// IDs and are swept as they are.
func (r *Realm) policyGCStores(ctx context.Context, out []fs.NamedStore) ([]fs.NamedStore, error) {
	pols, err := r.PoliciesInUse(ctx)
	if err != nil {
		return out, err
	}
	ecMember := map[string]bool{}
	var wrappers []fs.NamedStore
	for _, s := range pols {
		pol, err := meta.ParsePolicy(s)
		if err != nil || pol.Kind != meta.PolicyEC {
			continue
		}
		for _, m := range pol.Stores {
			ecMember[m] = true
		}
		ps, err := r.policyStore(ctx, s)
		if err != nil {
			return out, err
		}
		wrappers = append(wrappers, fs.NamedStore{Name: s, Store: ps.Store})
	}
	kept := out[:0]
	for _, o := range out {
		if !ecMember[o.Name] {
			kept = append(kept, o)
		}
	}
	return append(kept, wrappers...), nil
}
