package mount

import (
	"context"
	"errors"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// The writer lock of a file (DESIGN decision 4, SCFS §2.5.1 "locking
// service"): an open for writing takes the file's lock in the metadata
// service (meta.Vol.Lock, a key bound to this process's lease), and this
// mount holds it until the last writer has closed and the commit is done
// (in non-blocking mode, until the queued commit is). Processes on this
// device share it: the mount counts its users. A second device opening the
// file for writing meanwhile waits Options.LockWait for it, then gets
// EBUSY, and the mount logs the file's name. If this process dies, the
// lock goes with its lease (meta.Options.LockTTL, 15 s by default).
//
// A commit releases the lock in its own transaction (meta.Commit.Lock); if
// writers remain, the mount takes it again at once.

// DefaultLockWait is how long an open for writing waits for a writer
// lock held elsewhere before it fails with EBUSY.
const DefaultLockWait = time.Second

type writerLock struct {
	mu   sync.Mutex
	refs int        // write handles and queued commits of the file
	lock *meta.Lock // nil: not held now (used up by a commit, or lost)
	// taking is set while a write-back batch that publishes the new file
	// takes its lock (writeback.go); closed once it is done. An open for
	// writing meanwhile waits for it instead of asking for the lock
	// itself (the batch holds it, in this process).
	taking chan struct{}
}

// takeLock waits up to LockWait for the writer lock on name in dir.
func (n *node) takeLock(ctx context.Context, dir *node, name string) (*meta.Lock, error) {
	ctx, cancel := context.WithTimeout(ctx, n.m.lockWait)
	defer cancel()
	l, err := n.m.vol.Meta.Lock(ctx, dir.ino, name)
	if err != nil && errors.Is(err, cairn.ErrConflict) {
		n.m.log.Warn("file is open for writing on another device: refused (EBUSY)", "path", dir.path(name))
		return nil, cairn.E("lock", cairn.Conflict, dir.path(name), errors.New("the file is open for writing on another device"))
	}
	return l, err
}

// lockForWrite takes a reference on the writer lock of n (name in dir),
// taking the lock itself if this mount does not hold it.
func (n *node) lockForWrite(ctx context.Context, dir *node, name string) error {
	if n.m.queue.queuedBefore(n.ino) {
		n.m.log.Warn("file has a commit queued before this mount started, not done yet: open for writing refused (EBUSY)", "path", dir.path(name))
		return cairn.E("lock", cairn.Conflict, dir.path(name), errors.New("a commit of this file queued before the mount started is not done yet"))
	}
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for wl.lock == nil && wl.taking != nil {
		ch := wl.taking
		wl.mu.Unlock()
		<-ch
		wl.mu.Lock()
	}
	if wl.lock == nil || wl.lock.Lost() {
		l, err := n.takeLock(ctx, dir, name)
		if err != nil {
			return err
		}
		wl.lock = l
	}
	wl.refs++
	if wl.refs == 1 {
		n.m.lockedMu.Lock()
		n.m.locked[n] = struct{}{}
		n.m.lockedMu.Unlock()
	}
	return nil
}

// adoptLock takes a reference on the writer lock of n, a file just
// created with its lock (meta.Vol.CreateLocked).
func (n *node) adoptLock(ctx context.Context, l *meta.Lock) {
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.lock == nil || wl.lock.Lost() {
		wl.lock = l
	} else if err := l.Unlock(ctx); err != nil {
		// Not expected: a new node holds no lock yet.
		n.m.log.Warn("could not release a second writer lock (it lapses with the lease)", "path", n.path(""), "err", err)
	}
	wl.refs++
	if wl.refs == 1 {
		n.m.lockedMu.Lock()
		n.m.locked[n] = struct{}{}
		n.m.lockedMu.Unlock()
	}
}

// holdLock adds a reference to a lock the mount holds (a queued commit).
func (n *node) holdLock() {
	n.wl.mu.Lock()
	n.wl.refs++
	n.wl.mu.Unlock()
}

// unlockWrite drops a reference; the last one releases the lock.
func (n *node) unlockWrite(ctx context.Context) {
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.refs--
	if wl.refs > 0 {
		return
	}
	n.m.lockedMu.Lock()
	delete(n.m.locked, n)
	n.m.lockedMu.Unlock()
	if wl.lock == nil {
		return
	}
	if err := wl.lock.Unlock(ctx); err != nil {
		n.m.log.Warn("could not release a writer lock (it lapses with the lease)", "path", n.path(""), "err", err)
	}
	wl.lock = nil
}

// unlockAll releases every writer lock still held (Wait, once the kernel
// is gone and the queue has stopped).
func (m *Mount) unlockAll(ctx context.Context) {
	m.lockedMu.Lock()
	var ns []*node
	for n := range m.locked {
		ns = append(ns, n)
	}
	m.lockedMu.Unlock()
	for _, n := range ns {
		n.wl.mu.Lock()
		l := n.wl.lock
		n.wl.lock, n.wl.refs = nil, 0
		n.wl.mu.Unlock()
		if l != nil {
			l.Unlock(ctx)
		}
	}
}

// commitLock returns the lock a commit of n (name in dir) goes under:
// the one held, or, if a commit used it up or its lease was lost, a new
// one.
func (n *node) commitLock(ctx context.Context, dir *node, name string) (*meta.Lock, error) {
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.lock == nil || wl.lock.Lost() {
		l, err := n.takeLock(ctx, dir, name)
		if err != nil {
			return nil, err
		}
		wl.lock = l
	}
	return wl.lock, nil
}

// committed records that a commit released the lock; if other writers or
// queued commits remain (beyond the caller's own reference), it is taken
// again.
func (n *node) committed(ctx context.Context) {
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	wl.lock = nil
	if wl.refs <= 1 {
		return
	}
	name, p, ok := n.place()
	if !ok {
		return
	}
	l, err := n.takeLock(ctx, p, name)
	if err != nil {
		n.m.log.Warn("could not take the writer lock again after a commit; the next commit tries again", "path", n.path(""), "err", err)
		return
	}
	wl.lock = l
}

// commitFailed forgets a lock whose lease was lost (the next commit takes
// a new one).
func (n *node) commitFailed() {
	wl := &n.wl
	wl.mu.Lock()
	if wl.lock != nil && wl.lock.Lost() {
		wl.lock = nil
	}
	wl.mu.Unlock()
}

// dropLock releases n's writer lock, if this mount holds it, once n was
// renamed, renamed over or removed. Locks are keyed by name (meta.Vol.Lock
// takes parent and name): left at the old name, the lock would refuse a
// new file made there (EBUSY after LockWait: a log renamed while open for
// writing, then made again). A file no longer named never commits (its
// writes are dropped, as on a local disk); a renamed one takes its new
// name's lock at its next commit (commitLock). Not taken here: the rename
// would wait up to LockWait while a commit of the file that had the name
// holds it.
func (n *node) dropLock(ctx context.Context) {
	wl := &n.wl
	wl.mu.Lock()
	defer wl.mu.Unlock()
	if wl.lock == nil {
		return
	}
	if err := wl.lock.Unlock(ctx); err != nil {
		n.m.log.Warn("could not release the writer lock of a renamed or removed file (it lapses with the lease)", "path", n.path(""), "err", err)
	}
	wl.lock = nil
}
