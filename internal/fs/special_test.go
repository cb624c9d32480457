package fs_test

import (
	"context"
	"testing"

	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// TestSpecialFilesMaint: FIFOs, sockets and device nodes, live and in the
// trash, are no files with missing versions to fsck and gc, and stats
// counts them apart from files.
func TestSpecialFilesMaint(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	f.write(t, "file", random(10_000))
	for _, e := range []meta.Entry{
		{Name: "fifo", Type: meta.TypeFIFO, Mode: 0o644},
		{Name: "sock", Type: meta.TypeSocket, Mode: 0o755},
		{Name: "null", Type: meta.TypeChar, Mode: 0o666, Rdev: 1<<8 | 3},
		{Name: "sda", Type: meta.TypeBlock, Mode: 0o660, Rdev: 8 << 8},
	} {
		if _, err := f.vol.Meta.Create(ctx, f.root, e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.vol.Meta.Remove(ctx, f.root, "sda", "v:/sda", false); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, readData := range []bool{false, true} {
		fr, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, readData, nil)
		if err != nil || !fr.OK() {
			t.Fatalf("fsck (read data %t) = %+v, %v", readData, fr, err)
		}
	}
	if got, err := f.read(t, "file"); err != nil || len(got) != 10_000 {
		t.Fatalf("file after gc: %d bytes, %v", len(got), err)
	}
	stats, err := fs.ComputeStats(ctx, []*fs.Volume{f.vol}, f.st)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Files != 1 || stats.Specials != 3 || stats.LogicalBytes != 10_000 || stats.TrashItems != 1 {
		t.Fatalf("stats = %+v, want 1 file of 10000 bytes, 3 special files, 1 trash item", stats)
	}
}
