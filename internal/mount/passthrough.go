package mount

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// FUSE passthrough (Linux 6.9 and later, as root): the kernel reads and
// writes the open copy of a file (content.f) itself, at local-disk
// speed, without a request to the mount per read or write. The mount
// still sees every open, close (flush), fsync, truncate and release, and
// commits at close (blocking mode) or queues at the last writer's release
// (write-back mode) as before.
//
// The kernel's rules, which every open here keeps (fs/fuse/iomode.c):
// while any open of an inode is passthrough, every open of it must be,
// on one backing file; an open that breaks them fails with EIO. go-fuse
// registers one backing file per inode at its first passthrough open
// (the copy's descriptor, handle.PassthroughFd) and reuses it for every
// open until the last is released. So:
//
//   - node.pt is the copy the kernel has as the inode's backing file,
//     reserved by the open that chose it, cleared when go-fuse lets the
//     registration go (backing.UnregisterBackingFd, which runs after the
//     last release: an open in that gap waits for it).
//   - An open while the kernel has a backing file shares that copy. If the
//     copy is no longer the file's current version (committed elsewhere
//     while a descriptor here keeps it open), the copy is refreshed in
//     place: the new open sees the new version, and so do the descriptors
//     still open on it, from then on (as over NFS); without passthrough
//     they keep reading their version. A refreshed copy leaves the cache
//     index (it lives in work/ until its last close; a mount killed
//     meanwhile leaves it in unsaved/).
//   - The mount no longer sees writes: an open for writing takes the copy
//     out of the cache index at once (prepareWrite) and arms it (harvest):
//     its file's mtime is set to a sentinel that no write leaves behind,
//     so a commit knows from fstat whether the copy was written since, and
//     its size. Stores through a shared writable mapping of pages already
//     dirty do not move the mtime: the last writer's release compares the
//     copy with a checksum of what the last commit read, and commits again
//     if they differ.
//   - A shared writable mapping outlives its descriptor's close: the
//     kernel moves it onto the backing file, so the last writer's release
//     comes while it can still store into the copy. A file lease tells
//     whether one is left; if so the copy is held until it goes, then
//     committed again if it changed (held.go).
//   - Queued commits (write-back mode). A queued commit reads its data
//     later, from a file nothing may write meanwhile. Non-blocking mode
//     queues at every close, while the open it closes may still write
//     through another descriptor, and copies the queued file before the
//     next write (prepareWrite): a write the mount never sees cannot wait
//     for that, so that mode never uses passthrough. Write-back mode
//     queues at the last writer's release instead (saveAtClose), once no
//     open of the kernel can write the copy: the copy's file becomes the
//     commit's data (frozen), uncopied. An open for writing that comes
//     before the commit is done leaves the file in place (it may be the
//     kernel's backing file, shared with readers still open) and gives the
//     queue a copy of its own first (copyOut: the copy takes the name the
//     queue knows, so its records stay as they are; a commit reading the
//     data meanwhile is waited for). A commit queued while the kernel may
//     still write the copy (a truncate by path while a writer is open, a
//     copy held for a writable mapping) gets a copy made at once
//     (enqueue).

// Passthrough says whether a mount lets the kernel read and write open
// copies directly (FUSE passthrough).
//
// A writable shared mapping of a passthrough file stores into the copy
// after its descriptor's close (the kernel moves it onto the backing
// file, so the mount's release comes at the close(2)): such a copy is
// held until a file lease shows the mapping gone, then committed again
// if it changed (held.go). Without passthrough the mapping holds the
// file and the release comes after munmap, with its writes.
type Passthrough int

const (
	// PassthroughAuto (the default) uses passthrough when the kernel
	// offers it (Linux 6.9 and later), the mount may register backing
	// files (root) and the cache's disk grants file leases, in blocking
	// mode; elsewise the mount logs why and serves reads and writes
	// itself.
	PassthroughAuto Passthrough = iota
	// PassthroughOff serves every read and write through the mount.
	PassthroughOff
)

// ParsePassthrough reads "auto" or "off" ("": auto).
func ParsePassthrough(s string) (Passthrough, error) {
	switch s {
	case "auto", "":
		return PassthroughAuto, nil
	case "off":
		return PassthroughOff, nil
	}
	return 0, cairn.E("mount", cairn.Invalid, s, errors.New("passthrough must be auto or off"))
}

