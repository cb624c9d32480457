package mount

import (
	"cmp"
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/vpath"
)

// node is one cairn inode the kernel knows: the node's number is the
// entry's Ino, and where its record lives (parent and name) is the node's
// place in go-fuse's tree, which follows this mount's renames and
// removals. A file with several names (hard links) is one node with a
// place for each (go-fuse keeps one node per inode number); place answers
// one of them, and any will do: every name's record is a copy of the
// inode, and a change through one rewrites them all (meta.Vol.Link).
//
// Contexts: go-fuse cancels a request's context when the calling process
// gets any signal, and the Go runtime signals its threads (SIGURG) all the
// time; an open that restarted its fetch at every signal, or a close that
// gave up its commit, would be worse than one that finishes. Every method
// works on context.WithoutCancel of what it is given.
type node struct {
	gofs.Inode
	m   *Mount
	ino uint64
	typ meta.Type

	// The file's state on this mount, shared by every node of its inode
	// (nodeState, Mount.stateFor): the kernel can let a node go (evict it
	// from its caches) while a queued commit or a pending change still
	// needs what it held, and looks the file up again as a new node.
	*nodeState

	// moved is where a rename or removal on this mount put the node, set
	// before the call returns: go-fuse moves the node in its tree only
	// after, so while the tree still shows the node where it was (from),
	// place answers moved instead. Guarded by mu.
	moved *movedTo
}

// nodeState is what the nodes of one inode share (node).
type nodeState struct {
	mu sync.Mutex
	// content is the open copy of a regular file that new opens share
	// (file.go); nil when no handle is open.
	content *content
	// last is the entry as last read: what a removed file that is
	// still open reports, and the attributes it is written back with.
	last meta.Entry
	// wrote is the entry as this mount's latest commit of the file wrote
	// it, recorded before the copy it committed stops vouching for the
	// file (content.local, content.usable: its queued commit is done). An
	// entry read before that commit (from the entry cache, or by a read
	// of etcd that was on its way meanwhile) is older than wrote, and
	// with a copy that no longer vouches it would give the size and data
	// of the version before the commit: fresherLocked replaces it.
	wrote *meta.Entry
	// links are the names link(2) gave the file on this mount: its
	// queued commits' records carry them (queueRecord.Alt).
	links []queuePlace
	// served is the copy the kernel was last given an open of: a new
	// open of the same copy keeps the kernel's page cache (the memory
	// buffer of an open file), unless handles on another copy were open
	// meanwhile (mixed: their reads may have filled the page cache).
	served  *content
	mixed   bool
	handles map[*content]int // copies with handles of this inode, and how many

	// Passthrough (passthrough.go), guarded by mu: pt is the copy the
	// kernel has as this inode's backing file (reserved by the open that
	// chose it; cleared once go-fuse lets its registration ptID go), and
	// ptHandles counts the passthrough handles not yet released here.
	pt        *content
	ptID      int32
	ptHandles int
	// openMu serializes passthrough opens of the inode.
	openMu sync.Mutex

	// wl is the file's writer lock while this mount writes it (lock.go).
	wl writerLock

	// placeMu orders a commit of the file (from reading its place to the
	// metadata's compare-and-swap) with renames and removals of it on
	// this mount: a commit never writes under a name the file just left.
	placeMu sync.Mutex
	// removed: this mount removed the file's name (or renamed another
	// file over it). A node that has no place without being removed was
	// let go by the kernel (its caches evicted it): its queued commits
	// still go where the file is.
	removed atomic.Bool
	// heir is the file renamed over this one on this mount that took its
	// history (versions follow the path: meta.Vol.Rename) while its own
	// content was still to be committed here (RenamePending). Commits of
	// this file queued before that rename land where heir is, as the
	// versions before heir's own (the queue runs in order), instead of
	// being dropped: an editor's saves in quick succession each stay a
	// version.
	heir atomic.Pointer[node]
	// firstQueued is the queue sequence number of the file's first
	// queued commit (0: none yet): a commit of a file it replaced that
	// was queued after it is not made (queue.commit).
	firstQueued atomic.Uint64
	// mtimeSet is the mtime a utimes last set on the file on this mount,
	// and mtimeAt when (after its queued commits were given it:
	// queue.touched). A queued commit that read its mtime before makes it
	// again on the record it writes (writeBack.rebase). Guarded by mu.
	mtimeSet time.Time
	mtimeAt  time.Time
}

// mtimeSince returns the mtime a utimes set on n after since, if one did.
func (n *node) mtimeSince(since time.Time) *time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.mtimeAt.After(since) {
		return nil
	}
	t := n.mtimeSet
	return &t
}

// stateFor returns the state of inode ino's nodes: the one a node of it
// still referenced (by an open handle, a queued commit, a pending change)
// has, else a new one. Entries go once nothing references their state.
func (m *Mount) stateFor(ino uint64) *nodeState {
	m.statesMu.Lock()
	defer m.statesMu.Unlock()
	if p, ok := m.states[ino]; ok {
		if st := p.Value(); st != nil {
			return st
		}
	}
	st := &nodeState{}
	m.states[ino] = weak.Make(st)
	runtime.AddCleanup(st, m.dropState, ino)
	return st
}

// dropState forgets inode ino's state once it was collected (and not
// replaced since).
func (m *Mount) dropState(ino uint64) {
	m.statesMu.Lock()
	defer m.statesMu.Unlock()
	if p, ok := m.states[ino]; ok && p.Value() == nil {
		delete(m.states, ino)
	}
}

// movedTo is a node's place after a rename (or its removal: gone), and
// where it was before.
type movedTo struct {
	fromParent *node
	fromName   string
	parent     *node
	name       string
	gone       bool
}

var (
	_ gofs.NodeLookuper       = (*node)(nil)
	_ gofs.NodeGetattrer      = (*node)(nil)
	_ gofs.NodeSetattrer      = (*node)(nil)
	_ gofs.NodeReadlinker     = (*node)(nil)
	_ gofs.NodeOpener         = (*node)(nil)
	_ gofs.NodeCreater        = (*node)(nil)
	_ gofs.NodeMkdirer        = (*node)(nil)
	_ gofs.NodeMknoder        = (*node)(nil)
	_ gofs.NodeSymlinker      = (*node)(nil)
	_ gofs.NodeLinker         = (*node)(nil)
	_ gofs.NodeUnlinker       = (*node)(nil)
	_ gofs.NodeRmdirer        = (*node)(nil)
	_ gofs.NodeRenamer        = (*node)(nil)
	_ gofs.NodeOpendirHandler = (*node)(nil)
	_ gofs.NodeStatfser       = (*node)(nil)
	_ gofs.NodeFsyncer        = (*node)(nil)

	_ gofs.FileReaddirenter = (*dirHandle)(nil)
	_ gofs.FileLookuper     = (*dirHandle)(nil)
	_ gofs.FileSeekdirer    = (*dirHandle)(nil)
	_ gofs.FileReleasedirer = (*dirHandle)(nil)
)

