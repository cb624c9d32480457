package mount

import (
	"container/list"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
)

// The whole-file cache of one volume on this device (SCFS §2.5.1: "the
// local disk is a large and long-term cache"), kept across unmounts in
// <CacheDir>/<volume ID>/ (doc/format.md, "Mount cache, version 1"):
//
//	lock            flock(2)ed by the mount that uses the directory
//	clean/<ino>-<manifest>
//	                a copy of version <manifest> of inode <ino>, exactly
//	work/<ino>-<random>
//	                a copy being written: writes not yet committed, the
//	                data of a queued commit (non-blocking mode), or a
//	                copy a writable mapping may still store into (held.go)
//	tmp/            fetches in progress (emptied at start)
//	queue/          the non-blocking mode's commits not yet done (queue.go)
//	unsaved/        copies whose writes could not be committed, kept for
//	                a person to look at; never removed by cairn
//
// A clean copy is named by the version's manifest ID, which the metadata
// names as current: a copy of another version is never served for this
// one, whatever happened while the mount was down. Its size is checked
// against the version's at open (a copy cut short by a power loss is
// dropped and fetched again). Clean copies are evicted least recently used
// first when they exceed the cache's size bound; copies open, being
// written, or waiting in the queue are never evicted (they come on top of
// the bound until committed and closed).

// DefaultCacheSize returns the default bound of the whole-file cache in
// dir: a tenth of the free space of its disk, at most 4 GiB and at least
// 64 MiB.
func DefaultCacheSize(dir string) int64 {
	const lo, hi = 64 << 20, 4 << 30
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return lo
	}
	return min(hi, max(lo, int64(st.Bavail)*int64(st.Bsize)/10))
}

type cacheKey struct {
	ino      uint64
	manifest cairn.ID
}

func (k cacheKey) name() string { return fmt.Sprintf("%016x-%s", k.ino, k.manifest) }

// diskCache indexes the clean copies of one volume and holds the lock on
// its directory.
type diskCache struct {
	dir   string
	limit int64
	log   *slog.Logger
	lockf *os.File
	// spares are empty files made ahead for new work copies (spares.go).
	spares *spares

	mu     sync.Mutex
	clean  map[cacheKey]*content // every clean copy, open or not
	open   map[*content]struct{} // every content with handles (clean or not)
	lru    *list.List            // clean copies nobody has open, most recently used first
	used   int64                 // bytes of the clean copies
	closed bool

	evictions atomic.Int64
}

