package mount_test

// Differential tests of directory semantics (issue 15): the same
// operations on a directory on local disk and on the mount, in each
// mode, must give the same errors, directory link counts, and the same
// answer to "did the directory's mtime and ctime advance".

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// dirOp is one operation of a differential test, run in root.
type dirOp struct {
	name string
	do   func(root string) error
}

// dirObs is what is compared after an operation.
type dirObs struct {
	errno  syscall.Errno
	links  map[string]uint64 // directory -> nlink
	mtimeU map[string]bool   // directory -> mtime advanced by the op
	ctimeU map[string]bool
}

func dirErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

func statDir(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return st
}

// runDirOps runs ops in root, observing dirs (relative to root; "." is
// root) after each; times says whether to compare their times (a short
// sleep before each op lets a clock of coarse granularity move on).
func runDirOps(t *testing.T, root string, ops []dirOp, dirs []string, times bool) []dirObs {
	t.Helper()
	var out []dirObs
	for _, op := range ops {
		before := map[string]syscall.Stat_t{}
		if times {
			for _, d := range dirs {
				if _, err := os.Lstat(filepath.Join(root, d)); err == nil {
					before[d] = statDir(t, filepath.Join(root, d))
				}
			}
			time.Sleep(20 * time.Millisecond) // clock granularity, not synchronisation
		}
		o := dirObs{errno: dirErrno(op.do(root)), links: map[string]uint64{}, mtimeU: map[string]bool{}, ctimeU: map[string]bool{}}
		for _, d := range dirs {
			p := filepath.Join(root, d)
			if _, err := os.Lstat(p); err != nil {
				continue
			}
			st := statDir(t, p)
			o.links[d] = uint64(st.Nlink)
			if b, ok := before[d]; ok {
				o.mtimeU[d] = st.Mtim.Nano() > b.Mtim.Nano()
				o.ctimeU[d] = st.Ctim.Nano() > b.Ctim.Nano()
			}
		}
		out = append(out, o)
	}
	return out
}

// diffDirOps runs ops on local disk and on a mount of each mode and
// reports every difference.
func diffDirOps(t *testing.T, ops []dirOp, dirs []string, links, times bool) {
	want := runDirOps(t, t.TempDir(), ops, dirs, times)
	for _, mode := range []mount.Mode{mount.Blocking, mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			got := runDirOps(t, f.mnt, ops, dirs, times)
			for i, op := range ops {
				w, g := want[i], got[i]
				if w.errno != g.errno {
					t.Errorf("%s: error %v, local disk %v", op.name, g.errno, w.errno)
				}
				for _, d := range dirs {
					if links && w.links[d] != g.links[d] {
						t.Errorf("%s: nlink of %s %d, local disk %d", op.name, d, g.links[d], w.links[d])
					}
					if times && w.mtimeU[d] != g.mtimeU[d] {
						t.Errorf("%s: mtime of %s advanced %v, local disk %v", op.name, d, g.mtimeU[d], w.mtimeU[d])
					}
					if times && w.ctimeU[d] != g.ctimeU[d] {
						t.Errorf("%s: ctime of %s advanced %v, local disk %v", op.name, d, g.ctimeU[d], w.ctimeU[d])
					}
				}
			}
		})
	}
}

func dirIn(root, p string) string { return filepath.Join(root, p) }

func dirWrite(root, p string) error { return os.WriteFile(dirIn(root, p), []byte("x"), 0o644) }

func TestDirsNameTooLong(t *testing.T) {
	long := strings.Repeat("n", 256)
	ops := []dirOp{
		{"mkdir d", func(r string) error { return os.Mkdir(dirIn(r, "d"), 0o755) }},
		{"create f", func(r string) error { return dirWrite(r, "f") }},
		{"stat long", func(r string) error { _, err := os.Lstat(dirIn(r, long)); return err }},
		{"stat d/long", func(r string) error { _, err := os.Lstat(dirIn(r, "d/"+long)); return err }},
		{"chmod long", func(r string) error { return os.Chmod(dirIn(r, long), 0o600) }},
		{"chown long", func(r string) error { return os.Lchown(dirIn(r, long), os.Getuid(), os.Getgid()) }},
		{"truncate long", func(r string) error { return os.Truncate(dirIn(r, long), 0) }},
		{"rename long", func(r string) error { return os.Rename(dirIn(r, long), dirIn(r, "g")) }},
		{"rename to long", func(r string) error { return os.Rename(dirIn(r, "f"), dirIn(r, long)) }},
		{"rmdir long", func(r string) error { return syscall.Rmdir(dirIn(r, long)) }},
		{"unlink long", func(r string) error { return syscall.Unlink(dirIn(r, long)) }},
		{"readlink long", func(r string) error { _, err := os.Readlink(dirIn(r, long)); return err }},
		{"open long", func(r string) error { _, err := os.ReadFile(dirIn(r, long)); return err }},
		{"mkdir long", func(r string) error { return os.Mkdir(dirIn(r, long), 0o755) }},
		{"create long", func(r string) error { return dirWrite(r, long) }},
		{"symlink long", func(r string) error { return os.Symlink("f", dirIn(r, long)) }},
		{"create 255", func(r string) error { return dirWrite(r, long[:255]) }},
		{"stat 255", func(r string) error { _, err := os.Lstat(dirIn(r, long[:255])); return err }},
	}
	diffDirOps(t, ops, []string{"."}, false, false)
}

