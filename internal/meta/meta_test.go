package meta_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
)

// newVolRoot is newVol and the volume's root directory.
func newVolRoot(t *testing.T, keep int) (*meta.Service, *meta.Vol, *meta.Entry) {
	t.Helper()
	s, v := newVol(t, keep)
	root, err := v.Root(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s, v, root
}

// otherProcess opens volume "home" of s's etcd through a Service of its
// own (its own lease and writer locks), as another process would.
func otherProcess(t *testing.T, s *meta.Service) *meta.Vol {
	t.Helper()
	other, err := meta.New(s.Client(), meta.Options{LockTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	ov, err := other.Open(context.Background(), "home")
	if err != nil {
		t.Fatal(err)
	}
	return ov
}

func newVol(t *testing.T, keep int) (*meta.Service, *meta.Vol) {
	t.Helper()
	cli := etcdtest.New(t)
	s, err := meta.New(cli, meta.Options{LockTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if ierr := s.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); ierr != nil {
		t.Fatal(ierr)
	}
	if ierr := s.InitRealm(ctx, meta.RealmInfo{ID: "r2"}); !errors.Is(ierr, cairn.ErrExist) {
		t.Fatalf("second InitRealm err = %v, want Exist", ierr)
	}
	if cerr := s.CreateVolume(ctx, meta.Volume{Name: "home", KeepVersions: keep, TrashTTL: time.Hour}, 0o755, 0, 0); cerr != nil {
		t.Fatal(cerr)
	}
	if cerr := s.CreateVolume(ctx, meta.Volume{Name: "home"}, 0o755, 0, 0); !errors.Is(cerr, cairn.ErrExist) {
		t.Fatalf("duplicate CreateVolume err = %v, want Exist", cerr)
	}
	v, err := s.Open(ctx, "home")
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

func commit(t *testing.T, s *meta.Service, v *meta.Vol, dir *meta.Entry, name string, size int64, m byte) *meta.Entry {
	t.Helper()
	ctx := context.Background()
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id cairn.ID
	id[0] = m
	e, _, err := v.CommitVersion(ctx, dir, name, meta.Commit{Version: meta.Version{Manifest: id, Size: size}, Mode: 0o644, Gen: gen})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestNamespace(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 3)
	if _, err := s.Open(ctx, "nope"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Open(nope) = %v, want NotFound", err)
	}
	dir, err := v.MkdirAll(ctx, []string{"a", "b"}, 0o755, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if again, merr := v.MkdirAll(ctx, []string{"a", "b"}, 0o700, 0, 0); merr != nil || again.Ino != dir.Ino {
		t.Fatalf("MkdirAll again = %v, %v", again, merr)
	}
	f := commit(t, s, v, dir, "f.txt", 10, 1)
	if f.Current().N != 1 || f.Size != 10 {
		t.Fatalf("first commit = %+v", f)
	}
	if _, merr := v.MkdirAll(ctx, []string{"a", "b", "f.txt", "c"}, 0o755, 0, 0); !errors.Is(merr, cairn.ErrNotDir) {
		t.Fatalf("MkdirAll through file = %v, want NotDir", merr)
	}
	// Versions: keep 3.
	for i := 2; i <= 5; i++ {
		f = commit(t, s, v, dir, "f.txt", int64(i), byte(i))
	}
	if len(f.Versions) != 3 || f.Current().N != 5 || f.Versions[0].N != 3 {
		t.Fatalf("versions kept = %+v", f.Versions)
	}
	got, err := v.Lookup(ctx, []string{"a", "b", "f.txt"})
	if err != nil || got.Ino != f.Ino || got.Current().Manifest[0] != 5 {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	if _, lerr := v.Lookup(ctx, []string{"a", "zz"}); !errors.Is(lerr, cairn.ErrNotFound) {
		t.Fatalf("Lookup missing = %v", lerr)
	}
	if _, _, cerr := v.CommitVersion(ctx, mustLookup(t, v, "a"), "b", meta.Commit{}); !errors.Is(cerr, cairn.ErrIsDir) {
		t.Fatalf("commit over dir = %v, want IsDir", cerr)
	}
	// Symlink.
	if _, cerr := v.Create(ctx, dir, meta.Entry{Name: "ln", Type: meta.TypeSymlink, Target: "f.txt", Mode: 0o777}); cerr != nil {
		t.Fatal(cerr)
	}
	if _, cerr := v.Create(ctx, dir, meta.Entry{Name: "ln", Type: meta.TypeSymlink}); !errors.Is(cerr, cairn.ErrExist) {
		t.Fatalf("Create dup = %v", cerr)
	}
	ents, err := v.ReadDir(ctx, dir.Ino)
	if err != nil || len(ents) != 2 || ents[0].Name != "f.txt" || ents[1].Target != "f.txt" {
		t.Fatalf("ReadDir = %+v, %v", ents, err)
	}
	// ReadDirAt: the revision the listing was read at, no older than its
	// entries and older than any later change.
	ents, at, err := v.ReadDirAt(ctx, dir.Ino)
	if err != nil || len(ents) != 2 || at < max(ents[0].Rev, ents[1].Rev) {
		t.Fatalf("ReadDirAt = %+v at %d, %v", ents, at, err)
	}
	later, err := v.Create(ctx, dir, meta.Entry{Name: "later", Type: meta.TypeSymlink, Target: "f.txt", Mode: 0o777})
	if err != nil || later.Rev <= at {
		t.Fatalf("a create after a listing at %d: %+v, %v", at, later, err)
	}
	// EntryRevs: each entry's ModRevision, as a listing reads it, without
	// the records; a changed entry's moves.
	revs, cluster, err := v.EntryRevs(ctx, dir.Ino)
	if err != nil || cluster == 0 || len(revs) != 3 || revs["f.txt"] != ents[0].Rev || revs["ln"] != ents[1].Rev || revs["later"] != later.Rev {
		t.Fatalf("EntryRevs = %v, cluster %x, %v; listing %+v, later at %d", revs, cluster, err, ents, later.Rev)
	}
	ln := ents[1]
	ln.Target = "other"
	if _, err := v.Update(ctx, &ln); err != nil {
		t.Fatal(err)
	}
	if revs2, _, err := v.EntryRevs(ctx, dir.Ino); err != nil || revs2["ln"] <= revs["ln"] || revs2["f.txt"] != revs["f.txt"] {
		t.Fatalf("EntryRevs after an update of ln = %v, %v (before %v)", revs2, err, revs)
	}
	// EntryRevsOf: the same, for several directories in one transaction.
	root := mustLookup(t, v)
	many, cl, err := v.EntryRevsOf(ctx, []uint64{dir.Ino, root.Ino})
	one, _, _ := v.EntryRevs(ctx, dir.Ino)
	rootRevs, _, _ := v.EntryRevs(ctx, root.Ino)
	if err != nil || cl != cluster || len(many) != 2 || fmt.Sprint(many[dir.Ino]) != fmt.Sprint(one) || fmt.Sprint(many[root.Ino]) != fmt.Sprint(rootRevs) || len(rootRevs) == 0 {
		t.Fatalf("EntryRevsOf = %v, %x, %v; EntryRevs %v and %v", many, cl, err, one, rootRevs)
	}
}

func mustLookup(t *testing.T, v *meta.Vol, parts ...string) *meta.Entry {
	t.Helper()
	e, err := v.Lookup(context.Background(), parts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestTrashRenameRestore(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 10)
	root := mustLookup(t, v)
	d, _ := v.MkdirAll(ctx, []string{"d"}, 0o755, 0, 0)
	commit(t, s, v, d, "x", 1, 1)
	if _, err := v.Remove(ctx, root, "d", "home:/d", false); !errors.Is(err, cairn.ErrNotEmpty) {
		t.Fatalf("rm non-empty = %v, want NotEmpty", err)
	}
	item, err := v.Remove(ctx, root, "d", "home:/d", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Lookup(ctx, []string{"d"}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("removed dir still there: %v", err)
	}
	// The subtree is still walked (its chunks stay referenced).
	seen := map[string]bool{}
	if err := v.Walk(ctx, func(e *meta.Entry, trashed bool) error { seen[e.Name] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if !seen["x"] || !seen["d"] {
		t.Fatalf("walk missed trashed subtree: %v", seen)
	}
	if _, err := v.RestoreTrash(ctx, item.ID, root, "d"); err != nil {
		t.Fatal(err)
	}
	if e := mustLookup(t, v, "d", "x"); e.Size != 1 {
		t.Fatalf("restored file = %+v", e)
	}
	// Rename a file over another: the replaced one's history stays
	// with the name (TestRenameFollowsPath); an empty file with no
	// version renamed over it sends it to the trash.
	commit(t, s, v, root, "y", 2, 2)
	d = mustLookup(t, v, "d")
	if _, err := v.Create(ctx, d, meta.Entry{Name: "empty", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if err := v.Rename(ctx, d, "empty", root, "y", "home:/y"); err != nil {
		t.Fatal(err)
	}
	if e := mustLookup(t, v, "y"); e.Size != 0 || len(e.Versions) != 0 {
		t.Fatalf("after rename y = %+v", e)
	}
	trash, _ := v.Trash(ctx)
	if len(trash) != 1 || trash[0].Path != "home:/y" || trash[0].Entry.Size != 2 {
		t.Fatalf("trash = %+v", trash)
	}
	// Purge: nothing is old enough, then everything is.
	if n, err := v.PurgeTrash(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("purge young = %d, %v", n, err)
	}
	if n, err := v.PurgeTrash(ctx, time.Now().Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v", n, err)
	}
	// Dir onto non-empty dir refused.
	e2, _ := v.MkdirAll(ctx, []string{"e", "sub"}, 0o755, 0, 0)
	_ = e2
	if err := v.Rename(ctx, root, "d", root, "e", "home:/e"); !errors.Is(err, cairn.ErrNotEmpty) {
		t.Fatalf("dir over non-empty dir = %v", err)
	}
}

func TestGCFence(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 10)
	root := mustLookup(t, v)
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.BeginGC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, berr := s.BeginGC(ctx); !errors.Is(berr, cairn.ErrConflict) {
		t.Fatalf("second BeginGC = %v, want Conflict", berr)
	}
	// A writer that started before the collection is fenced.
	_, _, err = v.CommitVersion(ctx, root, "f", meta.Commit{Gen: gen})
	if !errors.Is(err, meta.ErrFenced) {
		t.Fatalf("commit during gc = %v, want ErrFenced", err)
	}
	// A writer starting now waits for the collection to end.
	got := make(chan int64, 1)
	go func() {
		g, err := s.WriteGen(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	select {
	case <-got:
		t.Fatal("WriteGen returned while gc held the fence")
	case <-time.After(200 * time.Millisecond):
	}
	if err := f.Alive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.End(ctx); err != nil {
		t.Fatal(err)
	}
	g2 := <-got
	if g2 == gen {
		t.Fatal("generation did not change across a gc")
	}
	if _, _, err := v.CommitVersion(ctx, root, "f", meta.Commit{Gen: g2}); err != nil {
		t.Fatal(err)
	}
}

func TestLockSerializesWriters(t *testing.T) {
	ctx := context.Background()
	_, v := newVol(t, 10)
	l, err := v.Lock(ctx, 1, "f")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	order := []string{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l2, lerr := v.Lock(ctx, 1, "f")
		if lerr != nil {
			t.Error(lerr)
			return
		}
		mu.Lock()
		order = append(order, "second")
		mu.Unlock()
		l2.Unlock(ctx)
	}()
	time.Sleep(150 * time.Millisecond)
	mu.Lock()
	order = append(order, "first")
	mu.Unlock()
	l.Unlock(ctx)
	<-done
	if len(order) != 2 || order[0] != "first" {
		t.Fatalf("order = %v", order)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	l3, err := v.Lock(ctx, 1, "g")
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Unlock(ctx)
	if _, err := v.Lock(short, 1, "g"); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("Lock held = %v, want Conflict", err)
	}
}

func TestConcurrentCommitsAllLand(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 100)
	root := mustLookup(t, v)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			gen, _ := s.WriteGen(ctx)
			if _, _, err := v.CommitVersion(ctx, root, "shared", meta.Commit{Version: meta.Version{Size: int64(i)}, Gen: gen}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	e := mustLookup(t, v, "shared")
	if len(e.Versions) != 20 || e.Current().N != 20 {
		t.Fatalf("versions = %d, current N = %d; want 20, 20", len(e.Versions), e.Current().N)
	}
}

// TestCreateLocked: a file created with its writer lock is locked against
// other processes until its commit releases the lock; where the lock is
// held already (in this process, or by another process writing a file of
// that name into existence) the entry is created without it.
func TestCreateLocked(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	ov := otherProcess(t, s)
	locked := func(name string) bool {
		t.Helper()
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		l, err := ov.Lock(short, 1, name)
		if errors.Is(err, cairn.ErrConflict) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		l.Unlock(ctx)
		return false
	}

	e, l, err := v.CreateLocked(ctx, root, meta.Entry{Name: "a", Type: meta.TypeFile, Mode: 0o644})
	if err != nil || l == nil {
		t.Fatalf("CreateLocked = %v, lock %v; want a lock", err, l)
	}
	if got := mustLookup(t, v, "a"); got.Ino != e.Ino || got.Rev != e.Rev {
		t.Fatalf("entry %+v, created %+v", got, e)
	}
	if !locked("a") {
		t.Fatal("another process took the lock of a file created locked")
	}
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, cerr := v.CommitVersion(ctx, root, "a", meta.Commit{Version: meta.Version{Size: 1}, Mode: 0o644, Gen: gen, Lock: l, Cur: meta.KnownEntry(e)}); cerr != nil {
		t.Fatal(cerr)
	}
	if locked("a") {
		t.Fatal("the commit did not release the lock taken by the create")
	}

	// Taken already: by this process, then by another.
	l2, err := v.Lock(ctx, 1, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, l, cerr := v.CreateLocked(ctx, root, meta.Entry{Name: "b", Type: meta.TypeFile}); cerr != nil || l != nil {
		t.Fatalf("CreateLocked of a name this process holds locked = %v, lock %v; want created, no lock", cerr, l)
	}
	l2.Unlock(ctx)
	l3, err := ov.Lock(ctx, 1, "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, l, cerr := v.CreateLocked(ctx, root, meta.Entry{Name: "c", Type: meta.TypeFile}); cerr != nil || l != nil {
		t.Fatalf("CreateLocked of a name another process holds locked = %v, lock %v; want created, no lock", cerr, l)
	}
	if !locked("c") {
		t.Fatal("the other process's lock went")
	}
	l3.Unlock(ctx)

	// Taken names and removed parents fail as Create does, holding nothing.
	if old, l, cerr := v.CreateLocked(ctx, root, meta.Entry{Name: "a", Type: meta.TypeFile}); !errors.Is(cerr, cairn.ErrExist) || l != nil || old == nil || old.Ino != e.Ino {
		t.Fatalf("CreateLocked of an existing name = %v, %v, lock %v", old, cerr, l)
	}
	if locked("a") {
		t.Fatal("a failed CreateLocked left the lock held")
	}
	d, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Remove(ctx, root, "d", "home:/d", false); err != nil {
		t.Fatal(err)
	}
	if _, l, err := v.CreateLocked(ctx, d, meta.Entry{Name: "x", Type: meta.TypeFile}); !errors.Is(err, cairn.ErrNotFound) || l != nil {
		t.Fatalf("CreateLocked in a removed directory = %v, lock %v; want NotFound", err, l)
	}
	if _, l, err := v.CreateLocked(ctx, d, meta.Entry{Name: "x", Type: meta.TypeFile}); !errors.Is(err, cairn.ErrNotFound) || l != nil {
		t.Fatalf("second CreateLocked in a removed directory = %v (the in-process lock was kept?)", err)
	}
}

// TestRenameFollowsPath: a file renamed over another (an editor's save)
// becomes the next version of the name's history, in one transaction:
// the destination's versions, then the source's renumbered after them,
// at most KeepVersions, with the source's inode, mode and owner; nothing
// goes to the trash and the replaced inode's attributes go. A source
// with no version yet takes the history along when its commit is pending
// (RenamePending), and its commit lands as the next version.
func TestRenameFollowsPath(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 4)
	commit(t, s, v, root, "f", 1, 1)
	commit(t, s, v, root, "f", 2, 2)
	f := commit(t, s, v, root, "f", 3, 3)
	if err := v.SetXattr(ctx, f.Ino, "user.x", []byte("1"), meta.XattrAny); err != nil {
		t.Fatal(err)
	}
	tmp := commit(t, s, v, root, "f.tmp", 4, 4)
	tmp.Mode, tmp.UID = 0o600, 7
	tmp, err := v.Update(ctx, tmp)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Rename(ctx, root, "f.tmp", root, "f", "home:/f"); err != nil {
		t.Fatal(err)
	}
	sizes := func(e *meta.Entry) (out []int64, ns []uint64) {
		for _, ver := range e.Versions {
			out, ns = append(out, ver.Size), append(ns, ver.N)
		}
		return out, ns
	}
	e := mustLookup(t, v, "f")
	got, ns := sizes(e)
	if !slices.Equal(got, []int64{1, 2, 3, 4}) || !slices.Equal(ns, []uint64{1, 2, 3, 4}) || e.Size != 4 ||
		e.Ino != tmp.Ino || e.Mode != 0o600 || e.UID != 7 {
		t.Fatalf("f after the save: sizes %v, numbers %v, size %d, ino %x (source %x), mode %o, uid %d", got, ns, e.Size, e.Ino, tmp.Ino, e.Mode, e.UID)
	}
	if trash, _ := v.Trash(ctx); len(trash) != 0 {
		t.Fatalf("trash after the save: %+v", trash)
	}
	if _, err := v.Xattr(ctx, f.Ino, "user.x"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("the replaced inode's attribute: %v, want NotFound", err)
	}
	// A source with a history of its own: appended after the
	// destination's, the oldest dropped past KeepVersions (4).
	commit(t, s, v, root, "g", 5, 5)
	commit(t, s, v, root, "g", 6, 6)
	if err := v.Rename(ctx, root, "g", root, "f", "home:/f"); err != nil {
		t.Fatal(err)
	}
	if got, ns = sizes(mustLookup(t, v, "f")); !slices.Equal(got, []int64{3, 4, 5, 6}) || !slices.Equal(ns, []uint64{3, 4, 5, 6}) {
		t.Fatalf("f after a source with two versions: sizes %v, numbers %v", got, ns)
	}
	// A pending source (no version yet): the history follows it, and
	// its commit is the next version.
	if _, err := v.Create(ctx, root, meta.Entry{Name: "p", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	p := mustLookup(t, v, "p")
	if _, err := v.RenamePending(ctx, root, "p", p, root, "f", "home:/f", nil); err != nil {
		t.Fatal(err)
	}
	if e = mustLookup(t, v, "f"); e.Ino != p.Ino || e.Size != 6 || len(e.Versions) != 4 {
		t.Fatalf("f after a pending source: %+v", e)
	}
	commit(t, s, v, root, "f", 7, 7)
	if got, ns = sizes(mustLookup(t, v, "f")); !slices.Equal(got, []int64{4, 5, 6, 7}) || !slices.Equal(ns, []uint64{4, 5, 6, 7}) {
		t.Fatalf("f after the pending commit: sizes %v, numbers %v", got, ns)
	}
	if trash, _ := v.Trash(ctx); len(trash) != 0 {
		t.Fatalf("trash: %+v", trash)
	}
}

// TestRenameKnown: a rename given the entries as the caller knew them
// reads nothing; given stale ones it fails with Conflict and changes
// nothing.
func TestRenameKnown(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	a := commit(t, s, v, root, "a", 1, 1)
	b := commit(t, s, v, root, "b", 2, 2)
	// Stale source, destination thought absent while present, and
	// destination thought present at an old revision: all refused.
	old := *a
	commit(t, s, v, root, "a", 3, 3)
	for i, try := range []struct {
		src *meta.Entry
		dst *meta.Known
	}{{&old, meta.KnownEntry(b)}, {nil, meta.KnownEntry(nil)}, {nil, meta.KnownEntry(&meta.Entry{Name: "b", Parent: 1, Ino: b.Ino, Type: meta.TypeFile, Rev: b.Rev - 1})}} {
		if _, err := v.RenameKnown(ctx, root, "a", try.src, root, "b", "home:/b", try.dst); !errors.Is(err, cairn.ErrConflict) {
			t.Fatalf("rename %d with a stale entry: %v, want Conflict", i, err)
		}
	}
	if got := mustLookup(t, v, "b"); got.Ino != b.Ino || got.Size != 2 {
		t.Fatalf("b changed: %+v", got)
	}
	cur := mustLookup(t, v, "a")
	if _, err := v.RenameKnown(ctx, root, "a", cur, root, "b", "home:/b", meta.KnownEntry(b)); err != nil {
		t.Fatal(err)
	}
	if got := mustLookup(t, v, "b"); got.Ino != cur.Ino || got.Size != 3 {
		t.Fatalf("after the rename b is %+v", got)
	}
	if _, err := v.Get(ctx, 1, "a"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("a after the rename: %v", err)
	}
}

// TestRenameNoReplace: a rename that must not replace moves the file to a
// free name; to a taken one (taken meanwhile, by anyone) it fails with
// Exist and changes nothing; with a stale source, Conflict.
func TestRenameNoReplace(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	a := commit(t, s, v, root, "a", 1, 1)
	b := commit(t, s, v, root, "b", 2, 2)
	if _, err := v.RenameNoReplace(ctx, root, "a", a, root, "b", "home:/b"); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("rename a over b without replacing: %v, want Exist", err)
	}
	if got := mustLookup(t, v, "b"); got.Ino != b.Ino || got.Size != 2 {
		t.Fatalf("b changed: %+v", got)
	}
	mustLookup(t, v, "a")
	old := *a
	commit(t, s, v, root, "a", 3, 3)
	if _, err := v.RenameNoReplace(ctx, root, "a", &old, root, "c", "home:/c"); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("rename with a stale source: %v, want Conflict", err)
	}
	if _, err := v.RenameNoReplace(ctx, root, "a", nil, root, "c", "home:/c"); err != nil {
		t.Fatal(err)
	}
	if got := mustLookup(t, v, "c"); got.Ino != a.Ino || got.Size != 3 {
		t.Fatalf("after the rename c is %+v", got)
	}
}

// TestRemoveKnown: a remove given a stale entry fails with Conflict and
// removes nothing; given the current one it removes it to the trash.
func TestRemoveKnown(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	old := commit(t, s, v, root, "a", 1, 1)
	cur := commit(t, s, v, root, "a", 2, 2)
	if _, err := v.RemoveKnown(ctx, root, "a", "home:/a", false, old); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("remove with a stale entry: %v, want Conflict", err)
	}
	mustLookup(t, v, "a")
	item, err := v.RemoveKnown(ctx, root, "a", "home:/a", false, cur)
	if err != nil {
		t.Fatal(err)
	}
	if item.Entry.Ino != cur.Ino || item.Entry.Size != 2 {
		t.Fatalf("trash item %+v", item.Entry)
	}
	if _, err := v.Get(ctx, 1, "a"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("a after the remove: %v", err)
	}
}

// TestCommitKeepAttrs: a commit that keeps attributes leaves a chmod and
// chown made after its caller read the entry (its compare-and-swap then
// fails and it reads the entry again); one that does not sets its own.
func TestCommitKeepAttrs(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 0)
	root := &meta.Entry{Ino: meta.RootIno, Type: meta.TypeDir}
	for _, keep := range []bool{true, false} {
		name := fmt.Sprintf("f-%v", keep)
		e := commit(t, s, v, root, name, 1, 1) // mode 0644
		changed := *e
		changed.Mode, changed.UID = 0o600, 42
		if _, err := v.Update(ctx, &changed); err != nil {
			t.Fatal(err)
		}
		gen, err := s.WriteGen(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := v.CommitVersion(ctx, root, name, meta.Commit{Version: meta.Version{Size: 2}, Mode: 0o644, Gen: gen,
			Cur: meta.KnownEntry(e), KeepAttrs: keep})
		if err != nil {
			t.Fatal(err)
		}
		wantMode, wantUID := uint32(0o644), uint32(0)
		if keep {
			wantMode, wantUID = 0o600, 42
		}
		if got.Mode != wantMode || got.UID != wantUID || got.Size != 2 {
			t.Errorf("KeepAttrs %v: mode %o uid %d size %d, want mode %o uid %d size 2", keep, got.Mode, got.UID, got.Size, wantMode, wantUID)
		}
		// A file the commit creates takes the commit's attributes either way.
		got, _, err = v.CommitVersion(ctx, root, name+"-new", meta.Commit{Mode: 0o640, UID: 7, Gen: gen, KeepAttrs: keep})
		if err != nil {
			t.Fatal(err)
		}
		if got.Mode != 0o640 || got.UID != 7 {
			t.Errorf("KeepAttrs %v, new file: mode %o uid %d, want 640 7", keep, got.Mode, got.UID)
		}
	}
}

// TestCommitCtime: Commit.Ctime is recorded instead of the commit's own
// time, for a new file and an existing one, but never before the file's
// ctime (a change made after the one the commit records).
func TestCommitCtime(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 0)
	root := &meta.Entry{Ino: meta.RootIno, Type: meta.TypeDir}
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour).UnixNano()
	got, _, err := v.CommitVersion(ctx, root, "new", meta.Commit{Mode: 0o644, Gen: gen, Ctime: past})
	if err != nil {
		t.Fatal(err)
	}
	if got.Ctime != past {
		t.Errorf("new file: ctime %d, want %d", got.Ctime, past)
	}
	got, _, err = v.CommitVersion(ctx, root, "new", meta.Commit{Version: meta.Version{Size: 1}, Gen: gen, Ctime: past + 5})
	if err != nil {
		t.Fatal(err)
	}
	if got.Ctime != past+5 {
		t.Errorf("existing file: ctime %d, want %d", got.Ctime, past+5)
	}
	got, _, err = v.CommitVersion(ctx, root, "new", meta.Commit{Version: meta.Version{Size: 2}, Gen: gen, Ctime: past})
	if err != nil {
		t.Fatal(err)
	}
	if got.Ctime != past+5 {
		t.Errorf("a Ctime before the file's: ctime %d, want the file's %d", got.Ctime, past+5)
	}
	before := time.Now().UnixNano()
	got, _, err = v.CommitVersion(ctx, root, "new", meta.Commit{Version: meta.Version{Size: 3}, Gen: gen})
	if err != nil {
		t.Fatal(err)
	}
	if got.Ctime < before {
		t.Errorf("without Ctime: ctime %d, want the commit's own (>= %d)", got.Ctime, before)
	}
}

// TestRenameKnownStaleSameIno: a destination entry from a stale cache that
// names the source's inode (the file was at b, another device renamed it
// b -> a; the cache still has b) must not pass for a rename onto itself.
func TestRenameKnownStaleSameIno(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	b := commit(t, s, v, root, "b", 1, 1)
	staleB := *b
	// Another device: b -> a.
	if err := v.Rename(ctx, root, "b", root, "a", "home:/a"); err != nil {
		t.Fatal(err)
	}
	a := mustLookup(t, v, "a")
	// This mount: a -> b, b's entry from its (stale) cache.
	if _, err := v.RenameKnown(ctx, root, "a", a, root, "b", "home:/b", meta.KnownEntry(&staleB)); err != nil {
		t.Fatalf("rename: %v", err)
	}
	if _, err := v.Get(ctx, 1, "b"); err != nil {
		t.Fatalf("rename a -> b returned success but b is missing: %v", err)
	}
}

// TestCommitUnlocked: a commit with Commit.Unlocked fails with ErrLocked
// and changes nothing while another writer holds the file's lock (new file
// or existing), and succeeds once the lock is gone.
func TestCommitUnlocked(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 0)
	root := &meta.Entry{Ino: meta.RootIno, Type: meta.TypeDir}
	commit(t, s, v, root, "old", 1, 1)
	gen, err := s.WriteGen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"old", "new"} {
		l, err := v.Lock(ctx, root.Ino, name)
		if err != nil {
			t.Fatal(err)
		}
		c := meta.Commit{Version: meta.Version{Size: 9}, Mode: 0o644, Gen: gen, Unlocked: true}
		_, _, err = v.CommitVersion(ctx, root, name, c)
		if !errors.Is(err, meta.ErrLocked) || !errors.Is(err, cairn.ErrConflict) {
			t.Fatalf("%s: commit under another writer's lock = %v, want ErrLocked (Conflict)", name, err)
		}
		cur, err := v.Get(ctx, root.Ino, name)
		switch {
		case name == "new" && !errors.Is(err, cairn.ErrNotFound):
			t.Fatalf("new: refused commit left an entry (%v, %v)", cur, err)
		case name == "old" && (err != nil || cur.Size == 9):
			t.Fatalf("old: refused commit changed the file (%v, %v)", cur, err)
		}
		if uerr := l.Unlock(ctx); uerr != nil {
			t.Fatal(uerr)
		}
		got, _, err := v.CommitVersion(ctx, root, name, c)
		if err != nil || got.Size != 9 {
			t.Fatalf("%s: commit after unlock = %v, %v", name, got, err)
		}
	}
}
