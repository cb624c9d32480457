package meta_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// sameInode checks that the records at names are copies of one inode
// (same ino, attributes, versions, links) whose Links are exactly names,
// and returns the first.
func sameInode(t *testing.T, v *meta.Vol, names ...meta.Link) *meta.Entry {
	t.Helper()
	ctx := context.Background()
	var first *meta.Entry
	for _, l := range names {
		e, err := v.Get(ctx, l.Parent, l.Name)
		if err != nil {
			t.Fatalf("get %v: %v", l, err)
		}
		if len(names) == 1 {
			if e.Links != nil {
				t.Fatalf("%s: one name left but Links %v", e.Name, e.Links)
			}
		} else if !reflect.DeepEqual(e.Links, names) || e.Nlink() != len(names) {
			t.Fatalf("%s: Links %v (nlink %d), want %v", e.Name, e.Links, e.Nlink(), names)
		}
		if first == nil {
			first = e
			continue
		}
		a, b := *first, *e
		a.Name, a.Parent, a.Rev, b.Name, b.Parent, b.Rev = "", 0, 0, "", 0, 0
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("copies differ:\n%s: %+v\n%s: %+v", first.Name, a, e.Name, b)
		}
	}
	return first
}

// sorted returns links sorted as Entry.Links are.
func sorted(ls ...meta.Link) []meta.Link {
	for i := range ls {
		for j := i + 1; j < len(ls); j++ {
			if ls[j].Parent < ls[i].Parent || ls[j].Parent == ls[i].Parent && ls[j].Name < ls[i].Name {
				ls[i], ls[j] = ls[j], ls[i]
			}
		}
	}
	return ls
}

// TestLink: a second name is a full copy of the inode, listed in every
// copy's Links; the realm's format is raised; directories, taken names
// and stale sources are refused; and every change through either name
// (commit, attributes, a write-back batch) is seen through the other.
func TestLink(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	a, err := v.Create(ctx, root, meta.Entry{Name: "a", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	f := commit(t, s, v, root, "f", 3, 1)
	if _, err = v.Link(ctx, a, root, "a2"); !errors.Is(err, cairn.ErrPermission) || !errors.Is(err, meta.ErrLinkDir) {
		t.Fatalf("link of a directory: %v, want Permission", err)
	}
	if _, err = v.Link(ctx, f, root, "a"); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("link onto a taken name: %v, want Exist", err)
	}
	a.Touch = true
	before := *a
	time.Sleep(2 * time.Millisecond)
	g, err := v.Link(ctx, f, a, "g")
	if err != nil {
		t.Fatal(err)
	}
	if g.Parent != a.Ino || g.Name != "g" || g.Ino != f.Ino || g.Nlink() != 2 || g.Ctime <= f.Ctime {
		t.Fatalf("link = %+v", g)
	}
	if a.Mtime <= before.Mtime {
		t.Fatal("link did not advance its directory's mtime")
	}
	names := sorted(meta.Link{Parent: root.Ino, Name: "f"}, meta.Link{Parent: a.Ino, Name: "g"})
	sameInode(t, v, names...)
	if r, rerr := s.Realm(ctx); rerr != nil || r.Format != 2 {
		t.Fatalf("realm after a link: %+v, %v; want format 2", r, rerr)
	}
	if _, err = v.Link(ctx, f, root, "h"); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("link of a stale entry: %v, want Conflict", err)
	}

	// A commit through one name is the inode's.
	commit(t, s, v, a, "g", 7, 2)
	e := sameInode(t, v, names...)
	if e.Size != 7 || len(e.Versions) != 2 || e.Current().N != 2 {
		t.Fatalf("after a commit through g: %+v", e)
	}
	// Attributes too.
	e.Mode = 0o600
	if _, err = v.Update(ctx, e); err != nil {
		t.Fatal(err)
	}
	if e = sameInode(t, v, names...); e.Mode != 0o600 {
		t.Fatalf("mode after chmod through %s: %o", e.Name, e.Mode)
	}
	// A write-back batch's change.
	gg, err := v.Get(ctx, a.Ino, "g")
	if err != nil {
		t.Fatal(err)
	}
	gg.UID = 42
	if _, err = v.PutBatch(ctx, []meta.BatchPut{{Entry: *gg, Dir: *a}}); err != nil {
		t.Fatal(err)
	}
	if e = sameInode(t, v, names...); e.UID != 42 {
		t.Fatalf("uid after a batch through g: %d", e.UID)
	}
	// A commit that must not change attributes keeps them in both.
	gen, _ := s.WriteGen(ctx)
	if _, _, err = v.CommitVersion(ctx, root, "f", meta.Commit{Version: meta.Version{Size: 9}, Gen: gen, KeepAttrs: true}); err != nil {
		t.Fatal(err)
	}
	if e = sameInode(t, v, names...); e.UID != 42 || e.Mode != 0o600 || e.Size != 9 {
		t.Fatalf("after a KeepAttrs commit: %+v", e)
	}
}