// openCache opens (making it if needed) the cache directory dir of one
// volume, locks it, and indexes its clean copies. A directory in use by
// another mount on this device gives Kind Conflict.
func openCache(dir string, limit int64, log *slog.Logger) (*diskCache, error) {
	const op = "open mount cache"
	for _, sub := range []string{"clean", "work", "tmp", "queue", "unsaved"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, cairn.E(op, cairn.IO, dir, err)
		}
	}
	lockf, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	if err = unix.Flock(int(lockf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := io.ReadAll(lockf)
		lockf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, cairn.E(op, cairn.Conflict, dir, fmt.Errorf("this volume is already mounted on this device (%s)", strings.TrimSpace(string(b))))
		}
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	lockf.Truncate(0)
	fmt.Fprintf(lockf, "pid %d\n", os.Getpid())
	c := &diskCache{dir: dir, limit: limit, log: log, lockf: lockf, spares: newSpares(filepath.Join(dir, "work")),
		clean: map[cacheKey]*content{}, open: map[*content]struct{}{}, lru: list.New()}
	if tmp, rerr := os.ReadDir(filepath.Join(dir, "tmp")); rerr == nil {
		for _, t := range tmp {
			os.Remove(filepath.Join(dir, "tmp", t.Name()))
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "clean"))
	if err != nil {
		c.close()
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	type found struct {
		key   cacheKey
		size  int64
		mtime time.Time
	}
	var all []found
	for _, de := range ents {
		key, ok := parseCacheName(de.Name())
		fi, err := de.Info()
		if !ok || err != nil || !fi.Mode().IsRegular() {
			os.Remove(filepath.Join(dir, "clean", de.Name()))
			continue
		}
		all = append(all, found{key, fi.Size(), fi.ModTime()})
	}
	// Most recently used first: the order the LRU list keeps.
	sort.Slice(all, func(i, j int) bool { return all[i].mtime.After(all[j].mtime) })
	for _, f := range all {
		cc := &content{ino: f.key.ino, size: f.size, version: true, manifest: f.key.manifest, cached: true, key: f.key}
		cc.path = c.cleanPath(f.key)
		c.clean[f.key] = cc
		cc.elem = c.lru.PushBack(cc)
		c.used += f.size
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

func parseCacheName(s string) (cacheKey, bool) {
	inoHex, mHex, ok := strings.Cut(s, "-")
	if !ok || len(inoHex) != 16 {
		return cacheKey{}, false
	}
	ino, err := strconv.ParseUint(inoHex, 16, 64)
	if err != nil {
		return cacheKey{}, false
	}
	b, err := hex.DecodeString(mHex)
	var id cairn.ID
	if err != nil || len(b) != len(id) {
		return cacheKey{}, false
	}
	copy(id[:], b)
	return cacheKey{ino, id}, true
}

func (c *diskCache) cleanPath(k cacheKey) string {
	return filepath.Join(c.dir, "clean", k.name())
}

func (c *diskCache) workPath(ino uint64) string {
	var r [6]byte
	rand.Read(r[:])
	return filepath.Join(c.dir, "work", fmt.Sprintf("%016x-%x", ino, r))
}

// close removes the spare files and releases the directory's lock.
func (c *diskCache) close() {
	c.spares.stop()
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.lockf.Close()
}

// lookup returns the clean copy of version k with one more reference,
// opening its file if nobody has it open; ok is false if there is none
// (or it is not size bytes: cut short, dropped).
func (c *diskCache) lookup(k cacheKey, size int64) (*content, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.clean[k]
	if cc == nil {
		return nil, false
	}
	if cc.refs == 0 {
		f, err := os.OpenFile(cc.path, os.O_RDWR, 0)
		var fi os.FileInfo
		if err == nil {
			fi, err = f.Stat()
		}
		if err != nil || fi.Size() != size {
			if f != nil {
				f.Close()
			}
			c.log.Warn("dropped a cached copy that is not what its name says", "copy", cc.path, "size", size, "err", err)
			c.dropLocked(cc)
			return nil, false
		}
		c.lru.Remove(cc.elem)
		cc.elem = nil
		cc.fmu.Lock()
		cc.f, cc.ro = f, false
		cc.fmu.Unlock()
		c.open[cc] = struct{}{}
	}
	cc.refs++
	return cc, true
}

// newWork makes an empty copy in work/ for ino, with one reference.
func (c *diskCache) newWork(ino uint64) (*content, error) {
	f, p := c.spares.take()
	if f == nil {
		p = c.workPath(ino)
		var err error
		if f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return nil, cairn.E("open", cairn.IO, p, err)
		}
	}
	cc := &content{ino: ino, f: f, path: p, refs: 1}
	c.mu.Lock()
	c.open[cc] = struct{}{}
	c.mu.Unlock()
	return cc, nil
}

// newTmp makes a file in tmp/ for a fetch.
func (c *diskCache) newTmp() (*os.File, error) {
	f, err := os.CreateTemp(filepath.Join(c.dir, "tmp"), "fetch-*")
	if err != nil {
		return nil, cairn.E("open", cairn.IO, c.dir, err)
	}
	return f, nil
}

// insertFetched makes f, a complete copy of version k just fetched into
// tmp/, the clean copy of k, open with one reference.
func (c *diskCache) insertFetched(f *os.File, k cacheKey, size int64) (*content, error) {
	p := c.cleanPath(k)
	if err := os.Rename(f.Name(), p); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, cairn.E("open", cairn.IO, p, err)
	}
	cc := &content{ino: k.ino, f: f, path: p, refs: 1, size: size, version: true, manifest: k.manifest, cached: true, key: k}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.clean[k]; old != nil {
		// Fetched twice at once (the file was renamed over): the other
		// keeps its open file, unindexed.
		c.unindexLocked(old)
		old.path = ""
	}
	c.clean[k] = cc
	c.used += size
	c.open[cc] = struct{}{}
	c.evictLocked()
	return cc, nil
}

// ref adds a reference to a content, opening its file again if nobody
// had it open (a copy whose queued commit is not done yet, or a clean
// copy in the cache). It fails if the file is gone (evicted).
func (c *diskCache) ref(cc *content) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc.refs == 0 {
		if cc.path == "" {
			return cairn.E("open", cairn.NotFound, "", errors.New("copy gone"))
		}
		f, err := os.OpenFile(cc.path, os.O_RDWR, 0)
		if err != nil {
			return cairn.E("open", cairn.IO, cc.path, err)
		}
		if cc.elem != nil {
			c.lru.Remove(cc.elem)
			cc.elem = nil
		}
		cc.fmu.Lock()
		cc.f, cc.ro = f, false
		cc.fmu.Unlock()
		c.open[cc] = struct{}{}
	}
	cc.refs++
	return nil
}

