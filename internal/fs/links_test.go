package fs_test

import (
	"bytes"
	"context"
	"testing"

	"cairn.dev/cairn/internal/fs"
)

// TestLinkedFileCountedOnce: a file with two names is one file to stats
// (its versions and bytes once), keeps its data through a gc after one
// name goes, and fsck finds it whole.
func TestLinkedFileCountedOnce(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 3)
	data := random(100 << 10)
	a := f.write(t, "a", data)
	if _, err := f.vol.Meta.Link(ctx, a, f.root, "b"); err != nil {
		t.Fatal(err)
	}
	s, err := fs.ComputeStats(ctx, []*fs.Volume{f.vol}, f.st)
	if err != nil {
		t.Fatal(err)
	}
	if s.Files != 1 || s.Versions != 1 || s.LogicalBytes != int64(len(data)) {
		t.Fatalf("stats of one file with two names: files %d, versions %d, bytes %d", s.Files, s.Versions, s.LogicalBytes)
	}
	if _, err = f.vol.Meta.Remove(ctx, f.root, "a", "v:/a", false); err != nil {
		t.Fatal(err)
	}
	if _, err = fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, rerr := f.read(t, "b"); rerr != nil || !bytes.Equal(got, data) {
		t.Fatalf("b after a's removal and a gc: %v", rerr)
	}
	fr, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, true, nil)
	if err != nil || !fr.OK() {
		t.Fatalf("fsck = %+v, %v", fr, err)
	}
}
