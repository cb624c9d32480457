package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

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

// foreground starts 'cairn mount --foreground' and waits until it serves.
func (r *realmT) foreground(dir string) (*exec.Cmd, *proc, *bytes.Buffer) {
	r.t.Helper()
	cmd := r.command("mount", "--foreground", "home", dir)
	cmd.Env = r.env
	var out bytes.Buffer
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

// proc is a started command: done is closed when it has exited with err.
type proc struct {
	done chan struct{}
	err  error
}

func waitExit(t *testing.T, p *proc, out *bytes.Buffer) {
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
	res := r.run("mount", "home", mnt)
	if res.code != 0 {
		t.Fatalf("background mount: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	m := regexp.MustCompile(`\(pid (\d+),`).FindStringSubmatch(res.stdout)
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
	res = r.run("mount", "home", mnt)
	if res.code != 0 || !strings.Contains(res.stderr, "repaired "+mnt) {
		t.Fatalf("mount after a kill: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	m = regexp.MustCompile(`\(pid (\d+),`).FindStringSubmatch(res.stdout)
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
