package director

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storetest"
)

// primaryEnv is fakeEnv with primary records (director.Primaries).
type primaryEnv struct {
	*fakeEnv
	pmu   sync.Mutex
	prim  map[string]string
	reads atomic.Int64
}

func (e *primaryEnv) Primary(_ context.Context, policy string) (string, error) {
	e.reads.Add(1)
	e.pmu.Lock()
	defer e.pmu.Unlock()
	return e.prim[policy], nil
}

func (e *primaryEnv) setPrimary(policy, name string) {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	e.prim[policy] = name
}

// hangingStore is a node that stopped answering (asleep, unannounced, or
// the registry snapshot is stale): a Get returns only when its caller
// gives up.
type hangingStore struct {
	*countingStore
	hang atomic.Bool
}

func (h *hangingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if h.hang.Load() {
		h.gets.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.countingStore.Get(ctx, id)
}

// A read of a copies version asks the policy's primary first, not the
// wrapper's first member.
func TestReadPrefersPrimary(t *testing.T) {
	ctx := context.Background()
	id, data := storetest.Blob(7, 4000)
	const pol = "copies:2@lap,nas"
	for _, prim := range []string{"nas", "lap"} {
		e := &primaryEnv{fakeEnv: newEnv(), prim: map[string]string{pol: prim}}
		held := map[string]*countingStore{"lap": holding(t, id, data), "nas": holding(t, id, data)}
		for name, st := range held {
			e.node(name, pki.Device, meta.NodeOnline, st)
		}
		d := New(e, Options{NoCache: true})
		w, err := d.ForWrite(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			got, err := w.Store.Get(store.WithSources(ctx, []string{pol}), id)
			if err != nil || string(got) != string(data) {
				t.Fatalf("primary %s: %v", prim, err)
			}
		}
		for name, st := range held {
			if want := map[bool]int64{true: 3, false: 0}[name == prim]; st.gets.Load() != want {
				t.Errorf("primary %s: %s was asked %d times, want %d", prim, name, st.gets.Load(), want)
			}
		}
		d.Close()
	}
}

// A reader whose cached primary sleeps does not wake it, even with a
// director that wakes: while the registry snapshot still shows it awake,
// the reader gives up on it within PrimaryGiveUp, reads the record once
// more and reads from the new primary; once the registry shows it asleep
// it is not asked at all.
func TestPrimaryAsleepReadsOtherNoWake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, data := storetest.Blob(8, 4000)
	id2, data2 := storetest.Blob(9, 4000)
	const pol = "copies:2@nas,lap"
	e := &primaryEnv{fakeEnv: newEnv(), prim: map[string]string{pol: "nas"}}
	nas := &hangingStore{countingStore: holding(t, id, data)}
	lap := holding(t, id, data)
	for _, st := range []*countingStore{nas.countingStore, lap} {
		if err := st.Put(ctx, id2, data2); err != nil {
			t.Fatal(err)
		}
	}
	e.node("nas", pki.Device, meta.NodeOnline, nas)
	e.node("lap", pki.Device, meta.NodeOnline, lap)
	var wakes atomic.Int64
	d := New(e, Options{NoCache: true, Decide: WakeDecide, WakeTimeout: 30 * time.Second,
		Wake: func(context.Context, meta.NodeStatus) (string, error) {
			wakes.Add(1)
			return "test", nil
		}})
	defer d.Close()
	w, err := d.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	read := func(id cairn.ID, want []byte) time.Duration {
		t.Helper()
		t0 := time.Now()
		got, err := w.Store.Get(store.WithSources(ctx, []string{pol}), id)
		if err != nil || string(got) != string(want) {
			t.Fatalf("read: %v", err)
		}
		return time.Since(t0)
	}
	read(id, data)
	if nas.gets.Load() != 1 || lap.gets.Load() != 0 || e.reads.Load() != 1 {
		t.Fatalf("first read: nas %d, lap %d gets, %d record reads", nas.gets.Load(), lap.gets.Load(), e.reads.Load())
	}

	// The primary announced standby: the role went to lap, the node
	// stopped answering, and this reader's registry snapshot (and cached
	// record) still show nas awake.
	e.setPrimary(pol, "lap")
	e.setState("nas", meta.NodeStandby)
	nas.hang.Store(true)
	took := read(id2, data2)
	if got := e.reads.Load(); got != 2 {
		t.Errorf("the record was read %d times, want 2 (once, then once after the give-up)", got)
	}
	if took < PrimaryGiveUp || took > PrimaryGiveUp+3*time.Second {
		t.Errorf("the read took %v: want the give-up (%v) and one read from the new primary", took, PrimaryGiveUp)
	}
	if nas.gets.Load() != 2 || lap.gets.Load() != 1 {
		t.Errorf("after the give-up: nas %d gets (want 2), lap %d (want 1)", nas.gets.Load(), lap.gets.Load())
	}

	// The registry shows nas asleep now, and the record names it again
	// (a stale record): it is neither asked nor woken; lap answers.
	d.router.mu.Lock()
	d.router.listed = nil
	d.router.mu.Unlock()
	e.setPrimary(pol, "nas")
	for _, ps := range d.pol {
		ps.pmu.Lock()
		ps.prim = primaryCache{}
		ps.pmu.Unlock()
	}
	if took := read(id, data); took > PrimaryGiveUp {
		t.Errorf("a read with the primary asleep in the registry took %v: it waited for it", took)
	}
	if nas.gets.Load() != 2 || lap.gets.Load() != 2 {
		t.Errorf("primary asleep: nas %d gets (want 2), lap %d (want 2)", nas.gets.Load(), lap.gets.Load())
	}
	if wakes.Load() != 0 {
		t.Errorf("%d wakes with an awake replica", wakes.Load())
	}
}