func (p Passthrough) String() string {
	if p == PassthroughOff {
		return "off"
	}
	return "auto"
}

// backing is the node bridge's view of the server (its ServerCallbacks):
// it forwards every call, and follows go-fuse's registrations of backing
// files so that node.pt is exactly the copy the kernel holds.
type backing struct {
	srv    atomic.Pointer[fuse.Server]
	on     atomic.Bool // the probe at mount succeeded and no registration failed since
	failed atomic.Bool
	log    interface{ Error(string, ...any) }

	mu       sync.Mutex
	next     *node    // whose copy PassthroughFd just gave (go-fuse registers it at once)
	nextFile *os.File // the descriptor it gave (the kernel keeps its own reference)
	ids      map[int32]*node
}

var _ gofs.ServerCallbacks = (*backing)(nil)

func (b *backing) DeleteNotify(parent, child uint64, name string) fuse.Status {
	return b.srv.Load().DeleteNotify(parent, child, name)
}
func (b *backing) EntryNotify(parent uint64, name string) fuse.Status {
	return b.srv.Load().EntryNotify(parent, name)
}
func (b *backing) InodeNotify(node uint64, off, length int64) fuse.Status {
	return b.srv.Load().InodeNotify(node, off, length)
}
func (b *backing) InodeRetrieveCache(node uint64, off int64, dest []byte) (int, fuse.Status) {
	return b.srv.Load().InodeRetrieveCache(node, off, dest)
}
func (b *backing) InodeNotifyStoreCache(node uint64, off int64, data []byte) fuse.Status {
	return b.srv.Load().InodeNotifyStoreCache(node, off, data)
}

// RegisterBackingFd is called by go-fuse (under its backing lock) right
// after a handle's PassthroughFd.
func (b *backing) RegisterBackingFd(m *fuse.BackingMap) (int32, syscall.Errno) {
	id, errno := b.srv.Load().RegisterBackingFd(m)
	b.mu.Lock()
	n, nf := b.next, b.nextFile
	b.next, b.nextFile = nil, nil
	if errno == 0 && n != nil {
		b.ids[id] = n
	}
	b.mu.Unlock()
	if nf != nil {
		nf.Close()
	}
	if errno != 0 {
		// go-fuse now opens every file without passthrough.
		b.on.Store(false)
		b.failed.Store(true)
		b.log.Error("passthrough: the kernel refused a backing file; files opened from now on go through the mount", "err", errno)
		return id, errno
	}
	if n != nil {
		n.mu.Lock()
		n.ptID = id
		n.mu.Unlock()
	}
	return id, 0
}

// UnregisterBackingFd is called by go-fuse once the last open of an inode
// with a backing file is released.
func (b *backing) UnregisterBackingFd(id int32) syscall.Errno {
	errno := b.srv.Load().UnregisterBackingFd(id)
	b.mu.Lock()
	n := b.ids[id]
	delete(b.ids, id)
	b.mu.Unlock()
	if n != nil {
		n.mu.Lock()
		if n.ptID == id {
			n.ptID = 0
			// An open that shared the copy after this release's handle
			// let go, before go-fuse let the registration go, registers
			// it again (PassthroughFd): it stays reserved for it.
			if n.ptHandles == 0 {
				n.pt = nil
			}
		}
		n.mu.Unlock()
		n.m.kickHeld() // the kernel let the copy go: a held one may be settled
	}
	return errno
}

// rawFS keeps the node bridge's ServerCallbacks (backing) in place: the
// bridge's own Init would replace them with the server.
type rawFS struct {
	fuse.RawFileSystem
	b *backing
}

func (r *rawFS) Init(s *fuse.Server) { r.b.srv.Store(s) }

