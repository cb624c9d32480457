package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
)

func countObjects(t *testing.T, st cairn.Store) int {
	t.Helper()
	n := 0
	if err := st.List(context.Background(), func(cairn.ID, int64) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGCSweepsOtherNodes: what a device sent to another node's store
// (put --store) is collected there once nothing references it, and what
// is still referenced stays.
func TestGCSweepsOtherNodes(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{Target: "a"})
	keep, gone := make([]byte, 1<<20), make([]byte, 1<<20)
	rand.Read(keep)
	rand.Read(gone)
	writeFile(t, b, "keep", keep)
	writeFile(t, b, "gone", gone)
	ast, err := a.Store(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := countObjects(t, ast)

	v, err := b.Volume(ctx, DefaultVolume)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := v.Meta.Root(ctx)
	if _, rerr := v.Meta.Remove(ctx, root, "gone", "home:/gone", false); rerr != nil {
		t.Fatal(rerr)
	}
	bst, _ := b.Store(ctx)
	others, errs, closeAll, err := b.GCStores(ctx)
	defer closeAll()
	if err != nil || len(errs) != 0 || len(others) != 1 || others[0].Name != "a" {
		t.Fatalf("GCStores = %v, %v, %v", others, errs, err)
	}
	vols, _ := b.AllVolumes(ctx)
	// A time past the trash's expiry: the removed file is purged.
	rep, err := fs.GC(ctx, b.Meta, vols, bst, fs.GCOptions{Others: others, Now: time.Now().Add(1000 * 24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Stores) != 1 || rep.Stores[0].DeletedObjects == 0 || rep.Stores[0].Error != "" {
		t.Fatalf("gc report %+v", rep)
	}
	after := countObjects(t, ast)
	if after != before-rep.Stores[0].DeletedObjects || after == 0 {
		t.Fatalf("a's store: %d objects before, %d after, %d deleted", before, after, rep.Stores[0].DeletedObjects)
	}
	if got, _, err := readFile(a, "keep"); err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("a kept file after gc: %v", err)
	}
}

// A store a placement policy names is not drained away (its copies or
// shards would be lost to the policy); a plain store is, and what only it
// held then reads from this device.
func TestRemoveStoreRefusesPolicyMember(t *testing.T) {
	ctx := context.Background()
	a, _, _ := twoDevices(t, Options{})
	for _, n := range []string{"d1", "d2", "d3"} {
		if _, err := a.AddStore(ctx, n, "file://"+t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", "copies:2@d1,d2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RemoveStore(ctx, "d1", "", nil); !errors.Is(err, cairn.ErrConflict) || !strings.Contains(err.Error(), "copies:2@d1,d2") {
		t.Fatalf("remove a policy member = %v, want Conflict naming the policy", err)
	}
	if rec, err := a.Meta.Store(ctx, "d1"); err != nil || rec.Draining {
		t.Fatalf("refused store: %+v, %v", rec, err)
	}
	if _, err := a.RemoveStore(ctx, "d3", "d1", nil); err != nil {
		t.Fatalf("remove an unused store: %v", err)
	}
}

// A node registered as a store (node://NODE) that an ec policy names
// holds shards: gc sweeps it neither as that store nor as the node, and on
// the node itself gc refuses to run rather than sweep its own store raw.
func TestGCSkipsECNodeAlias(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{})
	if _, err := b.AddStore(ctx, "na", "node://a"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"d1", "d2", "d3"} {
		if _, err := b.AddStore(ctx, n, "file://"+t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.SetPolicy(ctx, DefaultVolume, "/", "ec:2+2@na,d1,d2,d3"); err != nil {
		t.Fatal(err)
	}
	v, err := b.PolicyVolume(ctx, DefaultVolume, "ec:2+2@na,d1,d2,d3")
	if err != nil {
		t.Fatal(err)
	}
	root, _ := v.Meta.Root(ctx)
	data := make([]byte, 100<<10)
	rand.Read(data)
	if _, _, werr := v.WriteFile(ctx, root, "f", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
		t.Fatal(werr)
	}
	others, errs, closeAll, err := b.GCStores(ctx)
	defer closeAll()
	if err != nil || len(errs) != 0 {
		t.Fatalf("GCStores on b: %v %v", errs, err)
	}
	for _, o := range others {
		if o.Name == "a" || o.Name == "na" || o.Name == "d1" {
			t.Fatalf("gc would sweep %s raw: %v", o.Name, others)
		}
	}
	// Device a is the node behind na: its own store holds shards.
	_, _, closeA, err := a.GCStores(ctx)
	defer closeA()
	if !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("GCStores on the aliased node itself = %v, want Conflict", err)
	}
}
