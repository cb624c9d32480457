package mount

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/vpath"
)

// Write-back mode (doc/format.md, "Write-back mode"): a create, a mkdir, a symlink, a mknod or an
// attribute change the mount can decide on its own is answered at once and
// written to the metadata later, many in one transaction
// (meta.Vol.PutBatch), by one applier goroutine. A program that makes
// thousands of files (tar x, git clone) then waits for no etcd round trip
// per file. Closes queue their commits as in non-blocking mode.
//
// What the mount decides alone: a new name in a directory whose every
// entry it knows (one it made whose creation is still pending, which no
// other device can see yet, or one the entry cache holds complete while
// its watch vouches for it), and attribute changes of an entry it knows.
// Pending entries answer lookups, stats and opens here (entryCache.get
// asks the overlay first); nothing else of the mount's writes may pass
// them, so every other write to the metadata (rename, remove, extended
// attributes, a lock, a queued commit) and every directory listing read
// from etcd waits for the pending changes first (flush). So does an fsync
// of a directory, and the unmount.
//
// What another device sees: each change after its batch, once the mount
// is quiet (below), at most writeBackAge later (the applier takes whatever
// accumulated meanwhile, up to meta.MaxBatch a transaction). A new file open for writing
// here gets its writer lock in its batch's transaction, so once another
// device can see it, it cannot open it for writing before the commit. Conflicts: a name created
// here and on another device at once (possible only in a directory that
// was already visible) is kept under both: this device's entry is renamed
// NAME.conflict-XXXXXXXX (its inode number's last 8 hex digits), logged;
// an attribute change that meets a newer record is made again on it (the
// last change wins, as on one machine: a utimes's mtime is not, over
// content committed since, whose write came later), and one of a file whose queued
// commit here lands before the change is written is made again on the
// commit's record at once (rebase), before this mount shows that record:
// no change it acknowledged ever reads back undone; an entry whose directory was
// removed elsewhere meanwhile is dropped, logged (files with data keep it:
// their queued commit fails and keeps the copy in unsaved/).
//
// When: the applier waits while programs keep the mount busy (quiet), up
// to writeBackAge after the oldest pending change, so that the work of
// writing them (here and in etcd) does not compete with the program for
// the machine, and fills its transactions; anything that needs them
// written (flush) does not wait. Queued commits wait likewise (queue.go).
//
// New files made for writing (a create with a descriptor that writes)
// are the exception: their creation waits for their first commit, which
// makes the entry and its first version in one transaction, under the
// inode number the mount showed (queue.commit, claim): no other device,
// and no 'cairn ls' or 'cairn get', ever sees such a file empty. Until
// then the mount shows it from its own record (lookups, listings, stats
// with the size of its local copy); flushes pass it by; a rename of it to
// a name free as far as the mount knows (or etcd says) and its removal
// are made in memory (the queued commit's record follows the rename).
// What needs its entry in etcd earlier writes it (empty, with the writer
// lock while it is open: its commit follows): an fsync of it or of its
// directory, an extended attribute, a rename onto a name that exists in
// etcd, its last writer's release with no commit queued (a file made
// empty), and the unmount (after the queue). A name made on another
// device meanwhile meets the commit, which keeps this file under
// NAME.conflict-XXXXXXXX as above.
//
// Pending changes live in memory: a killed mount loses the ones not yet
// applied (its queued commits are not lost: the next mount finishes those
// whose directory exists, and keeps the others in unsaved/). The window
// is the applier's lag: up to writeBackAge while the mount is busy, a
// transaction or so when it is not.

// maxPending bounds the pending changes (while the metadata service does
// not answer, say): past it, creates are made in etcd at once, after the
// pending ones.
const maxPending = 50_000

// writeBackAge bounds how long a pending namespace change waits for the
// mount to be quiet before it is written anyway.
const writeBackAge = 2 * time.Second

// flushTimeout bounds a wait for the pending changes (flush) of a call
// that has no deadline of its own: past it the call fails (EIO) instead
// of hanging while the metadata service does not answer.
const flushTimeout = 30 * time.Second