// settleClosed disposes of the file of a content nobody has open that
// is not in the cache (after its queued commit ended): kept in unsaved/
// if it holds writes never committed, else removed. One with queued
// commits left, or held (held.go), stays.
func (c *diskCache) settleClosed(cc *content) {
	c.mu.Lock()
	if cc.refs > 0 || cc.cached || cc.path == "" {
		c.mu.Unlock()
		return
	}
	cc.mu.Lock()
	keep, stay := cc.dirty || cc.keep, cc.pending > 0 || cc.held
	cc.mu.Unlock()
	if stay {
		c.mu.Unlock()
		return
	}
	p := cc.path
	cc.path = ""
	c.mu.Unlock()
	if keep {
		c.keepUnsaved(p, cc.ino)
	} else {
		os.Remove(p)
	}
}

// unref drops a reference; at the last, the copy is closed: a clean copy
// stays in the cache (least recently used last), a work copy is removed,
// kept in unsaved/ if it holds writes that were never committed, or left
// to the queue that will commit it.
func (c *diskCache) unref(cc *content) {
	c.mu.Lock()
	cc.refs--
	if cc.refs > 0 {
		c.mu.Unlock()
		return
	}
	delete(c.open, cc)
	cc.fmu.Lock() // a node may still point at it (a held copy: held.go)
	f := cc.f
	cc.f = nil
	cc.fmu.Unlock()
	cached := cc.cached
	if cached {
		cc.elem = c.lru.PushFront(cc)
		c.evictLocked()
	}
	path := cc.path
	c.mu.Unlock()
	if f != nil {
		f.Close()
	}
	if cached {
		now := time.Now()
		os.Chtimes(path, now, now) // its place in the LRU order after a restart
		return
	}
	cc.mu.Lock()
	// queued: its file is the data of queued commits (frozen), or, when
	// they have copies of their own (copyOut, enqueue), what the file is
	// until they are done; the last one settles it (queue.finish).
	keep, queued, held := cc.dirty || cc.keep, cc.frozen || cc.pending > 0, cc.held
	cc.mu.Unlock()
	switch {
	case path == "" || queued || held: // held: settled later (held.go)
	case keep:
		c.keepUnsaved(path, cc.ino)
	default:
		os.Remove(path)
	}
}

// keepUnsaved moves a work copy whose writes were never committed to
// unsaved/, and says so.
func (c *diskCache) keepUnsaved(path string, ino uint64) {
	dst := filepath.Join(c.dir, "unsaved", fmt.Sprintf("%016x-%s", ino, time.Now().UTC().Format("20060102T150405.000000000")))
	if err := os.Rename(path, dst); err != nil {
		dst = path
	}
	c.log.Error("kept the unsaved content of a file whose commit failed", "copy", dst, "ino", fmt.Sprintf("%016x", ino))
}

// detach takes an open clean copy out of the index before it is written:
// its file moves to work/ (the version it was a copy of is still what
// the metadata holds, and a crash now must not leave a changed file under
// that version's name).
func (c *diskCache) detach(cc *content) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !cc.cached {
		return nil
	}
	p := c.workPath(cc.ino)
	if err := os.Rename(cc.path, p); err != nil {
		return cairn.E("write", cairn.IO, cc.path, err)
	}
	c.unindexLocked(cc)
	cc.path, cc.named = p, false
	return nil
}

// adopt makes an open work copy, just committed as version k, the clean
// copy of k. Another copy of k in the cache is replaced unless open.
func (c *diskCache) adopt(cc *content, k cacheKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc.cached || cc.path == "" {
		return
	}
	if old := c.clean[k]; old != nil {
		if old.refs > 0 {
			return // stays a work copy, removed when closed
		}
		c.dropLocked(old)
	}
	p := c.cleanPath(k)
	if err := os.Rename(cc.path, p); err != nil {
		c.log.Warn("could not keep a committed copy in the cache", "copy", cc.path, "err", err)
		return
	}
	cc.path, cc.cached, cc.named, cc.key = p, true, false, k
	c.clean[k] = cc
	c.used += cc.size
	if cc.refs == 0 {
		cc.elem = c.lru.PushFront(cc)
	}
	c.evictLocked()
}

// adoptFile makes path, a closed work copy just committed as version k
// (by a commit queued before a restart), the clean copy of k.
func (c *diskCache) adoptFile(path string, k cacheKey, size int64) {
	cc := &content{ino: k.ino, path: path, size: size, version: true, manifest: k.manifest}
	c.adopt(cc, k)
	if !cc.cached {
		os.Remove(path)
	}
}

