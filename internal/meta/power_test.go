package meta_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// A node that announces standby reads as standby (never offline), with
// since and its wake method, its liveness key gone; registering again
// makes it awake and clears the standby; a wake method set by hand wins
// over the one a registration or a standby learns.
func TestNodeStandby(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "lap", Role: "device", Serials: []string{"a1"}}); err != nil {
		t.Fatal(err)
	}
	learned := &meta.WakeInfo{MAC: "02:00:00:00:00:01", Broadcast: "192.0.2.255"}
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "lap", Role: "device", Addr: "h:1", Wake: learned}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "lap"); st.State != meta.NodeAwake || st.Standby != 0 || st.Wake == nil || st.Wake.MAC != learned.MAC || st.Format != meta.NodeRecordFormat || st.Since == 0 || st.Since != st.LastSeen {
		t.Fatalf("registered: %+v", st)
	}
	before := time.Now()
	since, err := reg.Standby(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := state(t, s, "lap")
	if st.State != meta.NodeStandby || st.Standby != since.UnixNano() || st.Since != st.Standby || since.Before(before) || st.Wake == nil || st.Wake.MAC != learned.MAC || st.Wake.Broadcast != learned.Broadcast {
		t.Fatalf("after standby: %+v", st)
	}
	if resp, gerr := s.Client().Get(ctx, "/cairn/v1/alive/lap"); gerr != nil || len(resp.Kvs) != 0 {
		t.Fatalf("liveness key after standby: %v %v", resp, gerr)
	}
	// Its lease is revoked, not left to lapse: nothing makes it offline
	// later (3 leases of 2 s would have passed StaleAfter).
	select {
	case <-reg.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the heartbeat goes on after standby")
	}
	nodes, err := s.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].State != meta.NodeStandby || nodes[0].Since != since.UnixNano() {
		t.Fatalf("Nodes after standby: %+v %v", nodes, err)
	}

	// Resume: registering again.
	reg, err = s.Register(ctx, meta.NodeRecord{Name: "lap", Role: "device", Addr: "h:1"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "lap"); st.State != meta.NodeAwake || st.Standby != 0 || st.Wake == nil || st.Wake.MAC != learned.MAC || len(st.Serials) != 1 {
		t.Fatalf("resumed: %+v", st)
	}
	if err := reg.Update(ctx, meta.NodeRecord{Addr: "h:1"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "lap"); st.Wake == nil || st.Wake.MAC != learned.MAC {
		t.Fatalf("a report dropped the wake method: %+v", st)
	}

	// Set by hand: kept over what registrations and standbys learn.
	byHand := &meta.WakeInfo{MAC: "02:00:00:00:00:99", Broadcast: "198.51.100.255", Proxy: "nas"}
	if err := s.SetNodeWake(ctx, "lap", byHand); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Standby(ctx, learned); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "lap"); st.State != meta.NodeStandby || st.Wake == nil || *st.Wake != (meta.WakeInfo{MAC: byHand.MAC, Broadcast: byHand.Broadcast, Proxy: "nas", Set: true}) {
		t.Fatalf("standby over a wake method set by hand: %+v", st)
	}
	reg, err = s.Register(ctx, meta.NodeRecord{Name: "lap", Role: "device", Wake: learned}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	if st := state(t, s, "lap"); st.Wake == nil || st.Wake.MAC != byHand.MAC {
		t.Fatalf("registration over a wake method set by hand: %+v", st)
	}
	// Forgotten: the next registration records what it learns.
	if err := s.SetNodeWake(ctx, "lap", nil); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "lap"); st.Wake != nil {
		t.Fatalf("wake method not forgotten: %+v", st.Wake)
	}
	if err := s.SetNodeWake(ctx, "ghost", byHand); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("SetNodeWake of unknown: %v", err)
	}
	if err := s.RemoveNode(ctx, "lap", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Standby(ctx, nil); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("standby of a removed node: %v", err)
	}
}

