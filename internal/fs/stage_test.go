package fs_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store/memstore"
)

// gcOnVerify is a target store that runs a garbage collection right after
// the Has call numbered at (CommitStaged's check that the upload is
// complete), so the collection falls between the upload and the commit.
type gcOnVerify struct {
	*memstore.Store
	calls atomic.Int64
	at    int64
	gc    func(context.Context) error
}

func (s *gcOnVerify) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	found, err := s.Store.Has(ctx, ids)
	if s.calls.Add(1) == s.at && err == nil {
		if gerr := s.gc(ctx); gerr != nil {
			return nil, gerr
		}
	}
	return found, err
}

// TestCommitStagedFencedByGC stages a file in a spool, then commits it to
// another store with a garbage collection running between the upload and
// the commit: the collection deletes the uploaded objects (nothing names
// them yet), the commit is fenced, the objects are uploaded again from the
// spool and the file then reads back. Before its commit the file does not
// exist.
// stageIn stages data (with attributes a) in a new spool, a memory store
// opened as a volume over f's metadata, and returns the spool and the
// staged version.
func stageIn(t *testing.T, f *fixture, data []byte, a fs.Attrs) (*memstore.Store, meta.Version) {
	t.Helper()
	spool := memstore.New()
	sv, err := fs.Open(f.svc, f.vol.Meta, f.master, spool, fs.Options{StoreName: "spool"})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	ver, _, err := sv.Stage(context.Background(), func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, a)
	if err != nil {
		t.Fatal(err)
	}
	return spool, ver
}

func TestCommitStagedFencedByGC(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	data := random(300 << 10) // no chunk twice
	a := fs.Attrs{Mode: 0o640, Mtime: time.Unix(1700000000, 0)}
	spool, ver := stageIn(t, f, data, a)
	if _, err := f.vol.Meta.Get(ctx, f.root.Ino, "s"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("a staged file is visible before its commit: %v", err)
	}

	target := &gcOnVerify{Store: memstore.New(), at: 2}
	tv, err := fs.Open(f.svc, f.vol.Meta, f.master, target, fs.Options{StoreName: "target"})
	if err != nil {
		t.Fatal(err)
	}
	defer tv.Close()
	gcs := 0
	target.gc = func(ctx context.Context) error {
		gcs++
		rep, gerr := fs.GC(ctx, f.svc, []*fs.Volume{tv}, target, fs.GCOptions{})
		if gerr == nil && rep.DeletedObjects == 0 {
			t.Errorf("the collection deleted nothing: the uploaded objects were not garbage")
		}
		return gerr
	}
	files := []fs.StagedFile{{Dir: f.root, Name: "s", Version: ver, Attrs: a}}
	res, cs, err := tv.CommitStaged(ctx, spool, files, nil)
	if err != nil || res[0].Err != nil {
		t.Fatalf("CommitStaged: %v, %v", err, res[0].Err)
	}
	if gcs != 1 {
		t.Fatalf("%d collections ran, want 1", gcs)
	}
	n := int64(1 + ver.Chunks) // manifest and chunks, each sent twice
	if cs.Objects != 2*n {
		t.Errorf("uploaded %d objects, want %d (all of them twice)", cs.Objects, 2*n)
	}
	e, err := f.vol.Meta.Get(ctx, f.root.Ino, "s")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Current().Stores; len(got) != 1 || got[0] != "target" {
		t.Errorf("version stores = %v", got)
	}
	var out bytes.Buffer
	if rerr := tv.ReadFile(ctx, e, nil, &out); rerr != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read back: %v (%d bytes, want %d)", rerr, out.Len(), len(data))
	}

	// Committing again (a drainer killed after the commit) commits nothing.
	res, _, err = tv.CommitStaged(ctx, spool, files, nil)
	if err != nil || res[0].Err != nil || !res[0].Already {
		t.Fatalf("second CommitStaged: %v, %+v", err, res[0])
	}
	if e2, _ := f.vol.Meta.Get(ctx, f.root.Ino, "s"); len(e2.Versions) != 1 {
		t.Fatalf("%d versions after committing twice, want 1", len(e2.Versions))
	}
}

// TestCommitStagedRespectsLock: a staged file whose writer lock another
// writer holds is not committed (its result matches meta.ErrLocked) and
// is committed by a later CommitStaged once the lock is gone.
func TestCommitStagedRespectsLock(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	data := random(40 << 10)
	a := fs.Attrs{Mode: 0o644, Mtime: time.Unix(1700000000, 0)}
	spool, ver := stageIn(t, f, data, a)
	l, err := f.vol.Meta.Lock(ctx, f.root.Ino, "held")
	if err != nil {
		t.Fatal(err)
	}
	files := []fs.StagedFile{{Dir: f.root, Name: "held", Version: ver, Attrs: a}}
	res, _, err := f.vol.CommitStaged(ctx, spool, files, nil)
	if err != nil || !errors.Is(res[0].Err, meta.ErrLocked) || res[0].Entry != nil {
		t.Fatalf("CommitStaged under another writer's lock: %v, %+v; want ErrLocked", err, res[0])
	}
	if _, gerr := f.vol.Meta.Get(ctx, f.root.Ino, "held"); !errors.Is(gerr, cairn.ErrNotFound) {
		t.Fatalf("the refused file exists: %v", gerr)
	}
	if uerr := l.Unlock(ctx); uerr != nil {
		t.Fatal(uerr)
	}
	res, _, err = f.vol.CommitStaged(ctx, spool, files, nil)
	if err != nil || res[0].Err != nil || res[0].Entry == nil {
		t.Fatalf("CommitStaged after the unlock: %v, %+v", err, res[0])
	}
	var out bytes.Buffer
	if err := f.vol.ReadFile(ctx, res[0].Entry, nil, &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read back: %v", err)
	}
}
