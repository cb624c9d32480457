package mount_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// opRequests are the etcd requests one operation on the mount made, by
// gRPC method.
type opRequests map[string]int64

func (r opRequests) total() int64 {
	var n int64
	for _, v := range r {
		n += v
	}
	return n
}

func (r opRequests) String() string {
	var ks []string
	for k := range r {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	fmt.Fprintf(&b, "%d", r.total())
	for _, k := range ks {
		fmt.Fprintf(&b, " %s=%d", k, r[k])
	}
	return b.String()
}

// measure runs op on f's mount once the mount's watch has caught up with
// etcd and returns the etcd requests the mount made for it, counted once
// the kernel has released every handle (a release may make requests).
func (f *fixture) measure(op func()) opRequests {
	f.t.Helper()
	cli, err := etcdtest.NewClient(f.etcd...)
	if err != nil {
		f.t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(context.Background(), "\x00")
	if err != nil {
		f.t.Fatal(err)
	}
	f.waitWatched(resp.Header.Revision)
	before := f.rpcs.snapshot()
	op()
	f.waitClosed(0)
	after := f.rpcs.snapshot()
	d := opRequests{}
	for k, v := range after {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	return d
}

// TestRequestsPerOperation counts the etcd requests (reads, writes,
// transactions) the mount makes for each namespace operation of a small
// file's life, and for what tar does per file (create, write, futimens,
// fchown, fchmod on the descriptor, close), checking them against what
// the design needs: a new file written and closed is one transaction for
// the create and its writer lock, and one for the commit (which releases
// the lock); attributes set on a file open for writing ride with the
// commit; the lookup before a create, in a directory this mount made, asks
// nothing (TestCompleteDirectory).
func TestRequestsPerOperation(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := randBytes(4096)
	uid, gid := os.Getuid(), os.Getgid()
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	write := func(name string, tar bool) {
		fd, err := unix.Open(f.path(name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
		check(err)
		_, err = unix.Write(fd, data)
		if err == nil && tar {
			ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime.UnixNano())}
			err = unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), ts, 0)
			if err == nil {
				err = unix.Fchown(fd, uid, gid)
			}
			if err == nil {
				err = unix.Fchmod(fd, 0o640)
			}
		}
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		check(err)
	}
	type result struct {
		op  string
		req opRequests
		max int64 // the most requests the op may make
	}
	var results []result
	run := func(op string, max int64, fn func()) {
		results = append(results, result{op, f.measure(fn), max})
	}
	// The first commit reads the GC generation and the first lock grants
	// the mount's lease: once per mount, not counted.
	write("d/warm", false)
	run("create+close (empty)", 2, func() {
		fd, err := unix.Open(f.path("d/empty"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		check(err)
		check(unix.Close(fd))
	})
	run("create+write 4 KiB+close", 2, func() { write("d/a", false) })
	run("tar: create+write+futimens+fchown+fchmod+close", 2, func() { write("d/t", true) })
	run("chmod (closed file)", 1, func() { check(os.Chmod(f.path("d/a"), 0o640)) })
	run("utimens (closed file)", 1, func() { check(os.Chtimes(f.path("d/a"), mtime, mtime)) })
	// A read, not a write: the entry cache may not have heard of a
	// chown made elsewhere (TestSetattrOnStaleEntry).
	run("chown, same owner (closed file)", 1, func() { check(os.Chown(f.path("d/a"), uid, gid)) })
	run("mkdir", 1, func() { check(os.Mkdir(f.path("d/sub"), 0o755)) })
	run("rename to a new name", 1, func() { check(os.Rename(f.path("d/a"), f.path("d/b"))) })
	run("rename over a file", 2, func() { check(os.Rename(f.path("d/b"), f.path("d/t"))) })
	run("rewrite an existing file (O_TRUNC)", 4, func() { check(os.WriteFile(f.path("d/t"), data[:100], 0o644)) })
	run("unlink", 1, func() { check(os.Remove(f.path("d/t"))) })
	for _, r := range results {
		t.Logf("%-50s %s", r.op, r.req)
	}
	for _, r := range results {
		if n := r.req.total(); n > r.max {
			t.Errorf("%s made %d etcd requests (%s), want at most %d", r.op, n, r.req, r.max)
		}
	}
}

// TestCompleteDirectory: in a directory this mount made (or listed
// whole), a name it does not know is absent without asking etcd, and
// what another device creates or removes there is seen once the watch
// has reported it; a directory listed while it changes is not taken for
// complete.
func TestCompleteDirectory(t *testing.T) {
	f := newFixture(t, mount.Options{AttrTimeout: mount.NoAttrCache})
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	absent := func(rel string) {
		t.Helper()
		if _, err := os.Lstat(f.path(rel)); !os.IsNotExist(err) {
			t.Fatalf("lstat %s: %v, want not found", rel, err)
		}
	}
	if r := f.measure(func() { absent("d/x") }); r.total() != 0 {
		t.Fatalf("the lookup of an absent name in a directory this mount made asked etcd: %s", r)
	}
	// Made elsewhere (not through this mount): seen once watched.
	f.put("d/x", []byte("x"))
	if r := f.measure(func() {
		if b, err := os.ReadFile(f.path("d/x")); err != nil || string(b) != "x" {
			t.Fatalf("read of a file made elsewhere in a complete directory: %q, %v", b, err)
		}
	}); r.total() != 0 {
		t.Fatalf("reading it asked etcd: %s", r)
	}
	ctx := context.Background()
	d := f.entry("d")
	if _, err := f.vol.Meta.Remove(ctx, d, "x", "v:/d/x", false); err != nil {
		t.Fatal(err)
	}
	f.measure(func() { absent("d/x") })

	// A directory made elsewhere becomes complete when listed.
	if _, err := f.vol.Meta.Create(ctx, d, meta.Entry{Name: "e", Type: meta.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	e := f.entry("d/e")
	if _, err := f.vol.Meta.Create(ctx, e, meta.Entry{Name: "y", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if r := f.measure(func() { absent("d/e/z") }); r.total() == 0 {
		t.Fatal("a directory made elsewhere and never listed was taken for complete")
	}
	f.measure(func() {
		if names := dirNames(t, f.path("d/e")); len(names) != 3 || names["y"] == 0 {
			t.Fatalf("listed %v", names)
		}
	})
	if r := f.measure(func() { absent("d/e/z") }); r.total() != 0 {
		t.Fatalf("the lookup of an absent name in a listed directory asked etcd: %s", r)
	}
	if _, err := os.Lstat(f.path("d/e/y")); err != nil {
		t.Fatal(err)
	}
	// A rename out of it makes this mount ask again (the change might
	// have failed); the names are right either way.
	if err := os.Rename(f.path("d/e/y"), f.path("d/y")); err != nil {
		t.Fatal(err)
	}
	absent("d/e/y")
	if _, err := os.Lstat(f.path("d/y")); err != nil {
		t.Fatal(err)
	}
}

// logRequests logs the etcd requests f's mount made since before, in all
// and per file of a tree of files.
func (f *fixture) logRequests(what string, before map[string]int64, files int) {
	f.t.Helper()
	d := opRequests{}
	for k, v := range f.rpcs.snapshot() {
		if v -= before[k]; v != 0 {
			d[k] = v
		}
	}
	f.t.Logf("%s of %d files: %s etcd requests, %.2f per file", what, files, d, float64(d.total())/float64(files))
}

// countFiles counts the regular files and symlinks below dir.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
