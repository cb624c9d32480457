package mount

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// The entry cache keeps the namespace records this mount has read, kept
// current by a watch on the volume's records (meta.Vol.WatchEntries), so
// that a lookup, a stat or an open of a file whose record has not changed
// asks the metadata service nothing: the lease idea of LBFS §3.2.1, with
// etcd's watch as the server's promise to call back.
//
// Close-to-open holds with a window: a version committed on another device
// is seen by the next open here once the watch has delivered its change,
// normally a network round trip after the commit. A watch that stalls
// without failing (a network that drops packets silently) would stretch
// that, so the cache is trusted only while the watch has answered within
// watchTrust: it is asked for a progress notice every watchProgress, and
// when none came back in time every read goes to etcd again. The worst
// case is therefore watchTrust (6 s) after the commit. When the watch
// fails (compaction, a lost leader, etcd gone) the cache is emptied and
// every read goes to etcd until a new watch is established.
const (
	watchTrust    = 6 * time.Second
	watchProgress = 2 * time.Second
	// maxCachedEntries bounds the cache; past it, it is emptied.
	maxCachedEntries = 200_000
)

type ekey struct {
	parent uint64 // 0: the root's own record
	name   string
}

type entryCache struct {
	vol *meta.Vol

	mu       sync.Mutex
	trust    time.Duration // watchTrust (tests shorten it)
	progress time.Duration // watchProgress (tests lengthen it)
	ents     map[ekey]*meta.Entry
	// complete are directories whose every entry ents holds (made by
	// this mount, or listed whole): the watch adds what is created in
	// them, and a name they lack is known absent without asking etcd.
	// Each maps to the revision its whole state was read at (the
	// listing's, or the write that made it empty): a change the watch
	// reports late, at or before it, is already there (apply).
	complete map[uint64]int64
	// subdirs are the names of the directories ents holds in each
	// directory (by its inode): its subdirectories while it is complete.
	// Kept by setLocked and delLocked, which every change of ents goes
	// through.
	subdirs map[uint64]map[string]struct{}
	epoch   uint64 // bumped when the cache is emptied; a read begun before is not kept
	live    bool   // a watch is established and reports every change
	heard   time.Time
	rev     int64 // the revision up to which the watch has reported every change
	// reads counts reads of etcd in progress, and tombs the newest change
	// seen for a name while any is, so that a read answered before a
	// change is not kept after it.
	reads int
	tombs map[ekey]int64
	// gone are names this mount renamed away, with the rename's
	// revision, until the watch has reported it: the watch's late report
	// of an older creation of such a name (a lock file git made and
	// renamed over its target) must not make it exist again (apply).
	gone map[ekey]int64

	etcdReads atomic.Int64 // reads that went to etcd (for tests)

	// wb holds the entries a write-back mount made or changed and has
	// not written yet (writeback.go): get answers from it first. nil in
	// the other modes.
	wb *writeBack
}

func newEntryCache(v *meta.Vol) *entryCache {
	return &entryCache{vol: v, trust: watchTrust, progress: watchProgress, ents: map[ekey]*meta.Entry{},
		complete: map[uint64]int64{}, subdirs: map[uint64]map[string]struct{}{}, tombs: map[ekey]int64{}, gone: map[ekey]int64{}}
}

// setLocked caches e under k, keeping subdirs.
func (c *entryCache) setLocked(k ekey, e *meta.Entry) {
	c.delLocked(k)
	c.ents[k] = e
	if e.IsDir() && k != (ekey{}) {
		d := c.subdirs[k.parent]
		if d == nil {
			d = map[string]struct{}{}
			c.subdirs[k.parent] = d
		}
		d[k.name] = struct{}{}
	}
}

// delLocked drops k, keeping subdirs.
func (c *entryCache) delLocked(k ekey) {
	old, ok := c.ents[k]
	if !ok {
		return
	}
	delete(c.ents, k)
	if d := c.subdirs[k.parent]; old.IsDir() && k != (ekey{}) && d != nil {
		if delete(d, k.name); len(d) == 0 {
			delete(c.subdirs, k.parent)
		}
	}
}

// subdirCount returns the number of subdirectories of directory ino if
// the cache may say it without asking etcd (ino is complete), counting
// the names in pending (write-back: directories made in it and not
// written yet) too, once.
func (c *entryCache) subdirCount(ino uint64, pending []string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trustedLocked() || !c.completeDir(ino) {
		return 0, false
	}
	d := c.subdirs[ino]
	k := len(d)
	for _, name := range pending {
		if _, ok := d[name]; !ok {
			k++
		}
	}
	return k, true
}

