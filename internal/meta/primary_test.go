package meta_test

import (
	"context"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// TestHandPrimaries: primary records are set, listed, and handed over in
// one compare-guarded transaction that moves nothing when any record
// changed since it was read.
func TestHandPrimaries(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	const p1, p2 = "copies:2@desk,lap", "copies:2@desk,nas"
	if err := s.SetPrimary(ctx, meta.PrimaryRecord{Policy: "copies:2@desk,lap", Primary: "other"}); cairn.KindOf(err) != cairn.Invalid {
		t.Fatalf("primary outside the policy: %v", err)
	}
	if err := s.SetPrimary(ctx, meta.PrimaryRecord{Policy: "ec:1+1@desk,lap", Primary: "desk"}); cairn.KindOf(err) != cairn.Invalid {
		t.Fatalf("primary of an ec policy: %v", err)
	}
	if _, err := s.Primary(ctx, p1); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("no primary yet: %v", err)
	}
	for _, p := range []string{p1, p2} {
		if err := s.SetPrimary(ctx, meta.PrimaryRecord{Policy: p, Primary: "desk", Set: 1, SetBy: "desk", Why: "set"}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.Primaries(ctx)
	if err != nil || len(recs) != 2 || recs[0].Policy != p1 || recs[1].Primary != "desk" {
		t.Fatalf("primaries: %+v, %v", recs, err)
	}
	// A record changed after it was read: nothing moves.
	if err := s.SetPrimary(ctx, meta.PrimaryRecord{Policy: p2, Primary: "desk", Set: 2}); err != nil {
		t.Fatal(err)
	}
	moves := []meta.PrimaryMove{{From: recs[0], To: "lap"}, {From: recs[1], To: "nas"}}
	if err := s.HandPrimaries(ctx, moves, "desk", "standby of desk", 3); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("stale hand-over: %v", err)
	}
	if r, _ := s.Primary(ctx, p1); r == nil || r.Primary != "desk" {
		t.Fatalf("a stale hand-over moved %+v", r)
	}
	recs, _ = s.Primaries(ctx)
	moves = []meta.PrimaryMove{{From: recs[0], To: "lap"}, {From: recs[1], To: "nas"}}
	if err := s.HandPrimaries(ctx, moves, "desk", "standby of desk", 3); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{p1: "lap", p2: "nas"} {
		r, err := s.Primary(ctx, p)
		if err != nil || r.Primary != want || r.Why != "standby of desk" || r.SetBy != "desk" {
			t.Fatalf("%s: %+v, %v", p, r, err)
		}
	}
}

// FuzzDecodePrimary: a primary record from the metadata never panics the
// decoder, and what it accepts is of the known format and names a member
// of a canonical copies policy.
func FuzzDecodePrimary(f *testing.F) {
	f.Add([]byte(`{"format":1,"policy":"copies:2@a,b","primary":"a","set":1,"set_by":"a","why":"set"}`))
	f.Add([]byte(`{"format":2,"policy":"copies:2@a,b","primary":"a"}`))
	f.Add([]byte(`{"format":1,"policy":"copies:2@a,b","primary":"c"}`))
	f.Add([]byte(`{"format":1,"policy":"ec:1+1@a,b","primary":"a"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := meta.DecodePrimary(b)
		if err != nil {
			if k := cairn.KindOf(err); k != cairn.Corrupt {
				t.Fatalf("kind %v: %v", k, err)
			}
			return
		}
		p, err := meta.ParsePolicy(r.Policy)
		if err != nil || p.Kind != meta.PolicyCopies || p.String() != r.Policy || r.Format != meta.PrimaryRecordFormat {
			t.Fatalf("accepted %+v (%v)", r, err)
		}
		found := false
		for _, s := range p.Stores {
			found = found || s == r.Primary
		}
		if !found {
			t.Fatalf("accepted a primary outside its policy: %+v", r)
		}
	})
}
