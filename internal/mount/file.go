package mount

import (
	"bufio"
	"container/list"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// content is one copy of a regular file on local disk (cache.go): a clean
// copy of a version, or a work copy holding writes. Every handle open on
// the file shares the node's current content, so descriptors of one mount
// see each other's writes at once, as on a local disk. A clean copy stays
// in the cache when its last handle is released.
//
// Durability (SCFS Table 1): a write lands in the copy (the kernel's page
// cache of it: no guarantee); fsync makes the copy durable on local disk;
// the close of a descriptor that wrote makes it durable in the store and
// current in the metadata (blocking mode), or queues that durably
// (non-blocking mode, queue.go).
//
// Locks, in the order they are taken: wmu, node.mu, the cache's mu, fmu, mu.
type content struct {
	ino uint64

	// wmu orders writes, truncates and commits: a commit reads the copy
	// while holding it, so a version is one state of the file.
	wmu sync.Mutex
	// qmu is held by a queued commit while it reads the copy's file as
	// its data, and by copyOut, which gives the queue a copy of its own
	// before the file is written.
	qmu sync.Mutex
	// fmu guards f against the swap of a copy-on-write (a write to a copy
	// a queued commit owns); reads hold it shared.
	fmu sync.RWMutex
	f   *os.File // nil while nobody has the copy open
	// ro: f is open read-only (passthrough, from the last writer's
	// release: held.go); writable makes it read-write again.
	ro bool

	// Guarded by the cache's mu.
	path   string        // where the copy is ("": renamed over, not ours)
	refs   int           // handles open on it, plus a fetch's
	cached bool          // indexed as the clean copy of key
	key    cacheKey      // what it is indexed under, while cached
	elem   *list.Element // its place in the LRU list while cached and closed
	named  bool          // path's directory entry is durable (fsynced)

	mu       sync.Mutex
	writers  int  // handles opened for writing
	dirty    bool // written since fetched or last committed (or queued)
	frozen   bool // its file is the data of a queued commit
	pending  int  // queued commits of it not yet done
	keep     bool // a commit failed: kept in unsaved/ when closed
	gone     bool // its file was removed while open: the copy is all there is
	size     int64
	mtime    time.Time
	version  bool      // it is (or, if dirty, was fetched from) a version
	manifest cairn.ID  // that version's manifest
	attrs    heldAttrs // set while written, for the next save to carry
	// ctime is when this mount last changed the copy's data or mtime: the
	// change time it shows while the copy holds what the metadata does
	// not yet (local), and the one a queued commit records, so that the
	// file's ctime does not move when the commit lands later (git
	// compares it with its index).
	ctime time.Time
	// truncOnly: its only change since fetched or saved is the truncation
	// of an open (O_TRUNC). A close of a descriptor of that open does not
	// save it while it is so (deferTrunc): `echo x > f` closes the
	// shell's own descriptor before the command writes through its dup,
	// and an empty version in between would cost one of the kept ones
	// and show other devices an empty file. The writes that follow are
	// saved with their close; the last release saves a truncation alone.
	truncOnly bool
	// releasing counts last writers' releases still saving it: the
	// kernel's writes to a passthrough copy are in its file, not yet in
	// dirty, until the release has taken them in (harvest).
	releasing int
	// flushedWriters counts the writers of write-back mode closed at
	// least once (a flush) and not released yet: most are closed for
	// good, their release on its way (waitReleases).
	flushedWriters int
	// closed: a close(2) of a writer, in write-back mode, left writes
	// that no commit has queued yet: counted in Mount.closed until the
	// last writer's release has queued them (or found nothing to save),
	// so that the status (status.go) counts a file as pending from its
	// close, not from the release that comes later.
	closed bool
	// Passthrough (passthrough.go): ptw is set once a handle that may
	// write was opened on it: its file, not size/dirty/mtime, says what
	// the kernel wrote (harvest). sum is the checksum of what the last
	// commit read of it, if sumOK. held: a writable mapping may still
	// store into its file after the last writer's release (held.go).
	ptw   bool
	sum   uint32
	sumOK bool
	held  bool
	// holdGen counts the holds of it: an end of a hold clears only the
	// one it settled, not one set again meanwhile (held.go).
	holdGen uint64
}

// heldAttrs are the mode, owner and mtime set on a file while this mount
// writes it, in blocking mode: the save at close carries them, in the
// commit's own transaction when there are writes to commit, instead of a
// transaction each. tar sets all three on the descriptor it wrote, before
// closing it. Other devices see them with the version, at close, as they
// see its writes; this mount's stat shows them at once (fill).
type heldAttrs struct {
	setMode, setUID, setGID, setMtime bool
	mode, uid, gid                    uint32
	mtime                             time.Time
}

func (a heldAttrs) any() bool { return a.setMode || a.setUID || a.setGID || a.setMtime }

// over returns a with what b sets on top (b is the newer).
func (a heldAttrs) over(b heldAttrs) heldAttrs {
	if b.setMode {
		a.setMode, a.mode = true, b.mode
	}
	if b.setUID {
		a.setUID, a.uid = true, b.uid
	}
	if b.setGID {
		a.setGID, a.gid = true, b.gid
	}
	if b.setMtime {
		a.setMtime, a.mtime = true, b.mtime
	}
	return a
}

// applyTo sets a's mode and owner (and mtime) in e.
func (a heldAttrs) applyTo(e *meta.Entry) {
	if a.setMode {
		e.Mode = a.mode & 07777
	}
	if a.setUID {
		e.UID = a.uid
	}
	if a.setGID {
		e.GID = a.gid
	}
	if a.setMtime {
		e.Mtime = a.mtime.UnixNano()
	}
}

// handle is one open of a file.
type handle struct {
	n       *node
	c       *content
	write   bool
	append  bool
	counted bool // in n.handles (an open the kernel made)
	pt      bool // the kernel reads and writes its copy directly (passthrough.go)
	// flushed: a writer of write-back mode the kernel sent a flush for
	// (a close(2)), counted in content.flushedWriters until its release
	// (c.mu).
	flushed bool
}

var (
	_ gofs.FileReader   = (*handle)(nil)
	_ gofs.FileWriter   = (*handle)(nil)
	_ gofs.FileFlusher  = (*handle)(nil)
	_ gofs.FileFsyncer  = (*handle)(nil)
	_ gofs.FileReleaser = (*handle)(nil)
)

// local returns the size, mtime and ctime of the copy, and the attributes held
// for its save, when they, not the metadata's, are the file's: it has
// writes not yet committed, a handle that may write, a queued commit, or
// its file was removed.
//
// An armed copy's file (passthrough) is read first, then c: a harvest in
// between (harvest takes the file's mtime into c, then arms the file
// again) is then seen in c, never missed in both; a write the file shows
// is later than anything c has.
func (c *content) local() (int64, time.Time, time.Time, heldAttrs, bool) {
	c.mu.Lock()
	ptw := c.ptw
	c.mu.Unlock()
	var ps int64
	var pmt time.Time
	var pok bool
	if ptw {
		// What the kernel wrote to it directly.
		ps, pmt, pok = c.ptLocal()
	}
	c.mu.Lock()
	size, mtime, ctime, attrs := c.size, c.mtime, c.ctime, c.attrs
	ok := c.dirty || c.writers > 0 || c.pending > 0 || c.gone || c.releasing > 0
	c.mu.Unlock()
	if ok && pok {
		size = ps
		if !pmt.IsZero() {
			mtime = pmt
			ctime = later(ctime, pmt)
		}
	}
	return size, mtime, ctime, attrs, ok
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// holdAttrs keeps attributes set on n for the save of its open copy, if
// that save is sure to come in blocking mode (a handle open for writing
// is still to close); it reports whether it kept them.
func (n *node) holdAttrs(a heldAttrs) bool {
	if n.m.mode != Blocking || n.typ != meta.TypeFile {
		return false
	}
	n.mu.Lock()
	c := n.content
	n.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writers == 0 || c.gone {
		return false
	}
	c.attrs = c.attrs.over(a)
	return true
}

// setAttrs writes a to n's entry now, with a compare-and-swap, read again
// and retried while a concurrent change wins.
func (n *node) setAttrs(ctx context.Context, a heldAttrs) error {
	if e, ok := n.m.wb.setAttrs(n, a); ok {
		n.remember(e)
		return nil
	}
	if err := n.m.wb.flush(ctx); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		fresh := attempt > 0
		e, err := n.readEntry(ctx, fresh)
		if err != nil {
			return err
		}
		was := *e
		a.applyTo(e)
		if e.Mode == was.Mode && e.UID == was.UID && e.GID == was.GID && e.Mtime == was.Mtime {
			if fresh {
				// Nothing changes (tar's chown, as root, of what it
				// made to root): no write.
				return nil
			}
			// Nothing changes as far as the entry cache knows; it may
			// not have heard yet of a change made on another device,
			// which this one must then undo: etcd says.
			continue
		}
		epoch := n.m.ents.writing()
		ne, err := n.m.vol.Meta.Update(ctx, e)
		n.m.ents.wrote(epoch, ne, false)
		if errors.Is(err, cairn.ErrConflict) && attempt < 20 {
			continue // a concurrent change won: read again
		}
		if err != nil {
			return err
		}
		n.remember(ne)
		return nil
	}
}

// usable reports whether a new open of a file whose entry is e may share
// c: always while c holds writes, writers, queued commits of this mount,
// a last writer's release not done saving it, or a writable mapping
// (held, held.go) (the last close wins, as in AFS),
// otherwise only while c is a copy of e's current version.
func (c *content) usable(e *meta.Entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirty || c.writers > 0 || c.pending > 0 || c.held || c.releasing > 0 {
		return true
	}
	cur := e.Current()
	if cur == nil {
		return !c.version && c.size == 0
	}
	return c.version && c.manifest == cur.Manifest && c.size == cur.Size
}

func (c *content) addWriter(write bool) {
	if write {
		c.mu.Lock()
		c.writers++
		c.mu.Unlock()
	}
}

func (c *content) touch(t time.Time) {
	c.mu.Lock()
	c.mtime, c.ctime = t, time.Now()
	c.mu.Unlock()
}

// touchContent sets c's mtime (utimes while open, or while a close's
// commit is queued): after what the kernel wrote to it directly so far,
// which is older. Commits of it queued already get the mtime too
// (queue.touched): under wmu, so that a close queuing one meanwhile
// (enqueue) reads the mtime set, or is done before. (Blocking mode
// queues nothing, and its commits hold wmu throughout.)
func (m *Mount) touchContent(c *content, t time.Time) syscall.Errno {
	c.mu.Lock()
	ptw := c.ptw
	c.mu.Unlock()
	if ptw || m.mode != Blocking {
		c.wmu.Lock()
		defer c.wmu.Unlock()
	}
	if ptw {
		if err := m.harvest(c); err != nil {
			return m.errno("setattr", "", err)
		}
	}
	c.touch(t)
	m.queue.touched(c.ino, t)
	return 0
}

// file returns the open copy: stable while wmu is held by a caller with
// a reference to c (the last reference's release closes it without wmu:
// cache.unref). Without one, use it only through the *os.File (which
// keeps its descriptor until its own calls end), never by its number.
func (c *content) file() *os.File {
	c.fmu.RLock()
	defer c.fmu.RUnlock()
	return c.f
}

// writable, with wmu held, returns the open copy for the mount to write
// (open read-write again if the last writer's release left it
// read-only).
func (c *content) writable() (*os.File, error) {
	return c.reopen(os.O_RDWR, false)
}

// reopen, with wmu held, opens c's file again with flag (os.O_RDONLY or
// os.O_RDWR) unless it is open so, and closes the descriptor it had: a
// new open file description of the same inode, wherever it was renamed.
func (c *content) reopen(flag int, ro bool) (*os.File, error) {
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if c.f == nil || c.ro == ro {
		return c.f, nil
	}
	nf, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(c.f.Fd())), flag, 0)
	if err != nil {
		return nil, cairn.E("open", cairn.IO, c.ino16(), err)
	}
	c.f.Close()
	c.f, c.ro = nf, ro
	return nf, nil
}