func bg(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// devFromKernel turns a device number as the kernel passes it to FUSE, in
// its 32-bit encoding (new_encode_dev: minor's low 8 bits, major's 12
// bits, minor's next 12 bits), into stat's st_rdev (glibc's 64-bit
// makedev), as an entry keeps it: the same number for every one the
// 32-bit form can hold.
func devFromKernel(dev uint32) uint64 {
	major := (dev & 0xfff00) >> 8
	minor := dev&0xff | (dev>>12)&0xfff00
	return unix.Mkdev(major, minor)
}

// devToKernel is devFromKernel's inverse, for the attributes the mount
// replies (a major from 4096 or a minor from 2^20 does not fit).
func devToKernel(rdev uint64) uint32 {
	major, minor := unix.Major(rdev), unix.Minor(rdev)
	return minor&0xff | (major&0xfff)<<8 | (minor&^0xff)<<12
}

// caller returns the uid and gid of the process making the request.
func caller(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// checkName refuses names cairn cannot store (vpath.ValidName).
func checkName(name string) syscall.Errno {
	if len(name) > vpath.MaxName {
		return syscall.ENAMETOOLONG
	}
	if vpath.ValidName(name) != nil {
		return syscall.EINVAL
	}
	return 0
}

// wroteEntry records e, just written by a commit of n on this mount.
func (n *node) wroteEntry(e *meta.Entry) {
	n.mu.Lock()
	if n.wrote == nil || e.Rev > n.wrote.Rev {
		w := *e
		w.Versions = nil // the current one is all that is used
		if v := e.Current(); v != nil {
			w.Versions = []meta.Version{*v}
		}
		n.wrote = &w
	}
	n.mu.Unlock()
}

// fresherLocked returns e, n's entry as read, or what this mount's latest
// commit of n wrote if e is older (read before that commit was done). An
// entry changed since (renamed, committed elsewhere) has a later Rev and
// is e. n.mu is held, and stays held while the entry is judged against
// n's copy, so that no commit ends in between.
func (n *node) fresherLocked(e *meta.Entry) *meta.Entry {
	if w := n.wrote; w != nil && w.Ino == e.Ino && w.Rev > e.Rev {
		return copyEntry(w)
	}
	return e
}

func (n *node) remember(e *meta.Entry) {
	n.mu.Lock()
	n.last = *e
	n.last.Versions = nil
	n.mu.Unlock()
}

// place returns n's name and parent directory as this mount knows them;
// ok is false for a node no longer in the tree (removed). The root has
// no name and no parent.
func (n *node) place() (name string, parent *node, ok bool) {
	if n.IsRoot() {
		return "", nil, true
	}
	name, p := n.Parent()
	n.mu.Lock()
	mv := n.moved
	if mv != nil && (p == nil || p.Operations().(*node) != mv.fromParent || name != mv.fromName) {
		// go-fuse has moved (or dropped) the node since: the tree is
		// current, and stays so for later moves made elsewhere.
		n.moved, mv = nil, nil
	}
	n.mu.Unlock()
	if mv != nil {
		return mv.name, mv.parent, !mv.gone
	}
	if p == nil {
		return "", nil, false
	}
	return name, p.Operations().(*node), true
}

// kid returns the node of name in directory n, if the kernel has one.
func (n *node) kid(name string) *node {
	if ch := n.GetChild(name); ch != nil {
		return ch.Operations().(*node)
	}
	return nil
}

func (n *node) setMoved(mv *movedTo) {
	n.mu.Lock()
	n.moved = mv
	n.mu.Unlock()
	if mv.gone {
		n.removed.Store(true)
	}
}

// lockPlaces takes the placeMu of the given nodes (nil ones skipped), in
// inode order, and returns what releases them.
func lockPlaces(nodes ...*node) func() {
	var held []*node
	for _, x := range nodes {
		if x != nil && !slices.ContainsFunc(held, func(h *node) bool { return h.nodeState == x.nodeState }) {
			held = append(held, x)
		}
	}
	slices.SortFunc(held, func(a, b *node) int { return cmp.Compare(a.ino, b.ino) })
	for _, x := range held {
		x.placeMu.Lock()
	}
	return func() {
		for _, x := range held {
			x.placeMu.Unlock()
		}
	}
}

// dirEntry is directory n as the meta calls that take a parent need it:
// its inode and where its own record lives (checked by the calls, so a
// directory removed or moved elsewhere fails them cleanly).
func (n *node) dirEntry() (*meta.Entry, syscall.Errno) {
	if n.typ != meta.TypeDir {
		return nil, syscall.ENOTDIR
	}
	if n.IsRoot() {
		return &meta.Entry{Ino: meta.RootIno, Type: meta.TypeDir}, 0
	}
	name, p, ok := n.place()
	if !ok {
		return nil, syscall.ENOENT
	}
	return &meta.Entry{Name: name, Parent: p.ino, Ino: n.ino, Type: meta.TypeDir}, 0
}

// path names n (or its child name) for logs and the trash: VOLUME:/a/b.
func (n *node) path(child string) string {
	p := n.m.vol.Name() + ":/" + n.Path(nil)
	if child != "" {
		if p[len(p)-1] != '/' {
			p += "/"
		}
		p += child
	}
	return p
}

// volPath is the path in the volume ("/a/b") of name in directory parent:
// where a commit looks up its placement policy.
func volPath(parent *node, name string) string {
	p := "/" + parent.Path(nil)
	if !strings.HasSuffix(p, "/") {
		p += "/"
	}
	return p + name
}

// entry returns n's current entry: from the entry cache while the watch
// vouches for it, else from the metadata service (entries.go). A node
// whose name now holds another entry (replaced on another device) is
// ESTALE: the kernel then looks the name up again.
func (n *node) entry(ctx context.Context) (*meta.Entry, error) {
	return n.readEntry(ctx, false)
}

// readEntry is entry, from the metadata service itself when fresh.
func (n *node) readEntry(ctx context.Context, fresh bool) (*meta.Entry, error) {
	var e *meta.Entry
	var err error
	if n.IsRoot() {
		e, err = n.m.ents.get(ctx, 0, "", fresh)
	} else {
		name, p, ok := n.place()
		if !ok {
			return nil, syscall.ENOENT
		}
		e, err = n.m.ents.get(ctx, p.ino, name, fresh)
	}
	if err != nil {
		return nil, err
	}
	if e.Ino != n.ino {
		return nil, syscall.ESTALE
	}
	n.remember(e)
	return e, nil
}

// fill sets a's attributes from e, then from the open copy where this
// mount holds writes the metadata does not have yet.
func (n *node) fill(e *meta.Entry, a *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e = n.fresherLocked(e)
	a.Ino = e.Ino
	a.Mode = meta.ModeBits(e.Type) | e.Mode&07777
	a.Size = uint64(e.Size)
	if e.Type == meta.TypeSymlink {
		a.Size = uint64(len(e.Target))
	}
	a.Rdev = devToKernel(e.Rdev)
	// Directories: 1 ("subdirectories unknown" to find and fts) until
	// the caller sets the count it knows (dirLinks). Files: their names.
	a.Nlink = uint32(e.Nlink())
	a.Uid, a.Gid = e.UID, e.GID
	mtime, ctime := time.Unix(0, e.Mtime), time.Unix(0, e.Ctime)
	if e.Type == meta.TypeDir {
		// Entries added or removed here since (dirtimes.go).
		if t := n.m.dirTimes.get(e.Ino); t != 0 {
			mtime, ctime = later(mtime, time.Unix(0, t)), later(ctime, time.Unix(0, t))
		}
	}
	a.SetTimes(&mtime, &mtime, &ctime)
	a.Blksize = 4096
	// Judged under n.mu with e: a queued commit that ends meanwhile
	// records its entry first (wroteEntry), then lets the copy go.
	if c := n.content; c != nil {
		if size, mtime, ctime, held, ok := c.local(); ok {
			a.Size = uint64(size)
			ctime = later(ctime, time.Unix(0, e.Ctime))
			a.SetTimes(&mtime, &mtime, &ctime)
			if held.setMode {
				a.Mode = meta.ModeBits(e.Type) | held.mode&07777
			}
			if held.setUID {
				a.Uid = held.uid
			}
			if held.setGID {
				a.Gid = held.gid
			}
		}
	}
	a.Blocks = (a.Size + 511) / 512
}

// child returns the inode of entry e in directory n, filling out (a
// directory's link count counted: entryLinks).
func (n *node) child(ctx context.Context, e *meta.Entry, out *fuse.EntryOut) *gofs.Inode {
	return n.childOf(ctx, e, out, true)
}

// childOf is child; count false takes a directory's link count from the
// entry cache only (entryLinks).
func (n *node) childOf(ctx context.Context, e *meta.Entry, out *fuse.EntryOut, count bool) *gofs.Inode {
	if ch := n.GetChild(e.Name); ch != nil && ch.StableAttr().Ino == e.Ino {
		cn := ch.Operations().(*node)
		cn.remember(e)
		cn.fill(e, &out.Attr)
		cn.entryLinks(ctx, out, count)
		return ch
	}
	cn := &node{m: n.m, ino: e.Ino, typ: e.Type, nodeState: n.m.stateFor(e.Ino)}
	cn.remember(e)
	cn.fill(e, &out.Attr)
	cn.entryLinks(ctx, out, count)
	return n.NewInode(ctx, cn, gofs.StableAttr{Mode: meta.ModeBits(e.Type), Ino: e.Ino})
}

// entryLinks sets the link count of directory n in a reply that gives
// its entry: 2 plus its subdirectories, as on ext4, counted by dirLinks
// (from the entry cache, else by listing n) when count is set. A
// READDIRPLUS (dirHandle.Lookup) does not count: listing every
// subdirectory of a directory being listed would cost a read of etcd
// each. Its replies take the count from the entry cache when it knows it;
// otherwise (and if a listing fails) they say 1, what btrfs says of every
// directory: "subdirectories unknown" to find and fts, which then look at
// every entry rather than trust the count (a count too high would make
// find skip subdirectories unless -noleaf). Such a reply is kept by the
// kernel for the shortest time it can be given (a nanosecond, which the
// kernel rounds up to a clock tick): a stat after it asks Getattr, which
// counts.
func (n *node) entryLinks(ctx context.Context, out *fuse.EntryOut, count bool) {
	if n.typ != meta.TypeDir {
		return
	}
	if k, ok := n.cachedSubdirs(); ok {
		out.Nlink = uint32(2 + k)
		return
	}
	if count {
		if links, err := n.dirLinks(ctx); err == nil {
			out.Nlink = links
			return
		}
	}
	out.Nlink = 1
	out.SetAttrTimeout(time.Nanosecond)
}

// cachedSubdirs returns directory n's number of subdirectories if the
// entry cache knows it (n's every entry; in write-back mode, with the
// directories made in n and not written yet).
func (n *node) cachedSubdirs() (int, bool) {
	pending, fresh := n.m.wb.pendingSubdirs(n.ino)
	if fresh {
		return len(pending), true
	}
	return n.m.ents.subdirCount(n.ino, pending)
}

// dirLinks returns directory n's link count, 2 plus its subdirectories
// (as on ext4): from the entry cache, else by listing n (which makes the
// cache hold its every entry for the next time, while the watch lasts).
func (n *node) dirLinks(ctx context.Context) (uint32, error) {
	if k, ok := n.cachedSubdirs(); ok {
		return uint32(2 + k), nil
	}
	if n.m.wb == nil {
		ents, err := n.m.ents.readDir(ctx, n.ino)
		if err != nil {
			return 0, err
		}
		return 2 + subdirsOf(ents, nil), nil
	}
	// Write-back: the directories made in n and not written yet, read
	// before the listing (one written meanwhile is in one or the other),
	// rather than a listing after the pending changes, which would make
	// a stat wait for them. Every other change (a removal, a rename) is
	// written before it returns.
	pending, _ := n.m.wb.pendingSubdirs(n.ino)
	ents, err := n.m.vol.Meta.ReadDir(ctx, n.ino)
	if err != nil {
		return 0, err
	}
	return 2 + subdirsOf(ents, pending), nil
}

// subdirsOf counts the directories of ents and the names of pending
// (directories too) that ents lacks.
func subdirsOf(ents []meta.Entry, pending []string) uint32 {
	var k uint32
	for i := range ents {
		if ents[i].IsDir() {
			k++
		}
	}
	for _, name := range pending {
		if !slices.ContainsFunc(ents, func(e meta.Entry) bool { return e.Name == name && e.IsDir() }) {
			k++
		}
	}
	return k
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ctx = bg(ctx)
	if n.typ != meta.TypeDir {
		return nil, syscall.ENOTDIR
	}
	if len(name) > vpath.MaxName {
		// As ext4: no such name can exist, and saying so names the cause
		// for every call that looks a name up first (chmod, unlink, ...).
		return nil, syscall.ENAMETOOLONG
	}
	e, err := n.m.ents.get(ctx, n.ino, name, false)
	if err != nil {
		return nil, n.m.errno("lookup", n.path(name), err)
	}
	return n.child(ctx, e, out), 0
}

func (n *node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.m.getattrCalls.Add(1)
	return n.getattr(ctx, f, out)
}

// getattr fills out with n's attributes (Getattr, and the reply of
// Setattr).
func (n *node) getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	ctx = bg(ctx)
	e, err := n.entry(ctx)
	if err != nil {
		if _, _, ok := n.place(); !ok {
			// Removed while open (fstat of an unlinked file).
			n.mu.Lock()
			last, open := n.last, n.content != nil
			n.mu.Unlock()
			if open {
				n.fill(&last, &out.Attr)
				out.Nlink = 0
				return 0
			}
		}
		return n.m.errno("stat", n.path(""), err)
	}
	n.fill(e, &out.Attr)
	if n.typ == meta.TypeDir {
		if links, lerr := n.dirLinks(ctx); lerr == nil {
			out.Nlink = links
		} else {
			// Unknown (1, as fill says), and asked again at once.
			n.m.log.Debug("directory not counted", "path", n.path(""), "err", lerr)
			out.SetTimeout(time.Nanosecond)
		}
	}
	return 0
}

// Setattr changes mode, owner, mtime (in the metadata, at once; on a file
// this mount is writing, with its save at close: heldAttrs) and size (in
// the open copy; a truncate by path commits at once). atime is not kept:
// it reads as mtime.
func (n *node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.m.offlineWrite() {
		return syscall.EROFS
	}
	ctx = bg(ctx)
	h, _ := asHandle(f)
	if size, ok := in.GetSize(); ok {
		switch n.typ {
		case meta.TypeDir:
			return syscall.EISDIR
		case meta.TypeSymlink:
			return syscall.EINVAL
		}
		if errno := n.truncate(ctx, h, int64(size)); errno != 0 {
			return errno
		}
	}
	mode, setMode := in.GetMode()
	uid, setUID := in.GetUID()
	gid, setGID := in.GetGID()
	mtime, setMtime := in.GetMTime()
	// A SETATTR that sets nothing is a chown(-1, -1) (the kernel drops
	// the kill-privilege flags it carries, FUSE_HANDLE_KILLPRIV, and
	// sends the rest): it clears the set-ID bits as every chown does.
	const sets = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE | fuse.FATTR_ATIME | fuse.FATTR_MTIME |
		fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME
	if _, trunc := in.GetSize(); !setMode && (setUID || setGID || trunc && in.Caller.Uid != 0 || in.Valid&sets == 0) {
		if m, kill := n.killPriv(ctx); kill {
			setMode, mode = true, m
		}
	}
	if setMtime && n.typ == meta.TypeDir {
		n.m.dirTimes.forget(n.ino) // the mtime set is the one it has
	}
	if setMtime {
		n.mu.Lock()
		c := n.content
		n.mu.Unlock()
		if c != nil {
			if errno := n.m.touchContent(c, mtime); errno != 0 { // the commit at close keeps it
				return errno
			}
		}
		if n.typ == meta.TypeFile {
			n.mu.Lock()
			n.mtimeSet, n.mtimeAt = mtime, time.Now()
			n.mu.Unlock()
		}
	}
	if setMode || setUID || setGID || setMtime {
		a := heldAttrs{setMode: setMode, setUID: setUID, setGID: setGID, setMtime: setMtime,
			mode: mode, uid: uid, gid: gid, mtime: mtime}
		// On a file this mount is writing, they ride with the save at
		// close (heldAttrs); elsewise they are written now.
		if _, _, ok := n.place(); !ok {
			// Removed while open (fchmod of an unlinked file): its
			// attributes live on in memory only, as its bytes do.
			n.mu.Lock()
			open := n.content != nil
			if open {
				a.applyTo(&n.last)
			}
			n.mu.Unlock()
			if open {
				return n.getattr(ctx, f, out)
			}
		}
		if !n.holdAttrs(a) {
			if err := n.setAttrs(ctx, a); err != nil {
				return n.m.errno("setattr", n.path(""), err)
			}
		}
	}
	// The attributes replied are as current as a Getattr's, and cached as
	// long: without a timeout the kernel asks again (GETATTR) at its next
	// permission check, once per chmod and chown of a tar x.
	if n.m.attrTimeout > 0 {
		out.SetTimeout(n.m.attrTimeout)
	}
	return n.getattr(ctx, f, out)
}

// killPriv returns what n's mode is without its set-user-ID bit and, if
// it is executable by its group, its set-group-ID bit, and whether that
// differs: what a chown, and a write or truncate by an unprivileged
// process, clear on a local disk. The mount does it (the kernel asks,
// FUSE_HANDLE_KILLPRIV), so that a chown costs no attribute round trip.
func (n *node) killPriv(ctx context.Context) (uint32, bool) {
	if n.typ != meta.TypeFile {
		return 0, false
	}
	e, err := n.entry(ctx)
	if err != nil {
		return 0, false
	}
	var a fuse.Attr
	n.fill(e, &a) // with the mode held for the save of an open copy
	m := a.Mode &^ syscall.S_ISUID
	if m&syscall.S_IXGRP != 0 {
		m &^= syscall.S_ISGID
	}
	return m & 07777, m != a.Mode
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	e, err := n.entry(bg(ctx))
	if err != nil {
		return nil, n.m.errno("readlink", n.path(""), err)
	}
	if e.Type != meta.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(e.Target), 0
}

// create adds entry e (a directory, symlink or empty file) to directory n.
func (n *node) create(ctx context.Context, e meta.Entry) (*meta.Entry, syscall.Errno) {
	ne, _, _, errno := n.createLocked(ctx, e, false)
	return ne, errno
}

// createLocked is create that, when locked, also takes the new file's
// writer lock in the same transaction (meta.Vol.CreateLocked); the lock
// is nil if it could not be had so. pending says the create is a pending
// one of write-back mode (writeback.go): no lock is taken.
func (n *node) createLocked(ctx context.Context, e meta.Entry, locked bool) (*meta.Entry, *meta.Lock, bool, syscall.Errno) {
	if errno := checkName(e.Name); errno != 0 {
		return nil, nil, false, errno
	}
	dir, errno := n.dirEntry()
	if errno != 0 {
		return nil, nil, false, errno
	}
	e.UID, e.GID = caller(ctx)
	if de, err := n.entry(ctx); err == nil && de.Mode&syscall.S_ISGID != 0 {
		// A set-group-ID directory gives what is made in it its group,
		// and a new subdirectory its set-group-ID bit (BSD semantics,
		// as on a local disk: inode_init_owner).
		e.GID = de.GID
		if e.Type == meta.TypeDir {
			e.Mode |= syscall.S_ISGID
		}
	}
	ne, ok, err := n.m.wb.create(n, dir, e, locked, false)
	if !ok && n.m.wb != nil && locked && e.Type == meta.TypeFile {
		// A new file made for writing in a directory whose every entry
		// this mount does not know: once etcd says the name is free,
		// its creation waits for its first commit all the same (no
		// other device sees it empty).
		switch cur, gerr := n.m.ents.get(ctx, n.ino, e.Name, true); {
		case gerr == nil:
			return cur, nil, false, syscall.EEXIST
		case errors.Is(gerr, cairn.ErrNotFound):
			ne, ok, err = n.m.wb.create(n, dir, e, true, true)
		}
	}
	if ok {
		if err != nil {
			return ne, nil, false, syscall.EEXIST
		}
		n.m.dirTimes.touch(n.ino)
		return ne, nil, true, 0
	}
	if ferr := n.m.wb.flush(ctx); ferr != nil {
		return nil, nil, false, n.m.errno("create", n.path(e.Name), ferr)
	}
	var l *meta.Lock
	epoch := n.m.ents.writing()
	td := n.m.touching(dir)
	tdRev := td.Rev
	if locked {
		ne, l, err = n.m.vol.Meta.CreateLocked(ctx, td, e)
	} else {
		ne, err = n.m.vol.Meta.Create(ctx, td, e)
	}
	if err != nil {
		n.m.ents.wrote(epoch, nil, false)
		if errors.Is(err, cairn.ErrExist) {
			if ne != nil {
				n.m.ents.put(ne)
			}
			return ne, nil, false, syscall.EEXIST
		}
		return nil, nil, false, n.m.errno("create", n.path(e.Name), err)
	}
	n.m.ents.wrote(epoch, ne, true)
	n.m.keepTouched(td, tdRev)
	n.m.dirTimes.touch(n.ino)
	return ne, l, false, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.m.offlineWrite() {
		return nil, syscall.EROFS
	}
	ctx = bg(ctx)
	e, errno := n.create(ctx, meta.Entry{Name: name, Type: meta.TypeDir, Mode: mode & 07777})
	if errno != 0 {
		return nil, errno
	}
	return n.child(ctx, e, out), 0
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.m.offlineWrite() {
		return nil, syscall.EROFS
	}
	ctx = bg(ctx)
	e, errno := n.create(ctx, meta.Entry{Name: name, Type: meta.TypeSymlink, Mode: 0o777, Target: target, Size: int64(len(target))})
	if errno != 0 {
		return nil, errno
	}
	return n.child(ctx, e, out), 0
}

// Mknod makes regular files and special files: FIFOs, sockets (bind(2)
// of a unix socket on the mount asks for one), character and block
// devices (the kernel has checked CAP_MKNOD), kept as entries with their
// type, mode, owner and device number. The kernel serves their opens
// itself (a FIFO's data, a socket's connections, a device's driver), on
// the machine that opens them. The mode comes with the umask applied by
// the kernel. In write-back mode a special file is made as a mkdir is:
// answered at once, written in the next batch.
func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.m.offlineWrite() {
		return nil, syscall.EROFS
	}
	ctx = bg(ctx)
	e := meta.Entry{Name: name, Type: meta.TypeFile, Mode: mode & 07777}
	if t, ok := meta.SpecialType(mode); ok {
		e.Type = t
		if t == meta.TypeChar || t == meta.TypeBlock {
			e.Rdev = devFromKernel(dev)
		}
	} else if mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, syscall.EINVAL
	}
	ne, errno := n.create(ctx, e)
	if errno != 0 {
		return nil, errno
	}
	return n.child(ctx, ne, out), 0
}

