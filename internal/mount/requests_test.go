package mount_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
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
// commit.
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
	run("create+close (empty)", 3, func() {
		fd, err := unix.Open(f.path("d/empty"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		check(err)
		check(unix.Close(fd))
	})
	run("create+write 4 KiB+close", 3, func() { write("d/a", false) })
	run("tar: create+write+futimens+fchown+fchmod+close", 3, func() { write("d/t", true) })
	run("chmod (closed file)", 1, func() { check(os.Chmod(f.path("d/a"), 0o600)) })
	run("utimens (closed file)", 1, func() { check(os.Chtimes(f.path("d/a"), mtime, mtime)) })
	run("chown, same owner (closed file)", 1, func() { check(os.Chown(f.path("d/a"), uid, gid)) })
	run("mkdir", 2, func() { check(os.Mkdir(f.path("d/sub"), 0o755)) })
	run("rename to a new name", 5, func() { check(os.Rename(f.path("d/a"), f.path("d/b"))) })
	run("rename over a file", 3, func() { check(os.Rename(f.path("d/b"), f.path("d/t"))) })
	run("rewrite an existing file (O_TRUNC)", 4, func() { check(os.WriteFile(f.path("d/t"), data[:100], 0o644)) })
	run("unlink", 2, func() { check(os.Remove(f.path("d/t"))) })
	for _, r := range results {
		t.Logf("%-50s %s", r.op, r.req)
	}
	for _, r := range results {
		if n := r.req.total(); n > r.max {
			t.Errorf("%s made %d etcd requests (%s), want at most %d", r.op, n, r.req, r.max)
		}
	}
}
