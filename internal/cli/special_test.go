package cli_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPutGetSpecialFiles: put stores a FIFO, a socket and device nodes as
// special entries (a second put of the unchanged tree changes nothing);
// get makes them again with their type, mode, mtime and device number;
// a get that may not make device nodes (no CAP_MKNOD) skips them with a
// warning and a count, makes the rest, and exits 0.
func TestPutGetSpecialFiles(t *testing.T) {
	r := newRealm(t)
	src := filepath.Join(t.TempDir(), "t")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	in := func(name string) string { return filepath.Join(src, name) }
	if err := unix.Mkfifo(in("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", in("sock"))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	null, blk := unix.Mkdev(1, 3), unix.Mkdev(7, 0x123)
	if err = unix.Mknod(in("null"), unix.S_IFCHR|0o600, int(null)); err != nil {
		t.Fatal(err)
	}
	if err = unix.Mknod(in("blk"), unix.S_IFBLK|0o600, int(blk)); err != nil {
		t.Fatal(err)
	}
	if err = os.WriteFile(in("file"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	perms := map[string]uint32{"fifo": 0o640, "sock": 0o751, "null": 0o666, "blk": 0o660}
	mt := time.Unix(1_600_000_000, 123)
	for name, perm := range perms {
		if err = unix.Chmod(in(name), perm); err != nil {
			t.Fatal(err)
		}
		if err = unix.UtimesNano(in(name), []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}); err != nil {
			t.Fatal(err)
		}
	}

	if s := putJSON(t, r, src, "home:/"); s.Specials != 4 || s.Files != 1 || s.Failed != 0 {
		t.Fatalf("put: %+v, want 4 special files and 1 file", s)
	}
	if s := putJSON(t, r, src, "home:/"); s.Specials != 0 || s.Files != 0 || s.Failed != 0 {
		t.Fatalf("put of the unchanged tree: %+v, want nothing stored", s)
	}
	ls := r.ok("ls", "-l", "home:/t")
	for _, want := range []string{"prw-r-----", "Srwxr-x--x", "Dcrw-rw-rw-       1, 3", "Drw-rw----     7, 291"} {
		if !strings.Contains(ls, want) {
			t.Errorf("ls -l does not show %s:\n%s", want, ls)
		}
	}

	fmts := map[string]uint32{"fifo": unix.S_IFIFO, "sock": unix.S_IFSOCK, "null": unix.S_IFCHR, "blk": unix.S_IFBLK}
	rdevs := map[string]uint64{"null": null, "blk": blk}
	check := func(dst string, devices bool) {
		t.Helper()
		for name, f := range fmts {
			var st unix.Stat_t
			err := unix.Lstat(filepath.Join(dst, name), &st)
			if f == unix.S_IFCHR || f == unix.S_IFBLK {
				if !devices {
					if err == nil {
						t.Errorf("%s made without CAP_MKNOD", name)
					}
					continue
				}
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if st.Mode&unix.S_IFMT != f || st.Mode&0o7777 != perms[name] || st.Rdev != rdevs[name] || st.Mtim.Nano() != mt.UnixNano() {
				t.Errorf("%s restored as mode %o rdev %#x mtime %d; want %o|%o, %#x, %d", name, st.Mode, st.Rdev, st.Mtim.Nano(), f, perms[name], rdevs[name], mt.UnixNano())
			}
		}
		if b, err := os.ReadFile(filepath.Join(dst, "file")); err != nil || string(b) != "data" {
			t.Errorf("file: %q, %v", b, err)
		}
	}
	dst := filepath.Join(t.TempDir(), "dst")
	r.ok("get", "home:/t", dst)
	check(dst, true)
	// One special file alone.
	one := filepath.Join(t.TempDir(), "one")
	r.ok("get", "home:/t/fifo", one)
	if st, err := os.Lstat(one); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("get of a FIFO alone: %v, %v", st, err)
	}

	// Without CAP_MKNOD (as a user other than root would run it).
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv to drop CAP_MKNOD")
	}
	dst2 := filepath.Join(t.TempDir(), "dst2")
	cmd := exec.Command(setpriv, "--bounding-set", "-mknod", os.Args[0], "get", "home:/t", dst2)
	cmd.Env = r.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("get without CAP_MKNOD: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "skipped 2 device node(s)") || strings.Count(stderr.String(), "skipping home:/t/") != 2 {
		t.Errorf("get without CAP_MKNOD says:\n%s", stderr.String())
	}
	check(dst2, false)
}
