package mount_test

// An fsx-style model test (issue 4, item 5): a long seeded random
// sequence of operations on files of the mount, run in lockstep on a
// directory on local disk; every result (bytes read, counts, sizes,
// errors, directory listings) must be the same on both.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/mount"
)

var (
	fsxSeed   = flag.Uint64("fsx.seed", 0, "TestFSX: seed of the operations (0: from the clock, printed; env CAIRN_FSX_SEED)")
	fsxOps    = flag.Int("fsx.ops", 0, "TestFSX: operations per run (default 300; env CAIRN_FSX_OPS; a long run: 20000)")
	fsxMaxLen = flag.Int("fsx.maxlen", 0, "TestFSX: largest file size in bytes (default 256 KiB; env CAIRN_FSX_MAXLEN)")
	fsxVerbos = flag.Bool("fsx.verbose", false, "TestFSX: log every operation")
	fsxModes  = flag.String("fsx.modes", "", "TestFSX: mount modes to run, comma-separated (default blocking,writeback; env CAIRN_FSX_MODES; blocking,nonblocking,writeback)")
)

// fsxParam is a flag's value, else the environment variable's, else def.
func fsxParam[T uint64 | int](t *testing.T, flagVal T, env string, def T) T {
	t.Helper()
	if flagVal != 0 {
		return flagVal
	}
	if s := os.Getenv(env); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", env, s, err)
		}
		return T(v)
	}
	return def
}

// fsxPaths are the names the operations use: files in the root and in a
// subdirectory, so renames cross directories too.
var fsxPaths = []string{"a", "b", "c", "d/e", "d/f"}

// fsxHandle is one file opened on both sides: the same open of the same
// file, at the same path (empty once the file was removed or renamed over
// while open: the descriptor still works, on the unnamed file).
type fsxHandle struct {
	mnt, loc *os.File
	path     string
	flags    int
	id       int
}

func (h *fsxHandle) String() string {
	p := h.path
	if p == "" {
		p = "(removed)"
	}
	return fmt.Sprintf("fd%d[%s %s]", h.id, p, fsxFlags(h.flags))
}

func fsxFlags(fl int) string {
	var s []string
	switch fl & syscall.O_ACCMODE {
	case os.O_RDONLY:
		s = append(s, "RDONLY")
	case os.O_WRONLY:
		s = append(s, "WRONLY")
	default:
		s = append(s, "RDWR")
	}
	for _, x := range []struct {
		f int
		n string
	}{{os.O_CREATE, "CREAT"}, {os.O_TRUNC, "TRUNC"}, {os.O_APPEND, "APPEND"}, {os.O_EXCL, "EXCL"}} {
		if fl&x.f != 0 {
			s = append(s, x.n)
		}
	}
	return strings.Join(s, "|")
}

// errnoOf reduces an error to what the two sides must agree on.
func errnoOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, io.EOF):
		return "EOF"
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en.Error()
	}
	return "error: " + err.Error()
}

type fsx struct {
	t       *testing.T
	f       *fixture
	mopts   mount.Options
	loc     string // the model: a directory on local disk
	r       *rand.Rand
	seed    uint64
	ops     int
	maxLen  int
	i       int      // operation being run
	op      string   // and what it is
	recent  []string // the last operations, for the failure message
	handles []*fsxHandle
	nextID  int
	counts  map[string]int
	buf     []byte
}

func (x *fsx) mp(p string) string { return filepath.Join(x.f.mnt, p) }
func (x *fsx) lp(p string) string { return filepath.Join(x.loc, p) }

// fail reports a divergence: the operation, its index, the seed, and how
// to run the same sequence again.
func (x *fsx) fail(format string, args ...any) {
	x.t.Helper()
	x.t.Fatalf("fsx: operation %d of %d, %s: %s\nseed %d; the operations before it:\n  %s\nreplay: go test ./internal/mount -run 'TestFSX' -v -fsx.seed=%d -fsx.ops=%d -fsx.maxlen=%d",
		x.i, x.ops, x.op, fmt.Sprintf(format, args...), x.seed, strings.Join(x.recent, "\n  "), x.seed, x.ops, x.maxLen)
}

