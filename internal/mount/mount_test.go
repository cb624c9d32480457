package mount_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/volkey"
)

// skipWithoutFUSE skips a test on a machine that cannot mount (CI runs as
// root with Debian's fuse3).
func skipWithoutFUSE(t *testing.T) {
	t.Helper()
	if err := mount.Available(); err != nil {
		t.Skip(err)
	}
}

// failStore is a memory store whose Puts fail while fail is set (a store
// that cannot be reached), and which counts its Gets.
type failStore struct {
	*memstore.Store
	fail atomic.Bool
	gets atomic.Int64
}

func (s *failStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if s.fail.Load() {
		return cairn.E("put", cairn.Unavailable, id.String(), errors.New("store unreachable (test)"))
	}
	return s.Store.Put(ctx, id, data)
}

func (s *failStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, id)
}

// countingClient is an etcd client of endpoints that counts its unary
// requests (reads, writes, transactions, lease grants; not the streams of
// watches and lease keep-alives).
func countingClient(t *testing.T, endpoints []string) (*clientv3.Client, *rpcCounter) {
	t.Helper()
	n := &rpcCounter{by: map[string]int64{}}
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.add(method)
		err := invoker(ctx, method, req, reply, cc, opts...)
		if h := n.after.Load(); h != nil {
			(*h)(ctx, method)
		}
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || !strings.HasSuffix(method, "/Watch") {
			return s, err
		}
		return &stalledStream{ClientStream: s, n: n}, nil
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count), grpc.WithChainStreamInterceptor(stream)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, n
}

// rpcCounter counts an etcd client's unary requests, in all and by gRPC
// method (its last element: Range, Txn, Put, DeleteRange, LeaseGrant, ...).
type rpcCounter struct {
	n  atomic.Int64
	mu sync.Mutex
	by map[string]int64
	// after, if set, runs when a request has its answer, before the
	// caller gets it (holdRequest).
	after atomic.Pointer[func(ctx context.Context, method string)]
	// stall, if set, holds what the client's watches receive until it is
	// closed (stallWatch).
	stall atomic.Pointer[chan struct{}]
}

// stalledStream is a watch stream of a countingClient.
type stalledStream struct {
	grpc.ClientStream
	n *rpcCounter
}

func (s *stalledStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if c := s.n.stall.Load(); c != nil {
		<-*c
	}
	return err
}

// stallWatch holds back what f's device hears from its watch until resume
// is called, as a slow network would: its entry cache is still trusted
// (for the few seconds of entries.go's watchTrust) but no longer current.
// Changes made by other devices meanwhile are not seen.
func (f *fixture) stallWatch() (resume func()) {
	c := make(chan struct{})
	f.rpcs.stall.Store(&c)
	var once sync.Once
	return func() {
		once.Do(func() {
			f.rpcs.stall.Store(nil)
			close(c)
		})
	}
}

// holdRequest makes the next etcd request of gRPC method (its last
// element: Range, Txn; "": any) that a request of the kernel makes
// through f's mount (a lookup, getattr, open, rename; not the queue's)
// wait with its answer in hand until release is called: a request on its
// way while something else changes what it answered. held is closed once
// one waits.
func (f *fixture) holdRequest(method string) (held <-chan struct{}, release func()) {
	h, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fn := func(ctx context.Context, m string) {
		if method != "" && m[strings.LastIndexByte(m, '/')+1:] != method {
			return
		}
		if _, ok := fuse.FromContext(ctx); !ok {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(h)
			<-rel
		}
	}
	f.rpcs.after.Store(&fn)
	return h, func() {
		f.rpcs.after.Store(nil)
		close(rel)
	}
}

func (c *rpcCounter) add(method string) {
	c.n.Add(1)
	c.mu.Lock()
	c.by[method[strings.LastIndexByte(method, '/')+1:]]++
	c.mu.Unlock()
}

// Load returns how many requests were made.
func (c *rpcCounter) Load() int64 { return c.n.Load() }

// snapshot returns the counts by method.
func (c *rpcCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int64, len(c.by))
	for k, v := range c.by {
		m[k] = v
	}
	return m
}

// syncBuf collects the mount's log; the test prints it when it fails.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every descriptor a test opens on the mount is closed by a defer: the
// test process serves the mount, and one left open when it exits hangs
// the exit (its close waits for a server that is gone).
type fixture struct {
	t     *testing.T
	st    *failStore
	vol   *fs.Volume
	m     *mount.Mount
	mnt   string
	cache string
	logs  *syncBuf

	etcd   []string      // the test etcd's endpoints
	master volkey.Master // the volume's key
	rpcs   *rpcCounter   // requests this device made to etcd
}