// Link gives a regular file another name (link(2)): meta.Vol.Link, one
// transaction that writes the new name's copy of the inode and rewrites
// the others. Both names are one kernel inode here (go-fuse keeps one
// node per inode number), so writes through either are seen through the
// other at once; another device sees them with the commit, which goes to
// every name. The file's pending work on this mount is written first
// (write-back: its deferred creation and pending changes; a queued
// commit needs no wait, since it lands on the inode whichever name it
// goes through). Directories are EPERM, as are symlinks and special
// files (cairn keeps hard links of regular files only); an inode with
// meta.MaxLinks names is EMLINK.
func (n *node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.m.offlineLinkOrXattr() {
		return nil, syscall.EROFS
	}
	ctx = bg(ctx)
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	tn, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	if tn.typ != meta.TypeFile {
		return nil, syscall.EPERM
	}
	dir, errno := n.dirEntry()
	if errno != 0 {
		return nil, errno
	}
	if wb := n.m.wb; wb != nil {
		wb.undeferNode(tn)
		if wb.isDeferred(n.ino, name) {
			return nil, syscall.EEXIST
		}
	}
	if errno := n.flushFor("link", name); errno != 0 {
		return nil, errno
	}
	// git writes an object to a temporary file, closes it and links it
	// to its name at once: the close's commit is queued at the kernel's
	// release, which may come after the link. Recorded first, a link
	// whose file's content is not yet in the journal leaves, after a
	// kill, a name with no content (an empty git object).
	tn.waitClosedWriters()
	// A commit of the file in flight finishes first, and none starts
	// under a name the link is about to rewrite until it is recorded.
	unlockPlaces := lockPlaces(tn)
	defer unlockPlaces()
	fresh := false
	var ne *meta.Entry
	td := n.m.touching(dir)
	tdRev := td.Rev
	err := retryConflict(func() error {
		src, err := tn.readEntry(ctx, fresh)
		fresh = true
		if err != nil {
			return err
		}
		epoch := n.m.ents.writing()
		ne, err = n.m.vol.Meta.Link(ctx, src, td, name)
		n.m.ents.wrote(epoch, ne, false)
		return err
	})
	switch {
	case errors.Is(err, meta.ErrTooManyLinks):
		return nil, syscall.EMLINK
	case errors.Is(err, meta.ErrLinkDir), cairn.KindOf(err) == cairn.Permission:
		return nil, syscall.EPERM
	case err != nil:
		return nil, n.m.errno("link", n.path(name), err)
	}
	n.m.keepTouched(td, tdRev)
	n.m.dirTimes.touch(n.ino)
	n.m.refreshNames(ctx, ne)
	p := queuePlace{Dir: dir.Ino, DirParent: dir.Parent, DirName: dir.Name, Name: name, Path: volPath(n, name)}
	tn.mu.Lock()
	tn.links = append(tn.links, p)
	tn.mu.Unlock()
	if q := n.m.queue; q != nil {
		q.linked(tn.ino, p)
	}
	return n.child(ctx, ne, out), 0
}

