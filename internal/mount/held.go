package mount

import (
	"context"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
)

// Held copies (passthrough only). The kernel moves a shared mapping of a
// passthrough file onto the backing file: the mount's release of the
// last writer comes at its close(2), while a MAP_SHARED writable mapping
// can still store into the copy until munmap, and nothing tells the
// mount when it goes. What tells it is a file lease on the copy
// (fcntl F_SETLEASE, fs/locks.c check_conflicting_open): the kernel
// grants a read lease only while no open file description of the inode
// is open for writing. A writable mapping keeps the file it was made
// from (here the kernel's backing file of that open, opened read-write)
// alive, and so its write count, until munmap. The descriptors the mount
// itself keeps of a passthrough copy are read-only from then on (content.
// reopen), and so is the one the kernel has as backing file
// (PassthroughFd): readers do not count.
//
//   - At the release of the last handle that could write a copy, the
//     mount asks for a read lease on its own descriptor (asked again for
//     up to ptAloneWait: the kernel lets the released open's file go a
//     moment after the release). Granted: no writer and no writable
//     mapping is left, and the release commits as without passthrough.
//     Refused: a mapping may still write, and the copy is held: the
//     release still commits what it holds, but the copy is not a clean
//     copy of that version (out of the cache's index, never evicted), and
//     the node keeps it: a new open here shares it as an open for writing
//     would (usable), and it is not refreshed in place for another
//     device's version (share).
//   - A watcher asks again, from a descriptor of its own, while nobody has
//     the copy open through the mount: at once when go-fuse lets a backing
//     registration go, then every 10 ms doubling up to 2 s. Granted: if
//     the copy changed since its commit (its mtime, or the checksum of
//     what the commit read), it is committed again as a new version,
//     under the writer lock like any writer's (a commit that fails, or a
//     file removed meanwhile, keeps it in unsaved/, logged); then it is a
//     clean copy of its version.
//   - An unmount happens once the kernel is done with the mount, mappings
//     included: it settles held copies as the watcher does, for up to
//     heldWaitEnd; any still held are kept in unsaved/ and logged.

const (
	ptAloneWait = 20 * time.Millisecond
	heldFirst   = 10 * time.Millisecond
	heldMax     = 2 * time.Second
	heldWaitEnd = 5 * time.Second
)

// leaseFree reports whether the kernel grants a lease of type typ
// (unix.F_RDLCK or unix.F_WRLCK) on f's inode to f, and lets it go at
// once: F_RDLCK, no open file description of the inode is open for
// writing; F_WRLCK, f is its only one.
func leaseFree(f *os.File, typ int) (bool, error) {
	fd := f.Fd()
	if _, err := unix.FcntlInt(fd, unix.F_SETLEASE, typ); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return false, nil
		}
		return false, err
	}
	if _, err := unix.FcntlInt(fd, unix.F_SETLEASE, unix.F_UNLCK); err != nil {
		return true, err
	}
	return true, nil
}

// ptAlone, at the last writer's release of c (a passthrough copy), says
// whether no open file description of the copy is open for writing any
// more (no writable mapping is left): the mount's own descriptor is
// opened read-only first (as is the one the kernel has: PassthroughFd).
func (m *Mount) ptAlone(n *node, c *content) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	f, err := c.reopen(os.O_RDONLY, true)
	if err != nil || f == nil {
		m.log.Error("passthrough: reopening a copy read-only failed; it is held as if mapped", "path", n.path(""), "err", err)
		return false
	}
	// The kernel lets the released open's own file go a moment after
	// the release (a delayed fput, ~1 ms here): asked again for a while.
	free, err := leaseFree(f, unix.F_RDLCK)
	for t0, wait := time.Now(), 100*time.Microsecond; !free && err == nil && time.Since(t0) < ptAloneWait; wait *= 2 {
		time.Sleep(wait)
		free, err = leaseFree(f, unix.F_RDLCK)
	}
	if err != nil {
		m.log.Error("passthrough: asking for a lease on a copy failed; it is held as if mapped", "path", n.path(""), "err", err)
	}
	return free
}

// hold marks c, a copy a writable mapping may still store into, as held.
func (m *Mount) hold(n *node, c *content) {
	c.wmu.Lock()
	err := m.cache.detach(c) // out of the clean index: it may change
	c.mu.Lock()
	was := c.held
	c.held = true
	c.holdGen++
	c.mu.Unlock()
	c.wmu.Unlock()
	if err != nil {
		m.log.Error("passthrough: could not take a held copy out of the cache's index", "path", n.path(""), "err", err)
	}
	m.heldMu.Lock()
	m.held[c] = n
	m.heldMu.Unlock()
	m.kickHeld() // the watcher waits for no timer while nothing is held
	if !was {
		m.log.Info("passthrough: the copy of a closed file may still be written through a mapping: held until it goes", "path", n.path(""))
	}
}

// unhold ends c's hold gen (nothing can write it unseen any more): a
// copy of its version it holds no other writes than makes a clean copy of
// it. A hold set again since gen was read (a writer opened, mapped and
// closed meanwhile) stays. The caller has c referenced.
func (m *Mount) unhold(n *node, c *content, gen uint64) {
	m.heldMu.Lock()
	c.mu.Lock()
	if c.holdGen != gen {
		c.mu.Unlock()
		m.heldMu.Unlock()
		return
	}
	delete(m.held, c)
	was := c.held
	c.held = false
	c.mu.Unlock()
	m.heldMu.Unlock()
	if was {
		m.adoptClean(n, c)
	}
}

