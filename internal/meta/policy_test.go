package meta_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

func TestParsePolicy(t *testing.T) {
	good := map[string]meta.Policy{
		"local":                 {Kind: "local"},
		"copies:2@a,b":          {Kind: "copies", N: 2, Stores: []string{"a", "b"}},
		"copies:1@a,b,c":        {Kind: "copies", N: 1, Stores: []string{"a", "b", "c"}},
		"ec:2+2@m1,m2,gcs,az":   {Kind: "ec", K: 2, M: 2, Stores: []string{"m1", "m2", "gcs", "az"}},
		"ec:1+1@laptop,s3.eu-1": {Kind: "ec", K: 1, M: 1, Stores: []string{"laptop", "s3.eu-1"}},
		"stripe:4,greedy":       {Kind: "stripe", W: 4, Strat: "greedy"},
		"stripe:2,greedy@b2,b1": {Kind: "stripe", W: 2, Strat: "greedy", Stores: []string{"b2", "b1"}},
	}
	for s, want := range good {
		p, err := meta.ParsePolicy(s)
		if err != nil {
			t.Errorf("ParsePolicy(%q): %v", s, err)
			continue
		}
		if p.Kind != want.Kind || p.N != want.N || p.K != want.K || p.M != want.M || p.W != want.W || p.Strat != want.Strat || strings.Join(p.Stores, ",") != strings.Join(want.Stores, ",") {
			t.Errorf("ParsePolicy(%q) = %+v, want %+v", s, p, want)
		}
		if p.String() != s {
			t.Errorf("ParsePolicy(%q).String() = %q", s, p.String())
		}
		if meta.IsPolicyName(s) != (s != "local") {
			t.Errorf("IsPolicyName(%q) = %v", s, !(s != "local"))
		}
	}
	many := make([]string, 256)
	for i := range many {
		many[i] = "s" + strings.Repeat("x", i%3) + string(rune('a'+i%26)) + strings.Repeat("0", i/26)
	}
	// stripe:W is stripe:W,greedy.
	if p, err := meta.ParsePolicy("stripe:3"); err != nil || p.String() != "stripe:3,greedy" {
		t.Errorf("stripe:3: %v %v", p, err)
	}
	for _, s := range []string{
		"stripe:", "stripe:0", "stripe:256", "stripe:02", "stripe:2,fast", "stripe:2,greedy@", "stripe:2@b,b", "stripe:2@B",
		"", "Local", "copies", "copies:2", "copies:2@", "copies:0@a", "copies:3@a,b", "copies:02@a,b", "copies:-1@a",
		"copies:2@a,a", "copies:1@A", "copies:1@a,,b", "copies:1@local", "ec:2@a,b", "ec:2+0@a,b", "ec:0+2@a,b",
		"ec:2+2@a,b,c", "ec:2+2@a,b,c,d,e", "ec:2+2@a,b,c,a", "ec:x+1@a,b", "mirror:2@a,b",
		"ec:200+56@" + strings.Join(many, ","), "copies:1@" + strings.Join(many, ","),
	} {
		if _, err := meta.ParsePolicy(s); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("ParsePolicy(%.40q) = %v, want Invalid", s, err)
		}
	}
	if meta.IsPolicyName("laptop") || meta.IsPolicyName("local") {
		t.Error("a store name taken for a policy")
	}
}

func TestPolicies(t *testing.T) {
	ctx := context.Background()
	_, v := newVol(t, 1)
	if recs, err := v.Policies(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("no policies: %+v %v", recs, err)
	}
	for _, rec := range []meta.PolicyRecord{
		{Path: "/", Policy: "copies:2@a,b"},
		{Path: "/photos", Policy: "ec:2+2@a,b,c,d"},
		{Path: "/photos/raw", Policy: "local"},
	} {
		if err := v.SetPolicy(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []meta.PolicyRecord{{Path: "photos", Policy: "local"}, {Path: "/a/", Policy: "local"}, {Path: "/a//b", Policy: "local"},
		{Path: "/a/../b", Policy: "local"}, {Path: "/a", Policy: "ec:1+1@a"}} {
		if err := v.SetPolicy(ctx, bad); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("SetPolicy(%+v) = %v, want Invalid", bad, err)
		}
	}
	recs, err := v.Policies(ctx)
	if err != nil || len(recs) != 3 {
		t.Fatalf("policies = %+v, %v", recs, err)
	}
	for path, want := range map[string]string{
		"/x":                "copies:2@a,b",
		"/photos":           "ec:2+2@a,b,c,d",
		"/photos/a.jpg":     "ec:2+2@a,b,c,d",
		"/photosbis/a.jpg":  "copies:2@a,b", // a prefix is whole segments
		"/photos/raw/1.cr2": "local",
		"/photos/rawer":     "ec:2+2@a,b,c,d",
	} {
		if got := meta.PolicyFor(recs, path); got == nil || got.Policy != want {
			t.Errorf("PolicyFor(%s) = %+v, want %s", path, got, want)
		}
	}
	// Replacing and deleting.
	if err := v.SetPolicy(ctx, meta.PolicyRecord{Path: "/photos", Policy: "copies:1@c,d"}); err != nil {
		t.Fatal(err)
	}
	if err := v.DeletePolicy(ctx, "/"); err != nil {
		t.Fatal(err)
	}
	if err := v.DeletePolicy(ctx, "/"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("second delete = %v", err)
	}
	recs, _ = v.Policies(ctx)
	if got := meta.PolicyFor(recs, "/x"); got != nil {
		t.Fatalf("after unset of /: %+v", got)
	}
	if got := meta.PolicyFor(recs, "/photos/b"); got == nil || got.Policy != "copies:1@c,d" || got.Path != "/photos" {
		t.Fatalf("after replace: %+v", got)
	}
}