// newFixture mounts a fresh volume (embedded etcd, memory store) in a
// temporary directory, unmounted at cleanup.
func newFixture(t *testing.T, o mount.Options) *fixture {
	t.Helper()
	skipWithoutFUSE(t)
	ctx := context.Background()
	endpoints := etcdtest.New(t).Endpoints()
	cli, rpcs := countingClient(t, endpoints)
	svc, err := meta.New(cli, meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	// As realm.Init writes it: a special file raises its format.
	if ierr := svc.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); ierr != nil {
		t.Fatal(ierr)
	}
	master := keyring.NewMaster()
	if cerr := svc.CreateVolume(ctx, meta.Volume{Name: "v", KeyCheck: fs.KeyCheck(master), ChunkMin: 4096, ChunkAvg: 16384, ChunkMax: 131072,
		KeepVersions: 10, TrashTTL: time.Hour}, 0o755, uint32(os.Getuid()), uint32(os.Getgid())); cerr != nil {
		t.Fatal(cerr)
	}
	mv, err := svc.Open(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	st := &failStore{Store: memstore.New()}
	vol, err := fs.Open(svc, mv, master, st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	f := &fixture{t: t, st: st, vol: vol, mnt: t.TempDir(), cache: t.TempDir(), logs: &syncBuf{}, etcd: endpoints, master: master, rpcs: rpcs}
	o = suiteOptions(o)
	o.CacheDir = f.cache
	o.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := mount.Start(ctx, vol, f.mnt, o)
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
			// Detached; it serves on until the process exits.
			mount.Unmount(f.mnt, true)
		} else {
			m.Wait()
		}
		if t.Failed() {
			t.Logf("mount log:\n%s", f.logs.String())
		}
	})
	return f
}

func (f *fixture) path(rel string) string { return filepath.Join(f.mnt, rel) }

// mountAgain unmounts f's mount (every descriptor on it must be closed)
// and mounts the volume on the same directory, with the same cache, again.
func (f *fixture) mountAgain(o mount.Options) {
	f.t.Helper()
	if err := f.m.Unmount(); err != nil {
		f.t.Fatalf("unmount: %v", err)
	}
	f.m.Wait()
	f.start(o)
}

// start mounts f's volume on f.mnt with o (and f's cache and log),
// unmounted at cleanup.
func (f *fixture) start(o mount.Options) {
	f.t.Helper()
	o = suiteOptions(o)
	o.CacheDir = f.cache
	o.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := mount.Start(context.Background(), f.vol, f.mnt, o)
	if err != nil {
		f.t.Fatalf("mount: %v", err)
	}
	f.m = m
	f.t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			f.t.Errorf("unmount: %v", err)
			mount.Unmount(f.mnt, true)
		} else {
			m.Wait()
		}
	})
}

// device mounts f's volume as another device does: its own etcd client
// (its own lease, so its own writer locks), its own cache and mount
// point; the same store (the realm's, reachable from both).
func (f *fixture) device(o mount.Options, mo meta.Options) *fixture {
	t := f.t
	t.Helper()
	svc, mv, rpcs := f.openMeta(mo)
	vol, err := fs.Open(svc, mv, f.master, f.st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	d := &fixture{t: t, st: f.st, vol: vol, mnt: t.TempDir(), cache: t.TempDir(), logs: &syncBuf{}, etcd: f.etcd, master: f.master, rpcs: rpcs}
	d.start(o)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("second device's mount log:\n%s", d.logs.String())
		}
	})
	return d
}