// probePassthrough registers a backing file and lets it go: it fails when
// the kernel has no passthrough, the mount may not use it (not root), or
// the cache's disk cannot back a FUSE file.
func probePassthrough(s *fuse.Server, dir string) error {
	f, err := os.CreateTemp(filepath.Join(dir, "tmp"), "probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	id, errno := s.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
	if errno != 0 {
		return errno
	}
	if errno := s.UnregisterBackingFd(id); errno != 0 {
		return errno
	}
	// Leases tell when a writable mapping of a copy is gone (held.go).
	if free, err := leaseFree(f, unix.F_WRLCK); err != nil || !free {
		return fmt.Errorf("no file lease on the cache's disk (needed to see writable mappings go): %v", err)
	}
	return nil
}

// ptHandle is a handle the kernel reads and writes through: its copy's
// file is the inode's backing file.
type ptHandle struct{ *handle }

var _ gofs.FilePassthroughFder = (*ptHandle)(nil)

// PassthroughFd gives go-fuse the copy's descriptor to register, at the
// first passthrough open of the inode (later ones reuse the registration:
// node.openPT made them share this copy).
func (p *ptHandle) PassthroughFd() (int, bool) {
	h := p.handle
	n := h.n
	n.mu.Lock()
	ok := n.pt == h.c
	n.mu.Unlock()
	// fmu held shared across the reopen: a reopen of the copy (content.
	// reopen) closes the descriptor it replaces, whose number could then
	// be another file's.
	c := h.c
	c.fmu.RLock()
	f := c.f
	if !ok || f == nil {
		c.fmu.RUnlock()
		n.m.log.Error("passthrough: an open's copy is not the inode's backing file (bug); it goes through the mount", "path", n.path(""))
		return 0, false
	}
	// The kernel gets a read-only description of the copy (it opens the
	// copy anew, with each open's own flags, for the reads and writes of
	// that open): so that only writers and writable mappings count as
	// writers of the copy (held.go).
	rf, err := os.Open("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	c.fmu.RUnlock()
	if err != nil {
		n.m.log.Error("passthrough: reopening a copy read-only failed; it goes through the mount", "path", n.path(""), "err", err)
		return 0, false
	}
	b := n.m.pt
	b.mu.Lock()
	b.next, b.nextFile = n, rf
	b.mu.Unlock()
	return int(rf.Fd()), true
}

// asHandle returns the handle behind a file handle of this mount.
func asHandle(f gofs.FileHandle) (*handle, bool) {
	switch h := f.(type) {
	case *handle:
		return h, true
	case *ptHandle:
		return h.handle, true
	}
	return nil, false
}

// fileHandle is what the kernel gets for h.
func (h *handle) fileHandle() gofs.FileHandle {
	if h.pt {
		return &ptHandle{h}
	}
	return h
}

// ptOn reports whether new opens use passthrough.
func (m *Mount) ptOn() bool { return m.pt != nil && m.pt.on.Load() }

// openKernel opens for the kernel (Open, Create): through passthrough
// when the mount uses it.
func (n *node) openKernel(ctx context.Context, e *meta.Entry, flags uint32) (*handle, error) {
	if !n.m.ptOn() {
		return n.open(ctx, e, flags)
	}
	return n.openPT(ctx, e, flags)
}

// ptWait bounds the wait for go-fuse to let a released backing file go.
const ptWait = 10 * time.Second

// openPT opens n for a passthrough handle: on the copy the kernel already
// has as n's backing file if it has one (refreshed to e's version if it
// is an older one), else on the copy an open would get, which becomes it.
// Opens of one node are serialized here, so two never pick different
// copies.
func (n *node) openPT(ctx context.Context, e *meta.Entry, flags uint32) (*handle, error) {
	n.openMu.Lock()
	defer n.openMu.Unlock()
	n.mu.Lock()
	for deadline := time.Now().Add(ptWait); n.pt != nil && n.ptHandles == 0; {
		if n.ptID == 0 {
			n.pt = nil // reserved, never registered (registration failed)
			break
		}
		// Every handle on it is released; go-fuse is about to let the
		// registration go.
		n.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, cairn.E("open", cairn.IO, n.path(""), errors.New("passthrough: the kernel's backing file of a closed file was not released"))
		}
		time.Sleep(200 * time.Microsecond)
		n.mu.Lock()
	}
	// A copy shared is referenced here, under n.mu, with the handle
	// counted: a handle on it still counted has not let its reference go
	// (drop uncounts it first), so the copy is still open. Referenced
	// after n.mu, the release could close it meanwhile (and remove it:
	// a work copy holding nothing), and the open fail with ENOENT.
	b := n.pt
	if b != nil {
		if err := n.m.cache.ref(b); err != nil {
			n.mu.Unlock()
			return nil, err
		}
		n.ptHandles++
	}
	n.mu.Unlock()
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	if b == nil {
		h, err := n.open(ctx, e, flags)
		if err != nil {
			return nil, err
		}
		if write {
			if err := n.m.ptWriter(h.c); err != nil {
				h.abandon()
				return nil, err
			}
		}
		h.pt = true
		n.mu.Lock()
		n.pt = h.c
		n.ptHandles++
		n.mu.Unlock()
		return h, nil
	}
	h, err := n.share(ctx, b, e, flags)
	if err != nil {
		n.ptClosed()
		return nil, err
	}
	h.pt = true
	return h, nil
}

// share opens a handle on b, the kernel's backing file of n, which the
// caller has referenced for it (the reference is the handle's, or let go
// if share fails).
func (n *node) share(ctx context.Context, b *content, e *meta.Entry, flags uint32) (*handle, error) {
	m := n.m
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	trunc := write && flags&syscall.O_TRUNC != 0
	// Judged against the newest entry this mount knows, as acquire does:
	// e was read before a commit of this mount that may have ended since
	// (b is then a copy of that newer version, not to be refreshed to e's
	// older one). A commit clears dirty after it records its entry
	// (wroteEntry, under n.mu), so one seen here as done is in n.wrote.
	n.mu.Lock()
	e = n.fresherLocked(e)
	b.mu.Lock()
	held := b.held
	b.mu.Unlock()
	// A held copy is not refreshed: a mapping may still store into it
	// (held.go); the new open shares it as it is.
	stale := !held && !b.usable(e)
	n.mu.Unlock()
	if stale {
		if err := n.retarget(ctx, b, e, trunc); err != nil {
			m.cache.unref(b)
			return nil, err
		}
	}
	b.addWriter(write)
	h := &handle{n: n, c: b, write: write, append: flags&syscall.O_APPEND != 0}
	if trunc {
		if err := m.truncatedAtOpen(b); err != nil {
			h.abandon()
			return nil, err
		}
	}
	if write {
		if err := m.ptWriter(b); err != nil {
			h.abandon()
			return nil, err
		}
	}
	n.mu.Lock()
	n.content = b
	n.mu.Unlock()
	return h, nil
}

// retarget makes b, a clean copy of an older version open here, a copy
// of e's current version in place (empty for an open that truncates): it
// is the kernel's backing file, which cannot change while it is open.
func (n *node) retarget(ctx context.Context, b *content, e *meta.Entry, trunc bool) error {
	m := n.m
	cur := e.Current()
	var src *content
	if cur != nil && !trunc {
		var err error
		if src, err = m.load(ctx, e, false); err != nil {
			return err
		}
		defer m.cache.unref(src)
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if err := m.cache.detach(b); err != nil {
		return err
	}
	bf, err := b.writable()
	if err != nil {
		return err
	}
	var size int64
	if src != nil {
		size = cur.Size
		if err := copyInto(bf, src.file(), size); err != nil {
			return cairn.E("open", cairn.IO, b.ino16(), err)
		}
	}
	if err := bf.Truncate(size); err != nil {
		return cairn.E("open", cairn.IO, b.ino16(), err)
	}
	b.mu.Lock()
	b.size, b.dirty, b.gone, b.sumOK = size, false, false, false
	b.version, b.manifest = cur != nil, cairn.ID{}
	b.mtime = time.Unix(0, e.Mtime)
	if cur != nil {
		b.manifest = cur.Manifest
		b.mtime = time.Unix(0, cur.Mtime)
		b.dirty = trunc && cur.Size > 0
	}
	armed := b.ptw
	b.ptw = false
	b.mu.Unlock()
	// The refresh moved the file's mtime as a write would: armed again,
	// so that only the kernel's writes from now on count (harvest).
	if armed {
		if err := m.harvest(b); err != nil {
			return err
		}
	}
	m.log.Debug("passthrough: a copy still open was refreshed to the current version for a new open", "path", n.path(""))
	return nil
}

// copyInto copies the first size bytes of src over dst's (in the kernel
// where it can).
func copyInto(dst, src *os.File, size int64) error {
	var roff, woff int64
	for roff < size {
		k, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(size-roff, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) {
				_, err = io.Copy(io.NewOffsetWriter(dst, woff), io.NewSectionReader(src, roff, size-roff))
			}
			return err
		}
		if k == 0 {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}

// abandon undoes an open that fails after its copy was acquired (the
// caller lets the writer lock go).
func (h *handle) abandon() {
	if h.write {
		h.c.mu.Lock()
		h.c.writers--
		h.c.mu.Unlock()
	}
	h.n.release(h.c)
}

// ptClosed counts a passthrough handle of n gone (released, or an open
// that failed).
func (n *node) ptClosed() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ptHandles--; n.ptHandles == 0 && n.ptID == 0 {
		n.pt = nil
	}
}

// ptWriter prepares c for a passthrough handle that may write: out of the
// cache index, and armed (harvest).
func (m *Mount) ptWriter(c *content) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := m.prepareWrite(c); err != nil {
		return err
	}
	c.mu.Lock()
	first := c.writers == 1
	if first && !c.held {
		// A new round of writers (a held copy keeps the checksum of its
		// last commit: a mapping may still store into it unseen).
		c.sumOK = false
	}
	c.mu.Unlock()
	return m.harvest(c)
}

// sentinel is the mtime an armed copy's file has while unwritten: a
// write sets it to the present.
var sentinel = unix.Timespec{Sec: 0, Nsec: 1}

func isSentinel(t time.Time) bool {
	return t.Unix() == sentinel.Sec && t.Nanosecond() == int(sentinel.Nsec)
}

// harvest, with c.wmu held, takes what the kernel wrote to an armed copy
// into c (dirty, mtime, size) and arms it again; it arms a copy that was
// not. A write(2) holds the file's inode lock from its mtime update to
// its last byte, as the reset here does: each write is either wholly
// before it (seen now, and in what the caller reads next) or moves the
// mtime again after it.
//
// c.fmu is held shared throughout: a caller without a reference to c (a
// utime by path: Setattr) may harvest while the last reference goes,
// which closes c's file without wmu (cache.unref). Its descriptor's
// number must stay c's until the arming through /proc/self/fd is done
// (else the arming fails with ENOENT, or arms another file that got the
// number); closed before, there is nothing to harvest.
func (m *Mount) harvest(c *content) error {
	c.fmu.RLock()
	defer c.fmu.RUnlock()
	f := c.f
	if f == nil {
		return nil // closed: nothing can write it
	}
	fi, err := f.Stat()
	if err != nil {
		return cairn.E("write", cairn.IO, c.ino16(), err)
	}
	c.mu.Lock()
	if c.ptw {
		c.size = fi.Size()
		if mt := fi.ModTime(); !isSentinel(mt) {
			c.dirty, c.mtime = true, mt
			c.ctime = later(c.ctime, mt)
		}
	}
	c.ptw = true
	c.mu.Unlock()
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, sentinel}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), ts, 0); err != nil {
		return cairn.E("write", cairn.IO, c.ino16(), fmt.Errorf("passthrough: arming the copy: %w", err))
	}
	return nil
}

