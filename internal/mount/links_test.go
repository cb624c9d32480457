package mount_test

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// inoNlink returns path's inode number and link count.
func inoNlink(t *testing.T, path string) (uint64, uint64) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino, uint64(st.Nlink)
}

// eventually polls cond (generous deadline) and fails with what.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHardLink: link(2) on the mount, in every mode: both names are one
// inode with link count 2; a write through one name reads back through
// the other at once here, and after its commit on another device; a
// directory is EPERM, a taken name EEXIST; unlinking one name (the file
// open) keeps the other working, its link count 1; a new file linked
// right after its close (write-back: its creation and commit still to
// come) keeps one history.
func TestHardLink(t *testing.T) {
	for _, mode := range versionModes {
		t.Run(mode.String(), func(t *testing.T) { testHardLink(t, mode) })
	}
}

func testHardLink(t *testing.T, mode mount.Mode) {
	f := newFixture(t, mount.Options{Mode: mode})
	g := f.device(mount.Options{Mode: mode}, meta.Options{})
	if err := os.WriteFile(f.path("a"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.settle()
	inoNlink(t, f.path("a")) // a's entry cached
	// The link counts are right at once, not once the watch says so.
	resume := f.stallWatch()
	t.Cleanup(resume) // a failure before resume must not leave it stalled
	if err := os.Link(f.path("a"), f.path("d/b")); err != nil {
		t.Fatal(err)
	}
	ia, na := inoNlink(t, f.path("a"))
	ib, nb := inoNlink(t, f.path("d/b"))
	resume()
	if ia != ib || na != 2 || nb != 2 {
		t.Fatalf("a: ino %d nlink %d; d/b: ino %d nlink %d", ia, na, ib, nb)
	}
	if err := os.Link(f.path("d"), f.path("d2")); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("link of a directory: %v, want EPERM", err)
	}
	if err := os.Link(f.path("a"), f.path("d")); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("link onto a taken name: %v, want EEXIST", err)
	}

	// A chmod through one name is the other's at once.
	for i, p := range []string{"a", "d/b", "a"} {
		m := os.FileMode(0o600 + 0o10*i)
		if err := os.Chmod(f.path(p), m); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"a", "d/b"} {
			if fi, err := os.Stat(f.path(q)); err != nil || fi.Mode().Perm() != m {
				t.Fatalf("%s after chmod %o of %s: %v, %v", q, m, p, fi.Mode(), err)
			}
		}
	}
	if err := os.Chmod(f.path("a"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Written through one name, read through the other at once.
	if err := os.WriteFile(f.path("d/b"), []byte("two!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(f.path("a")); err != nil || string(got) != "two!" {
		t.Fatalf("a after a write through d/b: %q, %v", got, err)
	}
	f.settle()
	if e := f.entry("a"); e.Nlink() != 2 || string(f.cat("a")) != "two!" || string(f.cat("d/b")) != "two!" {
		t.Fatalf("metadata after the commit: %+v", e)
	}
	// And on another device, after the commit.
	eventually(t, "the other device to read the commit through both names", func() bool {
		x, _ := os.ReadFile(g.path("a"))
		y, _ := os.ReadFile(g.path("d/b"))
		return string(x) == "two!" && string(y) == "two!"
	})
	if gi, gn := inoNlink(t, g.path("a")); gn != 2 || gi != ia {
		t.Fatalf("other device: a ino %d nlink %d", gi, gn)
	}

	// Unlink one name while the file is open for writing through it:
	// the other works on, and so does the writer.
	held, err := os.OpenFile(f.path("a"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = held.WriteAt([]byte("T"), 0); err != nil {
		t.Fatal(err)
	}
	inoNlink(t, f.path("d/b"))
	resume = f.stallWatch()
	t.Cleanup(resume)
	if err = os.Remove(f.path("a")); err != nil {
		t.Fatal(err)
	}
	if _, err = held.WriteAt([]byte("w"), 1); err != nil {
		t.Fatal(err)
	}
	_, nb = inoNlink(t, f.path("d/b"))
	resume()
	if nb != 1 {
		t.Fatalf("d/b's nlink after a's unlink: %d", nb)
	}
	var buf [16]byte
	if n, rerr := held.ReadAt(buf[:], 0); string(buf[:n]) != "Two!" {
		t.Fatalf("read of the open file after unlinking its name: %q, %v", buf[:n], rerr)
	}
	if got, rerr := os.ReadFile(f.path("d/b")); string(got) != "Two!" {
		t.Fatalf("d/b while a's writer writes: %q, %v", got, rerr)
	}
	if err = held.Close(); err != nil {
		t.Fatal(err)
	}
	f.settle()
	if got := f.cat("d/b"); string(got) != "Two!" {
		t.Fatalf("d/b after the writer's close: %q", got)
	}
	if err = os.WriteFile(f.path("d/b"), []byte("three"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.settle()
	if got := f.cat("d/b"); string(got) != "three" {
		t.Fatalf("d/b after a write: %q", got)
	}
	if e := f.entry("d/b"); e.Links != nil || len(e.Versions) != 4 {
		t.Fatalf("d/b: links %v, %d versions (want none, 4)", e.Links, len(e.Versions))
	}
	if tr, _ := f.vol.Meta.Trash(t.Context()); len(tr) != 0 {
		t.Fatalf("trash after unlinking one of two names: %+v", tr)
	}

	// A new file linked at once after its close.
	if err = os.WriteFile(f.path("n"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err = os.Link(f.path("n"), f.path("d/n2")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.path("d/n2")); !bytes.Equal(got, []byte("new")) {
		t.Fatalf("d/n2 at once: %q", got)
	}
	f.settle()
	e := f.entry("d/n2")
	if e.Nlink() != 2 || len(e.Versions) != 1 || string(f.cat("n")) != "new" || string(f.cat("d/n2")) != "new" {
		t.Fatalf("n linked after its close: %+v", e)
	}

	// Another file renamed over one name of a file being written through
	// its other: that name is the other file's, and the writer's commit
	// lands under the name left.
	if err = os.WriteFile(f.path("x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(f.path("n"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = w.Write([]byte("NEW")); err != nil {
		t.Fatal(err)
	}
	if err = os.Rename(f.path("x"), f.path("d/n2")); err != nil {
		t.Fatal(err)
	}
	if _, err = w.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if err = w.Close(); err != nil {
		t.Fatal(err)
	}
	f.settle()
	if got, rerr := os.ReadFile(f.path("n")); string(got) != "NEW!" {
		t.Fatalf("n on the mount after its other name was replaced: %q, %v", got, rerr)
	}
	if string(f.cat("n")) != "NEW!" || string(f.cat("d/n2")) != "x" || f.entry("n").Nlink() != 1 {
		t.Fatalf("n %q (%+v), d/n2 %q", f.cat("n"), f.entry("n"), f.cat("d/n2"))
	}
}