// same fails unless the two sides' errors agree.
func (x *fsx) same(what string, em, el error) {
	x.t.Helper()
	if a, b := errnoOf(em), errnoOf(el); a != b {
		x.fail("%s: %s on the mount, %s on local disk", what, a, b)
	}
}

func (x *fsx) logOp(op string) {
	x.op = op
	x.counts[strings.Fields(op)[0]]++
	x.recent = append(x.recent, fmt.Sprintf("%d: %s", x.i, op))
	if len(x.recent) > 40 {
		x.recent = x.recent[1:]
	}
	if *fsxVerbos {
		x.t.Logf("%d: %s", x.i, op)
	}
}

func (x *fsx) randPath() string { return fsxPaths[x.r.IntN(len(fsxPaths))] }

// existing returns a path that exists on local disk, or "".
func (x *fsx) existing() string {
	var ps []string
	for _, p := range fsxPaths {
		if _, err := os.Lstat(x.lp(p)); err == nil {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return ""
	}
	return ps[x.r.IntN(len(ps))]
}

func (x *fsx) handle() *fsxHandle {
	if len(x.handles) == 0 {
		return nil
	}
	return x.handles[x.r.IntN(len(x.handles))]
}

// writable returns an open handle that may write, or nil.
func (x *fsx) writable() *fsxHandle {
	var hs []*fsxHandle
	for _, h := range x.handles {
		if h.flags&syscall.O_ACCMODE != os.O_RDONLY {
			hs = append(hs, h)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return hs[x.r.IntN(len(hs))]
}

// size is the model's size of h's file.
func (x *fsx) size(h *fsxHandle) int64 {
	fi, err := h.loc.Stat()
	if err != nil {
		x.fail("fstat on local disk: %v", err)
	}
	return fi.Size()
}

// randLen is a write or read length: mostly small, sometimes up to a
// quarter of the largest file, a few exactly 1 MiB-aligned large ones.
func (x *fsx) randLen() int {
	switch k := x.r.IntN(10); {
	case k < 6:
		return 1 + x.r.IntN(4096)
	case k < 9:
		return 1 + x.r.IntN(max(1, x.maxLen/4))
	default:
		return 1 + x.r.IntN(x.maxLen)
	}
}

// randOff is an offset: anywhere in the file or a little past its end,
// often at the end, never making a file longer than maxLen.
func (x *fsx) randOff(size int64, n int) int64 {
	limit := int64(x.maxLen - n)
	var off int64
	switch x.r.IntN(4) {
	case 0:
		off = size // append
	case 1:
		off = size + int64(x.r.IntN(8192)) // a hole
	default:
		off = x.r.Int64N(size + 1)
	}
	return max(0, min(off, limit))
}

func (x *fsx) open(p string, flags int) {
	x.logOp(fmt.Sprintf("open %s %s", p, fsxFlags(flags)))
	mf, em := os.OpenFile(x.mp(p), flags, 0o644)
	lf, el := os.OpenFile(x.lp(p), flags, 0o644)
	x.same("open", em, el)
	if em != nil {
		return
	}
	x.nextID++
	x.handles = append(x.handles, &fsxHandle{mnt: mf, loc: lf, path: p, flags: flags, id: x.nextID})
}

func (x *fsx) close(h *fsxHandle) {
	x.logOp(fmt.Sprintf("close %v", h))
	em, el := h.mnt.Close(), h.loc.Close()
	x.handles = slices.DeleteFunc(x.handles, func(o *fsxHandle) bool { return o == h })
	x.same("close", em, el)
	if h.path != "" {
		x.compareFile(h.path)
	}
}

func (x *fsx) write(h *fsxHandle) {
	n := x.randLen()
	size := x.size(h)
	off := x.randOff(size, n)
	if h.flags&os.O_APPEND != 0 {
		n = max(1, min(n, x.maxLen-int(size)))
	}
	data := x.buf[:n]
	for i := range data {
		data[i] = byte(x.r.Uint32())
	}
	if h.flags&os.O_APPEND != 0 {
		// pwrite on an O_APPEND descriptor is refused by Go (it would
		// append anyway on Linux): write at the end.
		x.logOp(fmt.Sprintf("append %v len %d", h, n))
		km, em := h.mnt.Write(data)
		kl, el := h.loc.Write(data)
		x.same("append", em, el)
		if km != kl {
			x.fail("append wrote %d bytes on the mount, %d on local disk", km, kl)
		}
		return
	}
	x.logOp(fmt.Sprintf("write %v off %d len %d", h, off, n))
	km, em := h.mnt.WriteAt(data, off)
	kl, el := h.loc.WriteAt(data, off)
	x.same("write", em, el)
	if km != kl {
		x.fail("wrote %d bytes on the mount, %d on local disk", km, kl)
	}
}

func (x *fsx) read(h *fsxHandle) {
	size := x.size(h)
	n := x.randLen()
	off := x.r.Int64N(size + 1 + 100)
	if x.r.IntN(3) == 0 && size > 0 {
		off = max(0, size-int64(x.r.IntN(100))) // across the end
	}
	x.logOp(fmt.Sprintf("read %v off %d len %d (size %d)", h, off, n, size))
	bm, bl := make([]byte, n), make([]byte, n)
	km, em := h.mnt.ReadAt(bm, off)
	kl, el := h.loc.ReadAt(bl, off)
	x.same("read", em, el)
	if km != kl {
		x.fail("read %d bytes on the mount, %d on local disk", km, kl)
	}
	if i := firstDiff(bm[:km], bl[:kl]); i >= 0 {
		x.fail("read: byte %d (file offset %d) is %#x on the mount, %#x on local disk", i, off+int64(i), bm[i], bl[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func (x *fsx) ftruncate(h *fsxHandle) {
	size := x.r.Int64N(int64(x.maxLen) + 1)
	if x.r.IntN(3) == 0 {
		size = x.size(h) / 2 // shrink
	}
	x.logOp(fmt.Sprintf("ftruncate %v to %d (from %d)", h, size, x.size(h)))
	x.same("ftruncate", h.mnt.Truncate(size), h.loc.Truncate(size))
}

func (x *fsx) truncate(p string) {
	size := x.r.Int64N(int64(x.maxLen) + 1)
	x.logOp(fmt.Sprintf("truncate %s to %d", p, size))
	x.same("truncate", os.Truncate(x.mp(p), size), os.Truncate(x.lp(p), size))
}

func (x *fsx) fsync(h *fsxHandle) {
	x.logOp(fmt.Sprintf("fsync %v", h))
	x.same("fsync", h.mnt.Sync(), h.loc.Sync())
}

func (x *fsx) fstat(h *fsxHandle) {
	x.logOp(fmt.Sprintf("fstat %v", h))
	fm, em := h.mnt.Stat()
	fl, el := h.loc.Stat()
	x.same("fstat", em, el)
	if em == nil && fm.Size() != fl.Size() {
		x.fail("fstat size %d on the mount, %d on local disk", fm.Size(), fl.Size())
	}
}

// chmod changes the mode of h's file on its descriptor, or of a random
// path (on a file open for writing, the mount holds it for the commit at
// close: a later stat must show it all the same).
func (x *fsx) chmod(h *fsxHandle) {
	mode := []os.FileMode{0o600, 0o640, 0o644, 0o664}[x.r.IntN(4)]
	if x.r.IntN(2) == 0 {
		x.logOp(fmt.Sprintf("fchmod %v %v", h, mode))
		x.same("fchmod", h.mnt.Chmod(mode), h.loc.Chmod(mode))
		return
	}
	p := x.randPath()
	x.logOp(fmt.Sprintf("chmod %s %v", p, mode))
	x.same("chmod", os.Chmod(x.mp(p), mode), os.Chmod(x.lp(p), mode))
}

func (x *fsx) stat(p string) {
	x.logOp(fmt.Sprintf("stat %s", p))
	fm, em := os.Lstat(x.mp(p))
	fl, el := os.Lstat(x.lp(p))
	x.same("stat", em, el)
	if em == nil && (fm.Size() != fl.Size() || fm.Mode() != fl.Mode()) {
		x.fail("stat: size %d mode %v on the mount, size %d mode %v on local disk", fm.Size(), fm.Mode(), fl.Size(), fl.Mode())
	}
}

func (x *fsx) rename(from, to string) {
	x.logOp(fmt.Sprintf("rename %s %s", from, to))
	em := os.Rename(x.mp(from), x.mp(to))
	el := os.Rename(x.lp(from), x.lp(to))
	x.same("rename", em, el)
	if el != nil || from == to {
		return
	}
	for _, h := range x.handles {
		switch h.path {
		case to:
			h.path = "" // replaced: still open, no longer named
		case from:
			h.path = to
		}
	}
}

func (x *fsx) unlink(p string) {
	x.logOp(fmt.Sprintf("unlink %s", p))
	em, el := os.Remove(x.mp(p)), os.Remove(x.lp(p))
	x.same("unlink", em, el)
	if el != nil {
		return
	}
	for _, h := range x.handles {
		if h.path == p {
			h.path = ""
		}
	}
}

// compareFile reads p whole through a new descriptor on each side.
func (x *fsx) compareFile(p string) {
	x.t.Helper()
	bm, em := os.ReadFile(x.mp(p))
	bl, el := os.ReadFile(x.lp(p))
	x.same("read whole "+p, em, el)
	if i := firstDiff(bm, bl); i >= 0 {
		x.fail("%s read whole: %d bytes on the mount, %d on local disk, first difference at offset %d", p, len(bm), len(bl), i)
	}
}

// secondWrite opens p a second time (while another descriptor may have
// it open), writes through it and closes it.
func (x *fsx) secondWrite(p string) {
	n := x.randLen()
	fi, err := os.Stat(x.lp(p))
	if err != nil {
		return
	}
	off := x.randOff(fi.Size(), n)
	x.logOp(fmt.Sprintf("second-fd-write %s off %d len %d", p, off, n))
	data := x.buf[:n]
	for i := range data {
		data[i] = byte(x.r.Uint32())
	}
	for _, side := range []string{x.mp(p), x.lp(p)} {
		g, err := os.OpenFile(side, os.O_WRONLY, 0)
		if err != nil {
			x.fail("open a second descriptor on %s: %v", side, err)
		}
		if k, err := g.WriteAt(data, off); err != nil || k != n {
			g.Close()
			x.fail("write through a second descriptor on %s: %d, %v", side, k, err)
		}
		if err := g.Close(); err != nil {
			x.fail("close of a second descriptor on %s: %v", side, err)
		}
	}
}

func (x *fsx) readdir() {
	x.logOp("readdir")
	for _, d := range []string{".", "d"} {
		names := func(dir string) string {
			ents, err := os.ReadDir(dir)
			if err != nil {
				x.fail("readdir %s: %v", dir, err)
			}
			var s []string
			for _, e := range ents {
				s = append(s, e.Name())
			}
			return strings.Join(s, " ")
		}
		if a, b := names(x.mp(d)), names(x.lp(d)); a != b {
			x.fail("directory %s holds [%s] on the mount, [%s] on local disk", d, a, b)
		}
	}
}

// remount closes every descriptor, unmounts and mounts again, then
// compares every file.
func (x *fsx) remount() {
	for len(x.handles) > 0 {
		x.close(x.handles[0])
	}
	x.logOp("remount")
	x.f.mountAgain(x.mopts)
	for _, p := range fsxPaths {
		x.compareFile(p)
	}
	x.readdir()
}

// step runs one random operation.
func (x *fsx) step() {
	h := x.handle()
	switch k := x.r.IntN(100); {
	case k < 10 || h == nil && k < 60:
		if len(x.handles) >= 4 {
			x.close(x.handles[x.r.IntN(len(x.handles))])
			return
		}
		flags := []int{os.O_RDWR, os.O_RDWR | os.O_CREATE, os.O_RDWR | os.O_CREATE, os.O_RDWR | os.O_CREATE | os.O_TRUNC,
			os.O_WRONLY | os.O_CREATE, os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREATE, os.O_RDWR | os.O_CREATE | os.O_EXCL}
		x.open(x.randPath(), flags[x.r.IntN(len(flags))])
	case h == nil:
		x.stat(x.randPath())
	case k < 35:
		if w := x.writable(); w != nil {
			x.write(w)
		} else {
			x.read(h)
		}
	case k < 55:
		if h.flags&syscall.O_ACCMODE == os.O_WRONLY {
			x.fstat(h)
			return
		}
		x.read(h)
	case k < 62:
		if w := x.writable(); w != nil {
			x.ftruncate(w)
		}
	case k < 64:
		if p := x.existing(); p != "" {
			x.truncate(p)
		}
	case k < 68:
		x.fsync(h)
	case k < 75:
		x.close(h)
	case k < 78:
		x.fstat(h)
	case k < 80:
		x.chmod(h)
	case k < 84:
		x.rename(x.randPath(), x.randPath())
	case k < 86:
		x.unlink(x.randPath())
	case k < 90:
		if p := x.existing(); p != "" {
			x.logOp("read-whole " + p)
			x.compareFile(p)
		}
	case k < 93:
		if p := x.existing(); p != "" {
			x.secondWrite(p)
		}
	case k < 96:
		x.stat(x.randPath())
	case k < 99:
		x.readdir()
	default:
		x.remount()
	}
}

// TestFSX runs a random sequence of operations (fsx.ops, default 300) on
// the mount and on local disk in lockstep. Every divergence fails naming
// the operation, its index and the seed. A long run:
//
//	go test ./internal/mount -run TestFSX -v -timeout 2h -fsx.ops=20000
//
// Blocking and write-back modes run by default; non-blocking only when
// asked for (-fsx.modes=nonblocking).
// Before commits were ordered with renames (node.placeMu) and left
// attributes set after the close alone (KeepAttrs), 6 runs in 20 of 1,000
// operations diverged; after, about 1 in 40 (seed 1166302: 8 runs in 60),
// when an entry read before a queued commit ended was taken as current
// after it (node.wrote, TestQueuedCommitEndsDuringRead). Since that fix:
// 180 runs of random seeds and 140 of seed 1166302 with 1,000 operations,
// and 11 with 20,000, agree with local disk.
func TestFSX(t *testing.T) {
	seed := fsxParam(t, *fsxSeed, "CAIRN_FSX_SEED", uint64(time.Now().UnixNano()))
	ops := fsxParam(t, *fsxOps, "CAIRN_FSX_OPS", 300)
	maxLen := fsxParam(t, *fsxMaxLen, "CAIRN_FSX_MAXLEN", 256<<10)
	modes := *fsxModes
	if modes == "" {
		modes = os.Getenv("CAIRN_FSX_MODES")
	}
	if modes == "" {
		modes = "blocking,writeback"
	}
	for _, mode := range []struct {
		name string
		m    mount.Mode
	}{{"blocking", mount.Blocking}, {"nonblocking", mount.NonBlocking}, {"writeback", mount.WriteBack}} {
		t.Run(mode.name, func(t *testing.T) {
			if !slices.Contains(strings.Split(modes, ","), mode.name) {
				t.Skipf("not asked for: -fsx.modes=%s (or CAIRN_FSX_MODES) runs it", mode.name)
			}
			o := mount.Options{Mode: mode.m}
			f := newFixture(t, o)
			x := &fsx{t: t, f: f, mopts: o, loc: t.TempDir(), r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
				seed: seed, ops: ops, maxLen: maxLen, counts: map[string]int{}, buf: make([]byte, maxLen)}
			t.Logf("seed %d, %d operations, files up to %d bytes (replay: -fsx.seed=%d)", seed, ops, maxLen, seed)
			for _, d := range []string{x.mp("d"), x.lp("d")} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				for _, h := range x.handles {
					h.mnt.Close()
					h.loc.Close()
				}
			})
			start := time.Now()
			for x.i = 0; x.i < ops; x.i++ {
				if x.i == ops/2 {
					x.remount() // at least one in every run
					continue
				}
				x.step()
			}
			x.i = ops
			x.remount()
			var bytesM int64
			for _, p := range fsxPaths {
				if fi, err := os.Stat(x.lp(p)); err == nil {
					bytesM += fi.Size()
				}
			}
			keys := make([]string, 0, len(x.counts))
			for k := range x.counts {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var b bytes.Buffer
			for _, k := range keys {
				fmt.Fprintf(&b, " %s=%d", k, x.counts[k])
			}
			t.Logf("%d operations in %v, no divergence; %d bytes in the files at the end; ops:%s", ops, time.Since(start).Round(time.Millisecond), bytesM, b.String())
		})
	}
}

// Divergences TestFSX found, kept as plain tests.

// TestRenamedWhileWritingThenRecreated: a file renamed (or removed) while
// open for writing leaves its name free for a new file at once, as on a
// local disk: a log rotated under a writer, then made again. The writer
// lock is by name, and a rename or removal kept it at the old one (the
// new open waited a second and failed EBUSY, "open for writing on
// another device").
func TestRenamedWhileWritingThenRecreated(t *testing.T) {
	f := newFixture(t, mount.Options{})
	for _, how := range []string{"rename", "unlink"} {
		w, err := os.OpenFile(f.path("app.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if _, werr := w.WriteString("old log\n"); werr != nil {
			t.Fatal(werr)
		}
		if how == "rename" {
			err = os.Rename(f.path("app.log"), f.path("app.log.1"))
		} else {
			err = os.Remove(f.path("app.log"))
		}
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		g, err := os.OpenFile(f.path("app.log"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			t.Fatalf("after %s: a new file at the old name: %v (after %v)", how, err, time.Since(start))
		}
		defer g.Close()
		g.WriteString("new log\n")
		if err := g.Close(); err != nil {
			t.Fatalf("after %s: close of the new file: %v", how, err)
		}
		w.WriteString("more old\n")
		if err := w.Close(); err != nil {
			t.Fatalf("after %s: close of the old file: %v", how, err)
		}
		if got := string(f.cat("app.log")); got != "new log\n" {
			t.Fatalf("after %s: app.log holds %q", how, got)
		}
		if how == "rename" {
			if got := string(f.cat("app.log.1")); got != "old log\nmore old\n" {
				t.Fatalf("app.log.1 holds %q", got)
			}
		}
	}
}

// TestRemovedFileStillReadable: a descriptor open on a removed file reads
// what was written to it through another descriptor, also after that
// writer closed (its writes are dropped, not committed: the file has no
// name). The close dropped them from the size the mount reported, so
// reads past the old size ended early.
func TestRemovedFileStillReadable(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.NonBlocking} {
		f := newFixture(t, mount.Options{Mode: mode})
		if err := os.WriteFile(f.path("x"), []byte("0123456789"), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := os.Open(f.path("x"))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		w, err := os.OpenFile(f.path("x"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if rerr := os.Remove(f.path("x")); rerr != nil {
			t.Fatal(rerr)
		}
		if _, werr := w.WriteAt([]byte(" and more, written after the unlink"), 10); werr != nil {
			t.Fatal(werr)
		}
		if cerr := w.Close(); cerr != nil {
			t.Fatal(cerr)
		}
		const want = "0123456789 and more, written after the unlink"
		buf := make([]byte, 100)
		k, _ := r.ReadAt(buf, 0)
		fi, err := r.Stat()
		if string(buf[:k]) != want || err != nil || fi.Size() != int64(len(want)) {
			t.Fatalf("mode %v: the reader reads %q, fstat size %d (%v); want %q", mode, buf[:k], fi.Size(), err, want)
		}
		if _, err := os.Stat(f.path("x")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("mode %v: the removed file is back: %v", mode, err)
		}
	}
}

// TestRenameRacingCommits: renames and unlinks of a file that another
// device keeps committing succeed, as on a local disk. A commit that
// changed the entry between the rename's read and its compare-and-swap
// made it fail EBUSY ("changed concurrently; try again"); so did a
// commit queued by this mount in non-blocking mode (an editor's save
// failed at its rename).
func TestRenameRacingCommits(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("x"), []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // another device, committing x and y over and over
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx := context.Background()
			root, _ := f.vol.Meta.Root(ctx)
			open := func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(fmt.Sprint(i))), nil }
			f.vol.WriteFile(ctx, root, []string{"x", "y"}[i%2], open, fs.Attrs{Mode: 0o644, Mtime: time.Now()})
		}
	}()
	defer func() { close(stop); <-done }()
	for i := 0; i < 200; i++ {
		from, to := "x", "y"
		if i%2 == 1 {
			from, to = to, from
		}
		if err := os.Rename(f.path(from), f.path(to)); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("rename %d, %s over %s: %v", i, from, to, err)
		}
		if i%20 == 19 {
			if err := os.Remove(f.path(to)); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("unlink %d, %s: %v", i, to, err)
			}
		}
	}
}

// TestQueuedCommitEndsDuringRead: in non-blocking mode, a read of a
// file's entry that is on its way while the file's queued commit ends
// (asked before the commit, answered after it) gives the entry before the
// commit. Until the commit ends, the copy it commits vouches for the
// file's size and data; after, that old entry was taken as current: a
// stat showed the size before the close, and an open loaded the version
// before it (TestFSX in non-blocking mode: 8 runs in 60 of seed 1166302
// with 1,000 operations).
func TestQueuedCommitEndsDuringRead(t *testing.T) {
	const before, after = "old", "the new content, longer"
	for _, op := range []string{"fstat", "open"} {
		t.Run(op, func(t *testing.T) {
			o := mount.Options{Mode: mount.NonBlocking, QueueDelay: 200 * time.Millisecond, AttrTimeout: time.Minute}
			if op == "fstat" {
				o.AttrTimeout = mount.NoAttrCache // every fstat asks the mount
			}
			f := newFixture(t, o)
			if err := os.WriteFile(f.path("x"), []byte(before), 0o644); err != nil {
				t.Fatal(err)
			}
			f.waitPending(10 * time.Second)
			var r *os.File
			if op == "fstat" {
				var err error
				if r, err = os.Open(f.path("x")); err != nil {
					t.Fatal(err)
				}
				defer r.Close()
			}
			// Every read of an entry goes to etcd, where one can be held.
			resume := mount.BreakWatch(f.m)
			defer resume()
			if err := os.WriteFile(f.path("x"), []byte(after), 0o644); err != nil {
				t.Fatal(err)
			}
			if f.m.Pending() != 1 {
				t.Fatalf("%d commits pending after the close, want 1", f.m.Pending())
			}
			held, release := f.holdRequest("Range")
			type result struct {
				size int64
				data string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				if op == "fstat" {
					fi, err := r.Stat()
					if err != nil {
						done <- result{err: err}
						return
					}
					done <- result{size: fi.Size()}
					return
				}
				b, err := os.ReadFile(f.path("x"))
				done <- result{size: int64(len(b)), data: string(b), err: err}
			}()
			select {
			case <-held:
			case <-time.After(10 * time.Second):
				release()
				t.Fatal("the " + op + " read no entry")
			}
			f.waitPending(10 * time.Second) // the commit ends while the read is held
			release()
			res := <-done
			switch {
			case res.err != nil:
				t.Fatalf("%s: %v", op, res.err)
			case res.size != int64(len(after)):
				t.Fatalf("%s: size %d (data %q) after the queued commit of a close, want %d (%q)", op, res.size, res.data, len(after), after)
			case op == "open" && res.data != after:
				t.Fatalf("open: read %q after the queued commit of a close, want %q", res.data, after)
			}
		})
	}
}