func copyEntry(e *meta.Entry) *meta.Entry {
	c := *e
	c.Versions = append([]meta.Version(nil), e.Versions...)
	return &c
}

// trusted reports whether the cache may answer without asking etcd.
func (c *entryCache) trustedLocked() bool {
	return c.live && time.Since(c.heard) < c.trust
}

// get returns the record name in directory parent (0, "": the root's),
// from the cache when it may answer, else from etcd. A name a complete
// directory lacks is NotFound without a request (the lookup before every
// create of tar or git).
func (c *entryCache) get(ctx context.Context, parent uint64, name string, fresh bool) (*meta.Entry, error) {
	k := ekey{parent, name}
	if c.wb != nil {
		if e, absent := c.wb.lookup(parent, name); e != nil {
			return e, nil
		} else if absent {
			return nil, cairn.E("lookup", cairn.NotFound, name, nil)
		}
	}
	c.mu.Lock()
	if !fresh && c.trustedLocked() {
		if e := c.ents[k]; e != nil {
			c.mu.Unlock()
			// The watch keeps every record; the volume's ACLs decide
			// what this device may see of them.
			if err := c.vol.CheckRead(ctx, parent, name, e); err != nil {
				return nil, err
			}
			return copyEntry(e), nil
		}
		if k != (ekey{}) && c.completeDir(parent) {
			c.mu.Unlock()
			// A listing leaves out what the ACLs deny: refused, not
			// absent.
			if err := c.vol.CheckRead(ctx, parent, name, nil); err != nil {
				return nil, err
			}
			return nil, cairn.E("lookup", cairn.NotFound, name, nil)
		}
	}
	epoch := c.epoch
	c.reads++
	c.mu.Unlock()
	c.etcdReads.Add(1)
	e, err := c.vol.Get(ctx, parent, name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.keepLocked(epoch, k, e)
	}
	c.doneReadLocked()
	return e, err
}

// known returns what the cache may say without asking etcd of name in
// directory parent: its entry, or that there is none (nil); known is
// false when only etcd can say.
func (c *entryCache) known(parent uint64, name string) (e *meta.Entry, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trustedLocked() {
		return nil, false
	}
	if e := c.ents[ekey{parent, name}]; e != nil {
		return copyEntry(e), true
	}
	return nil, c.completeDir(parent)
}

// completeDir reports whether ents holds every entry of directory ino.
func (c *entryCache) completeDir(ino uint64) bool {
	_, ok := c.complete[ino]
	return ok
}

// readDir lists directory ino from etcd and keeps what it read (after
// the pending changes of write-back mode, which the listing must hold).
func (c *entryCache) readDir(ctx context.Context, ino uint64) ([]meta.Entry, error) {
	if err := c.wb.flush(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	epoch := c.epoch
	c.reads++
	c.mu.Unlock()
	c.etcdReads.Add(1)
	ents, at, err := c.vol.ReadDirAt(ctx, ino)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.listedLocked(epoch, ino, ents, at)
	}
	c.doneReadLocked()
	return ents, err
}

// listedLocked keeps ents, the whole listing of directory ino read from
// etcd at revision at (by a read begun since epoch), and marks the
// directory complete.
func (c *entryCache) listedLocked(epoch uint64, ino uint64, ents []meta.Entry, at int64) {
	for i := range ents {
		c.keepLocked(epoch, ekey{ino, ents[i].Name}, &ents[i])
	}
	c.completeAtLocked(epoch, ino, at)
}

// completeAtLocked marks directory ino complete as of revision at: every
// entry it had then was read (or it was made empty then, by this mount's
// write: its inode is new) since epoch and is kept. Not when the cache
// was emptied since, nor when the watch reported a change in it after at
// while the read was in progress: the read did not see that change, and
// the watch, which had passed it, will not report it again. A change the
// watch reports at or before at, during the read or after it, is one the
// directory's state already holds (apply ignores it).
func (c *entryCache) completeAtLocked(epoch uint64, ino uint64, at int64) {
	if !c.live || epoch != c.epoch {
		return
	}
	for k, rev := range c.tombs {
		if k.parent == ino && rev > at {
			return
		}
	}
	c.complete[ino] = at
}