// linkPlaces returns the names link(2) gave n on this mount.
func (n *node) linkPlaces() []queuePlace {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.links)
}

// refreshNames reads again, into the entry cache, the records of e's
// other names, which the change that wrote e rewrote (a link, an unlink
// of one name): a stat through one of them then says the new link count
// at once, rather than once the watch brings it.
func (m *Mount) refreshNames(ctx context.Context, e *meta.Entry) {
	for _, l := range e.Links {
		if l.Parent != e.Parent || l.Name != e.Name {
			_, _ = m.ents.get(ctx, l.Parent, l.Name, true)
		}
	}
}

// retryConflict runs a namespace change again while it fails because an
// entry changed between its read and its compare-and-swap (a commit
// here, queued or not, or on another device): the change asked for is
// still to be made, and a local disk would not have refused it.
func retryConflict(op func() error) error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = op(); !errors.Is(err, cairn.ErrConflict) {
			return err
		}
	}
	return err
}

// flushFor waits for the pending changes (write-back mode) before op on
// name in n. If writing them gave the entry the kernel meant another name
// (a conflict's rename), the call fails with ESTALE: the kernel looks the
// name up again instead of acting on the other device's entry.
func (n *node) flushFor(op, name string) syscall.Errno {
	if n.m.wb == nil {
		return 0
	}
	kid := n.kid(name)
	if err := n.m.wb.flush(context.Background()); err != nil {
		return n.m.errno(op, n.path(name), err)
	}
	if kid != nil && n.kid(name) != kid {
		return syscall.ESTALE
	}
	return 0
}