// adoptClean makes c the cache's clean copy of its version if it holds
// nothing else and nothing can write it unseen: no writer (a new one
// takes it out again under wmu, held here: ptWriter), not held.
func (m *Mount) adoptClean(n *node, c *content) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	clean := !c.dirty && !c.keep && !c.gone && !c.held && c.version && c.writers == 0 && c.pending == 0
	k := cacheKey{c.ino, c.manifest}
	c.mu.Unlock()
	if clean && k.ino == n.ino {
		m.cache.adopt(c, k)
	}
}

// kickHeld makes the watcher look at held copies now (a backing file was
// let go).
func (m *Mount) kickHeld() {
	m.heldMu.Lock()
	some := len(m.held) > 0
	m.heldMu.Unlock()
	if !some {
		return // every release of a backing file kicks: most hold nothing
	}
	select {
	case m.heldKick <- struct{}{}:
	default:
	}
}

// watchHeld settles held copies whose mappings went, until stop.
func (m *Mount) watchHeld(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	wait := heldFirst
	for {
		m.heldMu.Lock()
		some := len(m.held) > 0
		m.heldMu.Unlock()
		var tick <-chan time.Time
		if some {
			tick = time.After(wait)
		}
		select {
		case <-stop:
			return
		case <-m.heldKick:
			wait = heldFirst
		case <-tick:
			wait = min(2*wait, heldMax)
		}
		m.settleHeld(context.Background())
	}
}

// settleHeld settles every held copy nobody has open through the mount
// whose mappings are gone; it returns how many remain held.
func (m *Mount) settleHeld(ctx context.Context) int {
	m.heldMu.Lock()
	type pair struct {
		c *content
		n *node
	}
	var all []pair
	for c, n := range m.held {
		all = append(all, pair{c, n})
	}
	m.heldMu.Unlock()
	left := 0
	for _, p := range all {
		m.cache.mu.Lock()
		open, path := p.c.refs > 0, p.c.path
		m.cache.mu.Unlock()
		p.c.mu.Lock()
		gen := p.c.holdGen // the hold the lease below speaks for
		p.c.mu.Unlock()
		if open || path == "" {
			// Open here again: its last writer's release asks again
			// (or this watcher, once it is closed).
			left++
			continue
		}
		free, err := pathFree(path)
		if err != nil {
			m.log.Warn("passthrough: asking for a lease on a held copy failed", "path", p.n.path(""), "err", err)
		}
		if !free {
			left++
			continue
		}
		m.settle(ctx, p.n, p.c, gen)
	}
	return left
}

// pathFree reports whether no open file description of the file at path
// is open for writing.
func pathFree(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	return leaseFree(f, unix.F_RDLCK)
}

// settle ends the hold gen of c, whose mappings are gone: it commits it
// again if it changed since its last commit.
func (m *Mount) settle(ctx context.Context, n *node, c *content, gen uint64) {
	if err := m.cache.ref(c); err != nil {
		m.heldMu.Lock()
		delete(m.held, c)
		m.heldMu.Unlock()
		return
	}
	defer n.release(c)
	if err := m.settlePT(c); err != nil {
		m.log.Error("passthrough: checking a held copy failed", "path", n.path(""), "err", err)
		c.mu.Lock()
		c.dirty = true
		c.mu.Unlock()
	}
	c.mu.Lock()
	if !c.sumOK {
		c.dirty = true // no checksum to tell: committed again
	}
	dirty := c.dirty
	c.mu.Unlock()
	if dirty {
		m.log.Info("passthrough: a mapping wrote to a file after its last close: committed again", "path", n.path(""))
		if err := n.recommit(ctx, c); err != nil {
			m.log.Error("passthrough: committing what a mapping wrote after the last close failed; kept in the cache's unsaved/", "path", n.path(""), "err", err)
			c.mu.Lock()
			c.keep = true
			c.mu.Unlock()
		}
	}
	m.unhold(n, c, gen)
}

// recommit commits c as a writer of n would, under the writer lock.
func (n *node) recommit(ctx context.Context, c *content) error {
	name, p, ok := n.place()
	if !ok {
		// Removed, or forgotten by the kernel once the mapping went (the
		// node no longer knows its place): kept, not dropped.
		return cairn.E("commit", cairn.NotFound, n.path(""), errors.New("the file's place is no longer known (removed?)"))
	}
	if err := n.lockForWrite(ctx, p, name); err != nil {
		return err
	}
	defer n.unlockWrite(ctx)
	return n.save(ctx, c)
}

// stopHeldWatch stops the watcher of held copies, if it runs, and waits
// for it.
func (m *Mount) stopHeldWatch() {
	if m.heldStop == nil {
		return
	}
	m.heldStopOnce.Do(func() { close(m.heldStop) })
	<-m.heldDone
}

// endHeld, at unmount (the kernel is done with the mount, mappings
// included), settles the held copies, for up to heldWaitEnd; any still
// held are kept in unsaved/.
func (m *Mount) endHeld() {
	if m.heldStop == nil {
		return
	}
	m.stopHeldWatch()
	ctx := context.Background()
	for deadline := time.Now().Add(heldWaitEnd); m.settleHeld(ctx) > 0 && time.Now().Before(deadline); {
		time.Sleep(heldFirst)
	}
	m.heldMu.Lock()
	left := m.held
	m.held = map[*content]*node{}
	m.heldMu.Unlock()
	for c, n := range left {
		c.mu.Lock()
		c.held, c.keep = false, true
		c.mu.Unlock()
		m.log.Error("passthrough: a copy still written through a mapping at unmount was not committed; kept", "path", n.path(""))
		m.cache.settleClosed(c)
	}
}
