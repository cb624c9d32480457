package mount_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// offlineDevice mounts f's volume as device B whose link to etcd goes
// through a proxy the test cuts.
func (f *fixture) offlineDevice(o mount.Options) (*fixture, *etcdtest.CutProxy) {
	t := f.t
	t.Helper()
	p := etcdtest.NewCutProxy(t, f.etcd[0])
	cli, err := etcdtest.NewClient(p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	svc, err := meta.New(cli, meta.Options{OpTimeout: time.Second, LockTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	mv, err := svc.Open(context.Background(), "v")
	if err != nil {
		t.Fatal(err)
	}
	vol, err := fs.Open(svc, mv, f.master, f.st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	d := &fixture{t: t, st: f.st, vol: vol, mnt: t.TempDir(), cache: t.TempDir(), logs: &syncBuf{}, etcd: f.etcd, master: f.master}
	o.Device = "laptopB"
	d.start(o)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("device B's mount log:\n%s", d.logs.String())
		}
	})
	return d, p
}

func waitUntil(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOfflineWritesMount: device B's link to etcd is cut; on B's mount a
// create, a write, a truncate, a chmod, a utimes, a mkdir, a rename, an
// unlink, an rmdir and an editor's save (temporary file, fsync, rename
// over) are taken at once and read back there; A edits one of the same
// files meanwhile. Once the link is back, B's replay lands every change
// in the realm, and the file edited on both sides keeps A's version at
// its name and B's beside it (NAME.conflict-laptopB-...).
func TestOfflineWritesMount(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) { testOfflineWritesMount(t, mode) })
	}
}

