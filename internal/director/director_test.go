package director

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// fakeEnv is a realm in memory: a device "desk", nodes with states, each
// node's chunk service a store in memory, registered stores in memory.
type fakeEnv struct {
	mu     sync.Mutex
	self   string
	local  cairn.Store
	nodes  []meta.NodeStatus
	conns  map[string]cairn.Store // by node name: what Dial returns
	stores map[string]*Named
	// storeOpen, if set, is called to open registered store name, before
	// stores is looked at.
	storeOpen func(ctx context.Context, name string) (*Named, error)
	dials     atomic.Int64
}

func newEnv() *fakeEnv {
	return &fakeEnv{self: "desk", local: memstore.New(), conns: map[string]cairn.Store{}, stores: map[string]*Named{}}
}

// node adds a node: its state, role and chunk service.
func (e *fakeEnv) node(name string, role pki.Role, state string, st cairn.Store) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.nodes = append(e.nodes, meta.NodeStatus{NodeRecord: meta.NodeRecord{Name: name, Role: string(role), Addr: name + ":1", LastSeen: time.Date(2026, 12, 1, 10, 0, 0, 0, time.Local).UnixNano()}, State: state})
	e.conns[name] = st
}

func (e *fakeEnv) Self(context.Context) (string, error)            { return e.self, nil }
func (e *fakeEnv) Local(context.Context) (cairn.Store, error)      { return e.local, nil }
func (e *fakeEnv) CacheStore(context.Context) (cairn.Store, error) { return memstore.New(), nil }

func (e *fakeEnv) Nodes(context.Context) ([]meta.NodeStatus, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]meta.NodeStatus(nil), e.nodes...), nil
}

func (e *fakeEnv) Node(_ context.Context, name string) (*meta.NodeStatus, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range e.nodes {
		if n.Name == name {
			return &n, nil
		}
	}
	return nil, cairn.E("node", cairn.NotFound, name, errors.New("no such node"))
}

func (e *fakeEnv) Store(ctx context.Context, name string) (*Named, error) {
	if e.storeOpen != nil {
		return e.storeOpen(ctx, name)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stores[name], nil
}

func (e *fakeEnv) Dial(_ context.Context, name, _ string) (cairn.Store, error) {
	e.dials.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.conns[name]
	if st == nil {
		return nil, cairn.E("dial", cairn.Unavailable, name, errors.New("no such node"))
	}
	return noClose{st}, nil
}

// noClose keeps a node's store open when the director closes its client.
type noClose struct{ cairn.Store }

func (noClose) Close() error { return nil }

// countingStore counts the Gets it is asked.
type countingStore struct {
	cairn.Store
	gets atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, id)
}

// failingStore fails every Get with err.
type failingStore struct {
	cairn.Store
	err  error
	gets atomic.Int64
}

func (f *failingStore) Get(context.Context, cairn.ID) ([]byte, error) {
	f.gets.Add(1)
	return nil, f.err
}

func holding(t *testing.T, id cairn.ID, data []byte) *countingStore {
	t.Helper()
	c := &countingStore{Store: memstore.New()}
	if err := c.Put(context.Background(), id, data); err != nil {
		t.Fatal(err)
	}
	return c
}

