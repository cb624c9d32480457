package mount_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/mount"
)

// The user and groups the other-user tests run their child as: none of
// them the test's own (root).
const (
	otherUID   = 60001
	otherGID   = 60001
	otherGroup = 60002 // a supplementary group of the child
	thirdUID   = 60003 // a user the child is not
)

// envOtherOps gives the child process (TestOtherUserChild) its
// operations, one a line: "OP PATH [ARG...]".
const envOtherOps = "CAIRN_TEST_OTHER_OPS"

// TestOtherUserChild runs, in a child process of an other-user test as
// another user, the operations of envOtherOps, and prints one line each:
// "ok" or the errno's name. Skipped elsewise.
func TestOtherUserChild(t *testing.T) {
	ops := os.Getenv(envOtherOps)
	if ops == "" {
		t.Skip("only as the child of an other-user test")
	}
	for _, line := range strings.Split(strings.TrimSpace(ops), "\n") {
		fmt.Printf("RESULT %s\n", errName(otherOp(strings.Fields(line))))
	}
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EACCES:
			return "EACCES"
		case syscall.EPERM:
			return "EPERM"
		case syscall.ENOENT:
			return "ENOENT"
		}
		return "errno " + strconv.Itoa(int(errno))
	}
	return err.Error()
}

func otherOp(f []string) error {
	octal := func(s string) uint32 {
		v, _ := strconv.ParseUint(s, 8, 32)
		return uint32(v)
	}
	num := func(s string) int {
		v, _ := strconv.Atoi(s)
		return v
	}
	switch f[0] {
	case "stat":
		_, err := os.Stat(f[1])
		return err
	case "read":
		r, err := os.Open(f[1])
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.ReadAll(r)
		return err
	case "write":
		w, err := os.OpenFile(f[1], os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		if _, err = w.Write([]byte("y")); err != nil {
			w.Close()
			return err
		}
		return w.Close()
	case "create":
		w, err := os.OpenFile(f[1], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		return w.Close()
	case "readdir":
		_, err := os.ReadDir(f[1])
		return err
	case "unlink":
		return syscall.Unlink(f[1])
	case "rename":
		return syscall.Rename(f[1], f[2])
	case "chmod":
		return syscall.Chmod(f[1], octal(f[2]))
	case "chown":
		return syscall.Chown(f[1], num(f[2]), num(f[3]))
	}
	return fmt.Errorf("unknown op %q", f[0])
}

// otherUser runs ops (as envOtherOps) in a child process of the test
// binary as otherUID, otherGID and otherGroup, and returns a result per op.
func otherUser(t *testing.T, bin string, ops []string) []string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^TestOtherUserChild$", "-test.count=1")
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), envOtherOps+"="+strings.Join(ops, "\n"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: otherGID, Groups: []uint32{otherGroup}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as uid %d: %v\n%s", otherUID, err, out)
	}
	var res []string
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(l, "RESULT "); ok {
			res = append(res, r)
		}
	}
	if len(res) != len(ops) {
		t.Fatalf("child: %d results for %d operations:\n%s", len(res), len(ops), out)
	}
	return res
}