// wbItem is one pending entry: a new one (made) or a change of one.
type wbItem struct {
	e      meta.Entry // the record to write; for a change, e.Rev is the revision it changes
	parent *node      // the directory that holds it
	// dir is where the directory's own record was when the item was
	// made: used if the kernel lets the parent's node go meanwhile.
	dir  meta.Entry
	made bool
	// attrs are what the changes since the last snapshot set (made again
	// on a newer record, should the write meet one).
	attrs heldAttrs
	// set is what every change of it set, snapshots or not: made again on
	// the record a commit of this mount writes meanwhile (rebase), which
	// would otherwise show the entry as it was before them.
	set   heldAttrs
	first uint64 // the number of its oldest change not yet written: flush waits for it
	seq   uint64 // the number of its newest change
	// deferred: a new file made for writing, whose creation waits for its
	// first commit, which makes both in one transaction (queue.commit,
	// claim): no other device ever sees it empty. Batches and flushes
	// pass it by; what needs it in the metadata before (an extended
	// attribute, a rename onto a name that exists there) undefers it, and
	// so does its last writer's release when no commit is queued (a file
	// made empty), and the unmount.
	deferred bool
}

type writeBack struct {
	m *Mount

	mu    sync.Mutex
	cond  *sync.Cond // broadcast when items are written or dropped
	items map[ekey]*wbItem
	// dirItems are the names of the directories among items, by the
	// directory that holds them (pendingSubdirs). Kept by putItemLocked
	// and delItemLocked, which every change of items goes through.
	dirItems map[uint64]map[string]struct{}
	order    []ekey // first-pending order: directories before what they hold
	// fresh are directories made here whose creation is pending: no
	// other device can see them, so every entry they hold is pending.
	fresh    map[uint64]bool
	seq      uint64
	stopping bool
	// since is when the oldest pending change was made (zero while none
	// is pending); flushing counts the flushes waiting: the applier does
	// not wait for quiet while one does.
	since    time.Time
	flushing int
	kick     chan struct{}
	done     chan struct{}
	// hold, for tests, stops the applier while it is set (HoldWriteBack).
	hold chan struct{}
}

