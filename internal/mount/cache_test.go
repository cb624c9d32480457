package mount_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/store/memstore"
)

// cleanCopies lists the clean copies in the mount's cache.
func cleanCopies(t *testing.T, m *mount.Mount) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(mount.CacheDir(m), "clean", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// waitClosed waits until the kernel has released every handle but those
// on the open copies still meant to be open (its releases come after the
// closes, asynchronously): only then are the copies in the cache's LRU
// order.
func (f *fixture) waitClosed(open int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for mount.OpenCopies(f.m) > open {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d copies still open", mount.OpenCopies(f.m))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestCacheAcrossRemount: a file read or written once is served from the
// cache by a later mount, without a byte from the store; a version
// committed elsewhere while unmounted is fetched, never the stale copy.
func TestCacheAcrossRemount(t *testing.T) {
	f := newFixture(t, mount.Options{})
	a, b := randBytes(300<<10), randBytes(50<<10)
	if err := os.WriteFile(f.path("a"), a, 0o644); err != nil {
		t.Fatal(err)
	}
	f.put("b", b) // committed without the mount: not in its cache
	f.waitWatched(f.entry("b").Rev)
	if got := f.readMount("b"); !bytes.Equal(got, b) {
		t.Fatal("first read of b differs")
	}
	f.mountAgain(mount.Options{})
	if n := len(cleanCopies(t, f.m)); n != 2 {
		t.Fatalf("%d clean copies after the remount, want 2 (a, written; b, read)", n)
	}
	gets := f.st.gets.Load()
	if !bytes.Equal(f.readMount("a"), a) || !bytes.Equal(f.readMount("b"), b) {
		t.Fatal("a or b differs after the remount")
	}
	if n := f.st.gets.Load() - gets; n != 0 {
		t.Fatalf("reading cached files after a remount made %d store reads, want 0", n)
	}
	// Changed on another device while unmounted: the copy of the old
	// version is not what the next open reads.
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	b2 := randBytes(50 << 10)
	f.put("b", b2)
	f.start(mount.Options{})
	gets = f.st.gets.Load()
	if !bytes.Equal(f.readMount("b"), b2) {
		t.Fatal("after a commit elsewhere while unmounted, the mount served the old copy")
	}
	if f.st.gets.Load() == gets {
		t.Fatal("the new version was not fetched")
	}
	// A copy cut short (a power loss before its data reached the disk)
	// is dropped, not served.
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	cut := 0
	for _, p := range cleanCopies(t, f.m) {
		if fi, err := os.Stat(p); err == nil && fi.Size() == int64(len(a)) {
			os.Truncate(p, 1000)
			cut++
		}
	}
	if cut != 1 {
		t.Fatalf("found %d copies of a to cut", cut)
	}
	f.start(mount.Options{})
	if !bytes.Equal(f.readMount("a"), a) {
		t.Fatal("a copy cut short was served")
	}
}

// TestCacheEviction: clean copies are evicted least recently used first
// once they pass the bound; a copy open for reading and a file written but
// not yet closed are never evicted.
func TestCacheEviction(t *testing.T) {
	const size = 100 << 10
	f := newFixture(t, mount.Options{CacheSize: 3*size + size/2})
	data := map[string][]byte{}
	open := 0 // copies the test keeps open
	write := func(name string) {
		t.Helper()
		data[name] = randBytes(size)
		if err := os.WriteFile(f.path(name), data[name], 0o644); err != nil {
			t.Fatal(err)
		}
		f.waitClosed(open)
	}
	for _, name := range []string{"f0", "f1", "f2"} {
		write(name)
	}
	if used, ev := mount.CacheStats(f.m); used != 3*size || ev != 0 {
		t.Fatalf("after three files: %d bytes cached, %d evictions", used, ev)
	}
	// f0 is read again (most recently used now), then two more files
	// evict the two least recently used: f1 and f2.
	if !bytes.Equal(f.readMount("f0"), data["f0"]) {
		t.Fatal("f0 differs")
	}
	f.waitClosed(open)
	write("f3")
	write("f4")
	if used, ev := mount.CacheStats(f.m); used != 3*size || ev != 2 {
		t.Fatalf("after five files: %d bytes cached, %d evictions; want %d, 2", used, ev, 3*size)
	}
	gets := f.st.gets.Load()
	for _, name := range []string{"f0", "f3", "f4"} {
		if !bytes.Equal(f.readMount(name), data[name]) {
			t.Fatalf("%s differs", name)
		}
		f.waitClosed(open)
	}
	if n := f.st.gets.Load() - gets; n != 0 {
		t.Fatalf("reading the three cached files made %d store reads", n)
	}
	if !bytes.Equal(f.readMount("f1"), data["f1"]) || f.st.gets.Load() == gets {
		t.Fatal("f1 should have been evicted and fetched again")
	}
	// Open copies are not evicted: f0 stays open for reading, f5 is
	// being written (not closed), and three new files pass the bound.
	r, err := os.Open(f.path("f0"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.Create(f.path("f5"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	data["f5"] = randBytes(2 * size)
	if _, err := w.Write(data["f5"]); err != nil {
		t.Fatal(err)
	}
	open = 2
	for _, name := range []string{"f6", "f7", "f8", "f9"} {
		write(name)
	}
	got := make([]byte, size)
	if _, err := r.ReadAt(got, 0); err != nil || !bytes.Equal(got, data["f0"]) {
		t.Fatalf("reading the open f0 after the evictions: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f.cat("f5"), data["f5"]) {
		t.Fatal("f5, written while the cache evicted, differs")
	}
	r.Close()
	if used, _ := mount.CacheStats(f.m); used > 3*size+size/2 {
		t.Fatalf("%d bytes cached once everything is closed, over the bound", used)
	}
	var total int64
	for _, p := range cleanCopies(t, f.m) {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	if used, _ := mount.CacheStats(f.m); total != used {
		t.Fatalf("clean copies on disk hold %d bytes, the cache counts %d", total, used)
	}
}

// TestOpenWithoutRoundTrip: an open (and lookup, stat, read, close) of a
// cached file whose entry has not changed asks neither etcd nor the store
// anything; a version committed elsewhere is what the next open reads
// once the watch has reported it (from the watched entry, so still no
// etcd read); while the watch is down, every open asks etcd.
func TestOpenWithoutRoundTrip(t *testing.T) {
	// No kernel attribute cache: every lookup and stat reaches the mount.
	f := newFixture(t, mount.Options{AttrTimeout: mount.NoAttrCache})
	if err := os.MkdirAll(f.path("d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	v1 := randBytes(100 << 10)
	if err := os.WriteFile(f.path("d/e/a"), v1, 0o644); err != nil {
		t.Fatal(err)
	}
	e := f.entry("d/e/a")
	f.waitWatched(e.Rev)
	rpcs, gets := f.rpcs.Load(), f.st.gets.Load()
	for range 3 {
		if !bytes.Equal(f.readMount("d/e/a"), v1) {
			t.Fatal("read differs")
		}
		if _, err := os.Stat(f.path("d/e/a")); err != nil {
			t.Fatal(err)
		}
	}
	if n, g := f.rpcs.Load()-rpcs, f.st.gets.Load()-gets; n != 0 || g != 0 {
		t.Fatalf("opening an unchanged cached file 3 times made %d etcd requests and %d store reads, want 0 and 0", n, g)
	}

	// Another device commits: once the watch has reported it, the next
	// open reads the new version.
	v2 := randBytes(100 << 10)
	f.put("d/e/a", v2)
	f.waitWatched(f.entry("d/e/a").Rev)
	rpcs, gets = f.rpcs.Load(), f.st.gets.Load()
	if !bytes.Equal(f.readMount("d/e/a"), v2) {
		t.Fatal("the open after the watch reported a commit elsewhere read the old version")
	}
	if n, g := f.rpcs.Load()-rpcs, f.st.gets.Load()-gets; n != 0 || g == 0 {
		t.Fatalf("reading the new version made %d etcd requests (want 0: the watch brought the entry) and %d store reads (want some)", n, g)
	}

	// The watch fails: until it is back, opens check etcd, and see a
	// commit the watch never reported.
	resume := mount.BreakWatch(f.m)
	v3 := randBytes(10 << 10)
	f.put("d/e/a", v3)
	rpcs = f.rpcs.Load()
	if !bytes.Equal(f.readMount("d/e/a"), v3) {
		t.Fatal("with the watch down, an open read a stale version")
	}
	if f.rpcs.Load() == rpcs {
		t.Fatal("with the watch down, an open made no etcd request")
	}
	resume()
	f.waitWatched(f.entry("d/e/a").Rev)
	f.readMount("d/e/a") // the entry cache was emptied: this read fills it
	rpcs, gets = f.rpcs.Load(), f.st.gets.Load()
	if !bytes.Equal(f.readMount("d/e/a"), v3) {
		t.Fatal("read differs after the watch is back")
	}
	if n, g := f.rpcs.Load()-rpcs, f.st.gets.Load()-gets; n != 0 || g != 0 {
		t.Fatalf("with the watch back, an open made %d etcd requests and %d store reads", n, g)
	}
}

// TestWriterLock: an open for writing holds the file's writer lock until
// the commit of its last close; processes of one device share it; another
// device's open for writing fails with EBUSY meanwhile (logged with the
// file's name), its open for reading works.
func TestWriterLock(t *testing.T) {
	f := newFixture(t, mount.Options{})
	g := f.device(mount.Options{LockWait: 200 * time.Millisecond}, meta.Options{})
	if err := os.WriteFile(f.path("doc"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	w1, err := os.OpenFile(f.path("doc"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Close()
	w2, err := os.OpenFile(f.path("doc"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("a second writer on the same device: %v", err)
	}
	defer w2.Close()
	busy := func(what string) {
		t.Helper()
		x, oerr := os.OpenFile(g.path("doc"), os.O_WRONLY, 0)
		if oerr == nil {
			x.Close()
			t.Fatalf("%s: the other device opened the file for writing", what)
		}
		if !errors.Is(oerr, syscall.EBUSY) {
			t.Fatalf("%s: the other device's open for writing: %v, want EBUSY", what, oerr)
		}
	}
	busy("two writers open")
	if !strings.Contains(g.logs.String(), "open for writing on another device") || !strings.Contains(g.logs.String(), "v:/doc") {
		t.Fatalf("no log line naming the file:\n%s", g.logs.String())
	}
	if got := g.readMount("doc"); string(got) != "v1" {
		t.Fatalf("the other device reads %q", got)
	}
	// The first close commits; the second writer still holds the lock.
	w1.WriteString("+a")
	if cerr := w1.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if got := f.cat("doc"); string(got) != "v1+a" {
		t.Fatalf("after the first close: %q", got)
	}
	busy("one writer still open")
	w2.WriteString("+b")
	if cerr := w2.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	// Released with the last close (once the kernel has released the
	// handles): the other device writes now.
	f.waitClosed(0)
	g.waitWatched(f.entry("doc").Rev)
	x, err := os.OpenFile(g.path("doc"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("the other device after the last close: %v", err)
	}
	defer x.Close()
	x.WriteString("+c")
	if cerr := x.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	f.waitWatched(f.entry("doc").Rev)
	if got := f.readMount("doc"); string(got) != "v1+a+b+c" {
		t.Fatalf("first device reads %q", got)
	}
	// A new file made by one device is locked for the other while open.
	n, err := os.Create(f.path("new"))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// The other device knows of the new file once its watch has the
	// create (until then its complete-directory cache says ENOENT).
	g.waitWatched(f.entry("new").Rev)
	if x, oerr := os.OpenFile(g.path("new"), os.O_WRONLY, 0); !errors.Is(oerr, syscall.EBUSY) {
		if oerr == nil {
			x.Close()
		}
		t.Fatalf("the other device opens a file being created: %v, want EBUSY", oerr)
	}
	// Its lock, taken by the create's own transaction, goes with the
	// last close: the commit's, or without writes, the release's.
	n.WriteString("n")
	n.Close()
	e, err := os.Create(f.path("empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.Close()
	f.waitClosed(0)
	g.waitWatched(f.entry("new").Rev)
	g.waitWatched(f.entry("empty").Rev)
	for _, name := range []string{"new", "empty"} {
		x, err := os.OpenFile(g.path(name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatalf("the other device opens %s for writing after its maker closed it: %v", name, err)
		}
		defer x.Close()
		x.WriteString("+g")
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.cat("new"); string(got) != "n+g" {
		t.Fatalf("new holds %q", got)
	}
}

// TestTwoDevicesCloseToOpen: what one device writes and closes, the other
// reads at its next open once its watch reported the commit, including
// for a file it had read (and cached) before; both see each other's
// namespace changes.
func TestTwoDevicesCloseToOpen(t *testing.T) {
	f := newFixture(t, mount.Options{})
	g := f.device(mount.Options{}, meta.Options{})
	if err := os.WriteFile(f.path("shared"), []byte("from the first device"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.waitWatched(f.entry("shared").Rev)
	if got := g.readMount("shared"); string(got) != "from the first device" {
		t.Fatalf("second device reads %q", got)
	}
	for i := range 3 {
		want := fmt.Sprintf("round %d from the second device", i)
		if err := os.WriteFile(g.path("shared"), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		f.waitWatched(f.entry("shared").Rev)
		if got := f.readMount("shared"); string(got) != want {
			t.Fatalf("round %d: first device reads %q", i, got)
		}
		want = fmt.Sprintf("round %d from the first device", i)
		if err := os.WriteFile(f.path("shared"), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		g.waitWatched(f.entry("shared").Rev)
		if got := g.readMount("shared"); string(got) != want {
			t.Fatalf("round %d: second device reads %q", i, got)
		}
	}
	if err := os.Rename(g.path("shared"), g.path("moved")); err != nil {
		t.Fatal(err)
	}
	f.waitWatched(f.entry("moved").Rev)
	if _, err := os.Stat(f.path("shared")); !errors.Is(err, os.ErrNotExist) {
		// The kernel of the first device may keep the name for its
		// entry timeout; the mount itself must not.
		time.Sleep(mount.DefaultAttrTimeout)
		if _, err := os.Stat(f.path("shared")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a name renamed away on the other device: %v", err)
		}
	}
	if got := f.readMount("moved"); string(got) != "round 2 from the first device" {
		t.Fatalf("renamed file reads %q", got)
	}
}

// TestCommitIntoTrashedDirectory: a file open for writing whose directory
// another device moved to the trash fails its commit at close (ENOENT),
// loudly, and loses nothing: the writes are kept in the cache's unsaved/
// directory, and the trashed copy keeps its old version.
func TestCommitIntoTrashedDirectory(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path("d/f"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(f.path("d/f"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString("new writes")
	ctx := context.Background()
	if _, rerr := f.vol.Meta.Remove(ctx, f.entry(""), "d", "v:/d", true); rerr != nil {
		t.Fatal(rerr)
	}
	if cerr := w.Close(); !errors.Is(cerr, syscall.ENOENT) {
		t.Fatalf("close after the directory was trashed: %v, want ENOENT", cerr)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(f.logs.String(), "kept the unsaved content") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the kept copy:\n%s", f.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(f.logs.String(), "saving at close failed") {
		t.Fatalf("the failed commit was not logged:\n%s", f.logs.String())
	}
	kept, _ := filepath.Glob(filepath.Join(mount.CacheDir(f.m), "unsaved", "*"))
	if len(kept) != 1 {
		t.Fatalf("kept copies: %v", kept)
	}
	if b, _ := os.ReadFile(kept[0]); string(b) != "new writes" {
		t.Fatalf("kept copy holds %q", b)
	}
	trash, err := f.vol.Meta.Trash(ctx)
	if err != nil || len(trash) != 1 {
		t.Fatalf("trash: %v %v", trash, err)
	}
	fe, err := f.vol.Meta.Get(ctx, trash[0].Entry.Ino, "f")
	if err != nil || len(fe.Versions) != 1 {
		t.Fatalf("the trashed file: %+v, %v", fe, err)
	}
}

// waitPending waits until the kernel has released every handle that
// wrote (the caller closed them: write-back mode queues at the release,
// which comes after the close) and the mount's queue is empty.
func (f *fixture) waitPending(within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for f.m.WriteHandles() > 0 || f.m.Pending() > 0 {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d queued commits still pending, %d write handles open, after %v", f.m.Pending(), f.m.WriteHandles(), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNonBlocking: a close returns once the writes are durable locally,
// even with the store unreachable; nothing reaches the metadata before
// its data is stored; the writer lock is held until the commit; this
// mount reads its own queued writes; writes after a queued close are
// committed after it, in order; a queue left at unmount is finished by
// the next mount, which refuses writers of its files until then.
func TestNonBlocking(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.NonBlocking})
	g := f.device(mount.Options{LockWait: 200 * time.Millisecond}, meta.Options{})
	if err := os.WriteFile(f.path("a"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.waitPending(10 * time.Second)
	if got := f.cat("a"); string(got) != "v1" {
		t.Fatalf("after the queue ran: %q", got)
	}

	f.st.fail.Store(true)
	if err := os.WriteFile(f.path("a"), []byte("v2, queued"), 0o644); err != nil {
		t.Fatalf("close with the store unreachable: %v", err)
	}
	if f.m.Pending() != 1 {
		t.Fatalf("%d commits pending, want 1", f.m.Pending())
	}
	if e := f.entry("a"); len(e.Versions) != 1 || string(f.cat("a")) != "v1" {
		t.Fatalf("the metadata changed before the data was stored: %d versions", len(e.Versions))
	}
	if got := f.readMount("a"); string(got) != "v2, queued" {
		t.Fatalf("this mount reads %q before the commit", got)
	}
	records, _ := queueRecords(t, filepath.Join(mount.CacheDir(f.m), "queue"))
	if len(records) != 1 {
		t.Fatalf("queue records on disk: %v", records)
	}
	if x, err := os.OpenFile(g.path("a"), os.O_WRONLY, 0); !errors.Is(err, syscall.EBUSY) {
		if err == nil {
			x.Close()
		}
		t.Fatalf("another device's open for writing while the commit is queued: %v, want EBUSY", err)
	}
	// More writes after the queued close: a copy of the queued data
	// takes them, and they are committed after it.
	w, err := os.OpenFile(f.path("a"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString(" + more")
	if cerr := w.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if got := f.readMount("a"); string(got) != "v2, queued + more" || f.m.Pending() != 2 {
		t.Fatalf("after a second queued close: %q, %d pending", got, f.m.Pending())
	}
	f.st.fail.Store(false)
	f.waitPending(20 * time.Second)
	e := f.entry("a")
	if len(e.Versions) != 3 || string(f.cat("a")) != "v2, queued + more" {
		t.Fatalf("after the queue ran: %d versions, %q", len(e.Versions), f.cat("a"))
	}
	var prev bytes.Buffer
	if rerr := f.vol.ReadFile(context.Background(), e, &e.Versions[1], &prev); rerr != nil || prev.String() != "v2, queued" {
		t.Fatalf("version 2: %q, %v", prev.String(), rerr)
	}
	// The lock went with the last commit.
	f.waitClosed(0)
	g.waitWatched(e.Rev)
	x, err := os.OpenFile(g.path("a"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("the other device after the queue ran: %v", err)
	}
	x.Close()
	gets := f.st.gets.Load()
	if got := f.readMount("a"); string(got) != "v2, queued + more" || f.st.gets.Load() != gets {
		t.Fatalf("the committed copy is not served from the cache: %q", got)
	}

	// Unmounted with the store unreachable: the queue stays on disk, and
	// the next mount finishes it.
	f.st.fail.Store(true)
	if err := os.WriteFile(f.path("b"), []byte("queued across a remount"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	records, _ = queueRecords(t, filepath.Join(f.cache, "*", "queue"))
	if len(records) != 1 {
		t.Fatalf("queue records after the unmount: %v", records)
	}
	if _, err := f.vol.Meta.Lookup(context.Background(), []string{"b"}); err == nil {
		if e := f.entry("b"); len(e.Versions) != 0 {
			t.Fatal("b was committed with the store unreachable")
		}
	}
	f.st.fail.Store(false)
	// The next mount holds it back an hour: meanwhile the file is not
	// open for writing here (its queued commit needs the writer lock).
	f.start(mount.Options{Mode: mount.NonBlocking, QueueDelay: time.Hour})
	if f.m.Pending() != 1 {
		t.Fatalf("%d commits pending after the remount, want 1", f.m.Pending())
	}
	if x, err := os.OpenFile(f.path("b"), os.O_WRONLY, 0); !errors.Is(err, syscall.EBUSY) {
		if err == nil {
			x.Close()
		}
		t.Fatalf("open for writing of a file with a commit queued before the mount: %v, want EBUSY", err)
	}
	// An unmount does not wait out the delay: it finishes the queue.
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	if got := f.cat("b"); string(got) != "queued across a remount" {
		t.Fatalf("b after the next mount: %q", got)
	}
	if e := f.entry("b"); e.Mode != 0o600 {
		t.Fatalf("b's mode %o", e.Mode)
	}
	if records, _ = queueRecords(t, filepath.Join(f.cache, "*", "queue")); len(records) != 0 {
		t.Fatalf("queue records left: %v", records)
	}
}

// TestPageCacheNotStale: the kernel keeps its page cache of a file across
// opens of the same copy, but never serves a new version from pages an
// older copy's descriptor read in meanwhile.
func TestPageCacheNotStale(t *testing.T) {
	f := newFixture(t, mount.Options{})
	v1, v2 := bytes.Repeat([]byte("1"), 64<<10), bytes.Repeat([]byte("2"), 64<<10)
	f.put("p", v1)
	f.waitWatched(f.entry("p").Rev)
	r1, err := os.Open(f.path("p"))
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	buf := make([]byte, len(v1))
	if _, rerr := r1.ReadAt(buf, 0); rerr != nil || !bytes.Equal(buf, v1) {
		t.Fatalf("r1 reads v1: %v", rerr)
	}
	f.put("p", v2)
	f.waitWatched(f.entry("p").Rev)
	if !bytes.Equal(f.readMount("p"), v2) {
		t.Fatal("the open after the commit does not read v2")
	}
	// Drop the page cache, let the old descriptor read v1's bytes back
	// into it, close it: the next open must still read v2.
	r2, err := os.Open(f.path("p"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(r2.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	r2.Close()
	if _, err := r1.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	r1.Close()
	for range 2 {
		if got := f.readMount("p"); !bytes.Equal(got, v2) {
			t.Fatalf("an open after an old descriptor's reads got %q...", got[:8])
		}
	}
}

// TestPageCacheAfterWrite: what a program wrote and closed is read back
// from the kernel's page cache (the pages it cached as they were written),
// not through the mount, unless another copy was opened meanwhile; a new
// version from elsewhere is never served from those pages. With
// passthrough (the default where the kernel offers it), the kernel reads
// the copy itself: the mount is asked no read at all, and the new version
// is still what a new open reads.
func TestPageCacheAfterWrite(t *testing.T) {
	for _, pt := range []mount.Passthrough{mount.PassthroughOff, mount.PassthroughAuto} {
		t.Run("passthrough="+pt.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Passthrough: pt})
			on := mount.PassthroughOn(f.m)
			if pt == mount.PassthroughAuto && !on {
				t.Skip("passthrough not available here (kernel < 6.9 or not root)")
			}
			data := randBytes(1 << 20)
			if err := os.WriteFile(f.path("w"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			// Once the kernel has released the written copy, the next open gets
			// a fresh copy of the committed version from the disk cache.
			for deadline := time.Now().Add(10 * time.Second); mount.OpenCopies(f.m) != 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the written copy is still open 10 s after its close")
				}
			}
			reads := mount.ReadCalls(f.m)
			if got := f.readMount("w"); !bytes.Equal(got, data) {
				t.Fatal("read after write differs")
			}
			if n := mount.ReadCalls(f.m) - reads; n != 0 {
				t.Errorf("reading back what was just written asked the mount %d reads, want 0 (page cache)", n)
			}
			v2 := randBytes(1 << 20)
			f.put("w", v2)
			f.waitWatched(f.entry("w").Rev)
			reads = mount.ReadCalls(f.m)
			if got := f.readMount("w"); !bytes.Equal(got, v2) {
				t.Fatal("an open after another writer's commit does not read its version")
			}
			switch n := mount.ReadCalls(f.m) - reads; {
			case on && n != 0:
				t.Errorf("passthrough: the mount was asked %d reads, want 0", n)
			case !on && n == 0:
				t.Error("the new version was served from the old version's pages")
			}
			if on {
				if n := mount.WriteCalls(f.m); n != 0 {
					t.Errorf("passthrough: the mount was asked %d writes, want 0", n)
				}
			}
		})
	}
}

// TestQuietWatchNotTrusted: the entry cache is trusted only while the
// watch has answered recently (the window bound when a watch stalls
// without failing): past it, an open asks etcd again.
func TestQuietWatchNotTrusted(t *testing.T) {
	f := newFixture(t, mount.Options{AttrTimeout: mount.NoAttrCache})
	if err := os.WriteFile(f.path("s"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Trusted 200 ms after the watch's last word, and never asked for
	// progress: the watch falls quiet as a stalled one would.
	mount.SetWatchTiming(f.m, 200*time.Millisecond, time.Hour)
	mount.BreakWatch(f.m)() // a new watch, with that timing
	f.readMount("s")        // cached again (the new watch emptied the cache)
	deadline := time.Now().Add(10 * time.Second)
	for seen := false; ; {
		_, trusted := mount.WatchState(f.m)
		seen = seen || trusted
		if seen && !trusted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the entry cache did not fall from trust (trusted once: %v)", seen)
		}
		time.Sleep(5 * time.Millisecond)
	}
	rpcs := f.rpcs.Load()
	if got := f.readMount("s"); string(got) != "v1" {
		t.Fatalf("open with a quiet watch read %q", got)
	}
	if f.rpcs.Load() == rpcs {
		t.Fatal("an open with a quiet watch asked etcd nothing")
	}
}

// TestQueuedAcrossRemountFollowsPlacement: a commit queued in non-blocking
// mode and finished by the next mount is written through the placement
// policy of the file's path, as the mount that queued it would have. Its
// record had no path, and the commit went to the volume's own stores
// whatever the policy. A record of version 1 (no path) is still read and
// committed, where the volume writes.
func TestQueuedAcrossRemountFollowsPlacement(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, mount.Options{Mode: mount.NonBlocking})
	if err := os.Mkdir(f.path("placed"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Unmounted with the store unreachable: both commits stay queued.
	f.st.fail.Store(true)
	for _, name := range []string{"placed/new", "placed/old"} {
		if err := os.WriteFile(f.path(name), []byte("queued: "+name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	f.m.Wait()
	f.st.fail.Store(false)
	records, qdir := queueRecords(t, filepath.Join(f.cache, "*", "queue"))
	if len(records) != 2 {
		t.Fatalf("queue records after the unmount: %q", records)
	}
	// The records as files of an older cairn (queue version 4), moved into
	// the journal by the next mount; placed/old's as a mount before
	// version 2 wrote it.
	toRecordFiles(t, qdir, func(rec map[string]any) {
		if rec["name"] == "old" {
			rec["v"] = 1
			delete(rec, "path")
		}
	})
	// The policy of /placed: a store of its own.
	svc, mv, _ := f.openMeta(meta.Options{})
	placedStore := memstore.New()
	placed, err := fs.Open(svc, mv, f.master, placedStore, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { placed.Close() })
	var asked sync.Map
	f.vol.SetPlacement(func(ctx context.Context, path string) (*fs.Volume, error) {
		asked.Store(path, true)
		if strings.HasPrefix(path, "/placed/") {
			return placed, nil
		}
		return nil, nil
	})
	defer f.vol.SetPlacement(nil)
	f.start(mount.Options{Mode: mount.NonBlocking})
	// Moved into the journal at the mount: no record file is left.
	if old, _ := filepath.Glob(filepath.Join(qdir, "*.json")); len(old) != 0 {
		t.Fatalf("record files of the older format left after the mount: %v", old)
	}
	f.waitPending(20 * time.Second)
	if recs, _ := queueRecords(t, qdir); len(recs) != 0 {
		t.Fatalf("queue records left after the queue ran: %q", recs)
	}
	for _, name := range []string{"placed/new", "placed/old"} {
		if got := string(f.readMount(name)); got != "queued: "+name {
			t.Fatalf("%s after the next mount: %q", name, got)
		}
	}
	// The new record's commit is read back from the policy's store alone,
	// the old one's from the volume's.
	var b bytes.Buffer
	if err := placed.ReadFile(ctx, f.entry("placed/new"), nil, &b); err != nil || b.String() != "queued: placed/new" {
		t.Fatalf("placed/new from the store of its placement policy: %q, %v (placement asked for %v)", b.String(), err, keys(&asked))
	}
	b.Reset()
	if err := f.vol.ReadFile(ctx, f.entry("placed/old"), nil, &b); err != nil || b.String() != "queued: placed/old" {
		t.Fatalf("placed/old (a version 1 record) from the volume's store: %q, %v", b.String(), err)
	}
}

func keys(m *sync.Map) []any {
	var ks []any
	m.Range(func(k, _ any) bool { ks = append(ks, k); return true })
	return ks
}

// queueRecords returns the queued commits' records (JSON) in the queue
// journals of the directories glob matches, and the last such directory.
func queueRecords(t *testing.T, glob string) ([][]byte, string) {
	t.Helper()
	dirs, _ := filepath.Glob(glob)
	var recs [][]byte
	var last string
	for _, d := range dirs {
		rs, err := journal.Read(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			recs = append(recs, r.Payload)
		}
		last = d
	}
	return recs, last
}

// toRecordFiles turns the queue journal in dir into the record files of
// queue version 4 and before (queue/<seq>.json), as an older cairn left
// them, each first passed through edit.
func toRecordFiles(t *testing.T, dir string, edit func(rec map[string]any)) {
	t.Helper()
	recs, err := journal.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		var rec map[string]any
		d := json.NewDecoder(bytes.NewReader(r.Payload))
		d.UseNumber() // inode numbers do not fit a float64
		if derr := d.Decode(&rec); derr != nil {
			t.Fatal(derr)
		}
		rec["v"] = 4
		edit(rec)
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		seq, _ := rec["seq"].(json.Number).Int64()
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%016x.json", seq)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.jnl"))
	for _, s := range segs {
		os.Remove(s)
	}
}
