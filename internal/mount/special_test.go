package mount_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// specialWant is what stat must say of one special file.
type specialWant struct {
	fmt, perm, uid, gid uint32
	rdev                uint64
}

func statSpecial(p string) (specialWant, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return specialWant{}, err
	}
	return specialWant{st.Mode & unix.S_IFMT, st.Mode & 07777, st.Uid, st.Gid, st.Rdev}, nil
}

// TestSpecialFiles: FIFOs, unix sockets, character and block devices are
// made on the mount (mkfifo, bind, mknod) with the mode the umask leaves,
// work as such (the kernel carries a FIFO's data and a socket's
// connection; a device node opens the driver on a mount with Devices),
// change mode, owner, times and name, and are seen with the same type,
// mode, owner and device number by another device's mount (nodev: its
// device nodes do not open), in each mode.
func TestSpecialFiles(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) { testSpecialFiles(t, mode) })
	}
}

func testSpecialFiles(t *testing.T, mode mount.Mode) {
	f := newFixture(t, mount.Options{Mode: mode, Devices: true})
	d := f.device(mount.Options{Mode: mode}, meta.Options{})
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)

	// A FIFO: a writer and a reader through it.
	if err := unix.Mkfifo(f.path("fifo"), 0o666); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	const msg = "through the fifo"
	werr := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(f.path("fifo"), os.O_WRONLY, 0)
		if err == nil {
			_, err = io.WriteString(w, msg)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		werr <- err
	}()
	got, err := os.ReadFile(f.path("fifo"))
	if err != nil || string(got) != msg {
		t.Fatalf("read through the FIFO: %q, %v", got, err)
	}
	if err = <-werr; err != nil {
		t.Fatalf("write through the FIFO: %v", err)
	}

	// A unix socket bound on the mount, and a connection to it.
	l, err := net.Listen("unix", f.path("sock"))
	if err != nil {
		t.Fatalf("bind a unix socket on the mount: %v", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	defer l.Close()
	go func() {
		c, aerr := l.Accept()
		if aerr != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("unix", f.path("sock"))
	if err != nil {
		t.Fatalf("connect to the socket on the mount: %v", err)
	}
	defer c.Close()
	if _, err = io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err = io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the socket: %q, %v", buf, err)
	}

	// A character device like /dev/null, opened and written to; a block
	// device whose minor number needs more than 8 bits.
	null, blk := unix.Mkdev(1, 3), unix.Mkdev(7, 0x123)
	if err = unix.Mknod(f.path("null"), unix.S_IFCHR|0o666, int(null)); err != nil {
		t.Fatalf("mknod char: %v", err)
	}
	if err = unix.Mknod(f.path("blk"), unix.S_IFBLK|0o660, int(blk)); err != nil {
		t.Fatalf("mknod block: %v", err)
	}
	if err = os.WriteFile(f.path("null"), []byte("into the void"), 0); err != nil {
		t.Fatalf("write to the char device on the mount: %v", err)
	}

	// Attribute changes and a rename.
	if err = os.Chmod(f.path("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err = os.Lchown(f.path("fifo"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1_700_000_000, 0)
	if err = os.Chtimes(f.path("null"), mt, mt); err != nil {
		t.Fatal(err)
	}
	if err = os.Rename(f.path("blk"), f.path("blk2")); err != nil {
		t.Fatal(err)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	want := map[string]specialWant{
		"fifo": {unix.S_IFIFO, 0o600, 1234, 5678, 0},
		"sock": {unix.S_IFSOCK, 0o755, uid, gid, 0}, // bind's mode is 0777 less the umask
		"null": {unix.S_IFCHR, 0o644, uid, gid, null},
		"blk2": {unix.S_IFBLK, 0o640, uid, gid, blk},
	}
	for name, w := range want {
		if got, err := statSpecial(f.path(name)); err != nil || got != w {
			t.Errorf("%s on the mount: %+v, %v; want %+v", name, got, err, w)
		}
	}
	if st, err := os.Stat(f.path("null")); err != nil || !st.ModTime().Equal(mt) {
		t.Errorf("null's mtime after utimens: %v, %v; want %v", st.ModTime(), err, mt)
	}
	ents, err := os.ReadDir(f.path(""))
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]os.FileMode{"fifo": os.ModeNamedPipe, "sock": os.ModeSocket, "null": os.ModeDevice | os.ModeCharDevice, "blk2": os.ModeDevice}
	for _, e := range ents {
		if e.Type() != types[e.Name()] {
			t.Errorf("readdir: %s has type %v, want %v", e.Name(), e.Type(), types[e.Name()])
		}
	}

	// Another device sees the same, once the changes reach it.
	deadline := time.Now().Add(30 * time.Second)
	for name, w := range want {
		for {
			got, err := statSpecial(d.path(name))
			if err == nil && got == w {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s on the other device: %+v, %v; want %+v", name, got, err, w)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if e := d.entry("null"); e.Type != meta.TypeChar || e.Rdev != null {
		t.Errorf("null's record: %+v", e)
	}
	// The other device's mount is nodev: its device node does not open.
	if _, err = os.OpenFile(d.path("null"), os.O_WRONLY, 0); !errors.Is(err, syscall.EACCES) {
		t.Errorf("open of a device node on a nodev mount: %v, want EACCES", err)
	}

	// Unlink; the other device sees them go.
	for name := range want {
		if err = os.Remove(f.path(name)); err != nil {
			t.Fatalf("unlink %s: %v", name, err)
		}
	}
	for name := range want {
		for {
			_, err := os.Lstat(d.path(name))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline.Add(30 * time.Second)) {
				t.Fatalf("%s still on the other device after its unlink: %v", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestWriteBackSpecialFiles: in write-back mode a mknod is answered at once
// and written with the next batch, as a mkdir is: pending, it is shown
// here and not yet in the metadata; after an fsync of its directory the
// metadata holds it with its type, mode and device number.
func TestWriteBackSpecialFiles(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	if _, err := os.ReadDir(f.mnt); err != nil { // the mount knows every name of the root
		t.Fatal(err)
	}
	release := mount.HoldWriteBack(f.m)
	defer release()
	if err := unix.Mkfifo(f.path("fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(f.path("null"), unix.S_IFCHR|0o640, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("null"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := mount.PendingChanges(f.m); n != 2 {
		t.Fatalf("%d changes pending, want 2 (the chmod with its mknod)", n)
	}
	if got, err := statSpecial(f.path("null")); err != nil || got.fmt != unix.S_IFCHR || got.perm != 0o600 || got.rdev != unix.Mkdev(1, 3) {
		t.Fatalf("stat of a pending device node: %+v, %v", got, err)
	}
	if _, err := f.vol.Meta.Lookup(context.Background(), []string{"fifo"}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("a pending FIFO in the metadata before its batch: %v", err)
	}
	release()
	f.syncDir("")
	if e := f.entry("fifo"); e.Type != meta.TypeFIFO || e.Mode != 0o640 {
		t.Fatalf("fifo's record: %+v", e)
	}
	if e := f.entry("null"); e.Type != meta.TypeChar || e.Mode != 0o600 || e.Rdev != unix.Mkdev(1, 3) {
		t.Fatalf("null's record: %+v", e)
	}
}
