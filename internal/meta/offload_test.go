package meta_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
)

// An offloaded commit records its offload entry in the commit's own
// transaction (a commit of unchanged content adds no version and no
// entry); settling rewrites the version's stores and deletes the entry in
// one transaction, refused when either changed.
func TestOffloadEntries(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 0)
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mid := cairn.ID{1}
	c := meta.Commit{Version: meta.Version{Manifest: mid, Size: 10, Chunks: 2, Stores: []string{"laptop2"}, Digest: "d1"}, Mode: 0o644, Gen: gen,
		Offload: &meta.OffloadTo{Home: "desktop"}}
	before := testutil.ToFloat64(metrics.Default().OffloadBytes)
	e, _, err := v.CommitVersion(ctx, root, "doc", c)
	if err != nil {
		t.Fatal(err)
	}
	// The same content again: no new version, no new entry.
	if _, _, err := v.CommitVersion(ctx, root, "doc", c); err != nil {
		t.Fatal(err)
	}
	if d := testutil.ToFloat64(metrics.Default().OffloadBytes) - before; d != 10 {
		t.Errorf("cairn_offload_bytes_total grew by %v, want 10 (one offloaded version)", d)
	}
	list, err := s.Offloads(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("%d entries", len(list))
	}
	o := list[0]
	if o.Home != "desktop" || o.Now != "laptop2" || o.Ino != e.Ino || o.N != 1 || o.Manifest != mid || o.Bytes != 10 || o.Chunks != 2 || o.Name != "doc" || o.Vol != "home" || o.Since == 0 {
		t.Fatalf("entry %+v", o)
	}
	// An entry naming its own store as home is refused.
	bad := c
	bad.Version.Digest, bad.Offload = "d2", &meta.OffloadTo{Home: "laptop2"}
	if _, _, err := v.CommitVersion(ctx, root, "doc", bad); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("home = now: %v", err)
	}
	// A stale entry record: Conflict, nothing changed.
	e, err = v.Get(ctx, root.Ino, "doc")
	if err != nil {
		t.Fatal(err)
	}
	stale := *e
	stale.Rev--
	if _, err := v.SettleOffload(ctx, &stale, 0, o); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("stale settle: %v", err)
	}
	got, err := v.SettleOffload(ctx, e, 0, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Versions[0].Stores, []string{"desktop"}) {
		t.Fatalf("stores after settle: %v", got.Versions[0].Stores)
	}
	if e, err = v.Get(ctx, root.Ino, "doc"); err != nil || !slices.Equal(e.Versions[0].Stores, []string{"desktop"}) {
		t.Fatalf("stored after settle: %+v, %v", e, err)
	}
	if list, err = s.Offloads(ctx); err != nil || len(list) != 0 {
		t.Fatalf("entries after settle: %v, %v", list, err)
	}
	// A second settle of the same entry: Conflict (it is gone).
	if _, err := v.SettleOffload(ctx, e, 0, o); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("second settle: %v", err)
	}
	// DropOffload: only as read.
	c.Version.Digest, c.Version.Manifest = "d3", cairn.ID{3}
	if _, _, err := v.CommitVersion(ctx, root, "doc", c); err != nil {
		t.Fatal(err)
	}
	list, _ = s.Offloads(ctx)
	if len(list) != 1 || list[0].N != 2 {
		t.Fatalf("entries: %+v", list)
	}
	o2 := *list[0]
	o2.Rev++
	if err := s.DropOffload(ctx, &o2); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("stale drop: %v", err)
	}
	if err := s.DropOffload(ctx, list[0]); err != nil {
		t.Fatal(err)
	}
	if list, _ = s.Offloads(ctx); len(list) != 0 {
		t.Fatalf("entries after drop: %+v", list)
	}

	// A policy member offloaded: the entry names the members, the
	// settle rewrites the policy string.
	c.Version.Digest, c.Version.Manifest, c.Version.Stores = "d4", cairn.ID{4}, []string{"copies:2@lap,lap2"}
	c.Offload = &meta.OffloadTo{Home: "desktop", Now: "lap2", HomeStores: "copies:2@lap,desktop"}
	if e, _, err = v.CommitVersion(ctx, root, "doc", c); err != nil {
		t.Fatal(err)
	}
	list, _ = s.Offloads(ctx)
	if len(list) != 1 || list[0].Home != "desktop" || list[0].Now != "lap2" || list[0].Stores != "copies:2@lap,lap2" || list[0].HomeStores != "copies:2@lap,desktop" {
		t.Fatalf("member entry: %+v", list)
	}
	got, err = v.SettleOffload(ctx, e, len(e.Versions)-1, list[0])
	if err != nil || !slices.Equal(got.Current().Stores, []string{"copies:2@lap,desktop"}) {
		t.Fatalf("member settle: %+v, %v", got, err)
	}
}

