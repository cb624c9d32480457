package director

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storetest"
)

// setState changes a node's state in the fake registry.
func (e *fakeEnv) setState(name, state string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range e.nodes {
		if e.nodes[i].Name == name {
			e.nodes[i].State = state
			e.nodes[i].Wake = &meta.WakeInfo{MAC: "02:00:00:00:00:01", Broadcast: "10.0.0.255"}
		}
	}
}

// A read whose data only a sleeping node holds wakes it once, for every
// concurrent reader, waits and reads; with an awake copy the sleeper is
// never woken; a wake that never comes fails after WakeTimeout with Kind
// Unavailable naming the node and saying no awake store holds the data.
func TestWake(t *testing.T) {
	ctx := context.Background()
	id, data := storetest.Blob(5, 3000)
	e := newEnv()
	sleeper := holding(t, id, data)
	other := holding(t, id, data)
	e.node("desktop", pki.Device, meta.NodeStandby, sleeper)
	e.node("laptop2", pki.Device, meta.NodeOnline, other)
	e.setState("desktop", meta.NodeStandby)
	var wakes atomic.Int64
	resumes := true
	// The process's metrics (doc/metrics.md) count wakes, not the reads that wait for one.
	wokeOK := metrics.Default().Wakes.WithLabelValues("ok")
	wokeErr := metrics.Default().Wakes.WithLabelValues("error")
	ok0, err0 := testutil.ToFloat64(wokeOK), testutil.ToFloat64(wokeErr)
	var progress sync.Map
	d := New(e, Options{NoCache: true, Decide: WakeDecide, WakeTimeout: 30 * time.Second,
		Wake: func(ctx context.Context, n meta.NodeStatus) (string, error) {
			wakes.Add(1)
			if resumes {
				time.AfterFunc(1500*time.Millisecond, func() { e.setState(n.Name, meta.NodeOnline) })
			}
			return "test", nil
		},
		OnWake: func(node string, waited time.Duration, done bool, err error) {
			progress.Store(node, waited)
		}})
	defer d.Close()
	w, err := d.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	// An awake copy: read from it, no wake.
	got, err := w.Store.Get(store.WithSources(ctx, []string{"desktop", "laptop2"}), id)
	if err != nil || string(got) != string(data) || wakes.Load() != 0 || sleeper.gets.Load() != 0 {
		t.Fatalf("read with an awake copy: %v; wakes %d, sleeper gets %d", err, wakes.Load(), sleeper.gets.Load())
	}

	// Only the sleeper: eight concurrent reads share one wake.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			got, err := w.Store.Get(store.WithSources(ctx, []string{"desktop"}), id)
			if err == nil && string(got) != string(data) {
				err = errors.New("wrong data")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("read that wakes: %v", err)
		}
	}
	if wakes.Load() != 1 {
		t.Fatalf("%d wakes for 8 concurrent reads, want 1", wakes.Load())
	}
	if d := testutil.ToFloat64(wokeOK) - ok0; d != 1 {
		t.Fatalf("cairn_wakes_total{result=ok} moved by %v for one wake", d)
	}
	if v, ok := progress.Load("desktop"); !ok || v.(time.Duration) < time.Second {
		t.Fatalf("progress: %v", v)
	}

	// A wake that never comes.
	resumes = false
	e.setState("desktop", meta.NodeOffline)
	d2 := New(e, Options{NoCache: true, Decide: WakeDecide, WakeTimeout: 700 * time.Millisecond, Wake: d.opts.Wake})
	defer d2.Close()
	w2, err := d2.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = w2.Store.Get(store.WithSources(ctx, []string{"desktop"}), id)
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "no awake store holds the data") || !strings.Contains(err.Error(), "desktop") {
		t.Fatalf("a wake that never comes: %v", err)
	}
	if wakes.Load() != 2 {
		t.Fatalf("wakes %d, want 2", wakes.Load())
	}
	if d := testutil.ToFloat64(wokeErr) - err0; d != 1 {
		t.Fatalf("cairn_wakes_total{result=error} moved by %v for one failed wake", d)
	}
}
