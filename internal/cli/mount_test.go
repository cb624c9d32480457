package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/mount"
)

// skipWithoutFUSE skips a test on a machine that cannot mount (CI runs as
// root with Debian's fuse3).
func skipWithoutFUSE(t *testing.T) {
	t.Helper()
	if err := mount.Available(); err != nil {
		t.Skip(err)
	}
}

// mountPoint makes an empty directory that is unmounted (lazily, whatever
// state it is in) before the test's temporary directories are removed.
func mountPoint(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounted, _ := mount.IsMounted(dir); mounted {
			t.Errorf("%s still mounted at the end of the test", dir)
			exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
	})
	return dir
}

// waitFor polls cond every 10 ms until it holds or within passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isMounted(dir string) bool {
	m, _ := mount.IsMounted(dir)
	return m
}

// foreground starts 'cairn mount --foreground --mode blocking' and waits
// until it serves: most tests here check what a close commits at once,
// which is blocking mode's promise (the default, write-back, is
// TestMountDefaultWriteBack's).
func (r *realmT) foreground(dir string) (*exec.Cmd, *proc, *outBuf) {
	r.t.Helper()
	return r.foregroundWith(dir, nil, "--mode", "blocking")
}

// foregroundWith is foreground with more environment and flags.
func (r *realmT) foregroundWith(dir string, env []string, flags ...string) (*exec.Cmd, *proc, *outBuf) {
	r.t.Helper()
	cmd := r.command(append(append([]string{"mount", "--foreground"}, flags...), "home", dir)...)
	cmd.Env = append(append([]string{}, r.env...), env...)
	var out outBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &proc{done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	waitFor(r.t, "mount --foreground serving", 20*time.Second, func() bool {
		select {
		case <-p.done:
			r.t.Fatalf("mount --foreground exited early: %v\n%s", p.err, out.String())
		default:
		}
		return isMounted(dir)
	})
	return cmd, p, &out
}

// outBuf collects a running command's output; the test may read it
// while the command writes.
type outBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *outBuf) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *outBuf) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// proc is a started command: done is closed when it has exited with err.
type proc struct {
	done chan struct{}
	err  error
}

func waitExit(t *testing.T, p *proc, out *outBuf) {
	t.Helper()
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("mount exited with %v\n%s", p.err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("mount did not exit\n%s", out.String())
	}
}

