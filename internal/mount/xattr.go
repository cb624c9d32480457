package mount

import (
	"context"
	"errors"
	"sort"
	"strings"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// Extended attributes: the user.* namespace is kept per inode in the
// metadata service (meta.Vol.SetXattr and friends, under its full name,
// "user.comment"), so it follows the file through renames and is seen by
// every device. Other namespaces are refused with EOPNOTSUPP: security.*
// and system.* (ACLs) mean something to the kernel that cairn does not
// enforce, and trusted.* is for root's own bookkeeping. The kernel itself
// refuses user.* on symlinks and checks write permission before asking.
// Attributes are not cached: every call is one request to etcd.

const userXattr = "user."

// xattrListMax is Linux's bound on a listxattr buffer (XATTR_LIST_MAX).
const xattrListMax = 64 << 10

var (
	_ gofs.NodeGetxattrer    = (*node)(nil)
	_ gofs.NodeSetxattrer    = (*node)(nil)
	_ gofs.NodeRemovexattrer = (*node)(nil)
	_ gofs.NodeListxattrer   = (*node)(nil)
)

// xattrName checks a name of the user namespace; others are EOPNOTSUPP.
func xattrName(name string) syscall.Errno {
	if !strings.HasPrefix(name, userXattr) {
		return syscall.EOPNOTSUPP
	}
	if len(name) == len(userXattr) {
		return syscall.EINVAL
	}
	if len(name) > meta.MaxXattrName {
		return syscall.ERANGE
	}
	return 0
}

// xattrErrno maps what the meta xattr calls return: a missing attribute
// is ENODATA (ENOATTR), not ENOENT.
func (n *node) xattrErrno(op, name string, err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, cairn.ErrNotFound):
		return syscall.ENODATA
	case errors.Is(err, cairn.ErrExist):
		return syscall.EEXIST
	case cairn.KindOf(err) == cairn.Invalid:
		return syscall.E2BIG
	}
	return n.m.errno(op, n.path("")+" "+name, err)
}

// Getxattr copies the value into dest; when dest is too small (or empty:
// the caller asks for the size) it returns the size with ERANGE.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if errno := xattrName(attr); errno != 0 {
		return 0, errno
	}
	val, err := n.m.vol.Meta.Xattr(bg(ctx), n.ino, attr)
	if err != nil {
		return 0, n.xattrErrno("getxattr", attr, err)
	}
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), 0
}

// Setxattr sets a value: XATTR_CREATE fails with EEXIST on an existing
// attribute, XATTR_REPLACE with ENODATA on a missing one.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.m.offlineLinkOrXattr() {
		return syscall.EROFS
	}
	if errno := xattrName(attr); errno != 0 {
		return errno
	}
	flag := meta.XattrAny
	switch flags {
	case 0:
	case unix.XATTR_CREATE:
		flag = meta.XattrCreate
	case unix.XATTR_REPLACE:
		flag = meta.XattrReplace
	default:
		return syscall.EINVAL
	}
	n.m.wb.undeferNode(n)
	if err := n.m.wb.flush(bg(ctx)); err != nil { // the entry first (write-back)
		return n.m.errno("setxattr", n.path(""), err)
	}
	if err := n.m.vol.Meta.SetXattr(bg(ctx), n.ino, attr, data, flag); err != nil {
		return n.xattrErrno("setxattr", attr, err)
	}
	return n.m.errno("setxattr", n.path(""), n.touchCtime(bg(ctx)))
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.m.offlineLinkOrXattr() {
		return syscall.EROFS
	}
	if errno := xattrName(attr); errno != 0 {
		return errno
	}
	n.m.wb.undeferNode(n)
	if err := n.m.wb.flush(bg(ctx)); err != nil {
		return n.m.errno("removexattr", n.path(""), err)
	}
	if err := n.m.vol.Meta.RemoveXattr(bg(ctx), n.ino, attr); err != nil {
		return n.xattrErrno("removexattr", attr, err)
	}
	return n.m.errno("removexattr", n.path(""), n.touchCtime(bg(ctx)))
}

// touchCtime advances n's ctime, as a change to its extended attributes
// does on a local disk: they are keys of their own (meta.Vol.SetXattr),
// and the entry's record, which holds the ctime, is written again
// unchanged (meta.Vol.Update sets the ctime), read again and retried
// while a concurrent change wins.
func (n *node) touchCtime(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		e, err := n.readEntry(ctx, attempt > 0)
		if err != nil {
			return err
		}
		epoch := n.m.ents.writing()
		ne, err := n.m.vol.Meta.Update(ctx, e)
		n.m.ents.wrote(epoch, ne, false)
		if errors.Is(err, cairn.ErrConflict) && attempt < 20 {
			continue
		}
		if err != nil {
			return err
		}
		n.remember(ne)
		return nil
	}
}

// Listxattr lists the user.* names, each followed by a NUL, sorted; the
// size with ERANGE when dest is too small. Attributes other layers keep
// under other names (WebDAV dead properties) are not listed.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	all, err := n.m.vol.Meta.Xattrs(bg(ctx), n.ino)
	if err != nil {
		return 0, n.m.errno("listxattr", n.path(""), err)
	}
	names := make([]string, 0, len(all))
	size := 0
	for name := range all {
		if strings.HasPrefix(name, userXattr) {
			names = append(names, name)
			size += len(name) + 1
		}
	}
	if size > xattrListMax {
		return 0, syscall.E2BIG
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	sort.Strings(names)
	off := 0
	for _, name := range names {
		off += copy(dest[off:], name)
		dest[off] = 0
		off++
	}
	return uint32(off), 0
}