// ptLocal returns the size and mtime of an armed copy's file as stat
// shows them (mtime: zero while unwritten since armed).
func (c *content) ptLocal() (int64, time.Time, bool) {
	f := c.file()
	if f == nil {
		return 0, time.Time{}, false
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, time.Time{}, false
	}
	if mt := fi.ModTime(); !isSentinel(mt) {
		return fi.Size(), mt, true
	}
	return fi.Size(), time.Time{}, true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// summed wraps what a commit of an armed copy reads, so that *sum ends as
// the checksum of it.
func summed(r io.Reader, sum *uint32) io.Reader {
	*sum = 0
	return io.TeeReader(r, writerFunc(func(p []byte) (int, error) {
		*sum = crc32.Update(*sum, castagnoli, p)
		return len(p), nil
	}))
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// settlePT, at the release of the last handle that could write c (no
// writable mapping of it is left), marks c dirty if its file changed
// since the last commit in ways the mtime does not show (stores through
// a writable mapping to pages already dirty when it was armed again).
func (m *Mount) settlePT(c *content) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := m.harvest(c); err != nil {
		return err
	}
	c.mu.Lock()
	check := !c.dirty && c.sumOK
	size, want := c.size, c.sum
	c.mu.Unlock()
	f := c.file()
	if !check || f == nil {
		return nil
	}
	var got uint32
	if _, err := io.Copy(io.Discard, summed(io.NewSectionReader(f, 0, size), &got)); err != nil {
		return cairn.E("close", cairn.IO, c.ino16(), err)
	}
	if got != want {
		c.mu.Lock()
		c.dirty, c.mtime = true, time.Now()
		c.ctime = c.mtime
		c.mu.Unlock()
	}
	return nil
}
