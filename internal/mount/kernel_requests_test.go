package mount_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// tarLike makes n files in dir the way GNU tar x does as root: create
// exclusive, write, futimens, fchown, fchmod on the descriptor, close.
func tarLike(t *testing.T, dir string, n int) {
	t.Helper()
	mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	for i := range n {
		fd, err := unix.Open(fmt.Sprintf("%s/f%03d", dir, i), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Write(fd, []byte(strings.Repeat("x", 100+i))); err != nil {
			t.Fatal(err)
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), ts, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchown(fd, os.Getuid(), os.Getgid()); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchmod(fd, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Close(fd); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKernelRequestsPerFile: what the mount tells the kernel spares it
// requests. A descriptor that cannot write is closed without a FLUSH
// request (FOPEN_NOFLUSH), in every mode. Writers' closes flush: blocking
// mode commits there, and write-back mode, which queues the commit at the
// release, counts the file as pending there (Mount.Status: the release
// comes after the close returns). A tar-like file
// (create, write, futimens, fchown, fchmod, close) costs at most one
// GETATTR: Setattr's replies carry the attribute timeout (without it the
// kernel asks again before the next permission check), and the mount
// clears set-ID bits at a chown itself (FUSE_HANDLE_KILLPRIV; without it
// the kernel asks for the attributes before every chown). The one left
// is the directory's, whose attributes the kernel drops after each
// create and needs for its permission check (default_permissions).
func TestKernelRequestsPerFile(t *testing.T) {
	const files = 40
	for _, mode := range []mount.Mode{mount.Blocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			if err := os.Mkdir(f.path("d"), 0o755); err != nil {
				t.Fatal(err)
			}
			flushes, getattrs := mount.FlushCalls(f.m), mount.GetattrCalls(f.m)
			tarLike(t, f.path("d"), files)
			f.waitPending(time.Minute)
			gotFlush, gotGetattr := mount.FlushCalls(f.m)-flushes, mount.GetattrCalls(f.m)-getattrs
			wantFlush := int64(files) // each writer's close
			if gotFlush != wantFlush {
				t.Errorf("%d files made %d FLUSH requests, want %d", files, gotFlush, wantFlush)
			}
			if gotGetattr > files+2 {
				t.Errorf("%d files made %d GETATTR requests, want at most %d (one per create, for the directory)", files, gotGetattr, files+2)
			}
			for i := range files {
				name := fmt.Sprintf("d/f%03d", i)
				if got := f.cat(name); len(got) != 100+i {
					t.Fatalf("%s committed with %d bytes, want %d", name, len(got), 100+i)
				}
				if e := f.entry(name); e.Mode != 0o644 || e.Mtime != time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano() {
					t.Fatalf("%s: mode %o mtime %v", name, e.Mode, time.Unix(0, e.Mtime).UTC())
				}
			}
			// Read-only descriptors: no FLUSH in any mode.
			flushes = mount.FlushCalls(f.m)
			for i := range 10 {
				if got := f.readMount(fmt.Sprintf("d/f%03d", i)); len(got) != 100+i {
					t.Fatalf("read back %d bytes, want %d", len(got), 100+i)
				}
			}
			if n := mount.FlushCalls(f.m) - flushes; n != 0 {
				t.Errorf("closing 10 read-only descriptors made %d FLUSH requests, want 0", n)
			}
		})
	}
}

// TestKillPriv: the mount clears set-ID bits as a local disk does (the
// kernel leaves it to the mount: FUSE_HANDLE_KILLPRIV). A chown clears
// set-user-ID, and set-group-ID on a group-executable file (not on one
// that is not: that is a mandatory-locking mark); a chmod after it sets
// them again (tar x); an unprivileged process opening the file for
// writing clears them; root's does not.
func TestKillPriv(t *testing.T) {
	f := newFixture(t, mount.Options{})
	mode := func(rel string) uint32 {
		t.Helper()
		// A mode set while the kernel has not yet released the writer's
		// handle goes to the metadata with that release's save.
		f.waitPending(10 * time.Second)
		fi, err := os.Stat(f.path(rel))
		if err != nil {
			t.Fatal(err)
		}
		if m := f.entry(rel).Mode; m != uint32(fi.Mode().Perm())|setIDBits(fi) {
			t.Fatalf("%s: the metadata says %o, stat %o", rel, m, fi.Mode())
		}
		return f.entry(rel).Mode
	}
	for _, c := range []struct {
		name      string
		set, want uint32
	}{
		{"suid", 0o4755, 0o755},
		{"sgid-exec", 0o2755, 0o755},
		{"sgid-noexec", 0o2644, 0o2644},
		{"both", 0o6775, 0o775},
	} {
		if err := os.WriteFile(f.path(c.name), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.path(c.name), os.FileMode(c.set&0o777)|goSetID(c.set)); err != nil {
			t.Fatal(err)
		}
		if got := mode(c.name); got != c.set {
			t.Fatalf("%s: chmod %o gave %o", c.name, c.set, got)
		}
		if err := os.Chown(f.path(c.name), os.Getuid(), os.Getgid()); err != nil {
			t.Fatal(err)
		}
		if got := mode(c.name); got != c.want {
			t.Errorf("%s: after chown %o, want %o", c.name, got, c.want)
		}
		if err := os.Chmod(f.path(c.name), os.FileMode(c.set&0o777)|goSetID(c.set)); err != nil {
			t.Fatal(err)
		}
		if got := mode(c.name); got != c.set {
			t.Errorf("%s: chmod after chown gave %o, want %o", c.name, got, c.set)
		}
	}
	// Root opens "both" for writing: kept.
	w, err := os.OpenFile(f.path("both"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if got := mode("both"); got != 0o6775 {
		t.Errorf("after root's open for writing %o, want 0o6775", got)
	}
	if os.Getuid() != 0 {
		return
	}
	// Another user's open for writing (as FUSE sees it: the fsuid; the
	// mount admits only its own user's processes).
	if cerr := os.Chmod(f.path("both"), 0o6777|os.ModeSetuid|os.ModeSetgid); cerr != nil {
		t.Fatal(cerr)
	}
	root, err := unix.Open(f.mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0) // the path above it is root's only
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the fsuid is the thread's: it dies with it
		unix.Setfsuid(65534)
		fd, err := unix.Openat(root, "both", unix.O_WRONLY|unix.O_APPEND, 0)
		if err == nil {
			_, err = unix.Write(fd, []byte("y"))
			unix.Close(fd)
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("an unprivileged writer: %v", err)
	}
	if got := mode("both"); got != 0o777 {
		t.Errorf("after an unprivileged open for writing %o, want 0o777", got)
	}
}

func goSetID(m uint32) os.FileMode {
	var fm os.FileMode
	if m&syscall.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	return fm
}

func setIDBits(fi os.FileInfo) uint32 {
	var m uint32
	if fi.Mode()&os.ModeSetuid != 0 {
		m |= syscall.S_ISUID
	}
	if fi.Mode()&os.ModeSetgid != 0 {
		m |= syscall.S_ISGID
	}
	return m
}

// wbPT mounts in write-back mode with passthrough, or skips the test
// where the kernel or the user cannot have it.
func wbPT(t *testing.T, o mount.Options) *fixture {
	t.Helper()
	o.Mode, o.Passthrough = mount.WriteBack, mount.PassthroughAuto
	f := newFixture(t, o)
	if !mount.PassthroughOn(f.m) {
		t.Skip("passthrough not available here (kernel < 6.9 or not root)")
	}
	return f
}

// TestWriteBackPassthrough: in write-back mode the kernel reads and
// writes open copies itself (no READ or WRITE request); what it wrote is
// committed after the last close and is what the other device reads;
// reading it back here is served from the copy.
func TestWriteBackPassthrough(t *testing.T) {
	f := wbPT(t, mount.Options{})
	g := f.device(mount.Options{}, meta.Options{})
	data := randBytes(3<<20 + 17)
	if err := os.WriteFile(f.path("w"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := f.readMount("w"); !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, want %d", len(got), len(data))
	}
	f.waitPending(time.Minute)
	if got := f.cat("w"); !bytes.Equal(got, data) {
		t.Fatalf("committed %d bytes, want %d", len(got), len(data))
	}
	g.waitWatched(f.entry("w").Rev)
	if got := g.readMount("w"); !bytes.Equal(got, data) {
		t.Fatalf("the other device reads %d bytes, want %d", len(got), len(data))
	}
	if got := f.readMount("w"); !bytes.Equal(got, data) {
		t.Fatalf("read back after the commit: %d bytes, want %d", len(got), len(data))
	}
	if r, w := mount.ReadCalls(f.m), mount.WriteCalls(f.m); r != 0 || w != 0 {
		t.Errorf("the mount was asked %d reads and %d writes, want none (passthrough)", r, w)
	}
}

// versionBytes reads every version of rel the metadata keeps, oldest
// first.
func (f *fixture) versionBytes(rel string) [][]byte {
	f.t.Helper()
	e := f.entry(rel)
	var out [][]byte
	for i := range e.Versions {
		var b bytes.Buffer
		if err := f.vol.ReadFile(context.Background(), e, &e.Versions[i], &b); err != nil {
			f.t.Fatalf("read version %d of %s: %v", i, rel, err)
		}
		out = append(out, b.Bytes())
	}
	return out
}

// TestWriteBackPassthroughCopyOut: a file closed in write-back mode is
// queued with its copy as the commit's data (no copy made). A reader
// keeps it open, so the kernel keeps that copy as the inode's backing
// file, and a writer then opens it: the copy must stay the backing file
// (it cannot be swapped for another while an open lasts), so the queue
// gets a copy of its own first (copyOut). Both versions are committed,
// in order, each whole; the reader reads the writer's bytes.
func TestWriteBackPassthroughCopyOut(t *testing.T) {
	f := wbPT(t, mount.Options{QueueDelay: 300 * time.Millisecond})
	v1, v2 := bytes.Repeat([]byte("1"), 200<<10), bytes.Repeat([]byte("2"), 150<<10)
	if err := os.WriteFile(f.path("c"), v1, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); f.m.WriteHandles() > 0 || f.m.Pending() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the close queued no commit")
		}
	}
	r, err := os.Open(f.path("c"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(f.path("c"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(v2); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(v1))
	if k, _ := r.ReadAt(buf, 0); k != len(v2) || !bytes.Equal(buf[:k], v2) {
		t.Fatalf("the reader reads %d bytes, want the writer's %d", k, len(v2))
	}
	f.waitPending(time.Minute)
	vs := f.versionBytes("c")
	if len(vs) != 2 || !bytes.Equal(vs[0], v1) || !bytes.Equal(vs[1], v2) {
		var sizes []int
		for _, v := range vs {
			sizes = append(sizes, len(v))
		}
		t.Fatalf("versions of %v bytes, want v1 (%d) then v2 (%d), each whole", sizes, len(v1), len(v2))
	}
	r.Close()
	if got := f.readMount("c"); !bytes.Equal(got, v2) {
		t.Fatal("a new open does not read v2")
	}
	if strings.Contains(f.logs.String(), "unsaved") {
		t.Errorf("a copy was kept as unsaved:\n%s", f.logs.String())
	}
}

// TestWriteBackPassthroughTruncateWhileOpen: a truncate by path commits
// at once (queues, in write-back mode) while another descriptor still
// writes the copy through the kernel: the queued commit gets a copy of
// its own, so what the writer writes next is not in it.
func TestWriteBackPassthroughTruncateWhileOpen(t *testing.T) {
	f := wbPT(t, mount.Options{QueueDelay: 200 * time.Millisecond})
	w, err := os.OpenFile(f.path("t"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte("0123456789"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.path("t"), 4); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("abcdefgh"), 4); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.waitPending(time.Minute)
	vs := f.versionBytes("t")
	if len(vs) != 2 || string(vs[0]) != "0123" || string(vs[1]) != "0123abcdefgh" {
		var got []string
		for _, v := range vs {
			got = append(got, string(v))
		}
		t.Fatalf("versions %q, want the truncate's %q then the close's %q", got, "0123", "0123abcdefgh")
	}
}

// TestSpareFiles: new files' work copies come from empty files made ahead
// (spares.go); there are at most sparesMax of them, and none is left once
// the mount ends. The files made from them hold what was written.
func TestSpareFiles(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	spares := func() []string {
		ps, _ := filepath.Glob(filepath.Join(f.cache, "*", "work", "spare-*"))
		return ps
	}
	for i := range 50 {
		if err := os.WriteFile(f.path(fmt.Sprintf("s%02d", i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.waitPending(time.Minute)
	if n := len(spares()); n == 0 || n > 32 {
		t.Errorf("%d spare files while mounted, want 1 to 32", n)
	}
	for i := range 50 {
		if got := string(f.cat(fmt.Sprintf("s%02d", i))); got != fmt.Sprint(i) {
			t.Fatalf("s%02d: %q", i, got)
		}
	}
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	if ps := spares(); len(ps) != 0 {
		t.Errorf("spare files left after the unmount: %v", ps)
	}
	f.start(mount.Options{Mode: mount.WriteBack})
}