// remove moves name to the trash after checking its type, on the entry
// it removes: the compare-and-swap of the removal holds only while the
// name is still that entry.
func (n *node) remove(ctx context.Context, name string, dir bool) syscall.Errno {
	ctx = bg(ctx)
	if len(name) > vpath.MaxName {
		return syscall.ENAMETOOLONG
	}
	if errno := n.flushFor("remove", name); errno != 0 {
		return errno
	}
	parent, errno := n.dirEntry()
	if errno != 0 {
		return errno
	}
	// A commit of the file in flight (its queued one) finishes first, and
	// none starts under the name until the removal is recorded.
	unlockPlaces := lockPlaces(n.kid(name))
	defer unlockPlaces()
	if !dir {
		// A new file whose creation waits for its first commit
		// (write-back) is not in the metadata: removed here alone.
		if ino, ok := n.m.wb.dropDeferred(n.ino, name); ok {
			n.m.queue.drop(ino, true)
			n.m.ents.removed(n.ino, name)
			n.m.dirTimes.touch(n.ino)
			n.removedHere(ctx, name)
			return 0
		}
	} else if n.m.wb != nil {
		if e, err := n.m.ents.get(ctx, n.ino, name, false); err == nil && e.IsDir() && len(n.m.wb.deferredIn(e.Ino)) > 0 {
			return syscall.ENOTEMPTY // it holds such files
		}
	}
	// The first attempt removes the entry as the entry cache has it (a
	// stale one fails the compare-and-swap: Conflict); a retry reads it
	// from etcd. A type that does not fit is refused on etcd's word only:
	// the cache may not have heard yet that the name was made again, as a
	// directory or as a file, on another device.
	fresh, tried := false, false
	var others *meta.Entry // the removed name's file has other names
	var gone uint64        // the file removed
	tp := n.m.touching(parent)
	tpRev := tp.Rev
	err := retryConflict(func() error {
		e, err := n.m.ents.get(ctx, n.ino, name, fresh)
		if err == nil && e.IsDir() != dir && !fresh {
			e, err = n.m.ents.get(ctx, n.ino, name, true)
		}
		fresh = true
		switch {
		case err != nil:
			return err
		case dir && !e.IsDir():
			return syscall.ENOTDIR
		case !dir && e.IsDir():
			return syscall.EISDIR
		}
		tried = true
		_, err = n.m.vol.Meta.RemoveKnown(ctx, tp, name, n.path(name), false, e)
		if err == nil && e.Nlink() > 1 {
			others = e
		}
		gone = e.Ino
		return err
	})
	if !tried { // refused before any removal was tried
		return n.m.errno("remove", n.path(name), err)
	}
	if err != nil {
		n.m.ents.forget(n.ino, name)
		return n.m.errno("remove", n.path(name), err)
	}
	n.m.ents.removed(n.ino, name)
	n.m.keepTouched(tp, tpRev)
	n.m.dirTimes.touch(n.ino)
	if others != nil {
		// The inode lives on under its other names, where go-fuse's
		// tree still has it: not removed, and its writer lock stays.
		n.m.refreshNames(ctx, others)
		return 0
	}
	if !dir && n.m.queue != nil {
		n.m.queue.drop(gone, false)
	}
	n.removedHere(ctx, name)
	return 0
}