// prepareWrite, with c.wmu held, makes c's copy one a write may change: a
// copy a queued commit owns is copied first, a clean copy leaves the
// cache's index. Where the kernel may write copies itself (passthrough),
// the queue gets the copy (copyOut) and c keeps its file, which may be
// the kernel's backing file of the inode: one it cannot be given another
// of while any open of the file lasts.
func (m *Mount) prepareWrite(c *content) error {
	c.mu.Lock()
	frozen, size := c.frozen, c.size
	c.mu.Unlock()
	if frozen && m.pt != nil {
		if err := m.copyOut(c); err != nil {
			return err
		}
		return m.cache.detach(c)
	}
	if frozen {
		m.cache.mu.Lock()
		src := c.path
		m.cache.mu.Unlock()
		nf, np, err := m.cache.copyFile(src, c.ino, size)
		if err != nil {
			return err
		}
		c.fmu.Lock()
		old := c.f
		c.f, c.ro = nf, false
		c.fmu.Unlock()
		old.Close() // the queue reads its own descriptor
		m.cache.mu.Lock()
		c.path, c.named = np, false
		m.cache.mu.Unlock()
		c.mu.Lock()
		c.frozen = false
		c.mu.Unlock()
		return nil
	}
	return m.cache.detach(c)
}

// truncateContent cuts c to size. touch: a truncate(2) or ftruncate(2),
// which advances the mtime and ctime even to the size the file has (as
// a local disk does): the copy is then saved as a write would be (an
// open's O_TRUNC of an empty file leaves them: truncatedAtOpen).
func (m *Mount) truncateContent(c *content, size int64, touch bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := m.prepareWrite(c); err != nil {
		return err
	}
	f, err := c.writable()
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		return cairn.E("truncate", cairn.IO, c.ino16(), err)
	}
	c.mu.Lock()
	if size != c.size || touch {
		c.size, c.dirty, c.mtime = size, true, time.Now()
		c.ctime = c.mtime
	}
	c.truncOnly = false
	c.mu.Unlock()
	return nil
}

