package realm

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// A copies policy gets the setting device as its primary (or --primary);
// a standby of the primary hands the role to the awake replica, in one
// transaction, before recording the standby, and keeps a role no awake
// replica can take; a resume does not take the role back.
func TestStandbyHandsPrimaries(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	homeL := joinAs(t, a, pki.Device, "lap")
	joinAs(t, a, pki.Device, "nas") // never serves: offline
	l, err := Open(ctx, homeL, Options{NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	run(t, func(ctx context.Context, ready func(string)) error {
		return l.Serve(ctx, ServeOptions{Listen: "127.0.0.1:0", Lease: regLease, Ready: func(s string, _ bool) { ready(s) }})
	})
	waitNode(t, a.Meta, "lap", meta.NodeAwake, 10*time.Second)

	if _, err := a.SetPolicyPrimary(ctx, DefaultVolume, "/docs", "copies:2@lap,desk", "nope"); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("a primary the policy does not name: %v", err)
	}
	if _, err := a.SetPolicyPrimary(ctx, DefaultVolume, "/docs", "ec:1+1@lap,desk", "lap"); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("a primary of an ec policy: %v", err)
	}
	const docs, music = "copies:2@lap,desk", "copies:2@desk,nas"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/docs", docs); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetPolicyPrimary(ctx, DefaultVolume, "/music", music, "desk"); err != nil {
		t.Fatal(err)
	}
	prims, err := a.Primaries(ctx)
	if err != nil || prims[docs].Primary != "desk" || prims[music].Primary != "desk" {
		t.Fatalf("primaries after set: %+v %v", prims, err)
	}
	rev := prims[docs].Rev

	rep, err := Control(ctx, a.Home, "standby")
	if err != nil || rep.State != meta.NodeStandby {
		t.Fatalf("standby: %+v %v", rep, err)
	}
	want := map[string]PrimaryHandoff{docs: {Policy: docs, To: "lap"}, music: {Policy: music, Kept: "no other replica is awake"}}
	if len(rep.Primaries) != 2 || rep.PrimariesError != "" {
		t.Fatalf("standby reply: %+v", rep)
	}
	for _, h := range rep.Primaries {
		if h != want[h.Policy] {
			t.Fatalf("handoff %+v, want %+v", h, want[h.Policy])
		}
	}
	prims, err = a.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := prims[docs]; p.Primary != "lap" || p.Why != "standby of desk" || p.SetBy != "desk" || p.Rev == rev {
		t.Fatalf("docs primary after the standby: %+v", p)
	}
	if p := prims[music]; p.Primary != "desk" || p.Why != "set" {
		t.Fatalf("music primary after the standby: %+v", p)
	}
	// And the standby is recorded.
	st := waitNode(t, a.Meta, "desk", meta.NodeStandby, 10*time.Second)
	if st.Standby == 0 {
		t.Fatalf("standby not recorded: %+v", st)
	}

	// Resume: the role stays with lap.
	if _, err := Control(ctx, a.Home, "resume"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, a.Meta, "desk", meta.NodeAwake, 10*time.Second)
	if prims, err = a.Primaries(ctx); err != nil || prims[docs].Primary != "lap" {
		t.Fatalf("after resume: %+v %v", prims[docs], err)
	}
}

// TestPrimaryHeirOrder: a standby hands a primary role to an always-on
// replica before a faster one, then to the fastest, then by name.
func TestPrimaryHeirOrder(t *testing.T) {
	node := func(name string, rate float64, always bool) meta.NodeStatus {
		return meta.NodeStatus{NodeRecord: meta.NodeRecord{Name: name, Rate: rate, AlwaysOn: always}}
	}
	cands := []meta.NodeStatus{node("a", 50, false), node("c", 1, true), node("b", 90, false), node("d", 1, false), node("aa", 90, false)}
	sortHeirs(cands)
	var got []string
	for _, c := range cands {
		got = append(got, c.Name)
	}
	if want := []string{"c", "aa", "b", "a", "d"}; !slices.Equal(got, want) {
		t.Fatalf("heirs in order %v, want %v", got, want)
	}
}
