package meta_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

func TestPutBatch(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 3)
	ov := otherProcess(t, s)
	dir := meta.Entry{Name: "d", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeDir, Mode: 0o755}
	dirRef := meta.Entry{Name: "d", Parent: root.Ino, Ino: dir.Ino, Type: meta.TypeDir}
	file := meta.Entry{Name: "f", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile, Mode: 0o644}
	link := meta.Entry{Name: "l", Parent: root.Ino, Ino: meta.NewIno(), Type: meta.TypeSymlink, Mode: 0o777, Target: "d/f"}
	res, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: dir, Dir: *root}, {Entry: file, Dir: dirRef, Lock: true}, {Entry: link, Dir: *root}})
	rev := res.Rev
	if err != nil || rev == 0 {
		t.Fatalf("PutBatch = %d, %v", rev, err)
	}
	// The file's writer lock came with it: another writer waits for it.
	if res.Locks[0] != nil || res.Locks[1] == nil || res.Locks[2] != nil {
		t.Fatalf("locks %v: want the file's only", res.Locks)
	}
	lctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if l, lerr := ov.Lock(lctx, dir.Ino, "f"); lerr == nil {
		l.Unlock(ctx)
		cancel()
		t.Fatal("a second writer got the lock the batch took")
	}
	cancel()
	if uerr := res.Locks[1].Unlock(ctx); uerr != nil {
		t.Fatal(uerr)
	}
	got, err := v.Lookup(ctx, []string{"d", "f"})
	if err != nil || got.Ino != file.Ino || got.Rev != rev {
		t.Fatalf("d/f = %+v, %v; want ino %x at rev %d", got, err, file.Ino, rev)
	}

	// A batch with one name taken writes nothing.
	extra := meta.Entry{Name: "g", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
	taken := meta.Entry{Name: "f", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
	if _, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: extra, Dir: dirRef}, {Entry: taken, Dir: dirRef}}); !errors.Is(perr, cairn.ErrConflict) {
		t.Fatalf("batch with a taken name: err = %v, want Conflict", perr)
	}
	if _, gerr := v.Get(ctx, dir.Ino, "g"); !errors.Is(gerr, cairn.ErrNotFound) {
		t.Fatalf("g after a failed batch: err = %v, want NotFound", gerr)
	}
	// Alone, the taken name says Exist and what holds it.
	if res3, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: taken, Dir: dirRef}}); !errors.Is(perr, cairn.ErrExist) || res3.Old == nil || res3.Old.Ino != file.Ino {
		t.Fatalf("taken name alone: old %+v, err %v; want Exist with ino %x", res3.Old, perr, file.Ino)
	}
	// A name whose lock another writer holds (a file it creates by its
	// commit): ErrLocked when the lock is asked for, written without.
	l, err := ov.Lock(ctx, dir.Ino, "locked")
	if err != nil {
		t.Fatal(err)
	}
	held := meta.Entry{Name: "locked", Parent: dir.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
	if _, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: held, Dir: dirRef, Lock: true}}); !errors.Is(perr, meta.ErrLocked) {
		t.Fatalf("a new file whose lock is held: err = %v, want ErrLocked", perr)
	}
	if _, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: held, Dir: dirRef}}); perr != nil {
		t.Fatalf("the same without its lock: %v", perr)
	}
	l.Unlock(ctx)
	// A directory that is gone: NotFound.
	gone := meta.Entry{Name: "x", Parent: 12345, Ino: meta.NewIno(), Type: meta.TypeFile}
	if _, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: gone, Dir: meta.Entry{Name: "nodir", Parent: root.Ino, Ino: 12345, Type: meta.TypeDir}}}); !errors.Is(perr, cairn.ErrNotFound) {
		t.Fatalf("entry in a missing directory: err = %v, want NotFound", perr)
	}

	// A change at the revision read, then one at a stale revision.
	ch := *got
	ch.Mode = 0o600
	res2, err := v.PutBatch(ctx, []meta.BatchPut{{Entry: ch, Dir: dirRef}})
	rev2 := res2.Rev
	if err != nil {
		t.Fatalf("change at rev %d: %v", got.Rev, err)
	}
	if g2, _ := v.Get(ctx, dir.Ino, "f"); g2 == nil || g2.Mode != 0o600 || g2.Rev != rev2 {
		t.Fatalf("after the change: %+v", g2)
	}
	if _, perr := v.PutBatch(ctx, []meta.BatchPut{{Entry: ch, Dir: dirRef}}); !errors.Is(perr, cairn.ErrConflict) {
		t.Fatalf("change at a stale revision: err = %v, want Conflict", perr)
	}

	// Refused before anything is sent.
	twice := []meta.BatchPut{{Entry: extra, Dir: dirRef}, {Entry: extra, Dir: dirRef}}
	if _, perr := v.PutBatch(ctx, twice); !errors.Is(perr, cairn.ErrInvalid) {
		t.Fatalf("one name twice: err = %v, want Invalid", perr)
	}
	many := make([]meta.BatchPut, meta.MaxBatch+1)
	if _, perr := v.PutBatch(ctx, many); !errors.Is(perr, cairn.ErrInvalid) {
		t.Fatalf("%d entries: err = %v, want Invalid", len(many), perr)
	}

	// MaxBatch new files, each locked, each in a directory of its own
	// (so three compares each): one transaction etcd takes.
	full := make([]meta.BatchPut, 0, meta.MaxBatch)
	for i := range meta.MaxBatch {
		name := fmt.Sprintf("n%02d", i)
		sub, cerr := v.Create(ctx, &dirRef, meta.Entry{Name: "s" + name, Type: meta.TypeDir, Mode: 0o755})
		if cerr != nil {
			t.Fatal(cerr)
		}
		e := meta.Entry{Name: name, Parent: sub.Ino, Ino: meta.NewIno(), Type: meta.TypeFile}
		full = append(full, meta.BatchPut{Entry: e, Dir: *sub, Lock: true})
	}
	res, err = v.PutBatch(ctx, full)
	if err != nil {
		t.Fatalf("%d entries: %v", len(full), err)
	}
	for i, l := range res.Locks {
		if l == nil {
			t.Fatalf("no lock for entry %d", i)
		}
		l.Unlock(ctx)
	}
}