// truncatedAtOpen truncates c for an open with O_TRUNC: the truncation
// is part of the writer's change, saved with its writes (truncOnly). The
// open changes the mtime and ctime of a file it empties (or whose
// uncommitted writes it drops) at once, as on a local disk (POSIX open:
// marked for update), even when its copy was loaded empty for it (load):
// the save carries them.
func (m *Mount) truncatedAtOpen(c *content) error {
	if err := m.truncateContent(c, 0, false); err != nil {
		return err
	}
	c.mu.Lock()
	c.truncOnly = c.dirty
	if c.dirty {
		c.mtime = time.Now()
		c.ctime = c.mtime
	}
	c.mu.Unlock()
	return nil
}

// deferTrunc reports whether a close of a descriptor leaves c unsaved
// because it holds nothing but the truncation of its open (truncOnly):
// the last release saves it if nothing else does. A copy the kernel
// writes itself (passthrough) is judged by its file.
func (c *content) deferTrunc() bool {
	c.mu.Lock()
	only, ptw, size := c.truncOnly && c.dirty, c.ptw, c.size
	c.mu.Unlock()
	if !only {
		return false
	}
	if ptw {
		c.fmu.RLock()
		if f := c.f; f != nil {
			if fi, err := f.Stat(); err != nil || fi.Size() > 0 {
				size = 1
			}
		}
		c.fmu.RUnlock()
	}
	if size == 0 {
		return true
	}
	c.mu.Lock()
	c.truncOnly = false
	c.mu.Unlock()
	return false
}