// removedHere marks the node of name in n, if any, removed by this mount,
// and lets its writer lock go.
func (n *node) removedHere(ctx context.Context, name string) {
	if ch := n.kid(name); ch != nil {
		ch.setMoved(&movedTo{fromParent: n, fromName: name, gone: true})
	}
	if ch := n.GetChild(name); ch != nil {
		ch.Operations().(*node).dropLock(ctx)
	}
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.m.offlineWrite() {
		return syscall.EROFS
	}
	return n.remove(ctx, name, false)
}
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.m.offlineWrite() {
		return syscall.EROFS
	}
	return n.remove(ctx, name, true)
}

// Rename moves an entry, replacing an existing file or an empty
// directory. A file renamed over a file becomes the next version of its
// history (meta.Vol.Rename: versions follow the path), also while its
// own content is still to be committed here (unsaved): its commit then
// lands as that version. RENAME_EXCHANGE is not supported (EINVAL).
func (n *node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.m.offlineWrite() {
		return syscall.EROFS
	}
	ctx = bg(ctx)
	if len(name) > vpath.MaxName || len(newName) > vpath.MaxName {
		return syscall.ENAMETOOLONG
	}
	if flags&gofs.RENAME_EXCHANGE != 0 {
		return syscall.EINVAL
	}
	if errno := n.flushFor("rename", name); errno != 0 {
		return errno
	}
	if errno := checkName(newName); errno != 0 {
		return errno
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	src, errno := n.dirEntry()
	if errno != 0 {
		return errno
	}
	dst, errno := np.dirEntry()
	if errno != 0 {
		return errno
	}
	noReplace := flags&unix.RENAME_NOREPLACE != 0
	// Commits of the moved file and of the one it replaces wait, and
	// none starts under a stale name until the move is recorded.
	moving, replaced := n.kid(name), np.kid(newName)
	if moving != nil {
		// As for a link: a file closed just before its rename (an
		// editor's or a package manager's temporary file) has the
		// close's commit queued before the rename is recorded.
		moving.waitClosedWriters()
	}
	unlockPlaces := lockPlaces(moving, replaced)
	defer unlockPlaces()
	// Read with the places held: no commit of it lands meanwhile.
	unsaved := moving != nil && moving.unsaved()
	// The first attempt takes both names' entries from the entry cache
	// (a stale one fails the compare-and-swap: Conflict); a retry reads
	// them from etcd. RENAME_NOREPLACE makes the destination's absence
	// part of the compare-and-swap: a name made meanwhile on another
	// device is never replaced (EEXIST).
	fresh, follows := false, false
	// The records whose times the rename advances (dirtimes.go).
	tsrc, tdst := n.m.touching(src), n.m.touching(dst)
	tsrcRev, tdstRev := tsrc.Rev, tdst.Rev
	var movedIno, replacedIno uint64
	replacedLinked := false
	var renameErr error
	inMemory := false
	if wb := n.m.wb; wb != nil {
		// New files whose creation waits for their first commit
		// (write-back): renamed in memory to a free name, and replaced
		// by forgetting them. A rename of one onto a name that exists in
		// the metadata writes it first (empty: its commit follows).
		srcDeferred := wb.isDeferred(n.ino, name)
		if srcDeferred && wb.isDeferred(np.ino, newName) && (np.ino != n.ino || newName != name) {
			if noReplace {
				return syscall.EEXIST
			}
			if ino, ok := wb.dropDeferred(np.ino, newName); ok {
				replacedIno = ino
				n.m.ents.removed(np.ino, newName)
				if replaced != nil && replaced != moving {
					replaced.setMoved(&movedTo{fromParent: np, fromName: newName, gone: true})
					replaced.dropLock(ctx)
					replaced = nil
				}
			}
		}
		undeferred := false
		if srcDeferred {
			movedIno, inMemory = wb.moveDeferred(n, name, np, dst, newName, false)
			if !inMemory && !wb.isDeferred(np.ino, newName) {
				if _, gerr := n.m.ents.get(ctx, np.ino, newName, true); errors.Is(gerr, cairn.ErrNotFound) {
					movedIno, inMemory = wb.moveDeferred(n, name, np, dst, newName, true)
				}
			}
		}
		switch {
		case inMemory:
		case srcDeferred:
			wb.undefer(n.ino, name, 0)
			undeferred = true
		case wb.isDeferred(np.ino, newName):
			wb.undefer(np.ino, newName, 0)
			undeferred = true
		}
		if undeferred {
			if ferr := wb.flush(context.Background()); ferr != nil {
				return n.m.errno("rename", n.path(name), ferr)
			}
		}
	}
	// The entry the rename wrote under the new name (nil: it failed, or
	// did nothing), for the entry cache (entryCache.renamed).
	var moved *meta.Entry
	// The records of queued commits of the file replaced, acked before
	// the rename (queue.moving): written again unless it was replaced.
	var unqueued []*job
	if !inMemory {
		epoch := n.m.ents.writing()
		dstPlace := queuePlace{Dir: dst.Ino, DirParent: dst.Parent, DirName: dst.Name, Name: newName, Path: volPath(np, newName)}
		renameErr = retryConflict(func() error {
			se, err := n.m.ents.get(ctx, n.ino, name, fresh)
			if err != nil {
				return err
			}
			movedIno, replacedIno = se.Ino, 0
			if noReplace {
				fresh = true
				unqueued = append(unqueued, n.m.queue.moving(se.Ino, dstPlace, 0)...)
				moved, err = n.m.vol.Meta.RenameNoReplace(ctx, tsrc, name, se, tdst, newName, np.path(newName))
				return err
			}
			de, err := n.m.ents.get(ctx, np.ino, newName, fresh)
			if err != nil && !errors.Is(err, cairn.ErrNotFound) {
				return err
			}
			replacedLinked = false
			if de != nil && de.Ino != se.Ino {
				replacedIno = de.Ino
				// A file with other names only loses this one: it
				// and its queued commits live on (its writer lock,
				// by name, goes as any replaced file's).
				replacedLinked = de.Nlink() > 1
			}
			fresh = true
			follows = de != nil && meta.FollowsPath(se, de, unsaved)
			if replacedLinked {
				unqueued = append(unqueued, n.m.queue.moving(se.Ino, dstPlace, 0)...)
			} else {
				unqueued = append(unqueued, n.m.queue.moving(se.Ino, dstPlace, replacedIno)...)
			}
			if unsaved {
				moved, err = n.m.vol.Meta.RenamePending(ctx, tsrc, name, se, tdst, newName, np.path(newName), meta.KnownEntry(de))
			} else {
				moved, err = n.m.vol.Meta.RenameKnown(ctx, tsrc, name, se, tdst, newName, np.path(newName), meta.KnownEntry(de))
			}
			return err
		})
		if renameErr != nil {
			moved = nil
		}
		n.m.ents.renamed(epoch, n.ino, name, np.ino, newName, moved)
	} else {
		// Renamed in memory: the metadata has neither name.
		n.m.ents.removed(n.ino, name)
		n.m.ents.removed(np.ino, newName)
	}
	err := renameErr
	if replacedLinked {
		replacedIno = 0
		replaced = nil
	}
	if len(unqueued) > 0 {
		n.m.queue.restore(unqueued, renameErr == nil, replacedIno)
	}
	if err == nil && movedIno != 0 && n.m.queue != nil {
		n.m.queue.moved(movedIno, dst, newName, volPath(np, newName), replacedIno)
	}
	if err != nil {
		return n.m.errno("rename", n.path(name), err)
	}
	n.m.keepTouched(tsrc, tsrcRev)
	n.m.keepTouched(tdst, tdstRev)
	if np != n || newName != name {
		n.m.dirTimes.touch(n.ino)
		n.m.dirTimes.touch(np.ino)
	}
	if replaced != nil && replaced != moving {
		// The replaced file's queued commits land before the moving
		// file's own only if that one is still to come (RenamePending).
		// Otherwise the moving file's content is the name's current one
		// now (its committed versions, or none: an empty new file, or
		// one a write-back mount made just now because this rename
		// needed it), and a commit landing under the name after it
		// would give the name the replaced file's content: those
		// commits are dropped instead (the file is removed), as a
		// local disk drops a replaced file's unsaved writes.
		if follows && unsaved && moving != nil {
			replaced.heir.Store(moving)
		}
		replaced.setMoved(&movedTo{fromParent: np, fromName: newName, gone: true})
	}
	if moving != nil {
		moving.setMoved(&movedTo{fromParent: n, fromName: name, parent: np, name: newName})
	}
	// Writer locks are by name (dropLock): the moved file's and the
	// replaced file's go. go-fuse moves the nodes after this returns.
	for _, ch := range []*gofs.Inode{n.GetChild(name), np.GetChild(newName)} {
		if ch != nil {
			ch.Operations().(*node).dropLock(ctx)
		}
	}
	return 0
}

// waitClosedWriters waits, in write-back mode and up to releaseWait, for
// the releases of n's writers that were closed (a flush) but not yet
// released, and for releases saving: write-back mode queues a file's
// commit at its last writer's release, which the kernel sends after
// close(2) returned. A namespace change of the file that follows a close
// (link, rename) waits for it, so that the journal holds the file's
// content before the change: a kill in between then never leaves the
// change without the content. Writers never closed are not waited for;
// one closed but still open through another descriptor (dup, fork) makes
// the change wait the whole bound, as an fsync does (handle.waitReleases).
func (n *node) waitClosedWriters() {
	if n.m.mode != WriteBack || n.typ != meta.TypeFile {
		return
	}
	deadline := time.Now().Add(releaseWait)
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		n.mu.Lock()
		c := n.content
		n.mu.Unlock()
		if c == nil {
			return
		}
		c.mu.Lock()
		busy := c.flushedWriters > 0 || c.releasing > 0
		c.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			n.m.releaseWaitsOut.Add(1)
			n.m.log.Debug("a link or rename waited the whole bound for a release: a writer closed once is still open", "path", n.path(""))
			return
		}
		time.Sleep(delay)
	}
}