func TestDirsLinkCount(t *testing.T) {
	ops := []dirOp{
		{"mkdir a", func(r string) error { return os.Mkdir(dirIn(r, "a"), 0o755) }},
		{"mkdir a/b", func(r string) error { return os.Mkdir(dirIn(r, "a/b"), 0o755) }},
		{"mkdir a/c", func(r string) error { return os.Mkdir(dirIn(r, "a/c"), 0o755) }},
		{"create a/f", func(r string) error { return dirWrite(r, "a/f") }},
		{"symlink a/l", func(r string) error { return os.Symlink("b", dirIn(r, "a/l")) }},
		{"mkdir a/b/x", func(r string) error { return os.Mkdir(dirIn(r, "a/b/x"), 0o755) }},
		{"rename a/c out", func(r string) error { return os.Rename(dirIn(r, "a/c"), dirIn(r, "c")) }},
		{"rename c in", func(r string) error { return os.Rename(dirIn(r, "c"), dirIn(r, "a/b/c")) }},
		{"rename a/f", func(r string) error { return os.Rename(dirIn(r, "a/f"), dirIn(r, "a/g")) }},
		{"rmdir a/b (not empty)", func(r string) error { return syscall.Rmdir(dirIn(r, "a/b")) }},
		{"rmdir a/b/x", func(r string) error { return syscall.Rmdir(dirIn(r, "a/b/x")) }},
		{"rmdir a/b/c", func(r string) error { return syscall.Rmdir(dirIn(r, "a/b/c")) }},
		{"rmdir a/b", func(r string) error { return syscall.Rmdir(dirIn(r, "a/b")) }},
		{"unlink a/g", func(r string) error { return syscall.Unlink(dirIn(r, "a/g")) }},
	}
	diffDirOps(t, ops, []string{".", "a", "a/b", "c", "a/b/c", "a/b/x"}, true, false)
}

func TestDirsTimes(t *testing.T) {
	past := time.Unix(1e9, 0)
	ops := []dirOp{
		{"mkdir a", func(r string) error { return os.Mkdir(dirIn(r, "a"), 0o755) }},
		{"mkdir b", func(r string) error { return os.Mkdir(dirIn(r, "b"), 0o755) }},
		{"create a/f", func(r string) error { return dirWrite(r, "a/f") }},
		{"mkdir a/d", func(r string) error { return os.Mkdir(dirIn(r, "a/d"), 0o755) }},
		{"symlink a/l", func(r string) error { return os.Symlink("f", dirIn(r, "a/l")) }},
		{"mknod a/n", func(r string) error { return syscall.Mknod(dirIn(r, "a/n"), syscall.S_IFREG|0o644, 0) }},
		{"chmod a/f", func(r string) error { return os.Chmod(dirIn(r, "a/f"), 0o600) }},
		{"write a/f", func(r string) error { return os.WriteFile(dirIn(r, "a/f"), []byte("more"), 0o600) }},
		{"mkdir a (exists)", func(r string) error { return os.Mkdir(dirIn(r, "a"), 0o755) }},
		{"rename a/f b/f", func(r string) error { return os.Rename(dirIn(r, "a/f"), dirIn(r, "b/f")) }},
		{"rename b/f b/g", func(r string) error { return os.Rename(dirIn(r, "b/f"), dirIn(r, "b/g")) }},
		{"rename a/n over b/g", func(r string) error { return os.Rename(dirIn(r, "a/n"), dirIn(r, "b/g")) }},
		{"unlink b/g", func(r string) error { return syscall.Unlink(dirIn(r, "b/g")) }},
		{"unlink b/g (absent)", func(r string) error { return syscall.Unlink(dirIn(r, "b/g")) }},
		{"rmdir a/d", func(r string) error { return syscall.Rmdir(dirIn(r, "a/d")) }},
		{"rename a/l l", func(r string) error { return os.Rename(dirIn(r, "a/l"), dirIn(r, "l")) }},
		{"utimes a", func(r string) error { return os.Chtimes(dirIn(r, "a"), past, past) }},
		{"stat a", func(r string) error { _, err := os.Stat(dirIn(r, "a")); return err }},
		{"create a/f2", func(r string) error { return dirWrite(r, "a/f2") }},
		{"rename b a/b", func(r string) error { return os.Rename(dirIn(r, "b"), dirIn(r, "a/b")) }},
	}
	diffDirOps(t, ops, []string{".", "a", "b", "a/b"}, false, true)
}