func newWriteBack(m *Mount) *writeBack {
	w := &writeBack{m: m, items: map[ekey]*wbItem{}, dirItems: map[uint64]map[string]struct{}{}, fresh: map[uint64]bool{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// lookup answers for name in directory parent from the pending entries:
// the entry, or known absent (a directory whose creation is pending holds
// nothing else).
func (w *writeBack) lookup(parent uint64, name string) (e *meta.Entry, absent bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if it := w.items[ekey{parent, name}]; it != nil {
		return copyEntry(&it.e), false
	}
	return nil, name != "" && w.fresh[parent]
}

// create makes e (its Ino assigned here) in directory parent pending, if
// the mount can decide it alone: in write-back mode, a name absent from a
// directory whose every entry it knows. It returns the entry, or ok false
// when the create must be made in etcd now; EEXIST with the entry that
// holds the name.
//
// deferred (a new file made for writing) makes its creation wait for its
// first commit (wbItem.deferred); absent says the caller found the name
// absent in the metadata just now: the create is pending even if the
// mount does not know the directory's every entry (a name made on
// another device meanwhile meets it at the commit: renameAside).
func (w *writeBack) create(parent *node, dir *meta.Entry, e meta.Entry, deferred, absent bool) (*meta.Entry, bool, error) {
	if w == nil {
		return nil, false, nil
	}
	if len(e.Name) > vpath.MaxName-len(".conflict-00000000") {
		return nil, false, nil // no room for a conflict's name: made in etcd now
	}
	k := ekey{parent.ino, e.Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping || len(w.items) >= maxPending {
		return nil, false, nil
	}
	if it := w.items[k]; it != nil {
		return copyEntry(&it.e), true, cairn.E("create", cairn.Exist, e.Name, nil)
	}
	if !w.fresh[parent.ino] {
		old, known := w.m.ents.known(parent.ino, e.Name)
		if !known && !(absent && deferred && e.Type == meta.TypeFile) {
			return nil, false, nil
		}
		if old != nil {
			return old, true, cairn.E("create", cairn.Exist, e.Name, nil)
		}
	}
	now := time.Now().UnixNano()
	e.Parent, e.Ino = parent.ino, meta.NewIno()
	if e.Ctime == 0 {
		e.Ctime = now
	}
	if e.Mtime == 0 {
		e.Mtime = now
	}
	w.seq++
	it := &wbItem{e: e, parent: parent, dir: *dir, made: true, first: w.seq, seq: w.seq, deferred: deferred && e.Type == meta.TypeFile}
	w.putItemLocked(k, it)
	if !it.deferred {
		w.pendingSinceLocked()
	}
	w.order = append(w.order, k)
	if e.IsDir() {
		w.fresh[e.Ino] = true
	}
	w.poke()
	return copyEntry(&e), true, nil
}

// setAttrs records a on n's entry, pending, if the mount knows the entry
// (pending itself, or in the entry cache); ok false: written now.
func (w *writeBack) setAttrs(n *node, a heldAttrs) (*meta.Entry, bool) {
	if w == nil || n.IsRoot() {
		return nil, false
	}
	name, p, ok := n.place()
	if !ok {
		return nil, false
	}
	dir, errno := p.dirEntry()
	if errno != 0 {
		return nil, false
	}
	k := ekey{p.ino, name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping {
		return nil, false
	}
	if it := w.items[k]; it != nil {
		if it.e.Ino != n.ino {
			return nil, false
		}
		w.seq++
		a.applyTo(&it.e)
		it.e.Ctime = time.Now().UnixNano()
		it.attrs = it.attrs.over(a)
		it.set = it.set.over(a)
		it.seq = w.seq
		w.poke()
		return copyEntry(&it.e), true
	}
	e, known := w.m.ents.known(p.ino, name)
	if !known || e == nil || e.Ino != n.ino || e.Rev == 0 || len(w.items) >= maxPending {
		return nil, false
	}
	was := *e
	a.applyTo(e)
	if e.Mode == was.Mode && e.UID == was.UID && e.GID == was.GID && e.Mtime == was.Mtime {
		return e, true // nothing changes (tar's chown to the owner it has)
	}
	e.Ctime = time.Now().UnixNano()
	w.seq++
	w.putItemLocked(k, &wbItem{e: *e, parent: p, dir: *dir, attrs: a, set: a, first: w.seq, seq: w.seq})
	w.pendingSinceLocked()
	w.order = append(w.order, k)
	w.poke()
	return copyEntry(e), true
}

// pendingSinceLocked notes the time of the oldest pending change.
func (w *writeBack) pendingSinceLocked() {
	if w.since.IsZero() {
		w.since = time.Now()
	}
}

func (w *writeBack) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// flush waits until every change made before it was called is written
// (or dropped), or ctx ends; a ctx without a deadline gets flushTimeout.
func (w *writeBack) flush(ctx context.Context) error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.readyLocked() {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	target := w.seq
	w.flushing++
	defer func() { w.flushing-- }()
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	defer stop()
	w.poke()
	for w.waitingLocked(target) {
		if err := ctx.Err(); err != nil {
			return cairn.E("flush", cairn.Unavailable, w.m.vol.Name(), fmt.Errorf("namespace changes made on this device are not written to the metadata service yet: %w", err))
		}
		w.cond.Wait()
	}
	return nil
}

func (w *writeBack) waitingLocked(target uint64) bool {
	for _, it := range w.items {
		if it.first <= target && !it.deferred {
			return true
		}
	}
	return false
}

// run applies pending changes until stop.
func (w *writeBack) run() {
	defer close(w.done)
	backoff := 50 * time.Millisecond
	for {
		w.mu.Lock()
		for !w.readyLocked() && !w.stopping {
			w.mu.Unlock()
			<-w.kick
			w.mu.Lock()
		}
		if !w.readyLocked() {
			w.mu.Unlock()
			return
		}
		hold := w.hold
		w.mu.Unlock()
		if hold != nil {
			<-hold
		}
		w.waitQuiet()
		err := w.applyOnce(context.Background())
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
		if err != nil {
			w.m.log.Warn("pending namespace changes not written yet; trying again", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
	}
}

// waitQuiet waits, before the applier writes, while programs keep the
// mount busy (Mount.quietFor), up to writeBackAge after the oldest pending
// change; a flush waiting, the unmount, or a long backlog end the wait.
func (w *writeBack) waitQuiet() {
	for {
		w.mu.Lock()
		urgent := w.flushing > 0 || w.stopping || len(w.items) >= maxPending/2
		since := w.since
		w.mu.Unlock()
		wait := w.m.quietFor(since, writeBackAge)
		if urgent || wait <= 0 {
			return
		}
		select {
		case <-time.After(wait):
		case <-w.kick: // a flush, or more changes: judged again
		}
	}
}

// stop applies what is pending (trying for up to 30 s while the metadata
// service does not answer) and ends the applier.
func (w *writeBack) stop() {
	if w == nil {
		return
	}
	// New files whose first commit did not come (the queue ran first:
	// Mount.shutdown) are made now, empty, as they were shown.
	w.mu.Lock()
	for k, it := range w.items {
		if it.deferred {
			w.undeferLocked(k, it)
		}
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.flush(ctx); err != nil {
		w.mu.Lock()
		for _, it := range w.items {
			w.m.log.Error("a namespace change could not be written before the unmount: lost", "path", it.parent.path(it.e.Name))
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	w.stopping = true
	w.items, w.dirItems = map[ekey]*wbItem{}, map[uint64]map[string]struct{}{}
	w.since = time.Time{}
	w.cond.Broadcast()
	w.mu.Unlock()
	w.poke()
	<-w.done
}

// snapshot is an item as a batch writes it.
type snapshot struct {
	k    ekey
	it   *wbItem
	snap wbItem
	node *node // a new file's node while it has writers: its lock comes with the batch
}

// batch takes up to meta.MaxBatch pending items in order. The attribute
// changes each carries move to its snapshot (unbatch puts them back).
func (w *writeBack) batch() []snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []snapshot
	seen := map[ekey]bool{}
	for _, k := range w.order {
		if len(out) == meta.MaxBatch {
			break
		}
		it := w.items[k]
		if it == nil || seen[k] || it.deferred {
			continue // written already, renamed aside, pending again, or deferred
		}
		seen[k] = true
		out = append(out, snapshot{k: k, it: it, snap: *it})
		it.attrs = heldAttrs{}
	}
	return out
}

// unbatch gives the items of a batch not written back the attribute
// changes their snapshots took.
func (w *writeBack) unbatch(ss []snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range ss {
		if w.items[ss[i].k] == ss[i].it {
			ss[i].it.attrs = ss[i].snap.attrs.over(ss[i].it.attrs)
		}
	}
}

// dirOf is where a snapshot's directory's record is: the directory node's
// place, or, if the kernel let the node go (not removed here), where it
// was when the item was made. ok false: removed here.
func dirOf(s *wbItem) (*meta.Entry, bool) {
	if d, errno := s.parent.dirEntry(); errno == 0 {
		return d, true
	}
	if s.parent.removed.Load() {
		return nil, false
	}
	d := s.dir
	return &d, true
}

// writers returns the node of a new file s while it has writers here.
func writers(s *wbItem) *node {
	if !s.made || s.e.Type != meta.TypeFile {
		return nil
	}
	n := s.parent.kid(s.e.Name)
	if n == nil || n.ino != s.e.Ino {
		return nil
	}
	n.wl.mu.Lock()
	defer n.wl.mu.Unlock()
	if n.wl.refs == 0 || n.wl.lock != nil || n.wl.taking != nil {
		return nil
	}
	n.wl.taking = make(chan struct{})
	return n
}

// adopt ends the taking of node n's lock by a batch (writers): gives n
// the writer lock l the batch took (nil: none), or lets l go if n no
// longer needs it. A second call is a no-op.
func (w *writeBack) adopt(n *node, l *meta.Lock) {
	n.wl.mu.Lock()
	ch := n.wl.taking
	n.wl.taking = nil
	take := l != nil && n.wl.refs > 0 && n.wl.lock == nil
	if take {
		n.wl.lock = l
	}
	n.wl.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if l != nil && !take {
		l.Unlock(context.Background())
	}
}

// applyOnce writes one batch: in one transaction, or, when one of its
// conditions fails, one item at a time.
func (w *writeBack) applyOnce(ctx context.Context) error {
	ss := w.batch()
	if len(ss) == 0 {
		w.mu.Lock()
		w.order = w.order[:0]
		w.mu.Unlock()
		return nil
	}
	defer func() {
		for i := range ss {
			if ss[i].node != nil {
				w.adopt(ss[i].node, nil) // those not given their lock
			}
		}
	}()
	puts := make([]meta.BatchPut, 0, len(ss))
	for i := range ss {
		dir, ok := dirOf(&ss[i].snap)
		if !ok {
			// Its directory was removed here after the item was made
			// (the removal waited for the batch before it): nothing to
			// write. The others go in the next batch.
			w.m.log.Error("a pending entry's directory was removed: the entry is dropped", "path", ss[i].snap.parent.path(ss[i].snap.e.Name))
			w.unbatch(ss)
			w.finish(ss[i].k, ss[i].it, ss[i].snap.seq, 0)
			return nil
		}
		ss[i].node = writers(&ss[i].snap)
		puts = append(puts, meta.BatchPut{Entry: ss[i].snap.e, Dir: *w.m.touching(dir), Lock: ss[i].node != nil})
	}
	epoch := w.m.ents.writing()
	res, err := w.m.vol.Meta.PutBatch(ctx, puts)
	if err == nil {
		for i := range ss {
			e := ss[i].snap.e
			e.Rev = res.Rev
			w.m.ents.keepWritten(epoch, &e, ss[i].snap.made)
		}
		for i := range puts {
			if d := puts[i].Dir; d.Touch && d.Rev == res.Rev {
				d.Touch = false
				w.m.ents.keepWritten(epoch, &d, false) // its times advanced
			}
		}
		w.m.ents.wrote(epoch, nil, false)
		for i := range ss {
			if ss[i].node != nil {
				w.adopt(ss[i].node, res.Locks[i])
			}
			w.finish(ss[i].k, ss[i].it, ss[i].snap.seq, res.Rev)
		}
		return nil
	}
	w.m.ents.wrote(epoch, nil, false)
	if !errors.Is(err, cairn.ErrConflict) && !errors.Is(err, cairn.ErrExist) && !errors.Is(err, cairn.ErrNotFound) {
		w.unbatch(ss)
		return err
	}
	// Learn which: one at a time.
	for i := range ss {
		if err := w.applyOne(ctx, &ss[i]); err != nil {
			w.unbatch(ss[i:])
			return err
		}
	}
	return nil
}

// applyOne writes one item alone, resolving what stood in its way.
func (w *writeBack) applyOne(ctx context.Context, s *snapshot) error {
	k, it, snap := s.k, s.it, s.snap
	lock := s.node != nil
	for attempt := 0; ; attempt++ {
		dir, ok := dirOf(&snap)
		if !ok {
			w.m.log.Error("a pending entry's directory was removed: the entry is dropped", "path", snap.parent.path(snap.e.Name))
			w.finish(k, it, snap.seq, 0)
			return nil
		}
		epoch := w.m.ents.writing()
		puts := []meta.BatchPut{{Entry: snap.e, Dir: *w.m.touching(dir), Lock: lock}}
		res, err := w.m.vol.Meta.PutBatch(ctx, puts)
		if err == nil {
			e := snap.e
			e.Rev = res.Rev
			if d := puts[0].Dir; d.Touch && d.Rev == res.Rev {
				d.Touch = false
				w.m.ents.keepWritten(epoch, &d, false) // its times advanced
			}
			w.m.ents.wrote(epoch, &e, snap.made)
			if s.node != nil {
				w.adopt(s.node, res.Locks[0])
			}
			w.finish(k, it, snap.seq, res.Rev)
			return nil
		}
		w.m.ents.wrote(epoch, nil, false)
		switch {
		case errors.Is(err, cairn.ErrExist) && res.Old != nil && res.Old.Ino == snap.e.Ino:
			// Written already: by a transaction whose answer was lost.
			w.m.ents.put(res.Old)
			w.finish(k, it, snap.seq, res.Old.Rev)
			return nil
		case errors.Is(err, cairn.ErrExist) && snap.made && attempt < 5:
			nk, ok := w.renameAside(k, it)
			if !ok {
				return nil
			}
			k = nk
			snap.e.Name = nk.name
		case errors.Is(err, meta.ErrLocked) && lock:
			lock = false // a writer elsewhere makes the file by its commit: ours comes at our commit
		case errors.Is(err, cairn.ErrConflict) && !snap.made && attempt < 20:
			// A newer record: the change is made again on it.
			cur, gerr := w.m.vol.Meta.Get(ctx, k.parent, k.name)
			if gerr != nil || cur.Ino != snap.e.Ino {
				w.m.log.Warn("an attribute change met an entry removed or replaced elsewhere: dropped", "path", snap.parent.path(k.name))
				w.finish(k, it, snap.seq, 0)
				return nil
			}
			n := *cur
			a := snap.attrs
			if a.setMtime && contentMoved(&snap.e, cur) {
				// New content committed since the record the change was
				// made on: a write after the utimes, whose mtime stands.
				a.setMtime = false
			}
			a.applyTo(&n)
			n.Ctime = max(snap.e.Ctime, cur.Ctime)
			snap.e = n
		case errors.Is(err, cairn.ErrNotFound) && w.pendingDir(snap.e.Parent):
			// Its directory is pending itself (behind it after a
			// conflict's rename): tried again after it.
			return err
		case errors.Is(err, cairn.ErrNotFound):
			w.m.log.Error("a pending entry could not be written: its directory (or itself) was removed on another device; dropped", "path", snap.parent.path(k.name))
			w.finish(k, it, snap.seq, 0)
			return nil
		case errors.Is(err, cairn.ErrExist), errors.Is(err, cairn.ErrConflict):
			w.m.log.Error("a pending entry could not be written after several tries; dropped", "path", snap.parent.path(k.name), "err", err)
			w.finish(k, it, snap.seq, 0)
			return nil
		default:
			return err
		}
	}
}

// contentMoved reports whether cur, a newer record of file e, holds
// content committed since e's (a new version, or the current one written
// again: its commit time).
func contentMoved(e, cur *meta.Entry) bool {
	a, b := e.Current(), cur.Current()
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return a.N != b.N || a.Committed != b.Committed
}

// pendingSubdirs returns the names of the directories made in directory
// ino that are pending, and whether ino's creation is pending itself (its
// every entry is a pending one).
func (w *writeBack) pendingSubdirs(ino uint64) (names []string, fresh bool) {
	if w == nil {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for name := range w.dirItems[ino] {
		names = append(names, name)
	}
	return names, w.fresh[ino]
}

// putItemLocked records it as the pending item of k.
func (w *writeBack) putItemLocked(k ekey, it *wbItem) {
	w.delItemLocked(k)
	w.items[k] = it
	if it.e.IsDir() {
		d := w.dirItems[k.parent]
		if d == nil {
			d = map[string]struct{}{}
			w.dirItems[k.parent] = d
		}
		d[k.name] = struct{}{}
	}
}

// delItemLocked drops k's pending item.
func (w *writeBack) delItemLocked(k ekey) {
	if _, ok := w.items[k]; !ok {
		return
	}
	delete(w.items, k)
	if d := w.dirItems[k.parent]; d != nil {
		if delete(d, k.name); len(d) == 0 {
			delete(w.dirItems, k.parent)
		}
	}
}

// pendingDir reports whether directory ino's creation is pending.
func (w *writeBack) pendingDir(ino uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fresh[ino]
}

// renameAside gives a pending new entry whose name was taken on another
// device meanwhile a name of its own, here too.
func (w *writeBack) renameAside(k ekey, it *wbItem) (ekey, bool) {
	newName := fmt.Sprintf("%s.conflict-%08x", k.name, uint32(it.e.Ino))
	nk := ekey{k.parent, newName}
	w.mu.Lock()
	if w.items[nk] != nil || w.items[k] != it {
		w.mu.Unlock()
		w.m.log.Error("a pending entry's name was taken on another device and no other name is free: dropped", "path", it.parent.path(k.name))
		w.finish(k, it, it.seq, 0)
		return k, false
	}
	w.delItemLocked(k)
	it.e.Name = newName
	w.putItemLocked(nk, it)
	for i, ok := range w.order {
		if ok == k {
			w.order[i] = nk // in place: before what it holds
		}
	}
	if it.e.IsDir() {
		for _, c := range w.items {
			if c.e.Parent == it.e.Ino {
				c.dir.Name = newName
			}
		}
	}
	parent := it.parent
	w.mu.Unlock()
	w.m.log.Warn("a name made here was made on another device at the same time: this device's entry is renamed", "path", parent.path(k.name), "now", newName)
	w.m.ents.forget(k.parent, k.name)
	w.m.queue.renamed(it.e.Ino, k.parent, newName)
	if ch := parent.GetChild(k.name); ch != nil && ch.StableAttr().Ino == it.e.Ino {
		parent.MvChild(k.name, parent.EmbeddedInode(), newName, true)
	}
	// Not from here: the kernel may hold the directory locked while it
	// waits for a request that waits for this apply.
	go func() {
		parent.NotifyEntry(k.name)
		parent.NotifyEntry(newName)
	}()
	return nk, true
}

// finish ends item it (pending under k, as snapshot seq): written at rev,
// or dropped (rev 0). A change made to it since the snapshot stays
// pending, now as a change of the record written.
func (w *writeBack) finish(k ekey, it *wbItem, seq uint64, rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.items[k] == it {
		if it.e.IsDir() {
			delete(w.fresh, it.e.Ino) // visible now, or never
		}
		if rev != 0 && it.seq > seq {
			// A commit's record it was rebased on may be newer than the
			// one this write made.
			it.made, it.e.Rev, it.first, it.deferred = false, max(it.e.Rev, rev), seq+1, false
			w.order = append(w.order, k)
			// Pending now as any change (a deferred one was not: the
			// applier, asleep, must hear of it).
			w.pendingSinceLocked()
			w.poke()
		} else {
			w.delItemLocked(k)
		}
	}
	if !w.readyLocked() {
		w.since = time.Time{}
	}
	if len(w.items) == 0 {
		w.order = w.order[:0]
	} else if len(w.order) > 2*len(w.items)+64 {
		seen := map[ekey]bool{}
		kept := w.order[:0]
		for _, ok := range w.order {
			if w.items[ok] != nil && !seen[ok] {
				seen[ok] = true
				kept = append(kept, ok)
			}
		}
		w.order = kept
	}
}

// readyLocked reports whether an item not deferred is pending.
func (w *writeBack) readyLocked() bool {
	for _, it := range w.items {
		if !it.deferred {
			return true
		}
	}
	return false
}

// undeferLocked makes deferred item it (under k) pending as any other:
// written by the next batch.
func (w *writeBack) undeferLocked(k ekey, it *wbItem) {
	it.deferred = false
	w.seq++
	it.first, it.seq = w.seq, w.seq
	w.order = append(w.order, k)
	w.pendingSinceLocked()
	w.poke()
}

// deferredAt returns the deferred item of name in directory parent, if
// it is inode ino's (0: any).
func (w *writeBack) deferredAt(k ekey, ino uint64) *wbItem {
	if w == nil {
		return nil
	}
	it := w.items[k]
	if it == nil || !it.deferred || (ino != 0 && it.e.Ino != ino) {
		return nil
	}
	return it
}

// undefer makes the deferred creation of n (name in directory parent),
// if any, pending as any other: what needs the entry in the metadata
// calls it before flush.
func (w *writeBack) undefer(parent uint64, name string, ino uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := ekey{parent, name}
	if it := w.deferredAt(k, ino); it != nil {
		w.undeferLocked(k, it)
	}
}

// undeferNode is undefer for node n where this mount has it.
func (w *writeBack) undeferNode(n *node) {
	if w == nil {
		return
	}
	if name, p, ok := n.place(); ok && p != nil {
		w.undefer(p.ino, name, n.ino)
	}
}

// claim returns, for a commit of inode ino as name in directory parent,
// its deferred creation (the item and its snapshot), if there is one:
// the commit creates the file with the item's inode and attributes, then
// ends the item (finish, with the snapshot's seq).
func (w *writeBack) claim(parent uint64, name string, ino uint64) (*wbItem, wbItem, bool) {
	if w == nil {
		return nil, wbItem{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	it := w.deferredAt(ekey{parent, name}, ino)
	if it == nil {
		return nil, wbItem{}, false
	}
	return it, *it, true
}

// dropDeferred forgets the deferred creation of name in directory parent
// (removed, or replaced by a rename, on this mount before it was
// written): nothing of it reaches the metadata. It reports whether there
// was one.
func (w *writeBack) dropDeferred(parent uint64, name string) (ino uint64, ok bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k := ekey{parent, name}
	it := w.deferredAt(k, 0)
	if it == nil {
		return 0, false
	}
	w.delItemLocked(k)
	if !w.readyLocked() {
		w.since = time.Time{}
	}
	w.cond.Broadcast()
	return it.e.Ino, true
}

// isDeferred reports whether name in directory parent is a deferred
// creation.
func (w *writeBack) isDeferred(parent uint64, name string) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deferredAt(ekey{parent, name}, 0) != nil
}

// moveDeferred renames the deferred creation of name in directory from
// to newName in directory to (dir: its record), in memory, if the new
// name is free as far as this mount knows (pending itself, or known
// absent; absent: the caller found it absent in the metadata just now).
// It returns the file's inode number, and whether it did.
func (w *writeBack) moveDeferred(from *node, name string, to *node, dir *meta.Entry, newName string, absent bool) (uint64, bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	k, nk := ekey{from.ino, name}, ekey{to.ino, newName}
	it := w.deferredAt(k, 0)
	if it == nil || w.items[nk] != nil {
		return 0, false
	}
	if !w.fresh[to.ino] {
		if old, known := w.m.ents.known(to.ino, newName); (!known && !absent) || old != nil {
			return 0, false
		}
	}
	w.delItemLocked(k)
	it.e.Name, it.e.Parent = newName, to.ino
	it.e.Ctime = time.Now().UnixNano()
	it.parent, it.dir = to, *dir
	w.putItemLocked(nk, it)
	w.order = append(w.order, nk)
	return it.e.Ino, true
}

// deferredIn returns the deferred creations in directory dir (a
// listing read from the metadata lacks them).
func (w *writeBack) deferredIn(dir uint64) []meta.Entry {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []meta.Entry
	for k, it := range w.items {
		if it.deferred && k.parent == dir {
			out = append(out, *copyEntry(&it.e))
		}
	}
	return out
}

// finishClaim ends deferred item it (under k, claimed as snapshot seq)
// once its commit made the file as e (nil: not made); mt is the mtime a
// utimes set after the commit read the one it wrote (nil: none).
// Attribute changes made since the snapshot stay pending, as changes of
// e (rebasedLocked). It is called before the commit's record is shown
// for the file (node.wroteEntry).
func (w *writeBack) finishClaim(k ekey, it *wbItem, seq uint64, e *meta.Entry, mt *time.Time) {
	var rev int64
	if e != nil {
		rev = e.Rev
		w.mu.Lock()
		if w.items[k] == it && it.seq > seq {
			it.e = it.rebasedLocked(e, mt)
		}
		w.mu.Unlock()
	}
	w.finish(k, it, seq, rev)
}

// rebase makes the pending attribute changes of file n, made on a record
// older than e, changes of e: e was just written by a commit of n on this
// mount (which keeps the record's mode and owner, and sets the mtime of
// its close), having read the mtime it wrote at since. The entry the
// mount shows is then e with those changes, never e alone: a chmod,
// chown or utimes acknowledged before the commit landed does not read
// back undone (node.fresherLocked prefers the newer record). A utimes
// made after since that is written already (before e, which undid it) is
// made pending again. It is called after the entry cache has e (a change
// made meanwhile is made on e) and before the node does
// (node.wroteEntry).
func (w *writeBack) rebase(n *node, e *meta.Entry, since time.Time) {
	if w == nil {
		return
	}
	mt := n.mtimeSince(since)
	name, p, ok := n.place()
	if !ok || p == nil || name != e.Name || p.ino != e.Parent {
		return
	}
	dir, errno := p.dirEntry()
	if errno != 0 {
		return
	}
	k := ekey{e.Parent, e.Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	if it := w.items[k]; it != nil {
		if it.made || it.e.Ino != e.Ino || it.e.Rev >= e.Rev {
			return
		}
		// A batch writing it meanwhile meets e and makes its change
		// again on it (applyOne), or wrote it before e.
		it.e = it.rebasedLocked(e, mt)
		return
	}
	if mt == nil || e.Mtime == mt.UnixNano() || w.stopping {
		return
	}
	a := heldAttrs{setMtime: true, mtime: *mt}
	ne := *copyEntry(e)
	a.applyTo(&ne)
	w.seq++
	w.putItemLocked(k, &wbItem{e: ne, parent: p, dir: *dir, attrs: a, set: a, first: w.seq, seq: w.seq})
	w.pendingSinceLocked()
	w.order = append(w.order, k)
	w.poke()
}

// rebasedLocked is it's entry made again on e (a commit's record): e
// with the mode and owner it set, mt as its mtime (nil: e's; an mtime it
// set before the commit read its own is in e, or older than the writes
// e carries), and the later ctime. w.mu is held.
func (it *wbItem) rebasedLocked(e *meta.Entry, mt *time.Time) meta.Entry {
	n := *copyEntry(e)
	a := it.set
	a.setMtime = mt != nil
	if mt != nil {
		a.mtime = *mt
	}
	a.applyTo(&n)
	n.Ctime = max(n.Ctime, it.e.Ctime)
	return n
}

// undeferIn undefers the deferred creations in directory dir (an fsync
// of the directory).
func (w *writeBack) undeferIn(dir uint64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, it := range w.items {
		if it.deferred && k.parent == dir {
			w.undeferLocked(k, it)
		}
	}
}