// unsaved reports whether this mount holds content of n that is still to
// be committed: writes not yet saved (passthrough: ones the kernel made
// to the copy), a queued commit, a last writer's release saving it.
func (n *node) unsaved() bool {
	n.mu.Lock()
	c := n.content
	n.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	held := c.dirty || c.pending > 0 || c.releasing > 0
	ptw := c.ptw && c.writers > 0
	c.mu.Unlock()
	if !held && ptw {
		_, mt, ok := c.ptLocal()
		held = ok && !mt.IsZero() // written by the kernel since armed
	}
	return held
}

// Statfs reports the space of the disk that holds the cache, where
// writes land first.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st unix.Statfs_t
	if err := unix.Statfs(n.m.cache.dir, &st); err != nil {
		return n.m.errno("statfs", n.m.cache.dir, err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize, out.Frsize = uint32(st.Bsize), uint32(st.Frsize)
	out.NameLen = vpath.MaxName
	return 0
}

// Fsync of a directory: every namespace change is committed in the
// metadata service when its call returns, or, in write-back mode, once
// the pending ones are written, which this waits for.
func (n *node) Fsync(ctx context.Context, f gofs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := asHandle(f); ok {
		return h.Fsync(ctx, flags)
	}
	// An fsync writes what is pending, new files whose creation waits
	// for their first commit too (write-back): made now, empty until it.
	if n.typ == meta.TypeDir {
		n.m.wb.undeferIn(n.ino)
	} else {
		n.m.wb.undeferNode(n)
	}
	if err := n.m.wb.flush(bg(ctx)); err != nil {
		return n.m.errno("fsync", n.path(""), err)
	}
	return 0
}

// ---- directories ----

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.typ != meta.TypeDir {
		return nil, 0, syscall.ENOTDIR
	}
	return &dirHandle{n: n}, 0, 0
}