func (c *diskCache) unindexLocked(cc *content) {
	if !cc.cached {
		return
	}
	// The key it was indexed under: its manifest may have moved on since
	// (a commit of a copy still indexed).
	if c.clean[cc.key] == cc {
		delete(c.clean, cc.key)
	}
	if cc.elem != nil {
		c.lru.Remove(cc.elem)
		cc.elem = nil
	}
	c.used -= cc.size
	cc.cached = false
}

// dropLocked removes a clean copy nobody has open from the cache and disk.
func (c *diskCache) dropLocked(cc *content) {
	c.unindexLocked(cc)
	os.Remove(cc.path)
	cc.path = ""
}

// evictLocked removes the least recently used clean copies nobody has
// open until the cache is within its bound.
func (c *diskCache) evictLocked() {
	for c.used > c.limit {
		back := c.lru.Back()
		if back == nil {
			return // the rest is open
		}
		cc := back.Value.(*content)
		c.dropLocked(cc)
		c.evictions.Add(1)
	}
}

// openContents returns every content with handles (for an unmount that
// lost the kernel's last releases).
func (c *diskCache) openContents() []*content {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*content, 0, len(c.open))
	for cc := range c.open {
		out = append(out, cc)
	}
	return out
}

// forceClose drops every reference of cc (Wait, after the kernel is gone).
func (c *diskCache) forceClose(cc *content) {
	c.mu.Lock()
	if cc.refs <= 0 {
		c.mu.Unlock()
		return
	}
	cc.refs = 1
	c.mu.Unlock()
	c.unref(cc)
}

// size reports the bytes held by clean copies (for tests and statfs).
func (c *diskCache) size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.used
}

// unsavedLeftovers moves the work copies that no queued commit names (a
// mount that was killed with files open) to unsaved/, and says so.
func (c *diskCache) unsavedLeftovers(queued map[string]bool) {
	ents, err := os.ReadDir(filepath.Join(c.dir, "work"))
	if err != nil {
		return
	}
	for _, de := range ents {
		p := filepath.Join(c.dir, "work", de.Name())
		if queued[p] {
			continue
		}
		fi, err := de.Info()
		if err == nil && fi.Size() == 0 {
			os.Remove(p)
			continue
		}
		var ino uint64
		if k, _, ok := strings.Cut(de.Name(), "-"); ok {
			ino, _ = strconv.ParseUint(k, 16, 64)
		}
		dst := filepath.Join(c.dir, "unsaved", de.Name())
		if err := os.Rename(p, dst); err != nil {
			dst = p
		}
		c.log.Warn("a mount ended with a file open for writing: its uncommitted content is kept", "copy", dst, "ino", fmt.Sprintf("%016x", ino))
	}
}

// copyFile copies the first size bytes of the copy at src to a new work
// copy of ino (copy_file_range: a reflink where the disk offers it).
func (c *diskCache) copyFile(src string, ino uint64, size int64) (*os.File, string, error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, "", cairn.E("write", cairn.IO, src, err)
	}
	defer in.Close()
	p := c.workPath(ino)
	dst, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", cairn.E("write", cairn.IO, p, err)
	}
	if _, err := dst.ReadFrom(io.LimitReader(in, size)); err != nil {
		dst.Close()
		os.Remove(p)
		if errors.Is(err, syscall.ENOSPC) {
			return nil, "", syscall.ENOSPC
		}
		return nil, "", cairn.E("write", cairn.IO, p, err)
	}
	return dst, p, nil
}

// copyOut moves a copy of cc's file (the data of queued commits) under
// the name the file has, and gives the file itself a new name in work/:
// the commits keep reading what was queued, under the name their records
// know, while cc keeps its open file, free to be written. Each step
// leaves both names holding the queued data, so a crash in between loses
// nothing. The caller holds cc.wmu (cc's file is stable).
func (c *diskCache) copyOut(cc *content) error {
	c.mu.Lock()
	old := cc.path
	c.mu.Unlock()
	if old == "" {
		return cairn.E("write", cairn.IO, c.dir, errors.New("a queued copy without a name (bug)"))
	}
	f := cc.file()
	fi, err := f.Stat()
	if err != nil {
		return cairn.E("write", cairn.IO, old, err)
	}
	live := c.workPath(cc.ino)
	if err = os.Link(old, live); err != nil {
		return cairn.E("write", cairn.IO, old, err)
	}
	tmp, err := c.newTmp()
	if err == nil {
		err = copyInto(tmp, f, fi.Size())
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), old)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
	}
	if err != nil {
		os.Remove(live)
		if errors.Is(err, syscall.ENOSPC) {
			return syscall.ENOSPC
		}
		return cairn.E("write", cairn.IO, old, err)
	}
	c.mu.Lock()
	cc.path, cc.named = live, false
	c.mu.Unlock()
	return nil
}
