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

	res, err := a.Repair(ctx, "", true, nil)
	if err != nil || len(res) != 1 {
		t.Fatalf("repair: %+v %v", res, err)
	}
	rr := res[0]
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
