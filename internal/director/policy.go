package director

// Placement policies (meta/policy.go, DESIGN.md "placement policy"): a
// copies:N@... or ec:K+M@... policy is a replicastore or ecstore wrapper
// over the stores it names (registered stores and nodes, opened through
// Env). One wrapper per policy string per director, shared by the writes
// of every volume under that policy and by the reads of every version
// that names it: a version records the policy string itself as where its
// data is, so any device rebuilds the same wrapper (the order of the
// stores is part of the string) and reads the version back from K shards,
// fastest first.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/replicastore"
	"cairn.dev/cairn/internal/store/storeset"
)

// policyMissScan: a Get of an object a wrapper's index does not know
// (written by another device) scans the members at most this often.
const policyMissScan = 5 * time.Second

// memberRetry is how long a member that could not be opened is not
// tried again.
const memberRetry = 2 * time.Second

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

	pmu  sync.Mutex
	prim primaryCache // a copies policy's primary, as last read (primary.go)

	// morsels is a stripe policy's set of benefactors, under Store (a
	// pack store of morsels): stripe.go.
	morsels *morselSet
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
// reads and verifies everything; progress, if not nil, is told the
// objects checked of those listed as the walk goes.
func (p *PolicyStore) Repair(ctx context.Context, store string, scrub bool, progress func(done, total int)) (storeset.RepairReport, error) {
	switch s := p.Store.(type) {
	case *ecstore.Store:
		return s.Repair(ctx, ecstore.RepairOptions{Store: store, Scrub: scrub, Progress: progress})
	case *replicastore.Store:
		return s.Repair(ctx, replicastore.RepairOptions{Store: store, Scrub: scrub, Progress: progress})
	}
	return storeset.RepairReport{}, nil
}

// Target is the wrapper as a write strategy: writes go to it (at most
// policyInFlight at once) and versions record the policy string.
func (p *PolicyStore) Target(context.Context) (cairn.Store, string, error) {
	return p.io, p.Policy.String(), nil
}

// Policy returns the wrapper of policy s (copies or ec), opened on
// first use. Its members open on first need, and again after a failure,
// so a store that is down when the wrapper is made is only a member down.
func (d *Director) Policy(ctx context.Context, s string) (*PolicyStore, error) {
	pol, err := meta.ParsePolicy(s)
	if err != nil {
		return nil, err
	}
	if pol.Kind == meta.PolicyLocal {
		return nil, cairn.E("open policy", cairn.Invalid, s, errors.New("local is not a wrapper"))
	}
	key := pol.String()
	d.polMu.Lock()
	defer d.polMu.Unlock()
	if d.polClosed {
		return nil, errClosed
	}
	if ps := d.pol[key]; ps != nil {
		return ps, nil
	}
	if pol.Kind == meta.PolicyStripe {
		ps, errIn := d.newStripe(ctx, pol)
		if errIn != nil {
			return nil, errIn
		}
		if d.pol == nil {
			d.pol = map[string]*PolicyStore{}
		}
		d.pol[key] = ps
		return ps, nil
	}
	members := make([]storeset.Named, len(pol.Stores))
	for i, name := range pol.Stores {
		members[i] = storeset.Named{Name: name, Store: &member{name: name, d: d}}
	}
	sum := blake3.Sum256([]byte(key))
	dir := filepath.Join(d.opts.PolicyDir, hex.EncodeToString(sum[:8]))
	ps := &PolicyStore{Policy: pol}
	switch pol.Kind {
	case meta.PolicyEC:
		ps.Store, err = ecstore.New(pol.K, pol.M, members, ecstore.Options{Dir: dir, MissScan: policyMissScan, Logger: d.log})
	case meta.PolicyCopies:
		ps.Store, err = replicastore.New(pol.N, members, replicastore.Options{Dir: dir, Logger: d.log})
	}
	if err != nil {
		return nil, err
	}
	b := &bounded{Store: ps.Store, sem: make(chan struct{}, policyInFlight)}
	ps.io = b
	if rs, ok := ps.Store.(*replicastore.Store); ok {
		if pe, ok := d.env.(Primaries); ok {
			ps.io = &primaryFirst{bounded: b, d: d, ps: ps, rs: rs, pe: pe}
		}
	}
	if d.pol == nil {
		d.pol = map[string]*PolicyStore{}
	}
	d.pol[key] = ps
	return ps, nil
}

// policyPeer is the router's peer for a version that names a policy
// (router.storePeer).
func (rt *router) policyPeer(ctx context.Context, name string) (*peer, error) {
	ps, err := rt.d.Policy(ctx, name)
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

// member is one store of a policy, opened on first need: a registered
// store (the realm owns it), this device's own store, or another node's
// chunk service (the member owns that client). When it cannot be opened it
// fails with Kind Unavailable, so the wrapper counts it as down, and is
// tried again after memberRetry.
type member struct {
	name string
	d    *Director

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

	st, owned, err := m.d.openMember(ctx, m.name)

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

// openMember opens store or node name for a policy: this device's store,
// a registered store (the realm owns both) or a node's chunk service (the
// member owns that client).
func (d *Director) openMember(ctx context.Context, name string) (cairn.Store, bool, error) {
	if self, err := d.env.Self(ctx); err == nil && self == name {
		st, err := d.env.Local(ctx)
		return st, false, err
	}
	n, err := d.env.Store(ctx, name)
	if err != nil {
		return nil, false, err
	}
	if n != nil {
		// Not through the consistency anchor: a shard or copy missing
		// from a member is an expected answer the wrapper handles at
		// once (reading another member, rebuilding), not a lag to wait
		// out; the wrapper itself is read through the router, like any
		// store a version names.
		if n.Member != nil {
			return n.Member, false, nil
		}
		return n.Store, false, nil
	}
	st, err := d.OpenNode(ctx, name)
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
