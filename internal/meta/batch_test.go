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

// TestCommitVersions: many commits go in few transactions (the put of many
// small files); a batch whose conditions do not all hold is committed one
// file at a time, and each file that cannot be committed says why.
func TestCommitVersions(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 3)
	ov := otherProcess(t, s)
	dir, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ver := func(m byte) meta.Version {
		var id cairn.ID
		id[0], id[1] = m, 1
		return meta.Version{Manifest: id, Size: int64(m), Digest: fmt.Sprint("d", m)}
	}
	const n = 100
	var cs []meta.BatchCommit
	for i := range n {
		cs = append(cs, meta.BatchCommit{Parent: dir, Name: fmt.Sprint("f", i),
			Commit: meta.Commit{Version: ver(1), Mode: 0o644, Gen: gen, Cur: meta.KnownEntry(nil), Unlocked: true}})
	}
	revs := map[int64]bool{}
	for i, r := range v.CommitVersions(ctx, cs) {
		if r.Err != nil || r.Entry == nil || r.Entry.Current() == nil || r.Entry.Current().Manifest != ver(1).Manifest {
			t.Fatalf("commit %d: %+v, %v", i, r.Entry, r.Err)
		}
		revs[r.Entry.Rev] = true
	}
	// At most 128 compares a transaction, three per new file, two for the
	// fence: 42 files a transaction.
	if len(revs) > 3 {
		t.Fatalf("%d files committed in %d transactions, want at most 3", n, len(revs))
	}
	ents, err := v.ReadDir(ctx, dir.Ino)
	if err != nil || len(ents) != n {
		t.Fatalf("ReadDir: %d entries, %v; want %d", len(ents), err, n)
	}
	byName := map[string]*meta.Entry{}
	for i := range ents {
		byName[ents[i].Name] = &ents[i]
	}

	// Second versions, from the listing: f0 changed since (another
	// writer committed), f2's directory entry was read before it existed
	// (both fail the first transaction), and the lock of f90 (in the
	// last) is held by another process.
	commit(t, s, ov, dir, "f0", 7, 7)
	l, err := ov.Lock(ctx, dir.Ino, "f90")
	if err != nil {
		t.Fatal(err)
	}
	cs = cs[:0]
	for i := range n {
		name := fmt.Sprint("f", i)
		cur := meta.KnownEntry(byName[name])
		if i == 2 {
			cur = meta.KnownEntry(nil)
		}
		cs = append(cs, meta.BatchCommit{Parent: dir, Name: name,
			Commit: meta.Commit{Version: ver(2), Mode: 0o644, Gen: gen, Cur: cur, Unlocked: true}})
	}
	for i, r := range v.CommitVersions(ctx, cs) {
		if i == 90 {
			if !errors.Is(r.Err, meta.ErrLocked) {
				t.Fatalf("f90, whose lock another writer holds: %+v, %v; want ErrLocked", r.Entry, r.Err)
			}
			continue
		}
		if r.Err != nil || r.Entry.Current().Manifest != ver(2).Manifest {
			t.Fatalf("second commit of f%d: %+v, %v", i, r.Entry, r.Err)
		}
		want := []int64{1, 2}
		if i == 0 {
			want = []int64{1, 7, 2} // on top of the other writer's
		}
		got, gerr := v.Get(ctx, dir.Ino, fmt.Sprint("f", i))
		if gerr != nil || len(got.Versions) != len(want) {
			t.Fatalf("f%d: %+v, %v; want %d versions", i, got, gerr, len(want))
		}
		for k, w := range want {
			if got.Versions[k].Size != w {
				t.Fatalf("f%d: versions %+v, want sizes %v", i, got.Versions, want)
			}
		}
	}
	l.Unlock(ctx)
	if got, gerr := v.Get(ctx, dir.Ino, "f90"); gerr != nil || len(got.Versions) != 1 {
		t.Fatalf("f90 after ErrLocked: %+v, %v; want its first version only", got, gerr)
	}

	// A stale GC generation fences every commit, batched or not.
	f, err := s.BeginGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err = f.End(ctx); err != nil {
		t.Fatal(err)
	}
	for i, r := range v.CommitVersions(ctx, cs[3:6]) {
		if !errors.Is(r.Err, meta.ErrFenced) {
			t.Fatalf("commit %d after a collection: %+v, %v; want ErrFenced", i, r.Entry, r.Err)
		}
	}
}
