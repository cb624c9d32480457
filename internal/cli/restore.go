package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// Restoring a tree under a local directory without ever following a
// symlink below it: every directory is opened relative to its parent's
// descriptor with O_NOFOLLOW, and every file, symlink and directory is made
// relative to such a descriptor. A symlink that get itself just made (from a
// hostile or damaged record) or that was already in the target can therefore
// never send a later write elsewhere. (os.Root would keep writes inside the
// target but follows symlinks that stay inside it, and cannot set a
// symlink's own mtime.)

// localDir is a directory below the restore's top, by its parent and name.
type localDir struct {
	parent *localDir // nil for the top
	name   string
	path   string // for messages
}

const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// openTop opens the top directory the user named (which may itself be
// reached through symlinks of the user's own).
func openTop(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, cairn.E("get", cairn.IO, path, err)
	}
	return fd, nil
}

// open opens d, walking down from top one name at a time, never following
// a symlink.
func (d *localDir) open(top int) (int, error) {
	if d.parent == nil {
		fd, err := unix.Dup(top)
		if err != nil {
			return -1, cairn.E("get", cairn.IO, d.path, err)
		}
		unix.CloseOnExec(fd)
		return fd, nil
	}
	pfd, err := d.parent.open(top)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, d.name, dirFlags, 0)
	if err != nil {
		return -1, cairn.E("get", cairn.IO, d.path, notDirErr(err))
	}
	return fd, nil
}

// notDirErr explains what O_NOFOLLOW|O_DIRECTORY found instead of a directory.
func notDirErr(err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return errors.New("not a directory (or a symlink, which get does not follow)")
	}
	return err
}

// mkdirEnter makes directory name in parent (replacing a symlink there, as
// a restored file or symlink replaces what is in its way) and opens it.
func mkdirEnter(parent int, name, path string) (int, error) {
	err := unix.Mkdirat(parent, name, 0o700)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if serr := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if err = unix.Unlinkat(parent, name, 0); err == nil {
				err = unix.Mkdirat(parent, name, 0o700)
			}
		} else {
			err = nil // a directory (or not: the open below says)
		}
	}
	if err != nil {
		return -1, cairn.E("get", cairn.IO, path, err)
	}
	fd, err := unix.Openat(parent, name, dirFlags, 0)
	if err != nil {
		return -1, cairn.E("get", cairn.IO, path, notDirErr(err))
	}
	return fd, nil
}

// makeSymlink replaces whatever is at name in parent by a symlink.
func makeSymlink(parent int, name, target, path string, mtime time.Time) error {
	if err := unix.Unlinkat(parent, name, 0); errors.Is(err, unix.EISDIR) {
		_ = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR) // only if empty, as os.Remove
	}
	if err := unix.Symlinkat(target, parent, name); err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	_ = unix.UtimesNanoAt(parent, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

// makeSpecial makes the FIFO, socket or device node ent as name in
// directory parent, with its mode and mtime (owners are not restored, as
// for files): under a temporary name, then renamed into place, so that
// what is in the way is replaced only once the node exists. made is false,
// with nothing changed, when a device node may not be made here (EPERM:
// no CAP_MKNOD).
func makeSpecial(parent int, name, path string, ent *meta.Entry) (made bool, err error) {
	if !ent.Type.Special() {
		return false, cairn.E("get", cairn.Invalid, path, fmt.Errorf("not a special file (type %q)", ent.Type))
	}
	typ := meta.ModeBits(ent.Type)
	var st unix.Stat_t
	if err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return false, cairn.E("get", cairn.IsDir, path, errors.New("a local directory is in the way"))
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmpName := ".cairn-get-" + hex.EncodeToString(rnd[:])
	if err := unix.Mknodat(parent, tmpName, typ|0o600, int(ent.Rdev)); err != nil {
		if errors.Is(err, unix.EPERM) && (ent.Type == meta.TypeChar || ent.Type == meta.TypeBlock) {
			return false, nil
		}
		return false, cairn.E("get", cairn.IO, path, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = unix.Unlinkat(parent, tmpName, 0)
		}
	}()
	if err := unix.Fchmodat(parent, tmpName, ent.Mode&0o7777, 0); err != nil {
		return false, cairn.E("get", cairn.IO, path, err)
	}
	ts := unix.NsecToTimespec(ent.Mtime)
	if err := unix.UtimesNanoAt(parent, tmpName, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, cairn.E("get", cairn.IO, path, err)
	}
	if err := unix.Renameat(parent, tmpName, parent, name); err != nil {
		return false, cairn.E("get", cairn.IO, path, err)
	}
	ok = true
	return true, nil
}

// setDirAttrs sets the mode and mtime of d, opened without following.
func setDirAttrs(top int, d *localDir, mode os.FileMode, mtime time.Time) error {
	if d.parent == nil {
		_ = unix.Fchmod(top, uint32(mode))
		_ = unix.Futimes(top, []unix.Timeval{unix.NsecToTimeval(mtime.UnixNano()), unix.NsecToTimeval(mtime.UnixNano())})
		return nil
	}
	pfd, err := d.parent.open(top)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, d.name, dirFlags, 0)
	if err != nil {
		return cairn.E("get", cairn.IO, d.path, notDirErr(err))
	}
	_ = unix.Fchmod(fd, uint32(mode))
	unix.Close(fd)
	ts := unix.NsecToTimespec(mtime.UnixNano())
	_ = unix.UtimesNanoAt(pfd, d.name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

// writeFileAt writes one version of a file as name in directory dir: to a
// new temporary name there (O_EXCL, so never through a symlink), then
// renamed into place (which replaces a symlink, never follows it).
func writeFileAt(ctx context.Context, v *fs.Volume, ent *meta.Entry, ver *meta.Version, dir int, name, path string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return cairn.E("get", cairn.IsDir, path, errors.New("a local directory is in the way"))
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmpName := ".cairn-get-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dir, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	tmp := os.NewFile(uintptr(fd), filepath.Join(filepath.Dir(path), tmpName))
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			_ = unix.Unlinkat(dir, tmpName, 0)
		}
	}()
	if ver != nil {
		// Chunks land at their offsets as they come (the temporary file
		// is renamed into place only once all of them have).
		if err := v.ReadFileAt(ctx, ent, ver, tmp); err != nil {
			return err
		}
	}
	if err := tmp.Chmod(os.FileMode(ent.Mode & 0o7777)); err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	if err := tmp.Close(); err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	mt := time.Unix(0, ent.Mtime)
	if ver != nil {
		mt = time.Unix(0, ver.Mtime)
	}
	ts := unix.NsecToTimespec(mt.UnixNano())
	if err := unix.UtimesNanoAt(dir, tmpName, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	if err := unix.Renameat(dir, tmpName, dir, name); err != nil {
		return cairn.E("get", cairn.IO, path, err)
	}
	ok = true
	return nil
}