// load returns a copy of e's current version with one reference: from
// the cache, or fetched from the store into it (empty: an empty work copy,
// for an open that truncates).
func (m *Mount) load(ctx context.Context, e *meta.Entry, empty bool) (*content, error) {
	cur := e.Current()
	if cur == nil || empty {
		c, err := m.cache.newWork(e.Ino)
		if err != nil {
			return nil, err
		}
		c.mtime = time.Unix(0, e.Mtime)
		if cur != nil {
			c.version, c.manifest = true, cur.Manifest
			c.dirty = cur.Size > 0
		}
		return c, nil
	}
	k := cacheKey{e.Ino, cur.Manifest}
	if c, ok := m.cache.lookup(k, cur.Size); ok {
		return c, nil
	}
	f, err := m.cache.newTmp()
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = m.vol.ReadFile(ctx, e, cur, w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	c, err := m.cache.insertFetched(f, k, cur.Size)
	if err != nil {
		return nil, err
	}
	c.mtime = time.Unix(0, cur.Mtime)
	return c, nil
}

// acquire returns the copy a new handle of n shares, loading e's current
// version when there is none it may share (an older one lives on for the
// handles that have it). An e read before a commit of this mount ended is
// taken as that commit wrote it (node.wrote): the copy the commit made
// stops vouching for the file once it ends.
func (n *node) acquire(ctx context.Context, e *meta.Entry, write, empty bool) (*content, error) {
	m := n.m
	for {
		n.mu.Lock()
		e = n.fresherLocked(e)
		if c := n.content; c != nil && c.usable(e) {
			if m.cache.ref(c) == nil {
				c.addWriter(write)
				n.mu.Unlock()
				return c, nil
			}
			n.content = nil // its file was evicted
		}
		n.mu.Unlock()
		// Loaded without n.mu: a slow fetch does not hold up stat.
		c, err := m.load(ctx, e, empty)
		if err != nil {
			return nil, err
		}
		n.mu.Lock()
		if f := n.fresherLocked(e); f != e {
			// A commit of this mount ended during the load: what was
			// loaded is older than the file now is.
			n.mu.Unlock()
			m.discard(c, empty)
			e = f
			continue
		}
		if old := n.content; old != nil && old != c && old.usable(e) && m.cache.ref(old) == nil {
			n.mu.Unlock()
			m.discard(c, empty) // another open got there first
			old.addWriter(write)
			return old, nil
		}
		n.content = c
		c.addWriter(write)
		n.mu.Unlock()
		return c, nil
	}
}

// discard lets go of c, just loaded by load(..., empty) and not used. An
// empty work copy (for an open that truncates: nobody else has it) holds
// no writes to keep.
func (m *Mount) discard(c *content, empty bool) {
	if empty {
		c.mu.Lock()
		c.dirty = false
		c.mu.Unlock()
	}
	m.cache.unref(c)
}

// release lets go of a handle's reference to c. The node keeps pointing
// at a copy with a queued commit, so that a new open here sees its writes
// before the commit is done.
func (n *node) release(c *content) {
	n.mu.Lock()
	n.m.cache.mu.Lock()
	last := c.refs == 1
	n.m.cache.mu.Unlock()
	c.mu.Lock()
	pending := c.pending > 0 || c.held
	c.mu.Unlock()
	if last && n.content == c && !pending {
		n.content = nil
	}
	n.mu.Unlock()
	n.m.cache.unref(c)
}

// forgetClosed stops pointing at c once nobody has it open and it has no
// queued commit left.
func (n *node) forgetClosed(c *content) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.content != c {
		return
	}
	n.m.cache.mu.Lock()
	closed := c.refs == 0
	n.m.cache.mu.Unlock()
	c.mu.Lock()
	pending := c.pending > 0 || c.held
	c.mu.Unlock()
	if closed && !pending {
		n.content = nil
	}
}

// Open reads the file's entry (from the entry cache while the watch
// vouches for it, else from the metadata service) and gives a handle on a
// copy of its current version: the one this mount has open, one in the
// disk cache, or one fetched now. An open for writing first takes the
// file's writer lock. The kernel keeps its page cache of the file when the
// copy is the one it read last (the memory buffer of an open file).
func (n *node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 && n.m.offlineWrite() {
		return nil, 0, syscall.EROFS
	}
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
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		name, p, ok := n.place()
		if !ok {
			return nil, 0, syscall.ENOENT
		}
		if err = n.lockForWrite(ctx, p, name); err != nil {
			return nil, 0, n.m.errno("open for writing", n.path(""), err)
		}
		// An unprivileged writer clears the set-ID bits (killPriv): at
		// the open, as the mount may never see the writes (passthrough).
		if uid, _ := caller(ctx); uid != 0 {
			if m, kill := n.killPriv(ctx); kill {
				if err = n.setAttrs(ctx, heldAttrs{setMode: true, mode: m}); err != nil {
					n.unlockWrite(ctx)
					return nil, 0, n.m.errno("open for writing", n.path(""), err)
				}
			}
		}
	}
	h, err := n.openKernel(ctx, e, flags)
	if err != nil {
		if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
			n.unlockWrite(ctx)
		}
		return nil, 0, n.m.errno("open", n.path(""), err)
	}
	return h.fileHandle(), n.opened(h), 0
}