// otherBinary copies the test binary where another user may run it (go
// test's build directory is its user's only), and lets other users
// reach the mount point mnt.
func otherBinary(t *testing.T, mnt string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a process as another user")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cairn-other-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "mount.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err = os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(mnt)} {
		if err = os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// onMount returns op with its paths (the first argument, and a
// rename's second) on f's mount.
func onMount(f *fixture, op string) string {
	fs := strings.Fields(op)
	fs[1] = f.path(fs[1])
	if fs[0] == "rename" {
		fs[2] = f.path(fs[2])
	}
	return strings.Join(fs, " ")
}

// TestAllowOther: with AllowOther, another user's access is checked by
// the files' modes and owners as on a local disk: owner, group (a
// supplementary one) and other bits; a sticky directory; chmod and
// chown by a non-owner; set-ID bits cleared by a write of a non-owner
// and by a chown. Without it, the kernel refuses that user everything.
func TestAllowOther(t *testing.T) {
	for _, mode := range versionModes {
		t.Run(mode.String(), func(t *testing.T) {
			testAllowOther(t, mode)
		})
	}
}

func testAllowOther(t *testing.T, mode mount.Mode) {
	f := newFixture(t, mount.Options{Mode: mode, AllowOther: true})
	bin := otherBinary(t, f.mnt)
	type file struct {
		name     string
		uid, gid int
		mode     os.FileMode
	}
	files := []file{
		{"owner", otherUID, 0, 0o600},
		{"owner-ro", otherUID, 0, 0o400},
		{"group", 0, otherGroup, 0o060},
		{"group-ro", 0, otherGroup, 0o640},
		{"other", 0, 0, 0o604},
		{"other-rw", 0, 0, 0o606},
		{"none", 0, 0, 0o660},
		{"setid", thirdUID, otherGroup, 0o6777 | os.ModeSetuid | os.ModeSetgid},
		{"mine-setuid", otherUID, otherGID, 0o755 | os.ModeSetuid},
		{"sticky/theirs", thirdUID, thirdUID, 0o666},
		{"open/theirs", thirdUID, thirdUID, 0o666},
	}
	for _, d := range []string{"sticky", "open"} {
		if err := os.Mkdir(f.path(d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(f.path("sticky"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("open"), 0o777); err != nil {
		t.Fatal(err)
	}
	for _, fl := range files {
		p := f.path(fl.name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, fl.uid, fl.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, fl.mode); err != nil {
			t.Fatal(err)
		}
	}
	f.settle()
	cases := []struct{ op, want string }{
		{"read owner", "ok"},
		{"write owner", "ok"},
		{"read owner-ro", "ok"},
		{"write owner-ro", "EACCES"},
		{"read group", "ok"},
		{"write group", "ok"},
		{"read group-ro", "ok"},
		{"write group-ro", "EACCES"},
		{"read other", "ok"},
		{"write other", "EACCES"},
		{"write other-rw", "ok"},
		{"read none", "EACCES"},
		{"write none", "EACCES"},
		{"stat none", "ok"},
		{"readdir .", "ok"},
		{"create new", "EACCES"}, // the root is 0755, root's
		{"unlink other", "EACCES"},
		{"chmod other 0777", "EPERM"},
		{"chown other " + strconv.Itoa(otherUID) + " -1", "EPERM"},
		{"chmod owner 0644", "ok"},
		{"write setid", "ok"},
		{"chown mine-setuid -1 " + strconv.Itoa(otherGroup), "ok"},
		{"create sticky/mine", "ok"},
		{"unlink sticky/theirs", "EPERM"},
		{"rename sticky/theirs sticky/moved", "EPERM"},
		{"unlink sticky/mine", "ok"},
		{"unlink open/theirs", "ok"},
		{"create open/mine", "ok"},
	}
	var ops []string
	for _, c := range cases {
		ops = append(ops, onMount(f, c.op))
	}
	res := otherUser(t, bin, ops)
	for i, c := range cases {
		if res[i] != c.want {
			t.Errorf("as uid %d: %s: %s, want %s", otherUID, c.op, res[i], c.want)
		}
	}
	f.settle()
	stat := func(rel string) *syscall.Stat_t {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(f.path(rel), &st); err != nil {
			t.Fatal(err)
		}
		return &st
	}
	if st := stat("setid"); st.Mode&07777 != 0o777 {
		t.Errorf("setid after a write by a non-owner: mode %o, want 777 (set-ID bits cleared)", st.Mode&07777)
	}
	if st := stat("mine-setuid"); st.Mode&07777 != 0o755 || st.Gid != otherGroup {
		t.Errorf("mine-setuid after its owner's chgrp: mode %o gid %d, want 755 %d", st.Mode&07777, st.Gid, otherGroup)
	}
	if st := stat("open/mine"); st.Uid != otherUID || st.Gid != otherGID {
		t.Errorf("a file the other user made: owner %d:%d, want %d:%d", st.Uid, st.Gid, otherUID, otherGID)
	}
	if st := stat("owner"); st.Mode&07777 != 0o644 {
		t.Errorf("owner after its owner's chmod: mode %o", st.Mode&07777)
	}
	if got := string(f.readMount("owner")); got != "xy" {
		t.Errorf("owner reads %q after the other user's write, want xy", got)
	}
	if _, err := os.Stat(f.path("sticky/theirs")); err != nil {
		t.Errorf("sticky/theirs: %v", err)
	}
	// A chown by root clears the set-ID bits too.
	if err := os.Chmod(f.path("other"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f.path("other"), otherUID, -1); err != nil {
		t.Fatal(err)
	}
	if st := stat("other"); st.Mode&07777 != 0o755 || st.Uid != otherUID {
		t.Errorf("other after a chown: mode %o uid %d, want 755 %d", st.Mode&07777, st.Uid, otherUID)
	}

	// Without AllowOther the kernel refuses the other user everything.
	f.mountAgain(mount.Options{Mode: mode})
	refused := []string{"stat .", "readdir .", "stat other-rw", "read other-rw", "write other-rw", "create open/another", "unlink open/mine"}
	ops = ops[:0]
	for _, op := range refused {
		ops = append(ops, onMount(f, op))
	}
	res = otherUser(t, bin, ops)
	for i, op := range refused {
		if res[i] != "EACCES" {
			t.Errorf("as uid %d without AllowOther: %s: %s, want EACCES", otherUID, op, res[i])
		}
	}
}
