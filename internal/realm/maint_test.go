package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// countingListener accepts connections and counts them: a node's address
// that must never be dialled.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), &n
}

// gc and repair --scrub skip the store of a node in standby: no
// connection reaches its address, each says "skipped: node lap is standby
// since ...", neither counts it as a failure, and each records per store
// when it completed, on the stores it reached only (so that a later run
// catches lap up).
func TestPowerBackgroundWorkSkipsStandby(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	addr, dials := countingListener(t)
	if err := a.Meta.PutNode(ctx, meta.NodeRecord{Name: "lap", Role: "device", Serials: []string{"aa"}}); err != nil {
		t.Fatal(err)
	}
	reg, err := a.Meta.Register(ctx, meta.NodeRecord{Name: "lap", Role: "device", Addr: addr}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Standby(ctx, &meta.WakeInfo{MAC: "02:00:00:00:00:07", Broadcast: "192.0.2.255"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"d1", "d2"} {
		if _, err := a.AddStore(ctx, n, "file://"+filepath.Join(t.TempDir(), n)); err != nil {
			t.Fatal(err)
		}
	}
	const pol = "copies:2@d1,d2,lap"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", pol); err != nil {
		t.Fatal(err)
	}
	v, err := a.PolicyVolume(ctx, DefaultVolume, pol)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := v.Meta.Root(ctx)
	for _, name := range []string{"f", "g", "h"} {
		data := make([]byte, 100<<10)
		rand.Read(data)
		if _, _, werr := v.WriteFile(ctx, root, name, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
			t.Fatal(werr)
		}
	}

	rep, unreachable, err := a.GC(ctx, GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var said bool
	for _, u := range unreachable {
		if sk, ok := AsSkipped(u); ok && sk.Node == "lap" && sk.Standby() && strings.HasPrefix(sk.Error(), "skipped: node lap is standby since ") {
			said = true
		}
	}
	if !said {
		t.Fatalf("gc did not say it skipped lap: %v", unreachable)
	}
	for _, s := range rep.Stores {
		if s.Name == "lap" {
			t.Fatalf("gc swept lap: %+v", rep.Stores)
		}
	}

	walked := map[string][2]int{} // by policy: the last (done, total) the walk reported
	res, err := a.Repair(ctx, "", true, nil, func(policy string, done, total int) { walked[policy] = [2]int{done, total} })
	if err != nil || len(res) != 1 {
		t.Fatalf("repair: %+v %v", res, err)
	}
	rr := res[0]
	if w := walked[rr.Policy]; len(walked) != 1 || w[0] == 0 || w[0] != w[1] || int64(w[0]) != rr.Report.Objects {
		t.Fatalf("repair's walk progress: %v, report %+v", walked, rr.Report)
	}
	if len(rr.Skipped) != 1 || !strings.HasPrefix(rr.Skipped[0], "skipped: node lap is standby since ") || rr.Offline != 0 || rr.Error != "" || rr.Report.Failed != 0 || rr.Report.Unrecoverable != 0 {
		t.Fatalf("repair with lap in standby: %+v", rr)
	}

	m, err := a.Meta.Maint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"desk", "d1", "d2"} {
		if m[s].GC == 0 {
			t.Errorf("no gc recorded for %s: %+v", s, m[s])
		}
	}
	for _, s := range []string{"d1", "d2"} {
		if m[s].Scrub == 0 || m[s].Repair == 0 {
			t.Errorf("no scrub recorded for %s: %+v", s, m[s])
		}
	}
	if _, ok := m["lap"]; ok {
		t.Errorf("work recorded for lap, which slept: %+v", m["lap"])
	}
	if n := dials.Load(); n != 0 {
		t.Fatalf("%d connections reached the node in standby", n)
	}
	if st := waitNode(t, a.Meta, "lap", meta.NodeStandby, time.Second); st.Standby == 0 {
		t.Fatalf("lap: %+v", st)
	}
}

// What is due: gc for a store gc reaches whose last collection is older
// than the interval (or never made), repair and scrub likewise for the
// awake members of policies, scrub scrubFactor times less often.
func TestPowerMaintDue(t *testing.T) {
	now := time.Now()
	day := 24 * time.Hour
	at := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	recs := map[string]meta.MaintRecord{
		"desk": {GC: at(time.Hour)},
		"d1":   {GC: at(time.Hour), Repair: at(time.Hour), Scrub: at(2 * day)},
		"old":  {GC: at(2 * day), Repair: at(2 * day), Scrub: at(8 * day)},
	}
	if gc, repair, scrub := maintDue(now, day, recs, []string{"desk", "d1"}, []string{"d1"}); gc || repair || scrub {
		t.Fatalf("nothing due: %v %v %v", gc, repair, scrub)
	}
	// A store never collected (a node that slept through every run, awake
	// now) makes gc due.
	if gc, _, _ := maintDue(now, day, recs, []string{"desk", "lap"}, nil); !gc {
		t.Fatal("a store never collected: gc not due")
	}
	if gc, repair, scrub := maintDue(now, day, recs, []string{"old"}, []string{"old"}); !gc || repair || !scrub {
		t.Fatalf("old store: %v %v %v", gc, repair, scrub)
	}
	recs["old"] = meta.MaintRecord{Repair: at(2 * day), Scrub: at(2 * day)}
	if _, repair, scrub := maintDue(now, day, recs, nil, []string{"old"}); !repair || scrub {
		t.Fatalf("repair due, scrub not: %v %v", repair, scrub)
	}
}

// The node daemon's schedule runs gc while the device is awake and idle,
// skips the store of a device in standby without waking it, and catches
// it up once that device is awake again.
func TestPowerMaintCatchesUp(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{})
	sb := serveDevice(t, b)
	defer sb.stop()
	waitNode(t, a.Meta, "b", meta.NodeAwake, 10*time.Second)
	if _, err := Control(ctx, b.Home, "standby"); err != nil {
		t.Fatal(err)
	}
	standby := waitNode(t, a.Meta, "b", meta.NodeStandby, 10*time.Second).Standby
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ready atomic.Bool
	ready.Store(true)
	go a.maintLoop(lctx, MaintOptions{Every: time.Hour, Check: 100 * time.Millisecond}, ready.Load)
	waitMaint := func(store string) meta.MaintRecord {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			m, err := a.Meta.Maint(ctx)
			if err == nil && m[store].GC != 0 {
				return m[store]
			}
			if time.Now().After(deadline) {
				t.Fatalf("no gc of %s recorded: %+v %v", store, m, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitMaint("a")
	m, err := a.Meta.Maint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m["b"]; ok {
		t.Fatalf("b collected while in standby: %+v", m["b"])
	}
	if st := waitNode(t, a.Meta, "b", meta.NodeStandby, time.Second); st.Standby != standby {
		t.Fatalf("b after the gc: %+v", st)
	}
	if _, err := Control(ctx, b.Home, "resume"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, a.Meta, "b", meta.NodeAwake, 10*time.Second)
	waitMaint("b")
}

// A gc's record reaches the stores swept through a policy's wrapper (an
// ec policy's members) and the node behind a node:// store, so that the
// schedule does not find them due again at every look.
func TestPowerMaintNames(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	if _, err := a.AddStore(ctx, "na", "node://desk"); err != nil {
		t.Fatal(err)
	}
	got := a.maintNames(ctx, []string{"ec:2+2@na,d1,d2,d3", "x"})
	want := []string{"d1", "d2", "d3", "desk", "ec:2+2@na,d1,d2,d3", "na", "x"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("maintNames = %v, want %v", got, want)
	}
}