// opened records a new handle on c and returns the open flags for the
// kernel: FOPEN_KEEP_CACHE when its page cache can only hold c's bytes
// (the kernel drops it at every other open); FOPEN_NOFLUSH when the
// handle's closes have nothing to do (Flush): the kernel then sends no
// FLUSH request, and close(2) waits for no round trip to the mount.
func (n *node) opened(h *handle) uint32 {
	c := h.c
	h.counted = true
	if h.write {
		n.m.writeHandles.Add(1)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.handles == nil {
		n.handles = map[*content]int{}
	}
	n.handles[c]++
	others := len(n.handles) > 1
	keep := n.served == c && !n.mixed && !others
	n.served = c
	// Another copy's handles can fill the page cache from now on; an
	// open that drops it while no other copy is open makes it clean.
	n.mixed = others
	var flags uint32
	if !h.flushes() {
		flags |= fuse.FOPEN_NOFLUSH
	}
	if keep {
		flags |= fuse.FOPEN_KEEP_CACHE
	}
	return flags
}

// flushes reports whether the kernel sends a FLUSH at each close(2) of
// h: for a handle that may write. Blocking and non-blocking modes save
// there (saveAtClose); write-back mode counts the file as pending there
// (Flush), so that the status (status.go) has it from the moment the
// close returns, before the release.
func (h *handle) flushes() bool { return h.write }

// saveAtClose reports whether a close(2) of h saves the file (Flush): one
// that may write, in blocking and non-blocking modes. In write-back mode
// the last writer's release queues the commit instead (Release), as a
// local disk writes back after the close: a descriptor open elsewhere on
// the same open file may still write, unseen by the mount if the kernel
// writes the copy itself (passthrough), so the copy is the queue's only
// once the kernel has let the open go.
func (h *handle) saveAtClose() bool {
	return h.write && h.n.m.mode != WriteBack
}

// closed records the release of a handle on c.
func (n *node) closed(c *content) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.handles[c]--; n.handles[c] <= 0 {
		delete(n.handles, c)
	}
}

// open gives a handle on a copy of e's current version. For writing, the
// caller holds the writer lock.
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
		if err := n.m.truncatedAtOpen(c); err != nil {
			if write {
				c.mu.Lock()
				c.writers--
				c.mu.Unlock()
			}
			n.release(c)
			return nil, err
		}
	}
	return h, nil
}

// Create makes an empty file (no version yet) and opens it. A name made
// meanwhile by someone else is opened instead, unless O_EXCL.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.m.offlineWrite() {
		return nil, nil, 0, syscall.EROFS
	}
	ctx = bg(ctx)
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	// A new file's writer lock is taken by the create's own transaction.
	e, l, pending, errno := n.createLocked(ctx, meta.Entry{Name: name, Type: meta.TypeFile, Mode: mode & 07777}, write)
	if errno == syscall.EEXIST && e != nil && flags&syscall.O_EXCL == 0 {
		errno = 0
	}
	if errno != 0 {
		return nil, nil, 0, errno
	}
	ch := n.child(ctx, e, out)
	cn := ch.Operations().(*node)
	if l != nil || (pending && write) {
		// A pending new file (write-back) is seen by no other device:
		// its lock is taken by its commit (commitLock).
		cn.adoptLock(ctx, l)
	} else if write {
		if err := cn.lockForWrite(ctx, n, name); err != nil {
			return nil, nil, 0, n.m.errno("create", n.path(name), err)
		}
	}
	h, err := cn.openKernel(ctx, e, flags)
	if err != nil {
		if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
			cn.unlockWrite(ctx)
		}
		return nil, nil, 0, n.m.errno("create", n.path(name), err)
	}
	return ch, h.fileHandle(), cn.opened(h), 0
}

// truncate cuts a file to size: in h's copy (ftruncate; the commit is at
// close), or, for truncate(2) by path, in a copy opened for it and
// committed (or queued) at once.
func (n *node) truncate(ctx context.Context, h *handle, size int64) syscall.Errno {
	if h != nil {
		if err := n.m.truncateContent(h.c, size, true); err != nil {
			return n.m.errno("truncate", n.path(""), err)
		}
		return 0
	}
	e, err := n.entry(ctx)
	if err != nil {
		return n.m.errno("truncate", n.path(""), err)
	}
	name, p, ok := n.place()
	if !ok {
		return syscall.ENOENT
	}
	if err = n.lockForWrite(ctx, p, name); err != nil {
		return n.m.errno("truncate", n.path(""), err)
	}
	flags := uint32(syscall.O_WRONLY)
	if size == 0 {
		flags |= syscall.O_TRUNC
	}
	h, err = n.open(ctx, e, flags)
	if err != nil {
		n.unlockWrite(ctx)
		return n.m.errno("truncate", n.path(""), err)
	}
	if err = n.m.truncateContent(h.c, size, true); err == nil {
		err = n.save(ctx, h.c)
	}
	h.Release(ctx)
	return n.m.errno("truncate", n.path(""), err)
}

