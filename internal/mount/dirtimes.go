package mount

import (
	"sync"
	"time"

	"cairn.dev/cairn/internal/meta"
)

// maxDirTimes bounds dirTimes; past it, it is emptied.
const maxDirTimes = 100_000

// dirTimes are the times at which this mount last added or removed an
// entry of each directory (by inode; unix ns): a create, mkdir, symlink,
// mknod, unlink, rmdir, or rename into or out of it. A directory's mtime
// and ctime read as no earlier (fill), as on a local disk, where they
// advance with every change of the directory's entries.
//
// The change also advances the times in the directory's record, in its
// own transaction (touching, meta.Entry.Touch), but only if the record is
// still the one the entry cache holds: a compare-and-swap that the change
// itself depended on would make concurrent creates in one directory (tar,
// make -j, another device) conflict with each other and retry. So the
// record's times can lag (the cache had not heard of the record's last
// change yet, or the directory was not in it), and lag behind what this
// mount shows; another device, or this one after a remount, sees the
// record's. A write-back mount advances the record's times when it
// writes the pending changes, to when it made them (what it showed),
// except for a new file whose creation waited for its first commit (made
// by the commit, which does not touch the directory).
type dirTimes struct {
	mu sync.Mutex
	t  map[uint64]int64
}

// touch records that directory ino's entries changed now.
func (d *dirTimes) touch(ino uint64) {
	now := time.Now().UnixNano()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.t == nil || len(d.t) >= maxDirTimes {
		d.t = map[uint64]int64{}
	}
	d.t[ino] = max(d.t[ino], now)
}

// forget drops ino's time: its mtime was set (utimes), which the record
// holds.
func (d *dirTimes) forget(ino uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.t, ino)
}

// get returns when ino's entries last changed on this mount (0: not
// since it was mounted, or forgotten).
func (d *dirTimes) get(ino uint64) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t[ino]
}

// touching returns directory d (as dirEntry gives it: its inode and
// place) with its record as the entry cache holds it, marked to have its
// times advanced by the change it is given to (meta.Entry.Touch); d
// itself when the cache does not hold it (nothing asked of etcd for it).
func (m *Mount) touching(d *meta.Entry) *meta.Entry {
	e, _ := m.ents.known(d.Parent, d.Name)
	if e == nil || e.Ino != d.Ino || !e.IsDir() {
		return d
	}
	e.Touch = true
	return e
}

// keepTouched keeps in the entry cache the record of directory d (from
// touching, its Rev then rev) if the change it was given to wrote it: the
// next change in d finds its record current.
func (m *Mount) keepTouched(d *meta.Entry, rev int64) {
	if !d.Touch || d.Rev == rev {
		return
	}
	e := *d
	e.Touch = false
	m.ents.put(&e)
}