// TestDirsTimesStored: the mtime and ctime a change gives a directory
// are written into its record (as another device, or a remount, reads
// it), in every mode (write-back: once its pending changes are written).
func TestDirsTimesStored(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			for _, d := range []string{"a", "b"} {
				if err := os.Mkdir(f.path(d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			f.syncDir("")
			r := f.mnt
			ops := []struct {
				name string
				dirs []string // whose times it advances
				do   func() error
			}{
				{"mkdir a/d", []string{"a"}, func() error { return os.Mkdir(dirIn(r, "a/d"), 0o755) }},
				{"symlink a/l", []string{"a"}, func() error { return os.Symlink("x", dirIn(r, "a/l")) }},
				{"mknod a/n", []string{"a"}, func() error { return syscall.Mknod(dirIn(r, "a/n"), syscall.S_IFREG|0o644, 0) }},
				{"rename a/n b/n", []string{"a", "b"}, func() error { return os.Rename(dirIn(r, "a/n"), dirIn(r, "b/n")) }},
				{"rename b/n b/m", []string{"b"}, func() error { return os.Rename(dirIn(r, "b/n"), dirIn(r, "b/m")) }},
				{"unlink b/m", []string{"b"}, func() error { return syscall.Unlink(dirIn(r, "b/m")) }},
				{"rmdir a/d", []string{"a"}, func() error { return syscall.Rmdir(dirIn(r, "a/d")) }},
				{"mkdir c", []string{""}, func() error { return os.Mkdir(dirIn(r, "c"), 0o755) }},
			}
			for _, op := range ops {
				before := map[string]*meta.Entry{}
				for _, d := range op.dirs {
					before[d] = f.entry(d)
					f.waitWatched(before[d].Rev) // the mount holds the record
				}
				time.Sleep(2 * time.Millisecond) // clock granularity
				if err := op.do(); err != nil {
					t.Fatalf("%s: %v", op.name, err)
				}
				f.syncDir("")
				for _, d := range op.dirs {
					e := f.entry(d)
					if e.Mtime <= before[d].Mtime || e.Ctime <= before[d].Ctime {
						t.Errorf("%s: record of %q has mtime %d ctime %d, before %d %d", op.name, d, e.Mtime, e.Ctime, before[d].Mtime, before[d].Ctime)
					}
				}
			}
		})
	}
}

// TestDirsOtherDevice: subdirectories made and removed on another device
// change the link count this mount gives (its entry cache hears of them
// through its watch), and the times a change here gives a directory are
// what the other device shows.
func TestDirsOtherDevice(t *testing.T) {
	f := newFixture(t, mount.Options{})
	d := f.device(mount.Options{}, meta.Options{})
	if err := os.Mkdir(f.path("a"), 0o755); err != nil {
		t.Fatal(err)
	}
	links := func(p string) uint64 {
		t.Helper()
		st := statDir(t, p)
		return uint64(st.Nlink)
	}
	// waitFor polls cond (the kernel keeps attributes for a while, and
	// the watch takes a moment) with a generous deadline.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if n := links(f.path("a")); n != 2 {
		t.Fatalf("nlink of a new directory %d, want 2", n)
	}
	waitFor("the other device sees a", func() bool { _, err := os.Stat(d.path("a")); return err == nil })
	if err := os.Mkdir(d.path("a/x"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor("nlink 3 after a subdirectory made elsewhere", func() bool { return links(f.path("a")) == 3 })
	if err := syscall.Rmdir(d.path("a/x")); err != nil {
		t.Fatal(err)
	}
	waitFor("nlink 2 after it was removed elsewhere", func() bool { return links(f.path("a")) == 2 })

	before := statDir(t, d.path("a"))
	time.Sleep(2 * time.Millisecond) // clock granularity
	if err := os.WriteFile(f.path("a/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the other device sees a's times advance", func() bool {
		st := statDir(t, d.path("a"))
		return st.Mtim.Nano() > before.Mtim.Nano() && st.Ctim.Nano() > before.Ctim.Nano()
	})
}
