package mount_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// ptFixture mounts with passthrough, or skips the test where the kernel
// or the user cannot have it.
func ptFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, mount.Options{Passthrough: mount.PassthroughAuto})
	if !mount.PassthroughOn(f.m) {
		t.Skip("passthrough not available here (kernel < 6.9 or not root)")
	}
	return f
}

func versions(f *fixture, rel string) int {
	f.t.Helper()
	return len(f.entry(rel).Versions)
}

// TestPassthroughNewVersionWhileOpen: a descriptor here holds a file open
// (the kernel's backing file is its copy) while another device commits a
// new version; a new open here reads the new version, nothing fails, and
// the old descriptor reads on (the new bytes: its copy was refreshed in
// place, as passthrough.go documents). Writes through a descriptor opened
// meanwhile reach the other device at close.
func TestPassthroughNewVersionWhileOpen(t *testing.T) {
	f := ptFixture(t)
	g := f.device(mount.Options{Passthrough: mount.PassthroughAuto}, meta.Options{})
	v1, v2, v3 := bytes.Repeat([]byte("1"), 300<<10), bytes.Repeat([]byte("2"), 200<<10), randBytes(500<<10)
	if err := os.WriteFile(f.path("p"), v1, 0o644); err != nil {
		t.Fatal(err)
	}
	r1, err := os.Open(f.path("p"))
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	buf := make([]byte, len(v1))
	if k, rerr := r1.ReadAt(buf, 0); k != len(v1) || !bytes.Equal(buf, v1) {
		t.Fatalf("r1 reads v1: %d bytes, %v", k, rerr)
	}
	g.waitWatched(f.entry("p").Rev)
	if werr := os.WriteFile(g.path("p"), v2, 0o644); werr != nil {
		t.Fatal(werr)
	}
	f.waitWatched(f.entry("p").Rev)
	reads := mount.ReadCalls(f.m)
	if got := f.readMount("p"); !bytes.Equal(got, v2) {
		t.Fatalf("an open after the other device's commit reads %d bytes %q..., want v2", len(got), got[:min(8, len(got))])
	}
	if k, rerr := r1.ReadAt(buf, 0); k != len(v2) || !bytes.Equal(buf[:k], v2) {
		t.Fatalf("the descriptor held open reads %d bytes (%v), want v2's %d", k, rerr, len(v2))
	}
	// A writer here while r1 is still open: the same backing file.
	w, err := os.OpenFile(f.path("p"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(v3); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if k, err := r1.ReadAt(buf, 0); k != len(v1) || !bytes.Equal(buf, v3[:len(v1)]) {
		t.Fatalf("the descriptor held open does not read what this mount wrote: %d bytes, %v", k, err)
	}
	r1.Close()
	if n := mount.ReadCalls(f.m) - reads; n != 0 {
		t.Errorf("the mount was asked %d reads, want 0 (passthrough)", n)
	}
	if n := mount.WriteCalls(f.m); n != 0 {
		t.Errorf("the mount was asked %d writes, want 0 (passthrough)", n)
	}
	g.waitWatched(f.entry("p").Rev)
	if got := g.readMount("p"); !bytes.Equal(got, v3) {
		t.Fatalf("the other device reads %d bytes, want v3's %d", len(got), len(v3))
	}
	f.waitClosed(0)
	if got := f.readMount("p"); !bytes.Equal(got, v3) {
		t.Fatal("a new open here does not read v3")
	}
}

// TestPassthroughWrites: what the kernel writes to the copy itself is
// committed at close (size, bytes, mtime), appends land at the end, an
// open for writing that writes nothing makes no version, fsync works, and
// a utimes after the writes is the version's mtime.
func TestPassthroughWrites(t *testing.T) {
	f := ptFixture(t)
	data := randBytes(3<<20 + 17)
	if err := os.WriteFile(f.path("w"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("w"); !bytes.Equal(got, data) {
		t.Fatalf("committed %d bytes, want %d", len(got), len(data))
	}
	n := versions(f, "w")
	// Open for writing, write nothing (sqlite's reads), close.
	rw, err := os.OpenFile(f.path("w"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, rerr := rw.ReadAt(make([]byte, 10), 0); rerr != nil {
		t.Fatal(rerr)
	}
	rw.Close()
	f.waitClosed(0)
	if got := versions(f, "w"); got != n {
		t.Errorf("an open for writing without a write made %d versions, want none", got-n)
	}
	// Append, fsync, stat while open, utimes, close.
	a, err := os.OpenFile(f.path("w"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if fi, err := a.Stat(); err != nil || fi.Size() != int64(len(data)+4) {
		t.Fatalf("stat while open: %v, %v", fi.Size(), err)
	}
	mt := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(f.path("w"), mt, mt); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	want := append(data, "tail"...)
	if got := f.cat("w"); !bytes.Equal(got, want) {
		t.Fatalf("after the append: %d bytes, want %d", len(got), len(want))
	}
	if e := f.entry("w"); e.Mtime != mt.UnixNano() {
		t.Errorf("mtime %v, want the utimes' %v", time.Unix(0, e.Mtime).UTC(), mt)
	}
	if n := mount.WriteCalls(f.m); n != 0 {
		t.Errorf("the mount was asked %d writes, want 0 (passthrough)", n)
	}
}

// TestPassthroughMappedStoreAfterClose: a store through a shared writable
// mapping after the descriptor's close, to a page the mapping had already
// written (so the mtime does not move), is committed once the mapping
// goes. With passthrough the kernel releases the file at the close and
// the mapping stores into the copy unseen: the copy is held (held.go)
// until a lease says no writer is left, then committed again. Meanwhile
// a new open here reads what the mapping stored, and the copy is not the
// cache's clean copy of the version committed at the close.
func TestPassthroughMappedStoreAfterClose(t *testing.T) {
	f := ptFixture(t)
	g := f.device(mount.Options{}, meta.Options{})
	fd, err := unix.Open(f.path("m"), unix.O_RDWR|unix.O_CREAT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if ferr := unix.Ftruncate(fd, 8192); ferr != nil {
		t.Fatal(ferr)
	}
	mem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	mapped := true
	t.Cleanup(func() { // before the unmount
		if mapped {
			unix.Munmap(mem)
		}
	})
	copy(mem, "first")
	if err := unix.Close(fd); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("m"); !bytes.HasPrefix(got, []byte("first")) {
		t.Fatalf("after the close: %q", got[:8])
	}
	n := versions(f, "m")
	for deadline := time.Now().Add(10 * time.Second); mount.HeldCopies(f.m) != 1; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the copy is not held while a writable mapping of it lives")
		}
	}
	copy(mem, "again")
	if got := f.readMount("m"); len(got) != 8192 || !bytes.HasPrefix(got, []byte("again")) {
		t.Fatalf("an open here while the mapping lives reads %d bytes, %q; want what it stored", len(got), got[:min(8, len(got))])
	}
	f.waitClosed(1)
	if size, _ := mount.CacheStats(f.m); size != 0 {
		t.Errorf("the cache holds %d bytes of clean copies while the only copy is mapped for writing, want 0", size)
	}
	copy(mem[4096:], "later")
	mapped = false
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := f.cat("m")
		if len(got) == 8192 && bytes.HasPrefix(got, []byte("again")) && bytes.HasPrefix(got[4096:], []byte("later")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the mapping went: %d bytes, %q ... %q, want what it stored", len(got), got[:8], got[4096:4104])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := versions(f, "m"); got != n+1 {
		t.Errorf("%d versions after the mapping went, want %d (one commit of what it stored)", got, n+1)
	}
	g.waitWatched(f.entry("m").Rev)
	if got := g.readMount("m"); !bytes.HasPrefix(got, []byte("again")) || !bytes.HasPrefix(got[4096:], []byte("later")) {
		t.Fatalf("the other device reads %q ... %q", got[:8], got[4096:4104])
	}
	// Settled: the copy is the clean copy of the new version.
	f.waitClosed(0)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if size, _ := mount.CacheStats(f.m); size == 8192 {
			break
		}
		if time.Now().After(deadline) {
			size, _ := mount.CacheStats(f.m)
			t.Fatalf("the cache holds %d bytes of clean copies, want the settled copy's 8192", size)
		}
	}
	if strings.Contains(f.logs.String(), "unsaved") {
		t.Errorf("a copy was kept as unsaved:\n%s", f.logs.String())
	}
}

// TestPassthroughReaderNotHeld: a descriptor open for reading at the last
// writer's release does not make the copy held (held.go: readers are no
// writers of the copy): the copy is the cache's clean copy of the version
// at once, and a version committed on another device meanwhile is what a
// new open here reads.
func TestPassthroughReaderNotHeld(t *testing.T) {
	f := ptFixture(t)
	g := f.device(mount.Options{}, meta.Options{})
	v1, v2, v3 := randBytes(64<<10), randBytes(80<<10), randBytes(96<<10)
	if err := os.WriteFile(f.path("r"), v1, 0o644); err != nil {
		t.Fatal(err)
	}
	f.waitClosed(0)
	r, err := os.Open(f.path("r"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.WriteFile(f.path("r"), v2, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if size, _ := mount.CacheStats(f.m); size == int64(len(v2)) {
			break
		}
		if time.Now().After(deadline) {
			size, _ := mount.CacheStats(f.m)
			t.Fatalf("the cache holds %d bytes of clean copies, want v2's %d", size, len(v2))
		}
	}
	if n := mount.HeldCopies(f.m); n != 0 {
		t.Fatalf("%d copies held with only a reader open", n)
	}
	g.waitWatched(f.entry("r").Rev)
	if err := os.WriteFile(g.path("r"), v3, 0o644); err != nil {
		t.Fatal(err)
	}
	f.waitWatched(f.entry("r").Rev)
	if got := f.readMount("r"); !bytes.Equal(got, v3) {
		t.Fatalf("an open here after the other device's commit reads %d bytes, want v3's %d", len(got), len(v3))
	}
	if strings.Contains(f.logs.String(), "held until") {
		t.Errorf("a copy was held:\n%s", f.logs.String())
	}
}

// TestPassthroughModes: by default a blocking mount uses passthrough
// where it can; turned off, and in non-blocking mode even when asked for,
// reads and writes go through the mount.
func TestPassthroughModes(t *testing.T) {
	if f := newFixture(t, mount.Options{}); mount.PassthroughOn(f.m) {
		if err := os.WriteFile(f.path("x"), []byte("through the kernel"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := f.readMount("x"); string(got) != "through the kernel" || mount.WriteCalls(f.m) != 0 {
			t.Fatalf("default: read %q, %d writes", got, mount.WriteCalls(f.m))
		}
	} else if suiteOptions(mount.Options{}).Passthrough == mount.PassthroughAuto && !strings.Contains(f.logs.String(), "passthrough not available") {
		t.Errorf("passthrough off by default without a log line saying why:\n%s", f.logs.String())
	}
	for _, o := range []mount.Options{{Passthrough: mount.PassthroughOff}, {Mode: mount.NonBlocking, Passthrough: mount.PassthroughAuto}} {
		f := newFixture(t, o)
		if mount.PassthroughOn(f.m) {
			t.Fatalf("%+v: passthrough on", o)
		}
		if err := os.WriteFile(f.path("x"), []byte("through the mount"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := f.readMount("x"); string(got) != "through the mount" || mount.WriteCalls(f.m) == 0 {
			t.Fatalf("%+v: read %q, %d writes", o, got, mount.WriteCalls(f.m))
		}
	}
}

// TestPassthroughTwoWritersCleanIndex: two descriptors open for writing;
// the first's close commits v1, the second then writes (the kernel
// itself) and its close commits v2. The cache must never hold v2's bytes
// under v1's name (the copy adopted as clean v1 at the first close while
// the second could still write it).
func TestPassthroughTwoWritersCleanIndex(t *testing.T) {
	f := ptFixture(t)
	if err := os.WriteFile(f.path("q"), bytes.Repeat([]byte("0"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	w1, err := os.OpenFile(f.path("q"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := os.OpenFile(f.path("q"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w1.WriteAt([]byte("AAAA"), 0); err != nil {
		t.Fatal(err)
	}
	if err := w1.Close(); err != nil {
		t.Fatal(err)
	}
	v1 := f.entry("q").Current().Manifest
	if _, err := w2.WriteAt([]byte("BBBB"), 100); err != nil {
		t.Fatal(err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	f.waitClosed(0)
	e := f.entry("q")
	if e.Current().Manifest == v1 {
		t.Fatal("the second close made no version")
	}
	ps, _ := filepath.Glob(filepath.Join(f.cache, "*", "clean", fmt.Sprintf("%016x-%s", e.Ino, v1)))
	for _, p := range ps {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("BBBB")) {
			t.Errorf("the cache's clean copy of v1 holds the second writer's bytes (v2's)")
		}
	}
	want := bytes.Repeat([]byte("0"), 64<<10)
	copy(want, "AAAA")
	copy(want[100:], "BBBB")
	if got := f.readMount("q"); !bytes.Equal(got, want) {
		t.Fatal("the mount does not read v2")
	}
}

// TestPassthroughRefreshNoSpuriousVersion: a copy written here and still
// open (a reader) is refreshed in place for another device's version; an
// open for writing here that writes nothing then makes no version (the
// refresh's own writes to the copy are not taken for the kernel's).
func TestPassthroughRefreshNoSpuriousVersion(t *testing.T) {
	f := ptFixture(t)
	g := f.device(mount.Options{Passthrough: mount.PassthroughAuto}, meta.Options{})
	if err := os.WriteFile(f.path("r"), []byte("version one"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(f.path("r"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(f.path("r"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, werr := w.WriteAt([]byte("VERSION"), 0); werr != nil {
		t.Fatal(werr)
	}
	if cerr := w.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	g.waitWatched(f.entry("r").Rev)
	if werr := os.WriteFile(g.path("r"), []byte("version two from g"), 0o644); werr != nil {
		t.Fatal(werr)
	}
	f.waitWatched(f.entry("r").Rev)
	n, mt := versions(f, "r"), f.entry("r").Mtime
	time.Sleep(20 * time.Millisecond) // the refresh's mtime differs from g's
	rw, err := os.OpenFile(f.path("r"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.Close(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	f.waitClosed(0)
	if got := versions(f, "r"); got != n {
		t.Errorf("an open for writing without a write after a refresh made %d versions, want none", got-n)
	}
	if e := f.entry("r"); e.Mtime != mt {
		t.Errorf("an open for writing without a write after a refresh moved the mtime from %v to %v", time.Unix(0, mt), time.Unix(0, e.Mtime))
	}
	if !strings.Contains(f.logs.String(), "refreshed") {
		t.Error("no refresh in place")
	}
	if got := f.readMount("r"); string(got) != "version two from g" {
		t.Fatalf("reads %q", got)
	}
}

// TestPassthroughHeldQueuedCommittedOnce: in write-back mode (the one
// that queues a close's commit with passthrough), a copy held at its last writer's release (a writable
// mapping lives on, held.go; or, on a loaded machine, the kernel let the
// released open's file go too late to tell) is committed again when the
// hold ends only if the mapping stored into it since: the queued commit
// keeps the checksum of what it queued, as a commit does. (Without it
// every held copy was queued twice: TestWriteBackQueueChecksum found 3
// records for 2 files under load.)
func TestPassthroughHeldQueuedCommittedOnce(t *testing.T) {
	for _, later := range []bool{false, true} {
		name := "unchanged"
		if later {
			name = "stored-after-close"
		}
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mount.WriteBack, Passthrough: mount.PassthroughAuto})
			if !mount.PassthroughOn(f.m) {
				t.Skip("passthrough not available here (kernel < 6.9 or not root)")
			}
			f.st.fail.Store(true) // the commits stay queued, to be counted
			fd, err := unix.Open(f.path("m"), unix.O_RDWR|unix.O_CREAT, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			if ferr := unix.Ftruncate(fd, 8192); ferr != nil {
				unix.Close(fd)
				t.Fatal(ferr)
			}
			mem, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				unix.Close(fd)
				t.Fatal(err)
			}
			mapped := true
			t.Cleanup(func() { // before the unmount
				if mapped {
					unix.Munmap(mem)
				}
			})
			copy(mem, "first")
			if cerr := unix.Close(fd); cerr != nil {
				t.Fatal(cerr)
			}
			for deadline := time.Now().Add(30 * time.Second); mount.HeldCopies(f.m) != 1 || f.m.WriteHandles() > 0; time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the copy is not held while a writable mapping of it lives")
				}
			}
			if later {
				copy(mem[4096:], "later")
			}
			mapped = false
			if merr := unix.Munmap(mem); merr != nil {
				t.Fatal(merr)
			}
			for deadline := time.Now().Add(30 * time.Second); mount.HeldCopies(f.m) != 0; time.Sleep(2 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the copy is still held after the mapping went")
				}
			}
			want := 1
			if later {
				want = 2
			}
			if got := f.m.Pending(); got != want {
				t.Fatalf("%d commits queued after the mapping went, want %d", got, want)
			}
			f.st.fail.Store(false)
			f.settle()
			got := f.cat("m")
			if len(got) != 8192 || !bytes.HasPrefix(got, []byte("first")) || later != bytes.HasPrefix(got[4096:], []byte("later")) {
				t.Fatalf("m: %d bytes, %q ... %q", len(got), got[:min(8, len(got))], got[min(4096, len(got)):min(4104, len(got))])
			}
		})
	}
}
