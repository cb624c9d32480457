package mount

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// content is the open copy of a regular file: the version current when it
// was opened, fetched whole into a file on local disk, plus whatever this
// mount has written to it since. Every handle open on the file shares it,
// so descriptors of one mount see each other's writes at once, as on a
// local disk. It goes when its last handle is released.
type content struct {
	m *Mount
	f *os.File
	// wmu orders writes, truncates and commits: a commit reads the copy
	// while holding it, so a version is one state of the file.
	wmu sync.Mutex

	mu       sync.Mutex
	refs     int  // handles open on it
	writers  int  // of which opened for writing
	dirty    bool // written since fetched or last committed
	keep     bool // its commit failed: kept on disk (and logged) when dropped
	size     int64
	mtime    time.Time
	base     uint64   // the version it holds when clean (0: none)
	manifest cairn.ID // that version's manifest
}

// handle is one open of a file.
type handle struct {
	n      *node
	c      *content
	write  bool
	append bool
}

var (
	_ gofs.FileReader   = (*handle)(nil)
	_ gofs.FileWriter   = (*handle)(nil)
	_ gofs.FileFlusher  = (*handle)(nil)
	_ gofs.FileFsyncer  = (*handle)(nil)
	_ gofs.FileReleaser = (*handle)(nil)
)

// local returns the size and mtime of the copy when they, not the
// metadata's, are the file's: it has writes not yet committed, or a
// handle that may write.
func (c *content) local() (int64, time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.mtime, c.dirty || c.writers > 0
}

// usable reports whether a new open of a file whose entry is e may share
// c: always while c holds writes or writers of this mount (the last close
// wins, as in AFS), otherwise only while c is of e's current version.
func (c *content) usable(e *meta.Entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirty || c.writers > 0 {
		return true
	}
	cur := e.Current()
	if cur == nil {
		return c.base == 0 && c.size == 0
	}
	return c.base == cur.N && c.manifest == cur.Manifest
}

func (c *content) ref(write bool) {
	c.mu.Lock()
	c.refs++
	if write {
		c.writers++
	}
	c.mu.Unlock()
}

func (c *content) touch(t time.Time) {
	c.mu.Lock()
	c.mtime = t
	c.mu.Unlock()
}

func (c *content) truncate(size int64) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.f.Truncate(size); err != nil {
		return cairn.E("truncate", cairn.IO, c.f.Name(), err)
	}
	c.mu.Lock()
	if size != c.size {
		c.size, c.dirty, c.mtime = size, true, time.Now()
	}
	c.mu.Unlock()
	return nil
}

// drop closes the copy and removes it, unless a failed commit asked to
// keep it.
func (c *content) drop() {
	c.m.copiesMu.Lock()
	_, live := c.m.copies[c]
	delete(c.m.copies, c)
	c.m.copiesMu.Unlock()
	if !live {
		return // dropped already
	}
	c.mu.Lock()
	keep := c.keep
	c.mu.Unlock()
	c.f.Close()
	if keep {
		c.m.log.Error("kept the unsaved content of a file whose commit failed", "copy", c.f.Name())
		return
	}
	os.Remove(c.f.Name())
}