// TestLinkMax: an inode has at most MaxLinks names.
func TestLinkMax(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	f := commit(t, s, v, root, "f", 3, 1)
	var err error
	for i := 1; i < meta.MaxLinks; i++ {
		if f, err = v.Link(ctx, f, root, fmt.Sprintf("n%02d", i)); err != nil {
			t.Fatalf("link #%d: %v", i, err)
		}
	}
	if f.Nlink() != meta.MaxLinks {
		t.Fatalf("nlink %d, want %d", f.Nlink(), meta.MaxLinks)
	}
	if _, err = v.Link(ctx, f, root, "over"); !errors.Is(err, meta.ErrTooManyLinks) {
		t.Fatalf("link #%d: %v, want ErrTooManyLinks", meta.MaxLinks, err)
	}
	// Every copy changes with a commit, in one transaction.
	e := commit(t, s, v, root, "n33", 5, 2)
	names := append([]meta.Link(nil), e.Links...)
	if got := sameInode(t, v, names...); got.Size != 5 {
		t.Fatalf("size %d", got.Size)
	}
}

// TestUnlinkOneName: removing one name of several rewrites the others
// without it (one name left: no Links at all) and trashes nothing; the
// inode's extended attributes stay; the last name goes to the trash.
func TestUnlinkOneName(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	f := commit(t, s, v, root, "f", 3, 1)
	if err := v.SetXattr(ctx, f.Ino, "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	g, err := v.Link(ctx, f, root, "g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err = v.Link(ctx, g, root, "h"); err != nil {
		t.Fatal(err)
	}
	if _, err = v.Remove(ctx, root, "g", "/g", false); err != nil {
		t.Fatal(err)
	}
	if _, err = v.Get(ctx, root.Ino, "g"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("g after its unlink: %v", err)
	}
	sameInode(t, v, meta.Link{Parent: root.Ino, Name: "f"}, meta.Link{Parent: root.Ino, Name: "h"})
	if _, err = v.RemoveKnown(ctx, root, "h", "/h", false, nil); err != nil {
		t.Fatal(err)
	}
	e := sameInode(t, v, meta.Link{Parent: root.Ino, Name: "f"})
	if len(e.Versions) != 1 {
		t.Fatalf("versions after unlinks: %+v", e.Versions)
	}
	if tr, _ := v.Trash(ctx); len(tr) != 0 {
		t.Fatalf("trash after unlinking names of a file that lives on: %+v", tr)
	}
	if x, xerr := v.Xattr(ctx, f.Ino, "user.k"); xerr != nil || string(x) != "v" {
		t.Fatalf("xattr after unlinks: %q, %v", x, xerr)
	}
	if _, err = v.Remove(ctx, root, "f", "/f", false); err != nil {
		t.Fatal(err)
	}
	if tr, _ := v.Trash(ctx); len(tr) != 1 || tr[0].Entry.Ino != f.Ino {
		t.Fatalf("trash after the last name's removal: %+v", tr)
	}
}

// TestRenameLinks: a moved name changes in every copy's Links; a rename
// onto another name of the same inode does nothing; a rename over a name
// of a file with other names unlinks that name only (its inode and
// history live on, nothing is trashed) and the source keeps its own.
func TestRenameLinks(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	d, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	f := commit(t, s, v, root, "f", 3, 1)
	if _, err = v.Link(ctx, f, root, "g"); err != nil {
		t.Fatal(err)
	}
	if err = v.Rename(ctx, root, "g", d, "h", "/d/h"); err != nil {
		t.Fatal(err)
	}
	names := sorted(meta.Link{Parent: root.Ino, Name: "f"}, meta.Link{Parent: d.Ino, Name: "h"})
	sameInode(t, v, names...)
	if _, err = v.Get(ctx, root.Ino, "g"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("g after its rename: %v", err)
	}
	// Onto another name of itself: nothing happens, also with a cached
	// destination.
	if err = v.Rename(ctx, root, "f", d, "h", "/d/h"); err != nil {
		t.Fatal(err)
	}
	h, _ := v.Get(ctx, d.Ino, "h")
	ff, _ := v.Get(ctx, root.Ino, "f")
	if _, err = v.RenameKnown(ctx, d, "h", h, root, "f", "/f", meta.KnownEntry(ff)); err != nil {
		t.Fatal(err)
	}
	sameInode(t, v, names...)

	// Another file over h: h is unlinked from f's inode.
	x := commit(t, s, v, root, "x", 11, 9)
	if err = v.Rename(ctx, root, "x", d, "h", "/d/h"); err != nil {
		t.Fatal(err)
	}
	nh, err := v.Get(ctx, d.Ino, "h")
	if err != nil || nh.Ino != x.Ino || nh.Links != nil || len(nh.Versions) != 1 || nh.Size != 11 {
		t.Fatalf("h after x renamed over it: %+v, %v", nh, err)
	}
	e := sameInode(t, v, meta.Link{Parent: root.Ino, Name: "f"})
	if e.Ino != f.Ino || len(e.Versions) != 1 || e.Size != 3 {
		t.Fatalf("f after its other name was replaced: %+v", e)
	}
	if tr, _ := v.Trash(ctx); len(tr) != 0 {
		t.Fatalf("trash: %+v", tr)
	}

	// A file with two names renamed over a file of one: the replaced
	// file goes to the trash; the histories are not merged.
	if _, err = v.Link(ctx, e, root, "e2"); err != nil {
		t.Fatal(err)
	}
	commit(t, s, v, root, "y", 5, 7)
	if err = v.Rename(ctx, root, "e2", root, "y", "/y"); err != nil {
		t.Fatal(err)
	}
	e = sameInode(t, v, sorted(meta.Link{Parent: root.Ino, Name: "f"}, meta.Link{Parent: root.Ino, Name: "y"})...)
	if e.Ino != f.Ino || len(e.Versions) != 1 {
		t.Fatalf("after a linked file replaced y: %+v", e)
	}
	if tr, _ := v.Trash(ctx); len(tr) != 1 || tr[0].Path != "/y" {
		t.Fatalf("trash: %+v", tr)
	}
}

// TestLinkConcurrentCommits: commits racing through two names of one
// inode (two processes) all land, none lost: each loses the compare on
// the other's copy, reads again and retries, as commits to one name do.
func TestLinkConcurrentCommits(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 100)
	ov := otherProcess(t, s)
	f := commit(t, s, v, root, "f", 1, 1)
	if _, err := v.Link(ctx, f, root, "g"); err != nil {
		t.Fatal(err)
	}
	const each = 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for w, vol := range []*meta.Vol{v, ov} {
		name := []string{"f", "g"}[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				gen, err := s.WriteGen(ctx)
				if err != nil {
					errs <- err
					return
				}
				var id cairn.ID
				id[0], id[1] = byte(w+2), byte(i)
				if _, _, err = vol.CommitVersion(ctx, root, name, meta.Commit{Version: meta.Version{Manifest: id, Size: int64(i)}, Mode: 0o644, Gen: gen}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e := sameInode(t, v, meta.Link{Parent: root.Ino, Name: "f"}, meta.Link{Parent: root.Ino, Name: "g"})
	if len(e.Versions) != 1+2*each {
		t.Fatalf("%d versions, want %d: a commit was lost", len(e.Versions), 1+2*each)
	}
	seen := map[cairn.ID]bool{}
	for i, ver := range e.Versions {
		if ver.N != uint64(i+1) || seen[ver.Manifest] {
			t.Fatalf("version %d: %+v (numbering or a duplicate)", i, ver)
		}
		seen[ver.Manifest] = true
	}
}

// TestPurgeLinkedInTrash: purging a trashed directory that holds one name
// of a file whose other name lives outside it keeps that file (its Links
// without the purged name, its extended attributes); a file all of whose
// names were inside goes with its attributes.
func TestPurgeLinkedInTrash(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 10)
	d, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	in := commit(t, s, v, d, "in", 3, 1)
	if _, err = v.Link(ctx, in, root, "out"); err != nil {
		t.Fatal(err)
	}
	both := commit(t, s, v, d, "b1", 4, 2)
	if _, err = v.Link(ctx, both, d, "b2"); err != nil {
		t.Fatal(err)
	}
	for _, ino := range []uint64{in.Ino, both.Ino} {
		if err = v.SetXattr(ctx, ino, "user.k", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err = v.Remove(ctx, root, "d", "/d", true); err != nil {
		t.Fatal(err)
	}
	if n, perr := v.PurgeTrash(ctx, time.Now().Add(time.Hour)); perr != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, perr)
	}
	e := sameInode(t, v, meta.Link{Parent: root.Ino, Name: "out"})
	if e.Ino != in.Ino || e.Size != 3 {
		t.Fatalf("out after the purge: %+v", e)
	}
	if x, xerr := v.Xattr(ctx, in.Ino, "user.k"); xerr != nil || string(x) != "v" {
		t.Fatalf("xattr of the surviving file: %q, %v", x, xerr)
	}
	if x, xerr := v.Xattrs(ctx, both.Ino); xerr != nil || len(x) != 0 {
		t.Fatalf("xattrs of a file purged with all its names: %v, %v", x, xerr)
	}
}
