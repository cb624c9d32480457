package fs_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/volkey"
)

type fixture struct {
	master volkey.Master
	svc    *meta.Service
	vol    *fs.Volume
	st     *tamper
	root   *meta.Entry
}

// tamper is a memory store whose objects a test can damage: Get returns the
// damaged bytes as a broken medium would (the memory store itself refuses
// data that does not match its ID).
type tamper struct {
	*memstore.Store
	bad map[cairn.ID][]byte
	has atomic.Int64 // Has calls
}

func (s *tamper) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	s.has.Add(1)
	return s.Store.Has(ctx, ids)
}

func (s *tamper) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if b, ok := s.bad[id]; ok {
		return append([]byte(nil), b...), nil
	}
	return s.Store.Get(ctx, id)
}

func newFixture(t *testing.T, keep int) *fixture {
	t.Helper()
	ctx := context.Background()
	svc, err := meta.New(etcdtest.New(t), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	master := keyring.NewMaster()
	if err := svc.CreateVolume(ctx, meta.Volume{Name: "v", KeyCheck: fs.KeyCheck(master), ChunkMin: 4096, ChunkAvg: 16384, ChunkMax: 131072,
		KeepVersions: keep, TrashTTL: time.Hour}, 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	mv, err := svc.Open(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Open(svc, mv, keyring.NewMaster(), memstore.New(), fs.Options{}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("open with the wrong key = %v, want Permission", err)
	}
	st := &tamper{Store: memstore.New(), bad: map[cairn.ID][]byte{}}
	v, err := fs.Open(svc, mv, master, st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	root, err := mv.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{master: master, svc: svc, vol: v, st: st, root: root}
}

func source(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func (f *fixture) write(t *testing.T, name string, b []byte) *meta.Entry {
	t.Helper()
	e, _, err := f.vol.WriteFile(context.Background(), f.root, name, source(b), fs.Attrs{Mode: 0o644, Mtime: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (f *fixture) read(t *testing.T, name string) ([]byte, error) {
	t.Helper()
	e, err := f.vol.Meta.Get(context.Background(), f.root.Ino, name)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err = f.vol.ReadFile(context.Background(), e, nil, &buf)
	return buf.Bytes(), err
}

func TestWriteReadVersions(t *testing.T) {
	f := newFixture(t, 2)
	a, b, c := random(300<<10), random(10), []byte{}
	f.write(t, "x", a)
	if got, err := f.read(t, "x"); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("read = %d bytes, %v", len(got), err)
	}
	// The same content again adds no version and stores nothing new.
	objs, _ := f.st.Stats(context.Background())
	if e := f.write(t, "x", a); len(e.Versions) != 1 {
		t.Fatalf("rewrite of the same content made %d versions", len(e.Versions))
	}
	if again, _ := f.st.Stats(context.Background()); again.Objects != objs.Objects {
		t.Fatalf("rewrite of the same content stored %d objects", again.Objects-objs.Objects)
	}
	// One changed byte is a new version.
	a2 := bytes.Clone(a)
	a2[1000] ^= 1
	if e := f.write(t, "x", a2); len(e.Versions) != 2 {
		t.Fatalf("changed content made %d versions, want 2", len(e.Versions))
	}
	f.write(t, "x", a)
	f.write(t, "x", b)
	e := f.write(t, "x", c)
	if len(e.Versions) != 2 || e.Current().N != 5 || e.Size != 0 {
		t.Fatalf("versions = %+v", e.Versions)
	}
	var buf bytes.Buffer
	if err := f.vol.ReadFile(context.Background(), e, &e.Versions[0], &buf); err != nil || !bytes.Equal(buf.Bytes(), b) {
		t.Fatalf("old version = %d bytes, %v", buf.Len(), err)
	}
}

func TestGCKeepsLiveDropsDead(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 1)
	keep := random(200 << 10)
	f.write(t, "keep", keep)
	f.write(t, "churn", random(200<<10))
	before, _ := f.st.Stats(ctx)
	f.write(t, "churn", random(200<<10)) // version 1 dropped: its chunks are garbage
	rep, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{DryRun: true})
	if err != nil || rep.DeletedObjects == 0 {
		t.Fatalf("dry run = %+v, %v", rep, err)
	}
	mid, _ := f.st.Stats(ctx)
	if mid.Objects == before.Objects {
		t.Fatal("test setup: second churn write added nothing")
	}
	rep2, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{})
	if err != nil || rep2.DeletedObjects != rep.DeletedObjects || rep2.FreedBytes < 200<<10 {
		t.Fatalf("gc = %+v, %v (dry run said %+v)", rep2, err, rep)
	}
	if got, err := f.read(t, "keep"); err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("live file after gc: %v", err)
	}
	fr, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, true, nil)
	if err != nil || !fr.OK() {
		t.Fatalf("fsck after gc = %+v, %v", fr, err)
	}
}

func TestGCRefusesOnUnreadableManifest(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 10)
	e := f.write(t, "a", random(100<<10))
	f.write(t, "b", random(100<<10))
	f.st.Delete(ctx, e.Current().Manifest)
	objs, _ := f.st.Stats(ctx)
	if _, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); err == nil {
		t.Fatal("gc ran with a missing manifest")
	}
	after, _ := f.st.Stats(ctx)
	if after.Objects != objs.Objects {
		t.Fatalf("gc deleted %d objects despite the error", objs.Objects-after.Objects)
	}
}