// fetch makes a copy of e's current version (empty: an empty copy, for
// an open that truncates).
func (m *Mount) fetch(ctx context.Context, e *meta.Entry, empty bool) (*content, error) {
	f, err := os.CreateTemp(m.cache, "open-*")
	if err != nil {
		return nil, cairn.E("open", cairn.IO, m.cache, err)
	}
	c := &content{m: m, f: f, mtime: time.Unix(0, e.Mtime)}
	m.copiesMu.Lock()
	m.copies[c] = struct{}{}
	m.copiesMu.Unlock()
	cur := e.Current()
	if cur == nil {
		return c, nil
	}
	c.base, c.manifest = cur.N, cur.Manifest
	if empty {
		c.dirty = cur.Size > 0
		return c, nil
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = m.vol.ReadFile(ctx, e, cur, w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		c.drop()
		return nil, err
	}
	c.size = cur.Size
	return c, nil
}

// acquire returns the copy a new handle of n shares, fetching e's current
// version when there is none it may share (an older one lives on for the
// handles that have it).
func (n *node) acquire(ctx context.Context, e *meta.Entry, write, empty bool) (*content, error) {
	n.mu.Lock()
	if c := n.content; c != nil && c.usable(e) {
		c.ref(write)
		n.mu.Unlock()
		return c, nil
	}
	n.mu.Unlock()
	// Fetched without n.mu: a slow fetch does not hold up stat.
	c, err := n.m.fetch(ctx, e, empty)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old := n.content; old != nil && old.usable(e) {
		c.drop() // another open got there first
		old.ref(write)
		return old, nil
	}
	n.content = c
	c.ref(write)
	return c, nil
}

// release lets go of a handle's reference to c.
func (n *node) release(c *content) {
	n.mu.Lock()
	c.mu.Lock()
	c.refs--
	last := c.refs == 0
	c.mu.Unlock()
	if last && n.content == c {
		n.content = nil
	}
	n.mu.Unlock()
	if last {
		c.drop()
	}
}

// Open reads the file's current version from the metadata service (close-
// to-open: every open does) and gives a handle on a copy of it. The kernel
// is not told to keep its page cache, so it drops what it cached of the
// file at every open.
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	ctx = bg(ctx)
	n.mu.Lock()
	told := n.last
	n.mu.Unlock()
	e, err := n.entry(ctx)
	if err != nil {
		return nil, 0, n.m.errno("open", n.path(""), err)
	}
	if e.Size != told.Size || e.Mtime != told.Mtime {
		// Committed elsewhere since the kernel last asked: it must not
		// read the new version with the old size for the rest of its
		// attribute cache time.
		_ = n.NotifyContent(-1, 0)
	}
	h, err := n.open(ctx, e, flags)
	if err != nil {
		return nil, 0, n.m.errno("open", n.path(""), err)
	}
	return h, 0, 0
}

func (n *node) open(ctx context.Context, e *meta.Entry, flags uint32) (*handle, error) {
	if e.Type != meta.TypeFile {
		return nil, syscall.EISDIR
	}
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := write && flags&syscall.O_TRUNC != 0
	c, err := n.acquire(ctx, e, write, trunc)
	if err != nil {
		return nil, err
	}
	h := &handle{n: n, c: c, write: write, append: flags&syscall.O_APPEND != 0}
	if trunc {
		if err := c.truncate(0); err != nil {
			h.Release(ctx)
			return nil, err
		}
	}
	return h, nil
}

// Create makes an empty file (no version yet) and opens it. A name made
// meanwhile by someone else is opened instead, unless O_EXCL.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	ctx = bg(ctx)
	e, errno := n.create(ctx, meta.Entry{Name: name, Type: meta.TypeFile, Mode: mode & 07777})
	if errno == syscall.EEXIST && e != nil && flags&syscall.O_EXCL == 0 {
		errno = 0
	}
	if errno != 0 {
		return nil, nil, 0, errno
	}
	ch := n.child(ctx, e, out)
	h, err := ch.Operations().(*node).open(ctx, e, flags)
	if err != nil {
		return nil, nil, 0, n.m.errno("create", n.path(name), err)
	}
	return ch, h, 0, 0
}

// truncate cuts a file to size: in h's copy (ftruncate; the commit is at
// close), or, for truncate(2) by path, in a copy opened for it and
// committed at once.
func (n *node) truncate(ctx context.Context, h *handle, size int64) syscall.Errno {
	if h != nil {
		if err := h.c.truncate(size); err != nil {
			return n.m.errno("truncate", n.path(""), err)
		}
		return 0
	}
	e, err := n.entry(ctx)
	if err != nil {
		return n.m.errno("truncate", n.path(""), err)
	}
	flags := uint32(syscall.O_WRONLY)
	if size == 0 {
		flags |= syscall.O_TRUNC
	}
	h, err = n.open(ctx, e, flags)
	if err == nil {
		if err = h.c.truncate(size); err == nil {
			n.m.begin()
			err = n.commit(ctx, h.c)
			n.m.end()
		}
		h.Release(ctx)
	}
	return n.m.errno("truncate", n.path(""), err)
}