// Records written before power states (formats 1 and 2, no standby or
// wake) read as before, the online state now called awake; the removal
// of a format 2 record still revokes its serials, not its name, and a
// format 1 record its name.
func TestNodeOldRecords(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	c := s.Client()
	for k, v := range map[string]string{
		"/cairn/v1/node/two": `{"format":2,"name":"two","role":"device","addr":"h:2","registered":1,"serials":["ab"]}`,
		"/cairn/v1/node/one": `{"name":"one","role":"benefactor","registered":1}`,
		// Never rewritten by this cairn: removed at format 2.
		"/cairn/v1/node/old2": `{"format":2,"name":"old2","role":"device","registered":1,"serials":["cd"]}`,
	} {
		if _, err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"one", "two"} {
		if st := state(t, s, n); st.State != meta.NodeOffline || st.Standby != 0 || st.Wake != nil {
			t.Fatalf("%s: %+v", n, st)
		}
	}
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "two", Role: "device", Addr: "h:2"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "two"); st.State != "awake" || st.Format != meta.NodeRecordFormat || len(st.Serials) != 1 {
		t.Fatalf("format 2 record registered: %+v", st)
	}
	reg.Close(ctx)
	reg, err = s.Register(ctx, meta.NodeRecord{Name: "one", Role: "benefactor"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Standby(ctx, &meta.WakeInfo{MAC: "02:00:00:00:00:01"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "one"); st.State != meta.NodeStandby || st.Format != 0 {
		t.Fatalf("format 1 record in standby: %+v", st)
	}
	for _, n := range []string{"one", "two", "old2"} {
		if err := s.RemoveNode(ctx, n, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	names, serials, _, err := s.RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := names["two"]; ok || serials["ab"].IsZero() || names["one"].IsZero() || serials["cd"].IsZero() {
		t.Fatalf("removals: names %v serials %v", names, serials)
	}
	if _, ok := names["old2"]; ok {
		t.Fatalf("removals: names %v serials %v", names, serials)
	}
}

// A record of format 3 (before always_on) reads as a node not marked
// always-on; the mark set by its owner (format 4) survives the node's
// registrations and reports, which do not carry it, and a registration
// that carries it (node serve --always-on) sets it.
func TestNodeAlwaysOn(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	c := s.Client()
	if _, err := c.Put(ctx, "/cairn/v1/node/nas", `{"format":3,"name":"nas","role":"device","addr":"h:3","registered":1,"serials":["ef"],"standby":5,"wake":{"mac":"02:00:00:00:00:03"}}`); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "nas"); st.AlwaysOn || st.State != meta.NodeStandby || st.Format != 3 {
		t.Fatalf("format 3 record: %+v", st)
	}
	if err := s.SetNodeAlwaysOn(ctx, "nas", true); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "nas"); !st.AlwaysOn || st.Format != meta.NodeRecordFormat || st.Wake == nil || len(st.Serials) != 1 {
		t.Fatalf("marked always-on: %+v", st)
	}
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "nas", Role: "device", Addr: "h:3"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Update(ctx, meta.NodeRecord{Addr: "h:3"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "nas"); !st.AlwaysOn || st.State != meta.NodeAwake {
		t.Fatalf("a registration or report dropped the mark: %+v", st)
	}
	if err := s.SetNodeAlwaysOn(ctx, "nas", false); err != nil {
		t.Fatal(err)
	}
	if err := reg.Update(ctx, meta.NodeRecord{Addr: "h:3"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "nas"); st.AlwaysOn {
		t.Fatalf("--off: %+v", st)
	}
	reg.Close(ctx)
	if _, err := s.Register(ctx, meta.NodeRecord{Name: "nas", Role: "device", Addr: "h:3", AlwaysOn: true}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "nas"); !st.AlwaysOn {
		t.Fatalf("registered with always-on: %+v", st)
	}
	if err := s.SetNodeAlwaysOn(ctx, "nobody", true); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
}