// A move records its entries (PutOffloads) in batches, replacing an entry
// already there for the same version; a bad one is refused before
// anything of its batch is written; they settle as any entry.
func TestPutOffloads(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 0)
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// An offloaded version (home desktop) and 150 files at the laptop.
	c := meta.Commit{Version: meta.Version{Manifest: cairn.ID{1}, Size: 10, Chunks: 2, Stores: []string{"laptop2"}, Digest: "d1"}, Mode: 0o644, Gen: gen,
		Offload: &meta.OffloadTo{Home: "desktop"}}
	e, _, err := v.CommitVersion(ctx, root, "doc", c)
	if err != nil {
		t.Fatal(err)
	}
	list := []*meta.Offload{{Vol: "home", VolID: v.V.ID, Ino: e.Ino, Parent: root.Ino, Name: "doc", N: 1, Manifest: cairn.ID{1}, Home: "server", Now: "laptop2", Move: "/", Since: 5}}
	for i := range 150 {
		list = append(list, &meta.Offload{Vol: "home", VolID: v.V.ID, Ino: uint64(1000 + i), Parent: root.Ino, Name: "f", N: 1, Home: "server", Now: "laptop", Move: "/", Since: 5})
	}
	if err := s.PutOffloads(ctx, append(slices.Clone(list), &meta.Offload{Vol: "home", VolID: v.V.ID, Ino: 9, Name: "x", N: 1, Home: "server", Now: "server"})); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("home = now: %v", err)
	}
	got, err := s.Offloads(ctx)
	if err != nil || len(got) != 100 { // the first batch went in; the second held the bad one
		t.Fatalf("after a refused batch: %d entries, %v", len(got), err)
	}
	if err := s.PutOffloads(ctx, list); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Offloads(ctx); err != nil || len(got) != 151 {
		t.Fatalf("%d entries, %v", len(got), err)
	}
	i := slices.IndexFunc(got, func(o *meta.Offload) bool { return o.Ino == e.Ino })
	if i < 0 || got[i].Home != "server" || got[i].Move != "/" {
		t.Fatalf("the offloaded version's entry: %+v", got[i])
	}
	e, _ = v.Get(ctx, root.Ino, "doc")
	if e, err = v.SettleOffload(ctx, e, 0, got[i]); err != nil || !slices.Equal(e.Current().Stores, []string{"server"}) {
		t.Fatalf("settle: %+v, %v", e, err)
	}
}

func FuzzDecodeOffload(f *testing.F) {
	good := meta.Offload{Format: 1, Vol: "home", VolID: "ab", Ino: 0x1234, Parent: 1, Name: "doc", N: 2, Home: "desktop", Now: "laptop2", Since: 1}
	b, _ := json.Marshal(good)
	f.Add("offload/ab/0000000000001234/0000000000000002", string(b))
	f.Add("offload/ab/0000000000001234/0000000000000003", string(b))
	f.Add("offload/ab/zz/0000000000000002", string(b))
	f.Add("offload/ab/0000000000001234/0000000000000002", `{"format":2}`)
	f.Add("offload/ab/0000000000001234/0000000000000002", `{"format":1,"vol_id":"ab","ino":4660,"n":2,"name":"a","home":"d","now":"l2","stores":"copies:2@l,l2","home_stores":"copies:2@l,d"}`)
	f.Add("offload/ab/0000000000001234/0000000000000002", `{`)
	f.Add("offload/ab/0000000000001234/0000000000000002", `{"format":1,"vol_id":"ab","ino":4660,"n":2,"name":"a","home":"d","now":"l","move":"/docs/a"}`)
	f.Add("offload/ab/0000000000001234/0000000000000002", `{"format":1,"vol_id":"ab","ino":4660,"n":2,"name":"a","home":"d","now":"l","move":"docs/../a/"}`)
	f.Fuzz(func(t *testing.T, k, val string) {
		o, err := meta.DecodeOffload(k, []byte(val))
		if err != nil {
			if !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("error %v is not Corrupt", err)
			}
			return
		}
		if o.Format != meta.OffloadFormat || o.Home == "" || o.Now == "" || o.Home == o.Now || o.Name == "" || strings.Contains(o.Name, "/") ||
			(o.Stores == "") != (o.HomeStores == "") || (o.Move != "" && !meta.CleanPath(o.Move)) {
			t.Fatalf("accepted %+v", o)
		}
		want := "offload/" + o.VolID + "/"
		if !strings.HasPrefix(k, want) {
			t.Fatalf("key %q accepted for %+v", k, o)
		}
	})
}