// commit stores c as the file's new current version if it holds writes
// not yet committed (fs.Volume.WriteFile: chunks to the store, then a
// compare-and-swap in etcd, under the file's writer lock). A file removed
// while open is not brought back: its last writes are dropped, as on a
// local disk.
func (n *node) commit(ctx context.Context, c *content) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	dirty, size, mtime := c.dirty, c.size, c.mtime
	c.mu.Unlock()
	if !dirty {
		return nil
	}
	name, parent, ok := n.place()
	if !ok {
		n.m.log.Info("a file removed while open was closed: its unsaved writes are dropped", "ino", n.ino)
		c.mu.Lock()
		c.dirty = false
		c.mu.Unlock()
		return nil
	}
	dir, errno := parent.dirEntry()
	if errno != 0 {
		return errno
	}
	path := n.path("")
	n.mu.Lock()
	last := n.last
	n.mu.Unlock()
	attrs := fs.Attrs{Mode: last.Mode, UID: last.UID, GID: last.GID, Mtime: mtime}
	switch cur, err := n.m.vol.Meta.Get(ctx, parent.ino, name); {
	case err == nil:
		// Its mode and owner now, not when it was opened: a chmod while
		// open must survive the commit.
		attrs.Mode, attrs.UID, attrs.GID = cur.Mode, cur.UID, cur.GID
		if cur.Ino != n.ino {
			n.m.log.Warn("file replaced elsewhere while open here: the last close wins", "path", path)
		}
	case errors.Is(err, cairn.ErrNotFound):
		n.m.log.Warn("file removed elsewhere while open here: written back", "path", path)
	default:
		return err
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(io.NewSectionReader(c.f, 0, size)), nil }
	e, _, err := n.m.vol.WriteFile(ctx, dir, name, open, attrs)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.dirty, c.keep = false, false
	if v := e.Current(); v != nil {
		c.base, c.manifest = v.N, v.Manifest
	}
	c.mu.Unlock()
	n.remember(e)
	return nil
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	k, err := h.c.f.ReadAt(dest, off)
	if err != nil && err != io.EOF {
		return nil, h.n.m.errno("read", h.n.path(""), cairn.E("read", cairn.IO, h.c.f.Name(), err))
	}
	return fuse.ReadResultData(dest[:k]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.write {
		return 0, syscall.EBADF
	}
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if h.append {
		c.mu.Lock()
		off = c.size
		c.mu.Unlock()
	}
	k, err := c.f.WriteAt(data, off)
	c.mu.Lock()
	if k > 0 {
		c.dirty, c.mtime = true, time.Now()
		if end := off + int64(k); end > c.size {
			c.size = end
		}
	}
	c.mu.Unlock()
	if err != nil {
		return uint32(k), h.n.m.errno("write", h.n.path(""), cairn.E("write", cairn.IO, c.f.Name(), err))
	}
	return uint32(k), 0
}

// Flush runs at every close(2) of a descriptor: one that may have written
// commits the copy if it holds unsaved writes, and the close returns the
// commit's error.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	if !h.write {
		return 0
	}
	ctx = bg(ctx)
	h.n.m.begin()
	defer h.n.m.end()
	if err := h.n.commit(ctx, h.c); err != nil {
		return h.n.m.errno("commit at close", h.n.path(""), err)
	}
	return 0
}

// Fsync makes the copy durable on local disk (SCFS Table 1: close, not
// fsync, makes it durable in the stores).
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if err := h.c.f.Sync(); err != nil {
		return h.n.m.errno("fsync", h.n.path(""), cairn.E("fsync", cairn.IO, h.c.f.Name(), err))
	}
	return 0
}

// Release runs once the kernel drops the handle, after its last close.
// The last writer commits what no close committed (its flush failed, or a
// writable mapping wrote after it); nobody sees an error from here, so a
// failure is logged and the copy kept on disk.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	ctx = bg(ctx)
	c, n := h.c, h.n
	n.m.begin()
	defer n.m.end()
	c.mu.Lock()
	if h.write {
		c.writers--
	}
	commit := h.write && c.writers == 0 && c.dirty
	c.mu.Unlock()
	if commit {
		if err := n.commit(ctx, c); err != nil {
			n.m.log.Error("commit after the last close failed", "path", n.path(""), "err", err)
			c.mu.Lock()
			c.keep = true
			c.mu.Unlock()
		}
	}
	n.release(c)
	return 0
}