// save makes c's writes durable as the mode says: committed now
// (blocking), or on local disk and queued (non-blocking, write-back).
func (n *node) save(ctx context.Context, c *content) error {
	if n.m.mode != Blocking {
		return n.enqueue(ctx, c)
	}
	n.m.begin()
	defer n.m.end()
	n.m.saving.Add(1)
	defer n.m.saving.Add(-1)
	err := n.commit(ctx, c)
	n.m.countCommit(err)
	return err
}

// commitAttrs are the attributes a new version of n gets: the entry's
// mode and owner now, not when it was opened (a chmod while open must
// survive the commit).
func (n *node) commitAttrs(ctx context.Context, parent *node, name string, mtime time.Time) (fs.Attrs, error) {
	n.mu.Lock()
	last := n.last
	n.mu.Unlock()
	attrs := fs.Attrs{Mode: last.Mode, UID: last.UID, GID: last.GID, Mtime: mtime}
	switch cur, err := n.m.ents.get(ctx, parent.ino, name, false); {
	case err == nil:
		attrs.Mode, attrs.UID, attrs.GID = cur.Mode, cur.UID, cur.GID
		if cur.Rev != 0 { // not a pending entry (write-back), which etcd does not have yet
			attrs.Cur = cur // a file just created is not read again (fs.Attrs.Cur)
		}
		if cur.Ino != n.ino {
			n.m.log.Warn("file replaced elsewhere while open here: the last close wins", "path", n.path(""))
		}
	case errors.Is(err, cairn.ErrNotFound):
		n.m.log.Warn("file removed elsewhere while open here: written back", "path", n.path(""))
	default:
		return attrs, err
	}
	return attrs, nil
}

// commit stores c as the file's new current version if it holds writes
// not yet committed (fs.Volume.WriteFile: chunks to the store, then a
// compare-and-swap in etcd, under the writer lock this mount holds since
// the open). A file removed while open is not brought back: its last
// writes are dropped, as on a local disk. A commit that fails leaves the
// writes in the copy (kept in unsaved/ if the file is closed so).
func (n *node) commit(ctx context.Context, c *content) (err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	ptw := c.ptw
	c.mu.Unlock()
	if ptw {
		if err = n.m.harvest(c); err != nil {
			return err
		}
	}
	c.mu.Lock()
	dirty, size, mtime, ctime, held := c.dirty, c.size, c.mtime, c.ctime, c.attrs
	c.attrs = heldAttrs{}
	c.mu.Unlock()
	if held.any() {
		defer func() {
			if err != nil { // kept for the next save; newer ones win
				c.mu.Lock()
				c.attrs = held.over(c.attrs)
				c.mu.Unlock()
			}
		}()
	}
	if !dirty {
		if held.any() {
			if _, _, ok := n.place(); ok {
				return n.setAttrs(ctx, held)
			}
		}
		return nil
	}
	// From the place read to the compare-and-swap, no rename or removal
	// of the file on this mount runs (node.placeMu).
	n.placeMu.Lock()
	defer n.placeMu.Unlock()
	name, parent, ok := n.place()
	if !ok {
		n.m.log.Info("a file removed while open was closed: its unsaved writes are dropped", "ino", n.ino)
		c.mu.Lock()
		// Descriptors still open on it keep reading what was written.
		c.dirty, c.gone = false, true
		c.mu.Unlock()
		return nil
	}
	dir, errno := parent.dirEntry()
	if errno != 0 {
		return errno
	}
	attrs, err := n.commitAttrs(ctx, parent, name, mtime)
	if err != nil {
		return err
	}
	// The change time is the one stat showed since the writes (as the
	// queue's commits record it), not the commit's: elsewise a stat
	// after the close, from the kernel's cache, and one after it let
	// the attributes go, disagree on it.
	n.mu.Lock()
	lastCtime := n.last.Ctime
	n.mu.Unlock()
	attrs.Ctime = later(ctime, time.Unix(0, lastCtime))
	if held.setMode {
		attrs.Mode = held.mode & 07777
	}
	if held.setUID {
		attrs.UID = held.uid
	}
	if held.setGID {
		attrs.GID = held.gid
	}
	// Without attributes of its own to set, the commit leaves the entry's
	// as they are then: a chmod from another descriptor racing it stays.
	attrs.KeepAttrs = !held.setMode && !held.setUID && !held.setGID
	if attrs.Lock, err = n.commitLock(ctx, parent, name); err != nil {
		return err
	}
	attrs.Path = volPath(parent, name)
	f := c.file()
	var sum uint32
	open := func() (io.ReadCloser, error) {
		var r io.Reader = io.NewSectionReader(f, 0, size)
		if ptw {
			r = summed(r, &sum)
		}
		return io.NopCloser(r), nil
	}
	epoch := n.m.ents.writing()
	e, _, err := n.m.vol.WriteFile(ctx, dir, name, open, attrs)
	n.m.ents.wrote(epoch, e, false)
	if err != nil {
		n.commitFailed()
		return err
	}
	if e.Ino == n.ino {
		n.wroteEntry(e)
	}
	n.committed(ctx)
	c.mu.Lock()
	c.dirty, c.keep, c.truncOnly = false, false, false
	c.sum, c.sumOK = sum, ptw
	v := e.Current()
	c.version, c.manifest = true, v.Manifest
	// A held copy may still change (held.go), and so may a passthrough
	// copy while a writer has it open: the kernel's writes never take it
	// out of the index (prepareWrite). Adopted once the last goes.
	adopt := !c.held && (!ptw || c.writers == 0)
	c.mu.Unlock()
	if e.Ino == n.ino {
		if adopt {
			n.m.cache.adopt(c, cacheKey{n.ino, v.Manifest})
		}
		n.remember(e)
	}
	return nil
}