// dirHandle lists a directory: one ReadDir from the metadata service when
// reading starts (and again after a rewind), "." and ".." first. Its
// Lookup answers READDIRPLUS from that listing, without a request per
// entry.
type dirHandle struct {
	n      *node
	mu     sync.Mutex
	loaded bool
	list   []fuse.DirEntry
	ents   map[string]*meta.Entry
	pos    int
}

func (d *dirHandle) load(ctx context.Context) syscall.Errno {
	// New files whose creation waits for their first commit (write-back)
	// are not in the metadata yet: listed from the mount's own record,
	// taken before the metadata is read. One undeferred meanwhile (its
	// last writer's release, say) is then in one or the other: taken
	// after, it would be in neither if the read came before its write.
	deferred := d.n.m.wb.deferredIn(d.n.ino)
	ents, err := d.n.m.ents.readDir(ctx, d.n.ino)
	if err != nil {
		return d.n.m.errno("readdir", d.n.path(""), err)
	}
	parent := d.n.ino
	if _, p, ok := d.n.place(); ok && p != nil {
		parent = p.ino
	}
	d.list = append(d.list[:0], fuse.DirEntry{Name: ".", Ino: d.n.ino, Mode: syscall.S_IFDIR},
		fuse.DirEntry{Name: "..", Ino: parent, Mode: syscall.S_IFDIR})
	for _, e := range deferred {
		if !slices.ContainsFunc(ents, func(x meta.Entry) bool { return x.Name == e.Name }) {
			ents = append(ents, e)
		}
	}
	d.ents = make(map[string]*meta.Entry, len(ents))
	for i := range ents {
		e := &ents[i]
		d.list = append(d.list, fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: meta.ModeBits(e.Type)})
		d.ents[e.Name] = e
	}
	d.loaded = true
	return 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.loaded {
		if errno := d.load(bg(ctx)); errno != 0 {
			return nil, errno
		}
	}
	if d.pos >= len(d.list) {
		return nil, 0
	}
	de := d.list[d.pos]
	d.pos++
	de.Off = uint64(d.pos)
	return &de, 0
}

// Seekdir to 0 (rewinddir) lists the directory afresh.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		d.loaded, d.pos = false, 0
		return 0
	}
	if !d.loaded || off > uint64(len(d.list)) {
		return syscall.EINVAL
	}
	d.pos = int(off)
	return 0
}

func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.mu.Lock()
	e := d.ents[name]
	d.mu.Unlock()
	if e == nil {
		return d.n.Lookup(ctx, name, out)
	}
	return d.n.childOf(bg(ctx), e, out, false), 0
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {}