func TestFsckNamesDamagedFiles(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 10)
	good := random(50 << 10)
	f.write(t, "good", good)
	bad := f.write(t, "bad", random(300<<10))
	m, err := f.vol.Manifest(ctx, bad.Current())
	if err != nil {
		t.Fatal(err)
	}
	// Damage one chunk.
	victim := m.Chunks[1].ID
	data, _ := f.st.Get(ctx, victim)
	data[len(data)/2] ^= 1
	f.st.bad[victim] = data

	rep, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || len(rep.Damaged) != 1 || rep.Damaged[0].Path != "v:/bad" {
		t.Fatalf("fsck = %+v", rep)
	}
	if _, err := f.read(t, "bad"); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("read of damaged file = %v, want Corrupt", err)
	}
	if got, err := f.read(t, "good"); err != nil || !bytes.Equal(got, good) {
		t.Fatal("undamaged file unreadable")
	}
	// A missing chunk is found even without --read-data.
	delete(f.st.bad, victim)
	f.st.Delete(ctx, victim)
	rep, err = fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, false, nil)
	if err != nil || len(rep.Damaged) != 1 || rep.Damaged[0].Path != "v:/bad" {
		t.Fatalf("fsck without read-data = %+v, %v", rep, err)
	}
	if _, err := f.read(t, "bad"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("read with a missing chunk = %v, want NotFound", err)
	}
}

// A garbage collection that runs while a file is being written must not
// lose the file: the writer is fenced, writes again and commits.
func TestWriteDuringGC(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 10)
	data := random(400 << 10)
	opened := 0
	open := func() (io.ReadCloser, error) {
		opened++
		if opened == 1 {
			// The first attempt's chunks get stored, then a gc runs
			// before the commit and deletes them (nothing references them).
			return &hookReader{r: bytes.NewReader(data), atEOF: func() {
				if _, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); err != nil {
					t.Error(err)
				}
			}}, nil
		}
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	if _, _, err := f.vol.WriteFile(ctx, f.root, "w", open, fs.Attrs{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if opened < 2 {
		t.Fatalf("writer was not fenced (opened %d times)", opened)
	}
	if got, err := f.read(t, "w"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file written during gc: %v", err)
	}
	rep, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, true, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("fsck = %+v, %v", rep, err)
	}
}

type hookReader struct {
	r     io.Reader
	atEOF func()
	fired bool
}

func (h *hookReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	return n, err
}

func (h *hookReader) Close() error {
	if !h.fired {
		h.fired = true
		h.atEOF()
	}
	return nil
}

// Rewriting a small file with unchanged content asks the store nothing
// (its chunk IDs are computed first and match the current version's);
// changed content is stored as usual.
func TestUnchangedSmallFileAsksNothing(t *testing.T) {
	f := newFixture(t, 5)
	ctx := context.Background()
	data := random(100 << 10)
	f.write(t, "s", data)
	// Another process: its pipeline has not just stored these chunks.
	v2, err := fs.Open(f.svc, f.vol.Meta, f.master, f.st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	asked := f.st.has.Load()
	e, st, err := v2.WriteFile(ctx, f.root, "s", source(data), fs.Attrs{Mode: 0o644, Mtime: time.Unix(1e9, 0)})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.st.has.Load() - asked; n != 0 {
		t.Fatalf("unchanged rewrite asked the store %d times", n)
	}
	if len(e.Versions) != 1 || e.Mtime != time.Unix(1e9, 0).UnixNano() || st.NewChunks != 0 || st.DupChunks != st.Chunks {
		t.Fatalf("unchanged rewrite: %d versions, mtime %d, stats %+v", len(e.Versions), e.Mtime, st)
	}
	data[5000] ^= 1
	e, _, err = v2.WriteFile(ctx, f.root, "s", source(data), fs.Attrs{Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	if f.st.has.Load() == asked || len(e.Versions) != 2 {
		t.Fatalf("changed rewrite: asked %d times, %d versions", f.st.has.Load()-asked, len(e.Versions))
	}
	if got, err := f.read(t, "s"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
}
