package mount

import (
	"sync"
	"time"
)

// maxDirTimes bounds dirTimes; past it, it is emptied.
const maxDirTimes = 100_000

// dirTimes are the times at which this mount last added or removed an
// entry of each directory (by inode; unix ns): a create, mkdir, symlink,
// mknod, unlink, rmdir, or rename into or out of it. A directory's mtime
// and ctime read as no earlier (fill), as on a local disk, where they
// advance with every change of the directory's entries.
//
// They are kept in memory, on this mount only, not written into the
// directory's record: that would make every namespace change a
// compare-and-swap on its parent's record too, so that concurrent
// creates in one directory (tar, make -j, another device) would conflict
// with each other and retry, and a new key for them (written blindly in
// the change's transaction) would change the metadata format. So another
// device, or this one after a remount, sees the times the records hold.
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
