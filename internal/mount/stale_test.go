package mount_test

// Decisions made on the entry cache, while it has not heard yet of a
// change made on another device (its watch stalled: stallWatch). The
// cache may answer a lookup or a stat so, within its trust window
// (entries.go); it must not make a change this device asks for act on a
// name as it was before the other device's change.

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// TestSetattrOnStaleEntry: a chmod that changes nothing as far as the
// entry cache knows still makes the mode what it asks for, when another
// device changed it just before. It was skipped as a no-op on the
// cache's word, and the other device's mode stayed.
func TestSetattrOnStaleEntry(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(f.path("a")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("stat a: %v, %v", fi, err)
	}
	resume := f.stallWatch()
	defer resume()
	e := f.entry("a")
	e.Mode = 0o600 // another device's chmod
	if _, err := f.vol.Meta.Update(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	resume()
	if got := f.entry("a").Mode; got != 0o644 {
		t.Fatalf("mode %o after this device's chmod 644 that followed another device's chmod 600, want 644", got)
	}
}

// TestRemoveOnStaleEntry: an unlink of a name the entry cache knows as a
// file, made again as a directory on another device meanwhile, is EISDIR,
// and an rmdir of a name it knows as a directory, now a file, is ENOTDIR:
// the type is checked on the entry removed. It was checked on the cache's
// entry; the removal's compare-and-swap then failed (stale), and its
// retry removed what it read, of whatever type: unlink removed the
// directory, rmdir the file.
func TestRemoveOnStaleEntry(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("x"), []byte("a file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.path("y"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"x", "y"} {
		if _, err := os.Stat(f.path(p)); err != nil {
			t.Fatal(err)
		}
	}
	resume := f.stallWatch()
	defer resume()
	// Another device makes x a directory, y a file.
	root := f.entry("")
	for _, e := range []meta.Entry{{Name: "x", Type: meta.TypeDir, Mode: 0o755}, {Name: "y", Type: meta.TypeFile, Mode: 0o644}} {
		if _, err := f.vol.Meta.Remove(ctx, root, e.Name, "/"+e.Name, false); err != nil {
			t.Fatal(err)
		}
		if _, err := f.vol.Meta.Create(ctx, root, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(f.path("x")); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("unlink of x, a file here and a directory on the other device: %v, want EISDIR", err)
	}
	if err := syscall.Rmdir(f.path("y")); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("rmdir of y, a directory here and a file on the other device: %v, want ENOTDIR", err)
	}
	resume()
	if e := f.entry("x"); !e.IsDir() {
		t.Errorf("x: %+v, want the other device's directory", e)
	}
	if e := f.entry("y"); e.Type != meta.TypeFile {
		t.Errorf("y: %+v, want the other device's file", e)
	}
}

// TestRenameNoReplaceRacingCreate: a rename with RENAME_NOREPLACE never
// replaces a name another device makes while it runs: either the other
// device's create fails (the rename was first) or the rename fails with
// EEXIST. It checked the name absent with a read, then renamed as a
// plain rename would, over whatever was there by then.
func TestRenameNoReplaceRacingCreate(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The root listed whole: a lookup of b is answered by the entry
	// cache, so the rename's own request is the first one held.
	if _, err := os.ReadDir(f.mnt); err != nil {
		t.Fatal(err)
	}
	a := f.entry("a")
	root := f.entry("")
	held, release := f.holdRequest("")
	done := make(chan error, 1)
	go func() {
		done <- unix.Renameat2(unix.AT_FDCWD, f.path("a"), unix.AT_FDCWD, f.path("b"), unix.RENAME_NOREPLACE)
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		release()
		t.Fatal("the rename made no request")
	}
	// Another device makes b meanwhile.
	_, cerr := f.vol.Meta.Create(ctx, root, meta.Entry{Name: "b", Type: meta.TypeFile, Mode: 0o644})
	release()
	rerr := <-done
	b := f.entry("b")
	switch {
	case cerr == nil && rerr == nil:
		t.Fatalf("the other device made b and this one renamed a to b with RENAME_NOREPLACE: both succeeded, b is %x (a was %x)", b.Ino, a.Ino)
	case cerr == nil:
		if !errors.Is(rerr, syscall.EEXIST) || b.Ino == a.Ino {
			t.Fatalf("rename after the other device made b: %v, b is %x; want EEXIST and the other device's b", rerr, b.Ino)
		}
	default:
		if rerr != nil || !errors.Is(cerr, cairn.ErrExist) || b.Ino != a.Ino {
			t.Fatalf("rename %v, the other device's create %v, b is %x; want the rename done, the create refused", rerr, cerr, b.Ino)
		}
	}
}
