package director

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// A write whose target is asleep goes, under OffloadDecide, to an awake
// offload target (this device by default, or the one named), never waits
// for a wake, and says where the data was meant to go (Write.Home); a
// reader on another device then reads it from the offload target without
// waking the home.
func TestOffloadWrite(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	desktop, laptop2 := memstore.New(), memstore.New()
	e.node("desktop", pki.Device, meta.NodeOnline, desktop)
	e.node("laptop2", pki.Device, meta.NodeOnline, laptop2)
	e.setState("desktop", meta.NodeStandby)
	var wakes atomic.Int64
	wake := func(context.Context, meta.NodeStatus) (string, error) { wakes.Add(1); return "", nil }
	decide := OffloadDecide(WakeDecide)

	// Without an offload decider: the write fails as before.
	if _, err := New(e, Options{Target: "desktop", Decide: WakeDecide}).ForWrite(ctx, ""); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("no offload: %v", err)
	}
	// Auto: this device's own store, which holds no copy of the write.
	d := New(e, Options{Target: "desktop", Decide: decide, Wake: wake})
	w, err := d.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "desk" || w.Home != "desktop" {
		t.Fatalf("auto offload: name %q home %q", w.Name, w.Home)
	}
	id, data := storetest.Blob(1, 100)
	if err := w.Store.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if has, _ := e.local.Has(ctx, []cairn.ID{id}); !has[0] {
		t.Fatal("the offloaded write is not in this device's store")
	}
	d.Close()

	// Named: the second laptop.
	d = New(e, Options{Target: "desktop", Decide: decide, Wake: wake, OffloadTo: "laptop2"})
	defer d.Close()
	w, err = d.ForWrite(ctx, "")
	if err != nil || w.Name != "laptop2" || w.Home != "desktop" {
		t.Fatalf("offload to laptop2: %+v, %v", w, err)
	}
	id2, data2 := storetest.Blob(2, 100)
	if err := w.Store.Put(ctx, id2, data2); err != nil {
		t.Fatal(err)
	}
	if has, _ := laptop2.Has(ctx, []cairn.ID{id2}); !has[0] {
		t.Fatal("the offloaded write is not on laptop2")
	}
	if has, _ := desktop.Has(ctx, []cairn.ID{id, id2}); has[0] || has[1] {
		t.Fatal("the sleeping home got the write")
	}

	// Another device reads the version (which names laptop2) without
	// waking the desktop.
	e2 := newEnv()
	e2.self = "other"
	e2.node("desktop", pki.Device, meta.NodeOnline, desktop)
	e2.node("laptop2", pki.Device, meta.NodeOnline, laptop2)
	e2.setState("desktop", meta.NodeStandby)
	r := New(e2, Options{Decide: decide, Wake: wake, NoCache: true})
	defer r.Close()
	rt, err := r.routerOnly(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rt.Get(store.WithSources(ctx, []string{"laptop2"}), id2); err != nil || string(got) != string(data2) {
		t.Fatalf("read of the offloaded copy: %v", err)
	}
	if n := wakes.Load(); n != 0 {
		t.Fatalf("%d wakes", n)
	}

	// The home as offload target, or no awake target: clear errors.
	if _, err := New(e, Options{Target: "desktop", Decide: decide, OffloadTo: "desktop"}).ForWrite(ctx, ""); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("offload to the home: %v", err)
	}
	e.setState("laptop2", meta.NodeOffline)
	e.self = ""
	_, err = New(e, Options{Target: "desktop", Decide: decide}).ForWrite(ctx, "")
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "no awake offload target") {
		t.Fatalf("no awake target: %v", err)
	}
}

// A copies policy one of whose members sleeps: the write goes to the
// policy with an offload target in that member's place (this device, or
// the one named; never a member already holding a copy), so the policy's
// count of copies holds; two sleeping members, or no offload decider:
// the policy's own wrapper, as before.
func TestOffloadMember(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	lap, desktop, lap2 := memstore.New(), memstore.New(), memstore.New()
	e.node("lap", pki.Device, meta.NodeOnline, lap)
	e.node("desktop", pki.Device, meta.NodeOnline, desktop)
	e.node("lap2", pki.Device, meta.NodeOnline, lap2)
	e.node("attic", pki.Benefactor, meta.NodeOnline, memstore.New())
	e.setState("desktop", meta.NodeStandby)
	decide := OffloadDecide(WakeDecide)
	const pol = "copies:2@lap,desktop"

	w, err := New(e, Options{Decide: WakeDecide, PolicyDir: t.TempDir()}).ForWrite(ctx, pol)
	if err != nil || w.Name != pol || w.Home != "" {
		t.Fatalf("no offload decider: %+v, %v", w, err)
	}
	d := New(e, Options{Decide: decide, PolicyDir: t.TempDir()})
	defer d.Close()
	w, err = d.ForWrite(ctx, pol)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "copies:2@lap,desk" || w.Home != "desktop" || w.OffloadedTo != "desk" || w.HomePolicy != pol {
		t.Fatalf("auto: %+v", w)
	}
	id, data := storetest.Blob(3, 100)
	if err := w.Store.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	// The wrapper writes the copies beyond the first in the background:
	// wait for them.
	ps, err := d.Policy(ctx, w.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Store.(interface{ Flush(context.Context) error }).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]cairn.Store{"lap": lap, "desk": e.local} {
		if has, _ := st.Has(ctx, []cairn.ID{id}); !has[0] {
			t.Fatalf("no copy on %s", name)
		}
	}
	if has, _ := desktop.Has(ctx, []cairn.ID{id}); has[0] {
		t.Fatal("the sleeping member got a copy")
	}

	// Named; this device as a member: the next awake node by name.
	w, err = New(e, Options{Decide: decide, OffloadTo: "lap2", PolicyDir: t.TempDir()}).ForWrite(ctx, pol)
	if err != nil || w.Name != "copies:2@lap,lap2" {
		t.Fatalf("to lap2: %+v, %v", w, err)
	}
	w, err = New(e, Options{Decide: decide, PolicyDir: t.TempDir()}).ForWrite(ctx, "copies:2@desk,desktop")
	if err != nil || w.Name != "copies:2@desk,attic" || w.OffloadedTo != "attic" {
		t.Fatalf("this device a member: %+v, %v", w, err)
	}
	// As many awake members as copies without the sleeper: no offload,
	// the wrapper keeps the copies on them.
	w, err = New(e, Options{Decide: decide, PolicyDir: t.TempDir()}).ForWrite(ctx, "copies:2@lap,lap2,desktop")
	if err != nil || w.Name != "copies:2@lap,lap2,desktop" || w.Home != "" {
		t.Fatalf("two of three awake: %+v, %v", w, err)
	}
	// Two members asleep: the wrapper as before.
	e.setState("lap", meta.NodeOffline)
	w, err = New(e, Options{Decide: decide, PolicyDir: t.TempDir()}).ForWrite(ctx, pol)
	if err != nil || w.Name != pol || w.Home != "" {
		t.Fatalf("two asleep: %+v, %v", w, err)
	}
}
