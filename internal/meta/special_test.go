package meta_test

import (
	"context"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// TestSpecialEntries: FIFOs, sockets and device nodes are entries of their
// own type with mode, owner and (devices only) a device number; making the
// first raises the realm's record format to 2; they are updated, renamed,
// trashed, restored and walked like any entry; a commit onto one is
// refused; a device number on a non-device, or data on a special file, is
// Invalid.
func TestSpecialEntries(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 3)
	if r, _ := s.Realm(ctx); r.Format != 1 {
		t.Fatalf("realm format before any special file = %d, want 1", r.Format)
	}
	for _, bad := range []meta.Entry{
		{Name: "x", Type: meta.TypeFIFO, Mode: 0o644, Rdev: 5},
		{Name: "x", Type: meta.TypeFile, Mode: 0o644, Rdev: 5},
		{Name: "x", Type: meta.TypeSocket, Mode: 0o644, Size: 3},
		{Name: "x", Type: meta.TypeChar, Mode: 0o644, Versions: []meta.Version{{Size: 1}}},
		{Name: "x", Type: "q", Mode: 0o644},
	} {
		if _, err := v.Create(ctx, root, bad); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("create %+v: %v, want Invalid", bad, err)
		}
	}
	if r, _ := s.Realm(ctx); r.Format != 1 {
		t.Fatalf("realm format after refused creates = %d, want 1", r.Format)
	}
	mk := func(name string, typ meta.Type, rdev uint64) *meta.Entry {
		t.Helper()
		e, err := v.Create(ctx, root, meta.Entry{Name: name, Type: typ, Mode: 0o640, UID: 7, GID: 8, Rdev: rdev})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return e
	}
	mk("fifo", meta.TypeFIFO, 0)
	if r, _ := s.Realm(ctx); r.Format != 2 {
		t.Fatalf("realm format after a FIFO = %d, want 2", r.Format)
	}
	mk("sock", meta.TypeSocket, 0)
	mk("null", meta.TypeChar, 1<<8|3)
	mk("loop", meta.TypeBlock, 7<<8|0)
	// Another process reads them as they are.
	ov := otherProcess(t, s)
	want := map[string]meta.Type{"fifo": meta.TypeFIFO, "sock": meta.TypeSocket, "null": meta.TypeChar, "loop": meta.TypeBlock}
	ents, err := ov.ReadDir(ctx, meta.RootIno)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type != want[e.Name] || e.Mode != 0o640 || e.UID != 7 || e.GID != 8 {
			t.Errorf("read back %+v", e)
		}
		if rd := map[string]uint64{"null": 1<<8 | 3, "loop": 7 << 8}[e.Name]; e.Rdev != rd {
			t.Errorf("%s: rdev %#x, want %#x", e.Name, e.Rdev, rd)
		}
	}
	if len(ents) != 4 {
		t.Fatalf("readdir: %d entries, want 4", len(ents))
	}
	// Attributes change; a commit onto a special file is refused.
	null := mustLookup(t, v, "null")
	null.Mode, null.UID = 0o666, 0
	if _, err := v.Update(ctx, null); err != nil {
		t.Fatal(err)
	}
	if e := mustLookup(t, ov, "null"); e.Mode != 0o666 || e.UID != 0 || e.Rdev != 1<<8|3 || e.Type != meta.TypeChar {
		t.Fatalf("after update: %+v", e)
	}
	gen, _ := s.WriteGen(ctx)
	if _, _, err := v.CommitVersion(ctx, root, "fifo", meta.Commit{Version: meta.Version{Size: 1}, Mode: 0o644, Gen: gen}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("commit onto a FIFO: %v, want Exist", err)
	}
	// Rename, trash and restore keep type and rdev.
	if err := v.Rename(ctx, root, "loop", root, "loop0", "home:/loop0"); err != nil {
		t.Fatal(err)
	}
	item, err := v.Remove(ctx, root, "loop0", "home:/loop0", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.RestoreTrash(ctx, item.ID, root, "loop1"); err != nil {
		t.Fatal(err)
	}
	if e := mustLookup(t, ov, "loop1"); e.Type != meta.TypeBlock || e.Rdev != 7<<8 {
		t.Fatalf("renamed, trashed, restored: %+v", e)
	}
	// A batch makes them too.
	if _, err := v.PutBatch(ctx, []meta.BatchPut{{Dir: *root, Entry: meta.Entry{Name: "fifo2", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeFIFO, Mode: 0o600}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.PutBatch(ctx, []meta.BatchPut{{Dir: *root, Entry: meta.Entry{Name: "bad", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeSocket, Rdev: 1}}}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("batch of a socket with rdev: %v, want Invalid", err)
	}
	n := 0
	if err := v.Walk(ctx, func(e *meta.Entry, trashed bool) error {
		if e.Type.Special() {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 5 {
		t.Fatalf("walk saw %d special files, want 5", n)
	}
}