func (c *content) ino16() string { return cacheKey{ino: c.ino}.name()[:16] }

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.n.m.readCalls.Add(1)
	c := h.c
	c.fmu.RLock()
	k, err := c.f.ReadAt(dest, off)
	c.fmu.RUnlock()
	if err != nil && err != io.EOF {
		return nil, h.n.m.errno("read", h.n.path(""), cairn.E("read", cairn.IO, c.ino16(), err))
	}
	return fuse.ReadResultData(dest[:k]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.n.m.writeCalls.Add(1)
	if !h.write {
		return 0, syscall.EBADF
	}
	c := h.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := h.n.m.prepareWrite(c); err != nil {
		return 0, h.n.m.errno("write", h.n.path(""), err)
	}
	if h.append {
		c.mu.Lock()
		off = c.size
		c.mu.Unlock()
	}
	f, err := c.writable()
	if err != nil {
		return 0, h.n.m.errno("write", h.n.path(""), err)
	}
	k, err := f.WriteAt(data, off)
	c.mu.Lock()
	if k > 0 {
		c.dirty, c.mtime = true, time.Now()
		c.ctime = c.mtime
		c.truncOnly = false
		if end := off + int64(k); end > c.size {
			c.size = end
		}
	}
	c.mu.Unlock()
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return uint32(k), syscall.ENOSPC
		}
		return uint32(k), h.n.m.errno("write", h.n.path(""), cairn.E("write", cairn.IO, c.ino16(), err))
	}
	return uint32(k), 0
}

// Flush runs at every close(2) of a descriptor (unless the open told the
// kernel not to send it: opened): one that may have written saves the
// copy if it holds unsaved writes (save: committed, or queued in
// non-blocking mode), and the close returns the error. A failed commit is
// logged; the writes stay in the copy. In write-back mode the last
// writer's release saves (saveAtClose); the close counts the copy as
// pending if it may hold writes (markClosed).
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	h.n.m.flushCalls.Add(1)
	if h.write && h.n.m.mode == WriteBack {
		h.c.mu.Lock()
		if !h.flushed {
			h.flushed = true
			h.c.flushedWriters++
		}
		h.c.mu.Unlock()
		h.n.m.markClosed(h.c)
		return 0
	}
	if !h.saveAtClose() || h.c.deferTrunc() {
		return 0
	}
	ctx = bg(ctx)
	if err := h.n.save(ctx, h.c); err != nil {
		h.n.m.log.Error("saving at close failed; the writes stay in the local copy", "path", h.n.path(""), "err", err)
		return h.n.m.errno("commit at close", h.n.path(""), err)
	}
	return 0
}

// Fsync makes the copy durable on local disk (SCFS Table 1, level 1:
// close, not fsync, makes it durable in the stores): its data, and its
// name in the cache directory, so that a crash leaves it for the next
// mount to keep in unsaved/.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	c, m := h.c, h.n.m
	if m.mode == WriteBack {
		h.waitReleases()
	}
	if m.mode != Blocking {
		// What the file's closes queued reaches the disk: their data
		// (not fsynced at a write-back close) and the queue's journal.
		if err := m.queue.sync(ctx, h.n.ino); err != nil {
			return m.errno("fsync", h.n.path(""), err)
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.file().Sync(); err != nil {
		return m.errno("fsync", h.n.path(""), cairn.E("fsync", cairn.IO, c.ino16(), err))
	}
	m.cache.mu.Lock()
	p, named := c.path, c.named
	m.cache.mu.Unlock()
	if !named && p != "" {
		if err := durable.SyncDir(filepath.Dir(p)); err != nil {
			return m.errno("fsync", h.n.path(""), cairn.E("fsync", cairn.IO, p, err))
		}
		m.cache.mu.Lock()
		if c.path == p {
			c.named = true
		}
		m.cache.mu.Unlock()
	}
	if errno := h.fsyncEntry(ctx); errno != 0 {
		return errno
	}
	if m.mode == WriteBack {
		if err := h.n.fsyncRecord(ctx, c); err != nil {
			return m.errno("fsync", h.n.path(""), err)
		}
	}
	return 0
}

// releaseWait bounds how long an fsync in write-back mode waits for the
// releases of the file's other writers (waitReleases).
const releaseWait = time.Second

// waitReleases waits, up to releaseWait, until no writer of the file but
// h that was closed is still to be released, and no release is saving.
// Write-back mode queues a file's commit at its last writer's release,
// which the kernel sends after close returned (the request may reach the
// mount after a later fsync's): a close followed by an fsync of the file
// (on another descriptor) is durable once the fsync returns only if the
// fsync waits for it. Writers never closed are not waited for (an fsync
// while another process keeps the file open for writing costs nothing
// more); one closed but still open through another descriptor (dup,
// fork) makes the fsync wait the whole bound.
func (h *handle) waitReleases() {
	deadline := time.Now().Add(releaseWait)
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		h.c.mu.Lock()
		own := 0
		if h.flushed {
			own = 1
		}
		busy := h.c.flushedWriters > own || h.c.releasing > 0
		h.c.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			h.n.m.releaseWaitsOut.Add(1)
			h.n.m.log.Debug("fsync waited the whole bound for a release: a writer closed once is still open", "path", h.n.path(""))
			return
		}
		time.Sleep(delay)
	}
}