// TestMount: the real command line, each command its own process. A
// foreground mount serves files that 'cairn cat' reads as new versions
// after each close, and what 'cairn put' commits is what the next open
// through the mount reads; 'cairn umount' and SIGTERM end it cleanly. A
// background mount killed with SIGKILL leaves the mount point broken
// (ENOTCONN) until the next 'cairn mount' repairs it.
func TestMount(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	mnt := mountPoint(t)

	_, exited, out := r.foreground(mnt)
	if err := os.WriteFile(filepath.Join(mnt, "a.txt"), []byte("written through the mount\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.ok("cat", "home:/a.txt"); got != "written through the mount\n" {
		t.Fatalf("cairn cat after close: %q", got)
	}
	if err := os.MkdirAll(filepath.Join(mnt, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "a.txt"), filepath.Join(mnt, "d", "e", "b.txt")); err != nil {
		t.Fatal(err)
	}
	if got := r.ok("ls", "home:/d/e"); got != "b.txt\n" {
		t.Fatalf("cairn ls after mkdir and rename on the mount: %q", got)
	}
	src := filepath.Join(t.TempDir(), "put.txt")
	writeFile(t, src, []byte("committed by cairn put\n"), 0o600)
	r.ok("put", src, "home:/d")
	if got := mustRead(t, filepath.Join(mnt, "d", "put.txt")); string(got) != "committed by cairn put\n" {
		t.Fatalf("read through the mount after put: %q", got)
	}
	writeFile(t, src, []byte("second version, by put\n"), 0o600)
	r.ok("put", src, "home:/d")
	if got := mustRead(t, filepath.Join(mnt, "d", "put.txt")); string(got) != "second version, by put\n" {
		t.Fatalf("read through the mount after a second put: %q", got)
	}
	r.ok("umount", mnt)
	waitExit(t, exited, out)
	if isMounted(mnt) {
		t.Fatal("still mounted after umount")
	}
	if !strings.Contains(out.String(), "mounted home at "+mnt) {
		t.Fatalf("mount --foreground said: %s", out.String())
	}

	// SIGTERM unmounts and exits 0.
	cmd, exited, out := r.foreground(mnt)
	if got := mustRead(t, filepath.Join(mnt, "d", "e", "b.txt")); string(got) != "written through the mount\n" {
		t.Fatalf("second mount reads %q", got)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	waitExit(t, exited, out)
	if isMounted(mnt) || !strings.Contains(out.String(), "unmounted "+mnt) {
		t.Fatalf("after SIGTERM: mounted %v, output %s", isMounted(mnt), out.String())
	}

	// Background mount (the default), killed: the next mount repairs.
	res := r.run("mount", "--mode", "blocking", "home", mnt)
	if res.code != 0 {
		t.Fatalf("background mount: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	m := regexp.MustCompile(`; pid (\d+),`).FindStringSubmatch(res.stdout)
	if m == nil || !isMounted(mnt) {
		t.Fatalf("background mount printed %q; mounted %v", res.stdout, isMounted(mnt))
	}
	var pid int
	fmt.Sscan(m[1], &pid)
	if got := mustRead(t, filepath.Join(mnt, "d", "put.txt")); string(got) != "second version, by put\n" {
		t.Fatalf("background mount reads %q", got)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed mount leaves ENOTCONN", 10*time.Second, func() bool {
		_, err := os.Stat(mnt)
		return errors.Is(err, syscall.ENOTCONN)
	})
	res = r.run("mount", "--mode", "blocking", "home", mnt)
	if res.code != 0 || !strings.Contains(res.stderr, "repaired "+mnt) {
		t.Fatalf("mount after a kill: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	m = regexp.MustCompile(`; pid (\d+),`).FindStringSubmatch(res.stdout)
	fmt.Sscan(m[1], &pid)
	if err := os.WriteFile(filepath.Join(mnt, "after-repair"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.ok("cat", "home:/after-repair"); got != "ok" {
		t.Fatalf("cat after repair: %q", got)
	}
	// A second mount on a live one is refused.
	r.fails(8, "mount", "home", mnt)
	r.ok("umount", mnt)
	waitFor(t, "the background mount exits after umount", 20*time.Second, func() bool {
		return syscall.Kill(pid, 0) == syscall.ESRCH
	})
	if isMounted(mnt) {
		t.Fatal("still mounted after umount")
	}

	// Mistakes are reported by 'cairn mount' itself, with their exit codes.
	r.fails(3, "mount", "nosuchvolume", mnt)
	r.fails(3, "mount", "home", filepath.Join(mnt, "missing"))
	r.fails(2, "mount", "home:/d", mnt)
	r.fails(3, "umount", mnt)
}

// queueRecords lists the queued commits of the realm's mounts.
func queueRecords(t *testing.T, home string) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(home, "mountcache", "*", "queue"))
	if err != nil {
		t.Fatal(err)
	}
	var recs []string
	for _, d := range dirs {
		rs, err := journal.Read(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			recs = append(recs, string(r.Payload))
		}
	}
	return recs
}

// TestMountNonBlockingKilled: in non-blocking mode a close returns with
// the commit queued on disk and nothing committed; the mount is killed
// with SIGKILL; the next mount finishes the queued commit (once the dead
// mount's writer lock has lapsed with its lease).
func TestMountNonBlockingKilled(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	r.env = append(r.env, "CAIRN_LOCK_TTL=1s")
	mnt := mountPoint(t)
	src := filepath.Join(t.TempDir(), "doc")
	writeFile(t, src, []byte("version 1, by put\n"), 0o644)
	r.ok("put", src, "home:/")

	// The queue of this mount holds every commit an hour.
	cmd, exited, out := r.foregroundWith(mnt, []string{"CAIRN_MOUNT_QUEUE_DELAY=1h"}, "--mode", "non-blocking")
	v2 := randBytes(300 << 10)
	if err := os.WriteFile(filepath.Join(mnt, "doc"), v2, 0o644); err != nil {
		t.Fatalf("close in non-blocking mode: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("a new file, queued\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(mnt, "doc")); !bytes.Equal(got, v2) {
		t.Fatal("the mount does not read its own queued writes")
	}
	if got := r.ok("cat", "home:/doc"); got != "version 1, by put\n" {
		t.Fatalf("committed before the queue ran: %q", got)
	}
	if recs := queueRecords(t, r.home); len(recs) != 2 {
		t.Fatalf("queued commits on disk: %v", recs)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited.done
	waitFor(t, "the killed mount leaves ENOTCONN", 10*time.Second, func() bool {
		_, err := os.Stat(mnt)
		return errors.Is(err, syscall.ENOTCONN)
	})
	if got := r.ok("cat", "home:/doc"); got != "version 1, by put\n" {
		t.Fatalf("after the kill: %q", got)
	}

	// The next mount (blocking, in the background) repairs the mount
	// point and finishes the queue.
	res := r.run("mount", "--mode", "blocking", "home", mnt)
	if res.code != 0 {
		t.Fatalf("mount after the kill: exit %d\n%s%s\n%s", res.code, res.stdout, res.stderr, out.String())
	}
	waitFor(t, "the queued commits are done", 30*time.Second, func() bool { return len(queueRecords(t, r.home)) == 0 })
	if got := r.ok("cat", "home:/doc"); got != string(v2) {
		t.Fatalf("after the next mount: %d bytes, want the queued %d", len(got), len(v2))
	}
	if got := r.ok("cat", "home:/new"); got != "a new file, queued\n" {
		t.Fatalf("new file after the next mount: %q", got)
	}
	if got := mustRead(t, filepath.Join(mnt, "doc")); !bytes.Equal(got, v2) {
		t.Fatal("the next mount reads something else")
	}
	r.ok("umount", mnt)
	waitFor(t, "unmounted", 20*time.Second, func() bool { return !isMounted(mnt) })
}

// TestMountTwoDevices (issue 4, item 6): two devices of one realm, each
// with its own $CAIRN_HOME and mount of the same volume. What one writes
// and closes, the other's next open reads; a file open for writing on
// one is refused to the other's writers (EBUSY, logged); a device killed
// while writing loses nothing committed: the previous version stays
// current and readable, and its writer lock lapses with its lease.
func TestMountTwoDevices(t *testing.T) {
	skipWithoutFUSE(t)
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop", "--ttl", "10m"))
	b := joiner(t)
	b.env = append(b.env, "CAIRN_LOCK_TTL=1s")
	b.ok("join", tok, "--no-passphrase")
	b.serve("2s") // the desk reads what the laptop writes from its node
	mntA, mntB := mountPoint(t), mountPoint(t)
	_, _, outA := a.foreground(mntA)
	cmdB, exitedB, outB := b.foreground(mntB)
	pa, pb := filepath.Join(mntA, "doc"), filepath.Join(mntB, "doc")
	// readsAs waits until p reads want (the other device's watch has
	// reported the commit).
	readsAs := func(p, want string) {
		t.Helper()
		waitFor(t, p+" reads the other device's commit", 20*time.Second, func() bool {
			got, err := os.ReadFile(p)
			return err == nil && string(got) == want
		})
	}

	if err := os.WriteFile(pa, []byte("written on the desk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readsAs(pb, "written on the desk\n")
	if err := os.WriteFile(pb, []byte("written on the laptop\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readsAs(pa, "written on the laptop\n")
	// Both watch the volume (the laptop through the desk's gateway).
	for dev, out := range map[string]*outBuf{"desk": outA, "laptop": outB} {
		if strings.Contains(out.String(), "watch") {
			t.Fatalf("the %s's mount has no watch:\n%s", dev, out.String())
		}
	}

	// Concurrent writers: the desk holds the file open for writing.
	w, err := os.OpenFile(pa, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if x, oerr := os.OpenFile(pb, os.O_WRONLY, 0); !errors.Is(oerr, syscall.EBUSY) {
		if oerr == nil {
			x.Close()
		}
		t.Fatalf("the laptop opens for writing a file the desk writes: %v, want EBUSY", oerr)
	}
	waitFor(t, "the laptop's mount logs the refusal, naming the file", 5*time.Second, func() bool {
		return strings.Contains(outB.String(), "open for writing on another device") && strings.Contains(outB.String(), "home:/doc")
	})
	w.WriteString("appended on the desk\n")
	if cerr := w.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	readsAs(pb, "written on the laptop\nappended on the desk\n")

	// The laptop is killed while writing: its writes are lost, the
	// current version is intact everywhere, its lock lapses.
	wb, err := os.OpenFile(pb, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer wb.Close()
	wb.WriteString("half-written on the laptop")
	if x, err := os.OpenFile(pa, os.O_WRONLY, 0); !errors.Is(err, syscall.EBUSY) {
		if err == nil {
			x.Close()
		}
		t.Fatalf("the desk opens for writing a file the laptop writes: %v, want EBUSY", err)
	}
	if err := cmdB.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exitedB.done
	wb.Close()
	if err := mount.Unmount(mntB, true); err != nil {
		t.Fatalf("unmount the killed laptop's mount: %v", err)
	}
	want := "written on the laptop\nappended on the desk\n"
	if got := mustRead(t, pa); string(got) != want {
		t.Fatalf("the desk reads %q after the laptop was killed", got)
	}
	if got := a.ok("cat", "home:/doc"); got != want {
		t.Fatalf("cairn cat after the laptop was killed: %q", got)
	}
	waitFor(t, "the killed laptop's writer lock lapses", 20*time.Second, func() bool {
		x, err := os.OpenFile(pa, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return false
		}
		defer x.Close()
		x.WriteString("after the laptop died\n")
		return x.Close() == nil
	})
	if got := a.ok("cat", "home:/doc"); got != want+"after the laptop died\n" {
		t.Fatalf("after the lock lapsed: %q\n%s", got, outA.String())
	}
	a.ok("umount", mntA)
	// The laptop's next mount keeps what it had not committed aside, and
	// says where.
	_, _, outB = b.foreground(mntB)
	kept, _ := filepath.Glob(filepath.Join(b.home, "mountcache", "*", "unsaved", "*"))
	if len(kept) != 1 || string(mustRead(t, kept[0])) != "half-written on the laptop" {
		t.Fatalf("the laptop's uncommitted writes after its next mount: %v", kept)
	}
	waitFor(t, "the laptop's next mount logs where it kept them", 5*time.Second, func() bool {
		return strings.Contains(outB.String(), kept[0])
	})
	if got := mustRead(t, pb); string(got) != want+"after the laptop died\n" {
		t.Fatalf("the laptop's next mount reads %q", got)
	}
	b.ok("umount", mntB)
}

// TestMountPolicy: files written through the mount follow the placement
// policy of the directory they are closed in (after a rename too), as put
// does.
func TestMountPolicy(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	base := t.TempDir()
	for _, n := range []string{"a", "b"} {
		r.ok("store", "add", n, "file://"+filepath.Join(base, n))
	}
	r.ok("policy", "set", "home:/two", "copies:2@a,b")
	mnt := mountPoint(t)
	_, exited, out := r.foreground(mnt)
	if err := os.MkdirAll(filepath.Join(mnt, "two", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := randBytes(150 << 10)
	for _, p := range []string{"two/sub/t.bin", "plain.bin"} {
		if err := os.WriteFile(filepath.Join(mnt, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Written elsewhere, moved under /two while open, closed there.
	f, err := os.Create(filepath.Join(mnt, "moved.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "moved.bin"), filepath.Join(mnt, "two", "moved.bin")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"/two/sub/t.bin": "copies:2@a,b", "/two/moved.bin": "copies:2@a,b", "/plain.bin": ""} {
		rep := policyGet(t, r, "home:"+p)
		if len(rep.Files) != 1 {
			t.Fatalf("policy get %s: %+v", p, rep)
		}
		got := strings.Join(rep.Files[0].Stores, ",")
		if want != "" && got != want || want == "" && strings.Contains(got, ":") {
			t.Errorf("%s written through the mount is stored at %q, want %q (empty: this device)", p, got, want)
		}
	}
	if got := r.ok("cat", "--no-cache", "home:/two/sub/t.bin"); got != string(data) {
		t.Fatal("/two/sub/t.bin does not read back from its stores")
	}
	r.ok("umount", mnt)
	waitExit(t, exited, out)
}

// TestMountPassthroughDefault: 'cairn mount' asks for FUSE passthrough
// unless told --passthrough off. Its log (--verbose) says passthrough=on,
// or, where the kernel or the user cannot have it, why not (only a mount
// that asked for it says so); with --passthrough off it says
// passthrough=off and gives no reason. Each mount serves a file written
// through it to 'cairn cat'.
func TestMountPassthroughDefault(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	mnt := mountPoint(t)
	for _, tc := range []struct {
		flags []string
		asks  bool
	}{
		{nil, true},
		{[]string{"--passthrough", "off"}, false},
		{[]string{"--passthrough", "auto"}, true},
	} {
		_, exited, out := r.foregroundWith(mnt, nil, append([]string{"--verbose", "--mode", "blocking"}, tc.flags...)...)
		want := fmt.Sprintf("through a mount with %q\n", tc.flags)
		if err := os.WriteFile(filepath.Join(mnt, "f"), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := r.ok("cat", "home:/f"); got != want {
			t.Fatalf("flags %q: cairn cat after close: %q", tc.flags, got)
		}
		r.ok("umount", mnt)
		waitExit(t, exited, out)
		log := out.String()
		on, why := strings.Contains(log, "passthrough=on"), strings.Contains(log, "passthrough not available")
		switch {
		case tc.asks && !on && !why:
			t.Fatalf("flags %q: the mount did not ask for passthrough:\n%s", tc.flags, log)
		case !tc.asks && (on || why || !strings.Contains(log, "passthrough=off")):
			t.Fatalf("flags %q: the mount asked for passthrough:\n%s", tc.flags, log)
		}
		if tc.flags == nil && why {
			t.Logf("passthrough not available here; the default asked for it:\n%s", log)
		}
	}
}

// mountOptions returns the options the kernel shows for the FUSE mount
// on dir (the super block's, after " - " in /proc/self/mountinfo).
func mountOptions(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if f := strings.Fields(pre); ok && len(f) >= 5 && f[4] == dir {
			return post
		}
	}
	t.Fatalf("%s is not in /proc/self/mountinfo", dir)
	return ""
}

// TestMountAllowOther: 'cairn mount --allow-other' (in the background,
// the default) mounts with allow_other, which lets the kernel serve other
// users; without it the mount has no allow_other. (The check of
// /etc/fuse.conf for a mount by another user than root:
// mount.TestCheckAllowOther; other users' access: mount.TestAllowOther.)
func TestMountAllowOther(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	mnt := mountPoint(t)
	for _, tc := range []struct {
		flags []string
		want  bool
	}{{[]string{"--allow-other"}, true}, {nil, false}} {
		res := r.run(append(append([]string{"mount"}, tc.flags...), "home", mnt)...)
		if res.code != 0 {
			t.Fatalf("mount %q: exit %d\n%s%s", tc.flags, res.code, res.stdout, res.stderr)
		}
		opts := mountOptions(t, mnt)
		r.ok("umount", mnt)
		if got := strings.Contains(opts, "allow_other"); got != tc.want {
			t.Fatalf("mount %q: kernel options %q: allow_other %v, want %v", tc.flags, opts, got, tc.want)
		}
	}
}

// TestMountDev: 'cairn mount --dev' mounts without nodev, so device nodes
// on the mount open as devices; without it the mount is nodev.
func TestMountDev(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	mnt := mountPoint(t)
	perMount := func() string {
		t.Helper()
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 6 && f[4] == mnt {
				return f[5]
			}
		}
		t.Fatalf("%s is not in /proc/self/mountinfo", mnt)
		return ""
	}
	for _, tc := range []struct {
		flags []string
		nodev bool
	}{{[]string{"--dev"}, false}, {nil, true}} {
		res := r.run(append(append([]string{"mount"}, tc.flags...), "home", mnt)...)
		if res.code != 0 {
			t.Fatalf("mount %q: exit %d\n%s%s", tc.flags, res.code, res.stdout, res.stderr)
		}
		opts := perMount()
		r.ok("umount", mnt)
		if got := slices.Contains(strings.Split(opts, ","), "nodev"); got != tc.nodev {
			t.Fatalf("mount %q: mount options %q: nodev %v, want %v", tc.flags, opts, got, tc.nodev)
		}
	}
}

// TestMountDefaultWriteBack (issue 15, item 10): 'cairn mount' without
// --mode mounts in write-back mode and says so; a file written there is
// committed in the background (another reader sees it without any further
// step on the mount), and 'cairn umount' returns only once what was
// written before it is committed.
func TestMountDefaultWriteBack(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	mnt := mountPoint(t)
	res := r.run("mount", "home", mnt)
	if res.code != 0 || !strings.Contains(res.stdout, "mounted home at "+mnt+" (write-back; pid ") {
		t.Fatalf("mount without --mode: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	if err := os.WriteFile(filepath.Join(mnt, "bg"), []byte("committed in the background\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write-back mount commits the closed file", 30*time.Second, func() bool {
		return r.run("cat", "home:/bg").stdout == "committed in the background\n"
	})
	if err := os.MkdirAll(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := os.WriteFile(filepath.Join(mnt, "d", fmt.Sprintf("f%02d", i)), []byte{byte(i)}, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.ok("umount", mnt)
	if isMounted(mnt) {
		t.Fatal("still mounted after umount")
	}
	got := r.ok("ls", "home:/d")
	if n := strings.Count(got, "\n"); n != 20 {
		t.Fatalf("after umount, home:/d lists %d names, want the 20 written before it:\n%s", n, got)
	}
	if got := r.ok("cat", "home:/d/f07"); got != "\x07" {
		t.Fatalf("home:/d/f07 after umount: %q", got)
	}
}