// A read asks only the nodes the version names: a miss there is not
// broadcast to the other online nodes (benefactors, surrogates, devices).
// A version that names no node but this device ("local", written before
// versions named nodes) asks the other devices only.
func TestReadAsksOnlyTheNamedNodes(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	id, data := storetest.Blob(3, 5000)
	fakes := map[string]*countingStore{}
	for _, n := range []struct {
		name string
		role pki.Role
		has  bool
	}{{"donor", pki.Benefactor, true}, {"cafe", pki.Surrogate, true}, {"laptop", pki.Device, true}, {"spare", pki.Benefactor, false}} {
		c := &countingStore{Store: memstore.New()}
		if n.has {
			if err := c.Put(ctx, id, data); err != nil {
				t.Fatal(err)
			}
		}
		fakes[n.name] = c
		e.node(n.name, n.role, meta.NodeOnline, c)
	}
	d := New(e, Options{NoCache: true})
	defer d.Close()
	rt, err := d.routerOnly(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gets := func() map[string]int64 {
		m := map[string]int64{}
		for n, c := range fakes {
			m[n] = c.gets.Swap(0)
		}
		return m
	}

	// Named and held: one request, to it.
	if got, err := rt.Get(store.WithSources(ctx, []string{"donor"}), id); err != nil || string(got) != string(data) {
		t.Fatalf("read from the named node: %v", err)
	}
	if g := gets(); g["donor"] != 1 || g["cafe"]+g["laptop"]+g["spare"] != 0 {
		t.Fatalf("requests: %v", g)
	}
	// Named and missing: NotFound, nobody else asked.
	if _, err := rt.Get(store.WithSources(ctx, []string{"spare"}), id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("read from a node without it: %v", err)
	}
	if g := gets(); g["spare"] != 1 || g["donor"]+g["cafe"]+g["laptop"] != 0 {
		t.Fatalf("requests after a miss: %v", g)
	}
	// Named "local" (an old version): the other devices only.
	if got, err := rt.Get(store.WithSources(ctx, []string{"local"}), id); err != nil || string(got) != string(data) {
		t.Fatalf("read of an old version: %v", err)
	}
	if g := gets(); g["laptop"] != 1 || g["donor"]+g["cafe"]+g["spare"] != 0 {
		t.Fatalf("requests for an old version: %v", g)
	}
}

// A node that fails a request (a forged TLS alert at its address, a
// refusal of this device: one node's word, maybe on a stale list) does not
// stop a read: the router moves on to the next node that holds the chunk,
// and keeps the failed node behind the others for a while.
func TestReadMovesPastFailingNodes(t *testing.T) {
	ctx := context.Background()
	id, data := storetest.Blob(9, 20000)
	for _, fail := range []error{
		cairn.E("remote get", cairn.IO, "ghost", errors.New("remote error: tls: bad certificate")),
		cairn.E("remote get", cairn.Permission, id.String(), errors.New("certificate of node desk is revoked")),
	} {
		e := newEnv()
		ghost := &failingStore{Store: memstore.New(), err: fail}
		donor := holding(t, id, data)
		e.node("donor", pki.Benefactor, meta.NodeOnline, donor)
		e.node("ghost", pki.Benefactor, meta.NodeOnline, ghost)
		d := New(e, Options{NoCache: true})
		rt, err := d.routerOnly(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The ghost is asked first: the donor is made to look down (no
		// probe reorders them).
		dp, err := rt.peer(ctx, "donor", "donor:1")
		if err != nil {
			t.Fatal(err)
		}
		gp, err := rt.peer(ctx, "ghost", "ghost:1")
		if err != nil {
			t.Fatal(err)
		}
		dp.downUntil, dp.rtt, gp.rtt = time.Now().Add(time.Hour), time.Millisecond, time.Millisecond
		sctx := store.WithSources(ctx, []string{"ghost", "donor"})
		got, err := rt.Get(sctx, id)
		if err != nil || string(got) != string(data) {
			t.Fatalf("read past %v: %v", fail, err)
		}
		if ghost.gets.Load() != 1 || donor.gets.Load() != 1 {
			t.Fatalf("ghost asked %d times, donor %d; want 1 and 1", ghost.gets.Load(), donor.gets.Load())
		}
		if !time.Now().Before(gp.downUntil) {
			t.Fatal("the failed node is not kept behind the others")
		}
		d.Close()
	}
}

// A node a version names that is not awake (offline, or in any other state
// but online: standby) is not asked. With another copy the read uses it;
// without, it fails with Kind Unavailable naming the node and its state.
// A Decider that says Fail fails the read at once, naming the node, the
// state and the operation's Path.
func TestNodeNotAwake(t *testing.T) {
	ctx := context.Background()
	id, data := storetest.Blob(4, 3000)
	for _, state := range []string{meta.NodeOffline, "standby"} {
		t.Run(state, func(t *testing.T) {
			e := newEnv()
			sleeper := holding(t, id, data)
			donor := holding(t, id, data)
			e.node("laptop", pki.Device, state, sleeper)
			e.node("donor", pki.Benefactor, meta.NodeOnline, donor)
			d := New(e, Options{NoCache: true})
			defer d.Close()
			w, err := d.ForWrite(ctx, "")
			if err != nil {
				t.Fatal(err)
			}

			// Another copy: used; the sleeper is neither dialled nor asked.
			got, err := w.Store.Get(store.WithSources(ctx, []string{"laptop", "donor"}), id)
			if err != nil || string(got) != string(data) {
				t.Fatalf("read with another copy: %v", err)
			}
			if sleeper.gets.Load() != 0 || donor.gets.Load() != 1 {
				t.Fatalf("gets: sleeper %d, donor %d", sleeper.gets.Load(), donor.gets.Load())
			}

			// No other copy: Unavailable, naming the node and its state.
			_, err = w.Store.Get(store.WithSources(ctx, []string{"laptop"}), id)
			if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "laptop ("+state+")") {
				t.Fatalf("read of a copy only on a node that is %s = %v, want Unavailable naming laptop (%s)", state, err, state)
			}
			if sleeper.gets.Load() != 0 {
				t.Fatal("the sleeping node was asked")
			}

			// A decider that fails: at once, even with another copy.
			var asked []string
			fd := New(e, Options{NoCache: true, Decide: func(_ context.Context, n meta.NodeStatus, use Use) Decision {
				asked = append(asked, n.Name+"/"+use.String())
				return Fail
			}})
			defer fd.Close()
			fw, err := fd.ForWrite(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			_, err = fw.Store.Get(store.WithSources(ctx, []string{"laptop", "donor"}), id)
			var ce *cairn.Error
			if !errors.As(err, &ce) || ce.Kind != cairn.Unavailable || ce.Path != "laptop" || !strings.Contains(err.Error(), "the node is "+state+" (last seen 2026-12-01 10:00:00)") {
				t.Fatalf("read with Fail = %v, want Unavailable, Path laptop, its state", err)
			}
			if len(asked) != 1 || asked[0] != "laptop/read" || donor.gets.Load() != 1 {
				t.Fatalf("decider asked %v; donor gets %d", asked, donor.gets.Load())
			}
		})
	}
}

// A write target that is not awake fails with Kind Unavailable naming the
// node and its state; a surrogate is refused as a target; an awake node is
// dialled once and written to, and versions record its name.
func TestWriteTarget(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	nas := memstore.New()
	e.node("nas", pki.Benefactor, meta.NodeOnline, nas)
	e.node("attic", pki.Benefactor, meta.NodeOffline, memstore.New())
	e.node("cafe", pki.Surrogate, meta.NodeOnline, memstore.New())

	_, err := New(e, Options{Target: "attic"}).ForWrite(ctx, "")
	var ce *cairn.Error
	if !errors.As(err, &ce) || ce.Kind != cairn.Unavailable || ce.Path != "attic" || !strings.Contains(err.Error(), "the node is offline") {
		t.Fatalf("an offline target = %v", err)
	}
	if _, err := New(e, Options{Target: "cafe"}).ForWrite(ctx, ""); !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "surrogate") {
		t.Fatalf("a surrogate target = %v", err)
	}
	d := New(e, Options{Target: "nas"})
	defer d.Close()
	w, err := d.ForWrite(ctx, "copies:2@nas,attic") // Target overrides policies
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "nas" || !w.Default {
		t.Fatalf("write: name %q, default %v", w.Name, w.Default)
	}
	id, data := storetest.Blob(1, 100)
	if err := w.Store.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if has, _ := nas.Has(ctx, []cairn.ID{id}); !has[0] {
		t.Fatal("the write did not go to the target")
	}
	if has, _ := e.local.Has(ctx, []cairn.ID{id}); has[0] {
		t.Fatal("the write went to this device's store too")
	}
	// Written elsewhere, kept in the chunk cache: read back with no
	// request to the node.
	before := e.dials.Load()
	if got, err := w.Store.Get(ctx, id); err != nil || string(got) != string(data) {
		t.Fatalf("read back: %v", err)
	}
	if e.dials.Load() != before {
		t.Fatal("reading back what was written dialled a node")
	}
	// Without a target: this device's store, under its name.
	lw, err := New(e, Options{}).ForWrite(ctx, "")
	if err != nil || lw.Name != "desk" || !lw.Default {
		t.Fatalf("default write: %+v, %v", lw, err)
	}
}
