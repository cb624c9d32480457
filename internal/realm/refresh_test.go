package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"path/filepath"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
)

// TestPolicyWriteAfterGCElsewhere: device a writes a file under
// copies:1 to a directory store (packed, like a bucket), the file is
// removed, and a garbage collection on device b deletes its objects from
// the store. a then writes the same content again: the new generation
// makes a's policy wrapper refresh its member's pack index, so a stores
// the objects again instead of trusting its index, and b reads the file.
func TestPolicyWriteAfterGCElsewhere(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{NoCache: true})
	if _, err := a.AddStore(ctx, "d1", "file://"+filepath.Join(t.TempDir(), "d1")); err != nil {
		t.Fatal(err)
	}
	const pol = "copies:1@d1"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", pol); err != nil {
		t.Fatal(err)
	}
	va, err := a.PolicyVolume(ctx, DefaultVolume, pol)
	if err != nil {
		t.Fatal(err)
	}
	root, err := va.Meta.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 300<<10)
	rand.Read(data)
	write := func(name string) {
		t.Helper()
		if _, _, werr := va.WriteFile(ctx, root, name, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
			t.Fatal(werr)
		}
	}
	write("f")
	if _, rerr := va.Meta.Remove(ctx, root, "f", "/f", false); rerr != nil {
		t.Fatal(rerr)
	}
	vols, err := b.AllVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Store(ctx)
	if err != nil {
		t.Fatal(err)
	}
	others, errs, closeAll, err := b.GCStores(ctx)
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	defer closeAll()
	rep, err := fs.GC(ctx, b.Meta, vols, st, fs.GCOptions{Now: time.Now().Add(365 * 24 * time.Hour), Others: others, Keep: []cairn.ID{b.MarkerID()}})
	if err != nil {
		t.Fatal(err)
	}
	deleted := 0
	for _, s := range rep.Stores {
		deleted += s.DeletedObjects
	}
	if deleted == 0 {
		t.Fatalf("gc deleted nothing from the store: %+v", rep)
	}
	write("g")
	if got, _, err := readFile(b, "g"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("b reads g written after the gc: %d bytes, %v", len(got), err)
	}
}