// openMeta opens volume "v" of f's etcd through a new client of its own
// (counting its requests), as another process would.
func (f *fixture) openMeta(mo meta.Options) (*meta.Service, *meta.Vol, *rpcCounter) {
	t := f.t
	t.Helper()
	cli, rpcs := countingClient(t, f.etcd)
	svc, err := meta.New(cli, mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	mv, err := svc.Open(context.Background(), "v")
	if err != nil {
		t.Fatal(err)
	}
	return svc, mv, rpcs
}

// waitWatched waits until f's mount has seen every change up to rev
// through its watch (and trusts its entry cache).
func (f *fixture) waitWatched(rev int64) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, trusted := mount.WatchState(f.m)
		if got >= rev && trusted {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the mount's watch reached revision %d (trusted %v), not %d", got, trusted, rev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// entry reads rel's entry straight from the metadata, as another device would.
func (f *fixture) entry(rel string) *meta.Entry {
	f.t.Helper()
	var parts []string
	if rel != "" {
		parts = strings.Split(rel, "/")
	}
	e, err := f.vol.Meta.Lookup(context.Background(), parts)
	if err != nil {
		f.t.Fatalf("lookup %s in the metadata: %v", rel, err)
	}
	return e
}

// cat reads rel's current version through the file layer, not the mount.
func (f *fixture) cat(rel string) []byte {
	f.t.Helper()
	var b bytes.Buffer
	if err := f.vol.ReadFile(context.Background(), f.entry(rel), nil, &b); err != nil {
		f.t.Fatalf("read %s through fs: %v", rel, err)
	}
	return b.Bytes()
}

// put commits content as rel's new version through the file layer, as a
// writer on another device does.
func (f *fixture) put(rel string, content []byte) {
	f.t.Helper()
	ctx := context.Background()
	parts := strings.Split(rel, "/")
	dir, err := f.vol.Meta.Lookup(ctx, parts[:len(parts)-1])
	if err != nil {
		f.t.Fatal(err)
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(content)), nil }
	if _, _, err := f.vol.WriteFile(ctx, dir, parts[len(parts)-1], open, fs.Attrs{Mode: 0o644, Mtime: time.Now()}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) readMount(rel string) []byte {
	f.t.Helper()
	b, err := os.ReadFile(f.path(rel))
	if err != nil {
		f.t.Fatalf("read %s through the mount: %v", rel, err)
	}
	return b
}

// suiteOptions applies CAIRN_TEST_PASSTHROUGH=off (or 0): every mount
// of the suite without passthrough (the default is auto; tests of
// passthrough itself then skip).
func suiteOptions(o mount.Options) mount.Options {
	if v := os.Getenv("CAIRN_TEST_PASSTHROUGH"); v == "off" || v == "0" {
		o.Passthrough = mount.PassthroughOff
	}
	return o
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// dirNames lists a directory with getdents64 itself, so "." and ".."
// (which os.ReadDir hides) are seen too, with their inode numbers.
func dirNames(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 8192)
	for {
		n, err := syscall.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			ino := binary.LittleEndian.Uint64(b[0:8])
			reclen := binary.LittleEndian.Uint16(b[16:18])
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out[string(name)] = ino
			b = b[reclen:]
		}
	}
}

func TestWriteReadAndVersions(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("a.txt"), []byte("hello cairn\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got := f.readMount("a.txt"); string(got) != "hello cairn\n" {
		t.Fatalf("through the mount: %q", got)
	}
	// The close committed a version: the file layer reads it.
	e := f.entry("a.txt")
	if len(e.Versions) != 1 || e.Size != 12 || e.Mode != 0o640 || e.UID != uint32(os.Getuid()) {
		t.Fatalf("entry after the first close: %d versions, size %d, mode %o, uid %d", len(e.Versions), e.Size, e.Mode, e.UID)
	}
	if got := f.cat("a.txt"); string(got) != "hello cairn\n" {
		t.Fatalf("through fs: %q", got)
	}
	// stat shows the entry: its inode number, mode, size, times.
	var st syscall.Stat_t
	if err := syscall.Stat(f.path("a.txt"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino != e.Ino || st.Mode != syscall.S_IFREG|0o640 || st.Size != 12 || st.Nlink != 1 ||
		st.Mtim.Nano() != e.Mtime || st.Ctim.Nano() != e.Ctime || st.Uid != e.UID || st.Gid != e.GID {
		t.Fatalf("stat = ino %d mode %o size %d nlink %d mtime %d ctime %d; entry ino %d mtime %d ctime %d",
			st.Ino, st.Mode, st.Size, st.Nlink, st.Mtim.Nano(), st.Ctim.Nano(), e.Ino, e.Mtime, e.Ctime)
	}
	// Rewriting makes version 2; rewriting the same bytes adds none.
	if err := os.WriteFile(f.path("a.txt"), []byte("hello again\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path("a.txt"), []byte("hello again\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	e = f.entry("a.txt")
	if len(e.Versions) != 2 || string(f.cat("a.txt")) != "hello again\n" {
		t.Fatalf("after two rewrites: %d versions, content %q", len(e.Versions), f.cat("a.txt"))
	}
	// A file opened only for reading commits nothing at close.
	if _ = f.readMount("a.txt"); len(f.entry("a.txt").Versions) != 2 {
		t.Fatal("a read-only open added a version")
	}
	// An empty file created and closed exists, empty, without a version.
	if err := os.WriteFile(f.path("empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if e := f.entry("empty"); e.Size != 0 || e.Type != meta.TypeFile || len(f.readMount("empty")) != 0 {
		t.Fatalf("empty file: %+v", e)
	}
}

func TestNamespace(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.Mkdir(f.path("d"), 0o750); err != nil {
		t.Fatal(err)
	}
	if d := f.entry("d"); d.Type != meta.TypeDir || d.Mode != 0o750 {
		t.Fatalf("mkdir made %+v", d)
	}
	for _, n := range []string{"x", "y", "z"} {
		if err := os.WriteFile(f.path("d/"+n), []byte("file "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(f.path("d/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	// readdir: every entry with its cairn inode number, "." and "..".
	names := dirNames(t, f.path("d"))
	root, d := f.entry(""), f.entry("d")
	if root.Ino != meta.RootIno {
		t.Fatalf("root ino %d", root.Ino)
	}
	if len(names) != 6 || names["."] != d.Ino || names[".."] != meta.RootIno || names["x"] != f.entry("d/x").Ino || names["sub"] != f.entry("d/sub").Ino {
		t.Fatalf("readdir d = %v (d is %d)", names, d.Ino)
	}
	ents, err := os.ReadDir(f.path("d"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
		if e.IsDir() != (e.Name() == "sub") {
			t.Errorf("%s: IsDir %v", e.Name(), e.IsDir())
		}
	}
	sort.Strings(got)
	if strings.Join(got, " ") != "sub x y z" {
		t.Fatalf("os.ReadDir = %v", got)
	}
	// rename over an existing file: the target's content is replaced, the
	// source is gone, the replaced file's versions stay the name's
	// history (versions follow the path), nothing goes to the trash.
	xIno := f.entry("d/x").Ino
	if rerr := os.Rename(f.path("d/x"), f.path("d/y")); rerr != nil {
		t.Fatal(rerr)
	}
	if got := f.readMount("d/y"); string(got) != "file x" {
		t.Fatalf("after rename over y: %q", got)
	}
	if y := f.entry("d/y"); y.Ino != xIno || string(f.cat("d/y")) != "file x" {
		t.Fatalf("renamed entry ino %d content %q, want ino %d", y.Ino, f.cat("d/y"), xIno)
	}
	if _, serr := os.Stat(f.path("d/x")); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("source after rename: %v", serr)
	}
	trash, err := f.vol.Meta.Trash(context.Background())
	if err != nil || len(trash) != 0 {
		t.Fatalf("trash after rename over y: %+v, %v", trash, err)
	}
	if y := f.entry("d/y"); len(y.Versions) != 2 {
		t.Fatalf("d/y after the rename over it has %d versions, want y's and x's", len(y.Versions))
	}
	// rename into another directory, and of a directory.
	if rerr := os.Rename(f.path("d/z"), f.path("d/sub/z2")); rerr != nil {
		t.Fatal(rerr)
	}
	if rerr := os.Rename(f.path("d/sub"), f.path("sub2")); rerr != nil {
		t.Fatal(rerr)
	}
	if got := f.readMount("sub2/z2"); string(got) != "file z" || string(f.cat("sub2/z2")) != "file z" {
		t.Fatalf("after moves: %q", got)
	}
	// A file renamed while open for writing commits under its new name.
	w, err := os.Create(f.path("d/moving"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString("written before and after a rename")
	if err := os.Rename(f.path("d/moving"), f.path("sub2/moved")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("sub2/moved"); string(got) != "written before and after a rename" {
		t.Fatalf("renamed while open: %q", got)
	}
	// rmdir of a non-empty directory fails; unlink then rmdir works.
	if err := syscall.Rmdir(f.path("sub2")); err != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a non-empty directory: %v", err)
	}
	if err := syscall.Unlink(f.path("sub2")); err != syscall.EISDIR {
		t.Fatalf("unlink of a directory: %v", err)
	}
	if err := syscall.Rmdir(f.path("d/y")); err != syscall.ENOTDIR {
		t.Fatalf("rmdir of a file: %v", err)
	}
	for _, p := range []string{"sub2/z2", "sub2/moved"} {
		if err := os.Remove(f.path(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(f.path("sub2")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.vol.Meta.Lookup(context.Background(), []string{"sub2"}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("sub2 after rmdir: %v", err)
	}
	// symlink and readlink.
	if err := os.Symlink("d/y", f.path("link")); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(f.path("link")); err != nil || target != "d/y" {
		t.Fatalf("readlink = %q, %v", target, err)
	}
	if l := f.entry("link"); l.Type != meta.TypeSymlink || l.Target != "d/y" {
		t.Fatalf("symlink entry %+v", l)
	}
	if got := f.readMount("link"); string(got) != "file x" {
		t.Fatalf("read through the symlink: %q", got)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(f.path("link"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFLNK || st.Size != 3 {
		t.Fatalf("lstat link: mode %o size %d, %v", st.Mode, st.Size, err)
	}
	// A hard link of a symlink is refused cleanly (doc/posix.md; links
	// of regular files: links_test.go).
	if err := os.Link(f.path("link"), f.path("hard")); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("link of a symlink: %v, want EPERM", err)
	}
	// Existing names, O_EXCL, names cairn cannot store.
	if err := os.Mkdir(f.path("d"), 0o755); !errors.Is(err, os.ErrExist) {
		t.Fatalf("mkdir of an existing name: %v", err)
	}
	if g, err := os.OpenFile(f.path("d/y"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); !errors.Is(err, os.ErrExist) {
		if err == nil {
			g.Close()
		}
		t.Fatalf("O_EXCL on an existing file: %v", err)
	}
	if err := os.WriteFile(f.path("bad\xffname"), nil, 0o644); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("a name that is not UTF-8: %v", err)
	}
	// Special files are kept (TestSpecialFiles); their names are taken.
	if err := syscall.Mkfifo(f.path("fifo"), 0o644); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	if e := f.entry("fifo"); e.Type != meta.TypeFIFO {
		t.Fatalf("fifo's record: %+v", e)
	}
	if err := syscall.Mkfifo(f.path("fifo"), 0o644); err != syscall.EEXIST {
		t.Fatalf("mkfifo of an existing name: %v", err)
	}
}

func TestAttributes(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Until the kernel releases the writer (just after the close), a
	// chmod rides with the save of that release, not at once (heldAttrs).
	f.waitPending(10 * time.Second)
	if err := os.Chmod(f.path("f"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f.path("f"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	when := time.Date(2021, 3, 4, 5, 6, 7, 890, time.UTC)
	if err := os.Chtimes(f.path("f"), when, when); err != nil {
		t.Fatal(err)
	}
	e := f.entry("f")
	if e.Mode != 0o600 || e.UID != 1234 || e.GID != 5678 || e.Mtime != when.UnixNano() {
		t.Fatalf("after chmod, chown, utimes: mode %o uid %d gid %d mtime %v", e.Mode, e.UID, e.GID, time.Unix(0, e.Mtime))
	}
	fi, err := os.Stat(f.path("f"))
	if err != nil || fi.Mode() != 0o600 || !fi.ModTime().Equal(when) {
		t.Fatalf("stat: %v %v, %v", fi.Mode(), fi.ModTime(), err)
	}
	// A chmod while the file is open for writing survives its commit; an
	// mtime set on the descriptor before close (cp -p, tar) is the version's.
	w, err := os.OpenFile(f.path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.WriteString(" more")
	if err := os.Chmod(f.path("f"), 0o640); err != nil {
		t.Fatal(err)
	}
	later := when.Add(time.Hour)
	if err := os.Chtimes(f.path("f"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	e = f.entry("f")
	if e.Mode != 0o640 || e.Mtime != later.UnixNano() || e.Current().Mtime != later.UnixNano() || string(f.cat("f")) != "data more" {
		t.Fatalf("after writing with a chmod and utimes while open: mode %o mtime %v content %q", e.Mode, time.Unix(0, e.Mtime), f.cat("f"))
	}
	// Set on the descriptor of a file open for writing (what tar does),
	// they are this mount's at once and the metadata's with the commit at
	// close, in its transaction; with nothing written, the close writes
	// them alone.
	for _, write := range []bool{true, false} {
		w, err := os.OpenFile(f.path("f"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if write {
			w.WriteString("!")
		}
		mode, at := os.FileMode(0o604), when.Add(2*time.Hour)
		if !write {
			mode, at = 0o664, when.Add(3*time.Hour)
		}
		if err := w.Chmod(mode); err != nil {
			t.Fatal(err)
		}
		if err := w.Chown(4321, 8765); err != nil {
			t.Fatal(err)
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", w.Fd()),
			[]unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(at.UnixNano())}, 0); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(w.Fd()), &st); err != nil || st.Mode&07777 != uint32(mode) || st.Uid != 4321 || st.Gid != 8765 || st.Mtim.Nano() != at.UnixNano() {
			t.Fatalf("fstat while open (wrote %v): mode %o uid %d gid %d mtime %v, %v", write, st.Mode&07777, st.Uid, st.Gid, time.Unix(0, st.Mtim.Nano()), err)
		}
		if err := unix.Stat(f.path("f"), &st); err != nil || st.Mode&07777 != uint32(mode) || st.Uid != 4321 {
			t.Fatalf("stat by path while open (wrote %v): mode %o uid %d, %v", write, st.Mode&07777, st.Uid, err)
		}
		if e := f.entry("f"); e.Mode == uint32(mode) || e.Mtime == at.UnixNano() {
			t.Fatalf("the metadata has the attributes before the close (wrote %v): mode %o mtime %v", write, e.Mode, time.Unix(0, e.Mtime))
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		e := f.entry("f")
		if e.Mode != uint32(mode) || e.UID != 4321 || e.GID != 8765 || e.Mtime != at.UnixNano() {
			t.Fatalf("after the close (wrote %v): mode %o uid %d gid %d mtime %v", write, e.Mode, e.UID, e.GID, time.Unix(0, e.Mtime))
		}
		if want := "data more!"; string(f.cat("f")) != want {
			t.Fatalf("content %q, want %q", f.cat("f"), want)
		}
	}
	// Directory attributes.
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if d := f.entry("d"); d.Mode != 0o700 {
		t.Fatalf("dir mode %o", d.Mode)
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(f.mnt, &sfs); err != nil || sfs.Blocks == 0 || sfs.Bsize == 0 || sfs.Namelen != 255 {
		t.Fatalf("statfs: %+v, %v", sfs, err)
	}
}

func TestTruncateAppend(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("t"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	// truncate(2) by path commits at once.
	if err := os.Truncate(f.path("t"), 4); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("t"); string(got) != "0123" {
		t.Fatalf("after truncate to 4: %q", got)
	}
	if err := os.Truncate(f.path("t"), 6); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("t"); string(got) != "0123\x00\x00" || string(f.readMount("t")) != "0123\x00\x00" {
		t.Fatalf("after truncate to 6: %q", got)
	}
	if err := os.Truncate(f.path("t"), 0); err != nil {
		t.Fatal(err)
	}
	if e := f.entry("t"); e.Size != 0 || len(f.cat("t")) != 0 {
		t.Fatalf("after truncate to 0: size %d", e.Size)
	}
	// O_APPEND writes at the end, whatever the offset.
	os.WriteFile(f.path("log"), []byte("one\n"), 0o644)
	for _, line := range []string{"two\n", "three\n"} {
		a, err := os.OpenFile(f.path("log"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if _, err := a.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.cat("log"); string(got) != "one\ntwo\nthree\n" {
		t.Fatalf("after appends: %q", got)
	}
	// ftruncate and writes on one descriptor, seen by another before close;
	// fstat shows the size not yet committed; fsync keeps it local.
	w, err := os.OpenFile(f.path("log"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if terr := w.Truncate(3); terr != nil {
		t.Fatal(terr)
	}
	if _, werr := w.WriteAt([]byte("+tail"), 3); werr != nil {
		t.Fatal(werr)
	}
	if serr := w.Sync(); serr != nil {
		t.Fatal(serr)
	}
	if fi, serr := w.Stat(); serr != nil || fi.Size() != 8 {
		t.Fatalf("fstat while dirty: %v, %v", fi.Size(), serr)
	}
	if got := f.readMount("log"); string(got) != "one+tail" {
		t.Fatalf("another open before close sees %q", got)
	}
	if got := f.cat("log"); string(got) != "one\ntwo\nthree\n" {
		t.Fatalf("committed before close: %q", got)
	}
	if cerr := w.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if got := f.cat("log"); string(got) != "one+tail" {
		t.Fatalf("after close: %q", got)
	}
	// O_TRUNC on open.
	tr, err := os.OpenFile(f.path("log"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.WriteString("new")
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if got := f.cat("log"); string(got) != "new" {
		t.Fatalf("after O_TRUNC: %q", got)
	}
}

func TestLargeFile(t *testing.T) {
	f := newFixture(t, mount.Options{})
	data := randBytes(5 << 20)
	if err := os.WriteFile(f.path("big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if e := f.entry("big"); e.Size != int64(len(data)) || e.Current().Chunks < 10 {
		t.Fatalf("entry: size %d, %d chunks", e.Size, e.Current().Chunks)
	}
	if !bytes.Equal(f.cat("big"), data) {
		t.Fatal("5 MB file differs through fs")
	}
	if !bytes.Equal(f.readMount("big"), data) {
		t.Fatal("5 MB file differs through the mount")
	}
	r, err := os.Open(f.path("big"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 100000)
	for _, off := range []int64{0, 1, 3 << 20, int64(len(data)) - 100000} {
		if _, rerr := r.ReadAt(buf, off); rerr != nil || !bytes.Equal(buf, data[off:off+100000]) {
			t.Fatalf("ReadAt %d: %v", off, rerr)
		}
	}
	// Overwrite a range in the middle: one new version, the rest deduplicated.
	w, err := os.OpenFile(f.path("big"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	patch := randBytes(1000)
	if _, err := w.WriteAt(patch, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	copy(data[2<<20:], patch)
	if !bytes.Equal(f.cat("big"), data) || len(f.entry("big").Versions) != 2 {
		t.Fatal("patched file differs")
	}
}

// TestCloseToOpen: a version committed elsewhere (straight through the
// file layer, as another device would) is what the next open reads once
// the mount's watch has reported the commit (entries.go: the window),
// even while the kernel still caches the old attributes.
func TestCloseToOpen(t *testing.T) {
	f := newFixture(t, mount.Options{AttrTimeout: time.Minute})
	put := func(content string) {
		t.Helper()
		f.put("shared", []byte(content))
		f.waitWatched(f.entry("shared").Rev)
	}
	put("v1")
	if got := f.readMount("shared"); string(got) != "v1" {
		t.Fatalf("first read %q", got)
	}
	put("version two, longer")
	if got := f.readMount("shared"); string(got) != "version two, longer" {
		t.Fatalf("open after a commit elsewhere read %q", got)
	}
	// A descriptor open meanwhile does not hold the new version back.
	r, err := os.Open(f.path("shared"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	put("three")
	if got := f.readMount("shared"); string(got) != "three" {
		t.Fatalf("open after the third commit read %q", got)
	}
}

// TestCommitFailureReported: a close whose commit fails (the store cannot
// be reached) returns the error; the previous version stays current, and
// the copy with the writes is kept on disk and logged.
func TestCommitFailureReported(t *testing.T) {
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("f"), []byte("committed"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(f.path("f"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString("new content the store never gets"); err != nil {
		t.Fatal(err)
	}
	f.st.fail.Store(true)
	if err := w.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close with the store unreachable = %v, want EIO", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(f.logs.String(), "kept the unsaved content") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the kept copy:\n%s", f.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.st.fail.Store(false)
	if e := f.entry("f"); len(e.Versions) != 1 || string(f.cat("f")) != "committed" {
		t.Fatalf("after the failed commit: %d versions, %q", len(e.Versions), f.cat("f"))
	}
	kept, _ := filepath.Glob(filepath.Join(f.cache, "*", "unsaved", "*"))
	if len(kept) != 1 {
		t.Fatalf("kept copies: %v", kept)
	}
	if b, _ := os.ReadFile(kept[0]); string(b) != "new content the store never gets" {
		t.Fatalf("kept copy holds %q", b)
	}
}

func TestRepairAndMountChecks(t *testing.T) {
	skipWithoutFUSE(t)
	dir := t.TempDir()
	if repaired, err := mount.Repair(dir); repaired || err != nil {
		t.Fatalf("Repair of a plain directory = %v, %v", repaired, err)
	}
	if mounted, err := mount.IsMounted(dir); mounted || err != nil {
		t.Fatalf("IsMounted of a plain directory = %v, %v", mounted, err)
	}
	if err := mount.Unmount(dir, false); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Unmount of a plain directory = %v, want NotFound", err)
	}
	f := newFixture(t, mount.Options{})
	if mounted, err := mount.IsMounted(f.mnt); !mounted || err != nil {
		t.Fatalf("IsMounted of the mount = %v, %v", mounted, err)
	}
	// A second mount on a live one is refused.
	if _, err := mount.Start(context.Background(), f.vol, f.mnt, mount.Options{CacheDir: t.TempDir()}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("second mount = %v, want Exist", err)
	}
	// Unmount while a file is open: busy.
	r, err := os.Create(f.path("open"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := f.m.Unmount(); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("unmount with an open file = %v, want Conflict", err)
	}
	r.Close()
}

// TestXattrs: user.* attributes through the real system calls, kept in
// the metadata (another device sees them) and following a rename; other
// namespaces are not supported; the flags and short buffers give what
// Linux file systems give.
func TestXattrs(t *testing.T) {
	f := newFixture(t, mount.Options{})
	p := f.path("x")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.comment", []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.empty", nil, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(p, "user.comment", buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("getxattr = %q, %v", buf[:n], err)
	}
	if n, err := unix.Getxattr(p, "user.empty", buf); err != nil || n != 0 {
		t.Fatalf("getxattr of an empty value = %d, %v", n, err)
	}
	// Size query (empty buffer) and a buffer too short.
	if n, err := unix.Getxattr(p, "user.comment", nil); err != nil || n != 5 {
		t.Fatalf("size query = %d, %v", n, err)
	}
	if _, err := unix.Getxattr(p, "user.comment", make([]byte, 2)); err != unix.ERANGE {
		t.Fatalf("short buffer: %v, want ERANGE", err)
	}
	if _, err := unix.Getxattr(p, "user.missing", buf); err != unix.ENODATA {
		t.Fatalf("missing attribute: %v, want ENODATA", err)
	}
	// The metadata holds them: another device reads them by inode.
	if v, err := f.vol.Meta.Xattr(context.Background(), f.entry("x").Ino, "user.comment"); err != nil || string(v) != "hello" {
		t.Fatalf("in the metadata: %q, %v", v, err)
	}
	// Flags.
	if err := unix.Setxattr(p, "user.comment", []byte("x"), unix.XATTR_CREATE); err != unix.EEXIST {
		t.Fatalf("XATTR_CREATE on an existing attribute: %v, want EEXIST", err)
	}
	if err := unix.Setxattr(p, "user.new", []byte("x"), unix.XATTR_REPLACE); err != unix.ENODATA {
		t.Fatalf("XATTR_REPLACE on a missing attribute: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(p, "user.comment", []byte("replaced"), unix.XATTR_REPLACE); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p, "user.new", []byte("created"), unix.XATTR_CREATE); err != nil {
		t.Fatal(err)
	}
	// A value of Linux's largest size round-trips.
	big := randBytes(64 << 10)
	if err := unix.Setxattr(p, "user.big", big, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64<<10)
	if n, err := unix.Getxattr(p, "user.big", got); err != nil || !bytes.Equal(got[:n], big) {
		t.Fatalf("64 KiB value: %d bytes, %v", n, err)
	}
	// List: sorted user.* names, NUL-terminated; size query; ERANGE.
	want := "user.big\x00user.comment\x00user.empty\x00user.new\x00"
	if n, err := unix.Listxattr(p, nil); err != nil || n != len(want) {
		t.Fatalf("listxattr size = %d, %v", n, err)
	}
	lb := make([]byte, 256)
	if n, err := unix.Listxattr(p, lb); err != nil || string(lb[:n]) != want {
		t.Fatalf("listxattr = %q, %v", lb[:n], err)
	}
	if _, err := unix.Listxattr(p, make([]byte, 3)); err != unix.ERANGE {
		t.Fatalf("listxattr into a short buffer: %v, want ERANGE", err)
	}
	// Remove.
	if err := unix.Removexattr(p, "user.new"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Removexattr(p, "user.new"); err != unix.ENODATA {
		t.Fatalf("second removexattr: %v, want ENODATA", err)
	}
	// Other namespaces are not supported.
	for _, name := range []string{"trusted.x", "security.selinux", "os2.x"} {
		if err := unix.Setxattr(p, name, []byte("v"), 0); err != unix.EOPNOTSUPP {
			t.Errorf("setxattr %s: %v, want EOPNOTSUPP", name, err)
		}
	}
	if _, err := unix.Getxattr(p, "trusted.x", buf); err != unix.EOPNOTSUPP {
		t.Errorf("getxattr trusted.x: %v, want EOPNOTSUPP", err)
	}
	// They follow the file through a rename and survive a rewrite; a
	// directory has its own.
	if err := os.Rename(p, f.path("y")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.path("y"), []byte("new content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Getxattr(f.path("y"), "user.comment", buf); err != nil || string(buf[:n]) != "replaced" {
		t.Fatalf("after rename and rewrite: %q, %v", buf[:n], err)
	}
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f.path("d"), "user.dir", []byte("on a directory"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Listxattr(f.path("d"), lb); err != nil || string(lb[:n]) != "user.dir\x00" {
		t.Fatalf("directory's list = %q, %v", lb[:n], err)
	}
}
