package fs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/packstore"
)

// deferStore buffers Puts made with a store.WithDeferred context until
// Flush, as a pack store does: Get finds a buffered object, Has does not,
// and a failed Flush loses what was buffered.
type deferStore struct {
	*memstore.Store
	mu      sync.Mutex
	buf     map[cairn.ID][]byte
	flushes int
	fail    error        // Flush fails with it (and drops the buffer)
	onFlush func() error // called at each Flush, before anything is stored
}

func (s *deferStore) Defers() bool { return true }

func (s *deferStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if !store.Deferred(ctx) {
		return s.Store.Put(ctx, id, data)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf[id] = append([]byte(nil), data...)
	return nil
}

func (s *deferStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	s.mu.Lock()
	b, ok := s.buf[id]
	s.mu.Unlock()
	if ok {
		return append([]byte(nil), b...), nil
	}
	return s.Store.Get(ctx, id)
}

func (s *deferStore) Flush(ctx context.Context) error {
	s.mu.Lock()
	s.flushes++
	hook := s.onFlush
	s.mu.Unlock()
	if hook != nil {
		if err := hook(); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	buf := s.buf
	s.buf = map[cairn.ID][]byte{}
	if s.fail != nil {
		return s.fail
	}
	for id, b := range buf {
		if err := s.Store.Put(ctx, id, b); err != nil {
			return err
		}
	}
	return nil
}

// durable reports whether id is stored (not only buffered).
func (s *deferStore) durable(ctx context.Context, id cairn.ID) bool {
	found, err := s.Store.Has(ctx, []cairn.ID{id})
	return err == nil && found[0]
}

func newDeferFixture(t *testing.T) (*fixture, *deferStore) {
	t.Helper()
	f := newFixture(t, 2)
	ds := &deferStore{Store: memstore.New(), buf: map[cairn.ID][]byte{}}
	v, err := fs.Open(f.svc, f.vol.Meta, f.master, ds, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	f.vol = v
	return f, ds
}

// groupFiles returns n files: small ones and every 7th of 300 KiB (several
// chunks).
func groupFiles(n int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		size := 4096
		if i%7 == 3 {
			size = 300 << 10
		}
		files[fmt.Sprintf("f%03d", i)] = random(size)
	}
	return files
}

func prepareAll(t *testing.T, v *fs.Volume, dir *meta.Entry, files map[string][]byte) []*fs.PendingWrite {
	t.Helper()
	var ps []*fs.PendingWrite
	for name, b := range files {
		p, err := v.PrepareFile(context.Background(), dir, name, source(b), fs.Attrs{Mode: 0o644, Mtime: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

// A group of prepared writes is committed only after the one Flush that
// makes their objects durable, and then every committed version names
// only durable objects.
func TestCommitGroupAfterFlush(t *testing.T) {
	ctx := context.Background()
	f, ds := newDeferFixture(t)
	if !f.vol.Defers() {
		t.Fatal("Defers() = false over a store that defers")
	}
	files := groupFiles(40)
	ps := prepareAll(t, f.vol, f.root, files)
	n := 0
	ds.Store.List(ctx, func(cairn.ID, int64) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d objects durable before the flush, want 0 (all deferred)", n)
	}
	// Every committed version must name only durable objects: checked at
	// the flush (before it stores anything) and after the commits.
	committedDurable := func() error {
		ents, err := f.vol.Meta.ReadDir(ctx, f.root.Ino)
		if err != nil {
			return err
		}
		for _, e := range ents {
			ver := e.Current()
			if ver == nil {
				continue
			}
			if !ds.durable(ctx, ver.Manifest) {
				return fmt.Errorf("%s committed with manifest %s not durable", e.Name, ver.Manifest.Short())
			}
			m, err := f.vol.Manifest(ctx, ver)
			if err != nil {
				return err
			}
			for _, r := range m.Chunks {
				if !ds.durable(ctx, r.ID) {
					return fmt.Errorf("%s committed with chunk %s not durable", e.Name, r.ID.Short())
				}
			}
		}
		return nil
	}
	ds.onFlush = func() error {
		ents, err := f.vol.Meta.ReadDir(ctx, f.root.Ino)
		if err != nil {
			t.Error(err)
		}
		if len(ents) != 0 {
			t.Errorf("%d files committed before the flush of their group", len(ents))
		}
		if err := committedDurable(); err != nil {
			t.Error(err)
		}
		return nil
	}
	res := f.vol.CommitGroup(ctx, ps)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("commit %d: %v", i, r.Err)
		}
	}
	if ds.flushes != 1 {
		t.Fatalf("%d flushes for one group, want 1", ds.flushes)
	}
	if err := committedDurable(); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if got, err := f.read(t, name); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %v (%d bytes, want %d)", name, err, len(got), len(b))
		}
	}
	// The writer locks were released: writing one again does not wait.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := f.vol.WriteFile(wctx, f.root, "f000", source([]byte("again")), fs.Attrs{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
}

// If the Flush fails, nothing of the group is committed, each write
// reports the error, the locks are released, and writing the files again
// stores their data again (the engine does not trust what it lost).
func TestCommitGroupFlushFails(t *testing.T) {
	ctx := context.Background()
	f, ds := newDeferFixture(t)
	files := groupFiles(20)
	ps := prepareAll(t, f.vol, f.root, files)
	ds.fail = cairn.E("flush", cairn.Unavailable, "", errors.New("the bucket is down"))
	res := f.vol.CommitGroup(ctx, ps)
	for i, r := range res {
		if r.Err == nil || !errors.Is(r.Err, cairn.ErrUnavailable) {
			t.Fatalf("commit %d after a failed flush: %v, want the flush's error", i, r.Err)
		}
		if r.Entry != nil {
			t.Fatalf("commit %d returned an entry after a failed flush", i)
		}
	}
	if ents, err := f.vol.Meta.ReadDir(ctx, f.root.Ino); err != nil || len(ents) != 0 {
		t.Fatalf("after a failed flush: %d entries committed (%v), want 0", len(ents), err)
	}
	ds.fail = nil
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for name, b := range files {
		if _, _, err := f.vol.WriteFile(wctx, f.root, name, source(b), fs.Attrs{Mode: 0o644}); err != nil {
			t.Fatalf("%s written again: %v", name, err)
		}
	}
	rep, err := fs.Fsck(ctx, []*fs.Volume{f.vol}, ds, true, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("fsck = %+v, %v", rep, err)
	}
}

// A garbage collection that runs between PrepareFile and CommitGroup, over
// a real pack store that has already stored some of the group's packs
// (and so lists, and deletes, their unreferenced objects), loses nothing:
// the fenced commits write again.
func TestCommitGroupDuringGC(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 2)
	ps, err := packstore.New(ctx, memstore.New(), packstore.Options{Threshold: 32 << 10, PackSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	v, err := fs.Open(f.svc, f.vol.Meta, f.master, ps, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	if !v.Defers() {
		t.Fatal("Defers() = false over a pack store")
	}
	files := map[string][]byte{}
	for i := range 60 {
		files[fmt.Sprintf("g%03d", i)] = random(4096)
	}
	pend := prepareAll(t, v, f.root, files)
	rep, err := fs.GC(ctx, f.svc, []*fs.Volume{v}, ps, fs.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DeletedObjects == 0 {
		t.Fatal("the gc deleted nothing: the test does not put the group at risk")
	}
	for i, r := range v.CommitGroup(ctx, pend) {
		if r.Err != nil {
			t.Fatalf("commit %d: %v", i, r.Err)
		}
	}
	// A group whose objects are all still buffered when a collection
	// runs: the collection cannot see (or delete) them, and its own Flush
	// stores them, but the commits are fenced all the same and write again.
	more := map[string][]byte{}
	for i := range 5 {
		more[fmt.Sprintf("h%03d", i)] = random(4096)
	}
	pend = prepareAll(t, v, f.root, more)
	if _, gerr := fs.GC(ctx, f.svc, []*fs.Volume{v}, ps, fs.GCOptions{}); gerr != nil {
		t.Fatal(gerr)
	}
	for i, r := range v.CommitGroup(ctx, pend) {
		if r.Err != nil {
			t.Fatalf("commit %d of the buffered group: %v", i, r.Err)
		}
	}
	for name, b := range more {
		files[name] = b
	}
	// A later collection must not find anything to delete that a
	// committed version names, and every file reads back.
	if _, gerr := fs.GC(ctx, f.svc, []*fs.Volume{v}, ps, fs.GCOptions{}); gerr != nil {
		t.Fatal(gerr)
	}
	frep, err := fs.Fsck(ctx, []*fs.Volume{v}, ps, true, nil)
	if err != nil || !frep.OK() || frep.Files != len(files) {
		t.Fatalf("fsck = %+v, %v", frep, err)
	}
	for name, b := range files {
		e, err := v.Meta.Get(ctx, f.root.Ino, name)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := v.ReadFile(ctx, e, nil, &buf); err != nil || !bytes.Equal(buf.Bytes(), b) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// Re-putting unchanged content whose current version holds delta chunks
// reuses that version's manifest; the group must not look for the plain
// encodings of its chunks (never stored) and write the file again.
func TestCommitGroupUnchangedDeltaFile(t *testing.T) {
	ctx := context.Background()
	f, _ := newDeferFixture(t)
	text := bytes.Repeat([]byte("a line of text that compresses and deltas well\n"), 1500)
	edited := append([]byte(nil), text...)
	copy(edited[30000:], "an edit in the middle")
	for _, content := range [][]byte{text, edited, edited} {
		p, err := f.vol.PrepareFile(ctx, f.root, "doc", source(content), fs.Attrs{Mode: 0o644, Mtime: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		res := f.vol.CommitGroup(ctx, []*fs.PendingWrite{p})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		if res[0].Stats.LogicalBytes != int64(len(content)) {
			t.Fatalf("wrote %d bytes for %d: the file was written again", res[0].Stats.LogicalBytes, len(content))
		}
	}
	e, _ := f.vol.Meta.Get(ctx, f.root.Ino, "doc")
	m, err := f.vol.Manifest(ctx, e.Current())
	if err != nil {
		t.Fatal(err)
	}
	deltas := 0
	for _, r := range m.Chunks {
		if r.Base != nil {
			deltas++
		}
	}
	if deltas == 0 {
		t.Fatal("test setup: the edited version has no delta chunk")
	}
}

// A group prepared without writer locks (a put: Attrs.Unlocked, each
// file's entry from its directory's listing) is committed; a file whose
// lock another writer holds is committed once that writer lets go, not
// under its lock.
func TestCommitGroupUnlocked(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 3)
	v := f.vol
	f.write(t, "old", []byte("first version"))
	gen, err := v.Gen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := v.Meta.ReadDir(ctx, f.root.Ino)
	if err != nil || len(ents) != 1 {
		t.Fatalf("ReadDir: %v, %v", ents, err)
	}
	other, err := meta.New(f.svc.Client(), meta.Options{LockTTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ov, err := other.Open(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	l, err := ov.Lock(ctx, f.root.Ino, "held")
	if err != nil {
		t.Fatal(err)
	}
	files := groupFiles(60)
	files["old"], files["held"] = []byte("second version"), []byte("written while locked")
	var ps []*fs.PendingWrite
	var names []string
	for name, b := range files {
		names = append(names, name)
		a := fs.Attrs{Mode: 0o644, Mtime: time.Now(), Unlocked: true, Listed: true, ListedGen: gen}
		if name == "old" {
			a.Cur = &ents[0]
		}
		p, perr := v.PrepareFile(ctx, f.root, name, source(b), a)
		if perr != nil {
			t.Fatal(perr)
		}
		ps = append(ps, p)
	}
	done := make(chan []fs.GroupResult, 1)
	go func() { done <- v.CommitGroup(ctx, ps) }()
	select {
	case res := <-done:
		t.Fatalf("CommitGroup returned while another writer held a file's lock: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	if err = l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, r := range <-done {
		if r.Err != nil {
			t.Fatalf("%s: %v", names[i], r.Err)
		}
	}
	for name, want := range files {
		got, rerr := f.read(t, name)
		if rerr != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, %v; want %d", name, len(got), rerr, len(want))
		}
	}
	if e, gerr := v.Meta.Get(ctx, f.root.Ino, "old"); gerr != nil || len(e.Versions) != 2 {
		t.Fatalf("old: %+v, %v; want 2 versions", e, gerr)
	}
}
