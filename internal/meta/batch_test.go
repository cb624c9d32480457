package meta_test

import (
	"context"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

func TestPutBatch(t *testing.T) {
	ctx := context.Background()
	_, v, root := newVolRoot(t, 3)
	dir := meta.Entry{Name: "d", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeDir, Mode: 0o755}
	dirRef := meta.Entry{Name: "d", Parent: root.Ino, Ino: dir.Ino, Type: meta.TypeDir}
	file := meta.Entry{Name: "f", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile, Mode: 0o644}
	link := meta.Entry{Name: "l", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeSymlink, Mode: 0o777, Target: "d/f"}
	rev, _, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: dir, Dir: *root}, {Entry: file, Dir: dirRef}, {Entry: link, Dir: *root}})
	if err != nil || rev == 0 {
		t.Fatalf("PutBatch = %d, %v", rev, err)
	}
	got, err := v.Lookup(ctx, []string{"d", "f"})
	if err != nil || got.Ino != file.Ino || got.Rev != rev {
		t.Fatalf("d/f = %+v, %v; want ino %x at rev %d", got, err, file.Ino, rev)
	}

	// A batch with one name taken writes nothing.
	other := meta.Entry{Name: "g", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
	taken := meta.Entry{Name: "f", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
	if _, _, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: other, Dir: dirRef}, {Entry: taken, Dir: dirRef}}); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("batch with a taken name: err = %v, want Conflict", err)
	}
	if _, err := v.Get(ctx, dir.Ino, "g"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("g after a failed batch: err = %v, want NotFound", err)
	}
	// Alone, the taken name says Exist and what holds it.
	if _, old, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: taken, Dir: dirRef}}); !errors.Is(err, cairn.ErrExist) || old == nil || old.Ino != file.Ino {
		t.Fatalf("taken name alone: old %+v, err %v; want Exist with ino %x", old, err, file.Ino)
	}
	// A directory that is gone: NotFound.
	gone := meta.Entry{Name: "x", Parent: 12345, Ino: meta.NewIno(), Type: meta.TypeFile}
	if _, _, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: gone, Dir: meta.Entry{Name: "nodir", Parent: root.Ino, Ino: 12345, Type: meta.TypeDir}}}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("entry in a missing directory: err = %v, want NotFound", err)
	}

	// A change at the revision read, then one at a stale revision.
	ch := *got
	ch.Mode = 0o600
	rev2, _, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: ch, Dir: dirRef}})
	if err != nil {
		t.Fatalf("change at rev %d: %v", got.Rev, err)
	}
	if g2, _ := v.Get(ctx, dir.Ino, "f"); g2 == nil || g2.Mode != 0o600 || g2.Rev != rev2 {
		t.Fatalf("after the change: %+v", g2)
	}
	if _, _, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: ch, Dir: dirRef}}); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("change at a stale revision: err = %v, want Conflict", err)
	}

	// Refused before anything is sent.
	twice := []meta.BatchPut{{Entry: other, Dir: dirRef}, {Entry: other, Dir: dirRef}}
	if _, _, err := v.PutBatch(ctx, twice); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("one name twice: err = %v, want Invalid", err)
	}
	many := make([]meta.BatchPut, meta.MaxBatch+1)
	if _, _, err := v.PutBatch(ctx, many); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("%d entries: err = %v, want Invalid", len(many), err)
	}

	// MaxBatch new entries in as many directories of the root: one
	// transaction etcd takes.
	full := make([]meta.BatchPut, 0, meta.MaxBatch)
	for i := range meta.MaxBatch {
		e := meta.Entry{Name: "n" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
		full = append(full, meta.BatchPut{Entry: e, Dir: dirRef})
	}
	if _, _, err := v.PutBatch(ctx, full); err != nil {
		t.Fatalf("%d entries: %v", len(full), err)
	}
	ents, err := v.ReadDir(ctx, dir.Ino)
	if err != nil || len(ents) != meta.MaxBatch+1 {
		t.Fatalf("d holds %d entries (%v), want %d", len(ents), err, meta.MaxBatch+1)
	}
}