func testOfflineWritesMount(t *testing.T, mode mount.Mode) {
	f := newFixture(t, mount.Options{Mode: mount.Blocking})
	for _, n := range []string{"a", "doc", "gone", "keep", "trunc"} {
		f.put(n, []byte("first "+n+"\n"))
	}
	if err := os.Mkdir(f.path("emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, proxy := f.offlineDevice(mount.Options{Mode: mode})
	if got := b.readMount("a"); string(got) != "first a\n" {
		t.Fatalf("b reads a: %q", got)
	}
	copyFile := filepath.Join(b.cache, "offline", b.vol.Meta.V.ID)
	waitUntil(t, "b's local copy saved", 20*time.Second, func() bool {
		c, err := os.ReadFile(copyFile)
		return err == nil && bytes.Contains(c, []byte(`"name":"emptydir"`))
	})

	proxy.Cut()
	// A request of B's finds the service gone (the watch's silence
	// would, after its trust period).
	b.vol.Meta.Get(context.Background(), meta.RootIno, "not-there")
	waitUntil(t, "b offline", 20*time.Second, func() bool {
		_, off := b.vol.Meta.Service().Offline()
		return off
	})
	t0 := time.Now()
	write := func(rel, s string) {
		t.Helper()
		if err := os.WriteFile(b.path(rel), []byte(s), 0o644); err != nil {
			t.Fatalf("offline write of %s: %v", rel, err)
		}
	}
	write("a", "b's a\n")
	write("new", "made offline\n")
	if err := os.Mkdir(b.path("d"), 0o755); err != nil {
		t.Fatalf("offline mkdir: %v", err)
	}
	write("d/f", "in d\n")
	if err := os.Truncate(b.path("trunc"), 3); err != nil {
		t.Fatalf("offline truncate: %v", err)
	}
	if err := os.Chmod(b.path("new"), 0o600); err != nil {
		t.Fatalf("offline chmod: %v", err)
	}
	mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(b.path("keep"), mt, mt); err != nil {
		t.Fatalf("offline utimes: %v", err)
	}
	if err := os.Rename(b.path("keep"), b.path("d/kept")); err != nil {
		t.Fatalf("offline rename: %v", err)
	}
	if err := os.Remove(b.path("gone")); err != nil {
		t.Fatalf("offline unlink: %v", err)
	}
	if err := os.Remove(b.path("emptydir")); err != nil {
		t.Fatalf("offline rmdir: %v", err)
	}
	// An editor's save.
	tmp, err := os.OpenFile(b.path(".doc.swp"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatalf("offline create of the temporary file: %v", err)
	}
	if _, err := tmp.WriteString("saved offline\n"); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Sync(); err != nil {
		t.Fatalf("offline fsync: %v", err)
	}
	tmp.Close()
	if err := os.Rename(b.path(".doc.swp"), b.path("doc")); err != nil {
		t.Fatalf("offline rename over: %v", err)
	}
	t.Logf("offline changes took %v", time.Since(t0))
	// B sees them at once.
	for rel, want := range map[string]string{"a": "b's a\n", "new": "made offline\n", "d/f": "in d\n", "trunc": "fir", "d/kept": "first keep\n", "doc": "saved offline\n"} {
		if got, err := os.ReadFile(b.path(rel)); err != nil || string(got) != want {
			t.Fatalf("offline read of %s: %q, %v", rel, got, err)
		}
	}
	for _, rel := range []string{"gone", "emptydir", "keep", ".doc.swp"} {
		if _, err := os.Lstat(b.path(rel)); !os.IsNotExist(err) {
			t.Fatalf("%s offline: %v", rel, err)
		}
	}
	if fi, err := os.Stat(b.path("new")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("offline chmod reads back %v, %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(b.path("d/kept")); err != nil || !fi.ModTime().Equal(mt) {
		t.Fatalf("offline utimes reads back %v, %v", fi.ModTime(), err)
	}
	if b.m.Status().Offline == nil {
		t.Fatal("b's status does not say offline")
	}

	// A, meanwhile.
	if err := os.WriteFile(f.path("a"), []byte("a's a\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	proxy.Restore()
	waitUntil(t, "b's replay", 30*time.Second, func() bool {
		return strings.Contains(b.logs.String(), "offline changes replayed")
	})
	if !strings.Contains(b.logs.String(), "the replay of offline changes made conflicts") {
		t.Fatal("b's log does not say the replay made conflicts")
	}
	// As A sees it.
	for rel, want := range map[string]string{"a": "a's a\n", "new": "made offline\n", "d/f": "in d\n", "trunc": "fir", "d/kept": "first keep\n", "doc": "saved offline\n"} {
		if got := f.cat(rel); string(got) != want {
			t.Fatalf("after the replay, %s holds %q, want %q", rel, got, want)
		}
	}
	if e := f.entry("new"); e.Mode&0o777 != 0o600 {
		t.Fatalf("new's mode after the replay: %o", e.Mode)
	}
	if e := f.entry("d/kept"); e.Mtime != mt.UnixNano() {
		t.Fatalf("kept's mtime after the replay: %v", time.Unix(0, e.Mtime))
	}
	for _, rel := range []string{"gone", "emptydir", "keep", ".doc.swp"} {
		if _, err := f.vol.Meta.Get(context.Background(), meta.RootIno, rel); err == nil {
			t.Fatalf("%s after the replay: still there", rel)
		}
	}
	cs, err := f.vol.Meta.Conflicts(context.Background())
	if err != nil || len(cs) != 1 || cs[0].Kind != meta.ConflictContent || cs[0].Path != "/a" {
		t.Fatalf("conflicts: %+v, %v", cs, err)
	}
	if !strings.HasPrefix(cs[0].CopyName, "a.conflict-laptopB-") {
		t.Fatalf("conflict copy %q", cs[0].CopyName)
	}
	if got := f.cat(cs[0].CopyName); string(got) != "b's a\n" {
		t.Fatalf("the conflict copy holds %q", got)
	}
}

// TestOfflineGit: git works on a mount whose link to etcd is cut: status,
// add and commit (git's objects: a temporary file, then a link or a
// rename: the link is refused offline, git renames), and once the link
// is back the other device's mount sees the commit and a clean tree.
func TestOfflineGit(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	f := newFixture(t, mount.Options{Mode: mount.Blocking})
	git := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(gitBin, append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "gc.auto=0", "-c", "core.fsmonitor=false"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v in %s: %v\n%s", args, dir, err, out)
		}
		return string(out)
	}
	repo := f.path("repo")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	git(repo, "init", "-q")
	if err := os.WriteFile(filepath.Join(repo, "README"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(repo, "add", "README")
	git(repo, "commit", "-q", "-m", "first")
	b, proxy := f.offlineDevice(mount.Options{Mode: mount.Blocking})
	brepo := b.path("repo")
	if got := git(brepo, "status", "--porcelain"); got != "" {
		t.Fatalf("git status online on b: %q", got)
	}
	copyFile := filepath.Join(b.cache, "offline", b.vol.Meta.V.ID)
	waitUntil(t, "b's local copy saved", 20*time.Second, func() bool {
		c, err := os.ReadFile(copyFile)
		return err == nil && bytes.Contains(c, []byte(`"name":"README"`))
	})
	proxy.Cut()
	b.vol.Meta.Get(context.Background(), meta.RootIno, "not-there")
	waitUntil(t, "b offline", 20*time.Second, func() bool {
		_, off := b.vol.Meta.Service().Offline()
		return off
	})
	if err := os.WriteFile(filepath.Join(brepo, "README"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := git(brepo, "status", "--porcelain"); got != " M README\n" {
		t.Fatalf("git status offline: %q", got)
	}
	git(brepo, "commit", "-q", "-a", "-m", "second, offline")
	if got := git(brepo, "status", "--porcelain"); got != "" {
		t.Fatalf("git status offline after the commit: %q", got)
	}
	proxy.Restore()
	waitUntil(t, "b's replay", 30*time.Second, func() bool {
		return strings.Contains(b.logs.String(), "offline changes replayed")
	})
	if strings.Contains(b.logs.String(), "made conflicts") {
		t.Fatalf("the replay made conflicts")
	}
	waitUntil(t, "a sees b's commit", 30*time.Second, func() bool {
		cmd := exec.Command(gitBin, "-C", repo, "log", "--format=%s")
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
		out, _ := cmd.CombinedOutput()
		return string(out) == "second, offline\nfirst\n"
	})
	if got := git(repo, "status", "--porcelain"); got != "" {
		t.Fatalf("git status on a after the replay: %q", got)
	}
}

// TestOfflineWriteLatency measures (CAIRN_TEST_OFFLINE_LATENCY=N files;
// not run otherwise) the time to write and close N small files on a
// blocking mount, online and then with its link to etcd cut.
func TestOfflineWriteLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CAIRN_TEST_OFFLINE_LATENCY"))
	if n <= 0 {
		t.Skip("set CAIRN_TEST_OFFLINE_LATENCY=N to measure")
	}
	f := newFixture(t, mount.Options{Mode: mount.Blocking})
	b, proxy := f.offlineDevice(mount.Options{Mode: mount.Blocking})
	if err := os.Mkdir(b.path("on"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b.path("off"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile := filepath.Join(b.cache, "offline", b.vol.Meta.V.ID)
	waitUntil(t, "b's local copy saved", 20*time.Second, func() bool {
		c, err := os.ReadFile(copyFile)
		return err == nil && bytes.Contains(c, []byte(`"name":"off"`))
	})
	run := func(dir string) time.Duration {
		t0 := time.Now()
		for i := 0; i < n; i++ {
			if err := os.WriteFile(b.path(fmt.Sprintf("%s/f%04d", dir, i)), []byte("some content\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(t0) / time.Duration(n)
	}
	on := run("on")
	proxy.Cut()
	b.vol.Meta.Get(context.Background(), meta.RootIno, "not-there")
	waitUntil(t, "b offline", 20*time.Second, func() bool {
		_, off := b.vol.Meta.Service().Offline()
		return off
	})
	off := run("off")
	t.Logf("%d files of 13 bytes, create+write+close each, blocking mode: online %v, offline %v", n, on, off)
}