// fsyncEntry writes the file's entry, and those before it, if pending
// (write-back mode): after an fsync the file exists in the metadata.
func (h *handle) fsyncEntry(ctx context.Context) syscall.Errno {
	h.n.m.wb.undeferNode(h.n) // made now if its creation waits for its commit
	if err := h.n.m.wb.flush(bg(ctx)); err != nil {
		return h.n.m.errno("fsync", h.n.path(""), err)
	}
	return 0
}

// Release runs once the kernel drops the handle, after its last close.
// The last writer saves what no close saved (its flush failed, or a
// writable mapping wrote after it); nobody sees an error from here, so a
// failure is logged and the copy kept on disk. The last writer's release
// lets the writer lock go (unless a queued commit still needs it).
func (h *handle) Release(ctx context.Context) syscall.Errno {
	ctx = bg(ctx)
	c, n := h.c, h.n
	if hold := n.m.releaseHold.Load(); hold != nil {
		<-*hold
	}
	n.m.begin()
	defer n.m.end()
	c.mu.Lock()
	if h.write {
		c.writers--
	}
	if h.flushed {
		h.flushed = false
		c.flushedWriters--
	}
	last := h.write && c.writers == 0
	ptw, gen := c.ptw, c.holdGen
	if last {
		c.releasing++
	}
	c.mu.Unlock()
	if last {
		// Write-back mode queues the commit here (saveAtClose): counted
		// as pending meanwhile.
		wb := n.m.mode == WriteBack
		if wb {
			n.m.releasing.Add(1)
		}
		defer func() {
			c.mu.Lock()
			c.releasing--
			c.mu.Unlock()
			if wb {
				n.m.releasing.Add(-1)
			}
		}()
	}
	// Passthrough: a writable mapping may outlive the close (held.go).
	// Asked before the check and the commit, so that what it stored up
	// to now is in them.
	alone := false
	if last && ptw {
		if alone = n.m.ptAlone(n, c); !alone {
			n.m.hold(n, c)
		}
		if err := n.m.settlePT(c); err != nil {
			// As settle does: what the kernel wrote is unknown, so the
			// copy is saved (or kept), not dropped.
			n.m.log.Error("passthrough: checking a copy after the last close failed", "path", n.path(""), "err", err)
			c.mu.Lock()
			c.dirty = true
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	save := last && (c.dirty || c.attrs.any())
	c.mu.Unlock()
	if save {
		if err := n.save(ctx, c); err != nil {
			n.m.log.Error("saving after the last close failed", "path", n.path(""), "err", err)
			c.mu.Lock()
			c.keep = true
			c.mu.Unlock()
		}
	}
	if last {
		// Queued now (or nothing to save): the queue counts it from here.
		n.m.unmarkClosed(c)
	}
	if last && n.m.wb != nil && !n.m.queue.has(n.ino) {
		// A new file whose creation waited for a commit that does not
		// come (made empty): made now, as it was shown.
		n.m.wb.undeferNode(n)
	}
	if alone {
		n.m.unhold(n, c, gen) // held after an earlier close: no longer
		// The last writer's commits left it out of the index.
		n.m.adoptClean(n, c)
	}
	h.drop(ctx)
	return 0
}

// drop releases what the handle holds: its writer lock reference and its
// copy.
func (h *handle) drop(ctx context.Context) {
	if h.write {
		h.n.unlockWrite(ctx)
	}
	if h.counted {
		h.n.closed(h.c)
		if h.write {
			h.n.m.writeHandles.Add(-1)
		}
	}
	if h.pt {
		// Before the copy's reference goes: an open that finds the
		// backing file reserved by a handle still counted here shares
		// the copy, which must then still be open (release removes a
		// closed work copy holding nothing to commit). Once uncounted, an
		// open waits for go-fuse to let the registration go instead.
		h.n.ptClosed()
	}
	h.n.release(h.c)
}
