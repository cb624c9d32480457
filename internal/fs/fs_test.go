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
	// As realm.Init writes it: a special file raises its format.
	if ierr := svc.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); ierr != nil {
		t.Fatal(ierr)
	}
	master := keyring.NewMaster()
	if cerr := svc.CreateVolume(ctx, meta.Volume{Name: "v", KeyCheck: fs.KeyCheck(master), ChunkMin: 4096, ChunkAvg: 16384, ChunkMax: 131072,
		KeepVersions: keep, TrashTTL: time.Hour}, 0o755, 0, 0); cerr != nil {
		t.Fatal(cerr)
	}
	mv, err := svc.Open(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, oerr := fs.Open(svc, mv, keyring.NewMaster(), memstore.New(), fs.Options{}); !errors.Is(oerr, cairn.ErrPermission) {
		t.Fatalf("open with the wrong key = %v, want Permission", oerr)
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
	if got, rerr := f.read(t, "keep"); rerr != nil || !bytes.Equal(got, keep) {
		t.Fatalf("live file after gc: %v", rerr)
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
	if _, rerr := f.read(t, "bad"); !errors.Is(rerr, cairn.ErrCorrupt) {
		t.Fatalf("read of damaged file = %v, want Corrupt", rerr)
	}
	if got, rerr := f.read(t, "good"); rerr != nil || !bytes.Equal(got, good) {
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

// text is compressible, text-like data (its plain chunks still take about
// half their size): random words.
func text(n int) []byte {
	words := bytes.Fields([]byte("the of and to in is that for it as was with be by on func return struct error nil context package import var const type range select chan go defer if else"))
	var b bytes.Buffer
	r := random(n)
	for i := 0; b.Len() < n; i++ {
		b.Write(words[int(r[i%len(r)])%len(words)])
		if r[(i+7)%len(r)]%11 == 0 {
			b.WriteString(".\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.Bytes()[:n]
}

// A small file edited in the middle is stored as a delta against its
// current version: far fewer bytes than its plain chunk. Every version
// reads back, also once the base's version is pruned (KeepVersions 1) and
// gc has run; fsck and stats see the bases; the digest is that of the
// plain chunks, so the same content written again is recognised.
func TestDeltaSmallFileEdit(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 1)
	v1 := text(60 << 10)
	f.write(t, "s", v1)
	v2 := append(bytes.Clone(v1[:30<<10]), []byte("a new line in the middle.\n")...)
	v2 = append(v2, v1[30<<10:]...)
	e, st, err := f.vol.WriteFile(ctx, f.root, "s", source(v2), fs.Attrs{Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	// The same content as a new file is stored plainly (no current
	// version): the changed chunk's plain cost.
	_, plain, err := f.vol.WriteFile(ctx, f.root, "p", source(v2), fs.Attrs{Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	if st.DeltaChunks == 0 || plain.DeltaChunks != 0 || plain.NewChunks == 0 {
		t.Fatalf("delta write %+v, plain write %+v", st, plain)
	}
	if st.NewStoredBytes*4 > plain.NewStoredBytes {
		t.Fatalf("delta write stored %d bytes (manifest included), plain %d", st.NewStoredBytes, plain.NewStoredBytes)
	}
	if got, rerr := f.read(t, "s"); rerr != nil || !bytes.Equal(got, v2) {
		t.Fatalf("read v2: %v", rerr)
	}
	if len(e.Versions) != 1 {
		t.Fatalf("%d versions kept, want 1 (the base's version is pruned)", len(e.Versions))
	}
	// Version 3 edits the delta chunk again: its base is still v1's chunk.
	v3 := bytes.Clone(v2)
	copy(v3[31<<10:], "EDITED")
	if _, st2, werr := f.vol.WriteFile(ctx, f.root, "s", source(v3), fs.Attrs{Mode: 0o644}); werr != nil || st2.DeltaChunks == 0 {
		t.Fatalf("v3: %+v, %v", st2, werr)
	}
	if _, gerr := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); gerr != nil {
		t.Fatal(gerr)
	}
	if got, rerr := f.read(t, "s"); rerr != nil || !bytes.Equal(got, v3) {
		t.Fatalf("read v3 after gc: %v", rerr)
	}
	for _, readData := range []bool{false, true} {
		fr, ferr := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, readData, nil)
		if ferr != nil || !fr.OK() {
			t.Fatalf("fsck (read data %t) = %+v, %v", readData, fr, ferr)
		}
	}
	stats, err := fs.ComputeStats(ctx, []*fs.Volume{f.vol}, f.st)
	if err != nil || stats.Chunks <= plain.Chunks {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
	// Another process writes v3 again: recognised by its digest, nothing
	// asked or stored.
	vb, err := fs.Open(f.svc, f.vol.Meta, f.master, f.st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer vb.Close()
	asked := f.st.has.Load()
	e, st, err = vb.WriteFile(ctx, f.root, "s", source(v3), fs.Attrs{Mode: 0o644})
	if err != nil || f.st.has.Load() != asked || st.NewChunks != 0 || e.Current().N != 3 {
		t.Fatalf("unchanged rewrite after deltas: version %d, stats %+v, asked %d, %v", e.Current().N, st, f.st.has.Load()-asked, err)
	}
	// A damaged base is found by fsck, named as a base.
	var base cairn.ID
	m, err := f.vol.Manifest(ctx, e.Current())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range m.Chunks {
		if r.Base != nil {
			base = r.Base.ID
		}
	}
	f.st.bad[base] = []byte("damaged")
	fr, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, f.st, true, nil)
	if err != nil || fr.OK() {
		t.Fatalf("fsck with a damaged base = %+v, %v", fr, err)
	}
	if _, err := f.read(t, "s"); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("read with a damaged base: %v, want Corrupt", err)
	}
}

// A volume created after gc listed the volumes (but before it took the
// fence) would be missing from the mark: gc refuses and deletes nothing.
// A Check that fails also stops it before anything is deleted.
func TestGCRefusesUnlistedVolume(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 1)
	f.write(t, "churn", random(100<<10))
	f.write(t, "churn", random(100<<10)) // garbage to collect
	before, _ := f.st.Stats(ctx)
	stop := errors.New("caller says no")
	if _, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{Check: func(context.Context) error { return stop }}); !errors.Is(err, stop) {
		t.Fatalf("gc with a failing check = %v", err)
	}
	if err := f.svc.CreateVolume(ctx, meta.Volume{Name: "late", KeyCheck: fs.KeyCheck(keyring.NewMaster()), ChunkMin: 4096, ChunkAvg: 16384, ChunkMax: 131072, KeepVersions: 1}, 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GC(ctx, f.svc, []*fs.Volume{f.vol}, f.st, fs.GCOptions{}); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("gc with an unlisted volume = %v, want Conflict", err)
	}
	if after, _ := f.st.Stats(ctx); after.Objects != before.Objects {
		t.Fatalf("refused gc deleted %d objects", before.Objects-after.Objects)
	}
}