func (c *entryCache) doneReadLocked() {
	c.reads--
	if c.reads == 0 && len(c.tombs) > 0 {
		c.tombs = map[ekey]int64{}
	}
}

// keepLocked caches e, read from etcd since epoch, unless the cache was
// emptied since or a newer change of that name was seen.
func (c *entryCache) keepLocked(epoch uint64, k ekey, e *meta.Entry) {
	if !c.live || epoch != c.epoch {
		return
	}
	if old := c.ents[k]; old != nil && old.Rev > e.Rev {
		return
	}
	if t, ok := c.tombs[k]; ok && t > e.Rev {
		if t == math.MaxInt64 && k != (ekey{}) {
			// This mount removed or renamed the name while a read was in
			// flight, and the name is back (a create after an unlink):
			// its entry cannot be kept, so its directory's listing
			// cannot say it is absent either. Ask etcd next time.
			delete(c.complete, k.parent)
		}
		return
	}
	if len(c.ents) >= maxCachedEntries {
		c.resetLocked()
		return
	}
	c.setLocked(k, copyEntry(e))
}

// put records e, just written by this mount (its Rev is the write's). A
// name the cache does not hold is kept only if the watch has not yet
// reported e's revision: a newer change of it the watch already passed
// over (names not held are not followed) would be missed.
func (c *entryCache) put(e *meta.Entry) {
	k := ekey{e.Parent, e.Name}
	if e.Ino == meta.RootIno {
		k = ekey{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reads > 0 {
		c.tombs[k] = max(c.tombs[k], e.Rev)
	}
	if _, held := c.ents[k]; !held && e.Rev <= c.rev {
		return
	}
	c.keepLocked(c.epoch, k, e)
}

// writing starts a write of this mount's (a create, a commit, an
// attribute change) and returns what wrote needs: like a read, it makes
// the cache remember the newest change the watch reports meanwhile for
// each name, so that the written entry is kept by wrote even when the
// watch reported it first (which put must refuse for a name not held),
// and not kept when a newer change of the name was reported.
func (c *entryCache) writing() (epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.epoch
}

// wrote ends a write begun by writing; e (nil: the write failed) is the
// entry it wrote, with the write's revision. made says e is a directory
// the write created, empty.
func (c *entryCache) wrote(epoch uint64, e *meta.Entry, made bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e != nil {
		c.keepWrittenLocked(epoch, e, made)
	}
	c.doneReadLocked()
}

// keepWritten is wrote for one of several entries a write (begun by one
// writing) wrote; wrote(epoch, nil, false) ends the write.
func (c *entryCache) keepWritten(epoch uint64, e *meta.Entry, made bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keepWrittenLocked(epoch, e, made)
}

func (c *entryCache) keepWrittenLocked(epoch uint64, e *meta.Entry, made bool) {
	k := ekey{e.Parent, e.Name}
	if e.Ino == meta.RootIno {
		k = ekey{}
	}
	c.keepLocked(epoch, k, e)
	if made && e.IsDir() {
		c.completeAtLocked(epoch, e.Ino, e.Rev)
	}
}

// forget drops a name this mount just removed or renamed (what a read in
// progress returns for it is not kept either).
func (c *entryCache) forget(parent uint64, name string) {
	k := ekey{parent, name}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delLocked(k)
	delete(c.complete, parent) // the change may have failed: ask etcd
	if c.reads > 0 {
		c.tombs[k] = math.MaxInt64
	}
}

// removed drops a name this mount just removed from the metadata (or
// a creation of it never written there: writeBack.dropDeferred). Unlike
// forget, a directory complete stays so: its entries less the name are
// what etcd has (the watch's later report of the removal finds nothing
// to drop). Without that, an rm -rf listed each directory again from
// etcd after every unlink, to answer the kernel's stat of it (its link
// count: node.dirLinks): O(n) per unlink in a directory of n entries.
func (c *entryCache) removed(parent uint64, name string) {
	k := ekey{parent, name}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delLocked(k)
	if c.reads > 0 {
		c.tombs[k] = math.MaxInt64
	}
}

// renamed ends a rename begun by writing: the name srcName in directory
// srcParent moved to e's name (e: the entry the rename wrote there, with
// its revision). Each directory complete stays so, its listing changed in
// place: the old name dropped, the new one added or replaced. Without
// that, each rename into a directory (git's index.lock, a package
// manager's temporary files) made the next stat of it (its link count)
// list it whole from etcd again. A change of either name the watch
// reported newer than the rename (another device's) is kept, as wrote
// keeps it. e nil (the rename failed, or did nothing): both names are
// forgotten and both directories are read from etcd again.
func (c *entryCache) renamed(epoch uint64, srcParent uint64, srcName string, dstParent uint64, dstName string, e *meta.Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.doneReadLocked()
	sk, dk := ekey{srcParent, srcName}, ekey{dstParent, dstName}
	if e == nil {
		for _, k := range []ekey{sk, dk} {
			c.delLocked(k)
			delete(c.complete, k.parent)
			c.tombs[k] = math.MaxInt64
		}
		return
	}
	if old := c.ents[sk]; old != nil && old.Rev <= e.Rev {
		c.delLocked(sk)
	}
	c.tombs[sk] = max(c.tombs[sk], e.Rev)
	if sk != dk && e.Rev > c.rev {
		c.gone[sk] = max(c.gone[sk], e.Rev)
	}
	c.keepWrittenLocked(epoch, e, false)
	if c.ents[dk] == nil {
		// Not kept (a change of the name seen since, or one of this
		// mount's removals of it whose revision is unknown): only etcd
		// can say what the directory holds.
		delete(c.complete, dstParent)
	}
}

func (c *entryCache) resetLocked() {
	c.ents = map[ekey]*meta.Entry{}
	c.gone = map[ekey]int64{}
	c.complete = map[uint64]int64{}
	c.subdirs = map[uint64]map[string]struct{}{}
	c.epoch++
}

// established starts trusting the cache: a watch from rev is live.
func (c *entryCache) established(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetLocked()
	c.live, c.heard, c.rev = true, time.Now(), rev
}

// broken stops trusting the cache: the watch ended.
func (c *entryCache) broken() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetLocked()
	c.live = false
}

// apply takes in one response of the watch. It returns the changes to
// names the cache held (for the kernel's caches).
//
// The watch may report a change after the cache holds a newer state: a
// read or a write of this mount's answered at a revision the watch has
// not reached yet. Such a late change must not undo that state: a change
// older than the entry held is ignored (a removal too: the name was made
// again since), and so is a creation, in a complete directory, at or
// before the revision the directory was listed at (the listing has the
// name, or it was gone by then), and so is a creation of a name this
// mount renamed away since (gone). Without that, a name git created and
// renamed away (index.lock, config.lock) came back for a moment when the
// watch reported its creation, and git's next create of it failed with
// EEXIST.
func (c *entryCache) apply(ev meta.EntryEvents) []meta.EntryChange {
	c.mu.Lock()
	defer c.mu.Unlock()
	var known []meta.EntryChange
	for _, ch := range ev.Changes {
		k := ekey{ch.Parent, ch.Name}
		if c.reads > 0 {
			c.tombs[k] = max(c.tombs[k], ch.Rev)
		}
		old, ok := c.ents[k]
		if !ok {
			if g, renamed := c.gone[k]; renamed && ch.Rev < g {
				continue // made before this mount renamed it away
			}
			if at, complete := c.complete[ch.Parent]; ch.Entry != nil && complete && ch.Rev > at {
				if len(c.ents) >= maxCachedEntries {
					c.resetLocked()
				} else {
					c.setLocked(k, ch.Entry) // created in a complete directory
				}
			}
			continue
		}
		if ch.Rev < old.Rev {
			continue // older than what the cache holds
		}
		known = append(known, meta.EntryChange{Parent: ch.Parent, Name: ch.Name, Entry: old, Rev: ch.Rev})
		if ch.Entry == nil {
			c.delLocked(k)
		} else {
			c.setLocked(k, ch.Entry)
		}
	}
	c.heard = time.Now()
	c.rev = max(c.rev, ev.Rev)
	for k, g := range c.gone {
		if g <= c.rev {
			delete(c.gone, k) // reported: nothing older comes any more
		}
	}
	return known
}

// silent reports whether the watch is established and has not answered
// for the trust period: its progress notices stopped coming.
func (c *entryCache) silent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live && time.Since(c.heard) >= c.trust
}

// progressEvery returns how often the watch is asked for progress.
func (c *entryCache) progressEvery() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.progress
}

// watchedRev returns the revision up to which the watch has reported
// every change, and whether the cache is trusted now.
func (c *entryCache) watchedRev() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev, c.trustedLocked()
}
