package cli

import (
	"context"
	"encoding/hex"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/filescache"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/vpath"
)

// racyWindow: a file whose mtime or ctime is less than this before the put
// began is not remembered in the files cache. A change made to it after
// this put looked at it could keep both times (a file system's clock ticks
// coarsely, some keep whole seconds, FAT two), and the cache would then
// call it unchanged; the next put compares its record instead (size,
// mtime, inode), as without a cache. (git's "racy clean" entries.)
const racyWindow = 2e9 // ns

// filesCachePath is where the files cache of puts into dest lives: one
// file per destination, under this device's CAIRN_HOME.
func (e *env) filesCachePath(volID, dest string) string {
	h := blake3.Sum256([]byte(dest))
	return filepath.Join(e.home, "cache", "files", volID+"-"+hex.EncodeToString(h[:12]))
}

// loadCache loads the files cache of puts into p (dir is p's entry). A
// cache that cannot be used is ignored (said on stderr), never trusted.
func (st *putState) loadCache(ctx context.Context, v *fs.Volume, dir *meta.Entry, p vpath.Path) {
	_, cluster, err := v.Meta.EntryRevs(ctx, dir.Ino)
	if err != nil || cluster == 0 {
		return // offline: revisions cannot be compared; no cache
	}
	if st.cwd, err = os.Getwd(); err != nil {
		return
	}
	st.revs = map[uint64]map[string]int64{}
	st.revWait = map[uint64]chan struct{}{}
	st.revKick = make(chan struct{}, 1)
	rctx, stop := context.WithCancel(ctx)
	st.stopRevs = stop
	go st.readRevs(rctx)
	path := st.e.filesCachePath(v.Meta.V.ID, p.String())
	fc, err := filescache.Load(path, v.Meta.V.ID, p.String(), cluster)
	if err != nil {
		st.prog.println(fmt.Sprintf("cairn: ignoring the files cache %s: %v", path, err))
	}
	st.fc, st.fcPath = fc, path
}

// saveCache saves the files cache if it changed: the entries of this put,
// and those of other sources' puts into the same destination. After a
// put that failed, entries not met are kept too.
func (st *putState) saveCache(srcs []string, whole bool) {
	if st.fc == nil {
		return
	}
	st.stopRevs()
	var roots []string
	if whole {
		for _, s := range srcs {
			if !filepath.IsAbs(s) {
				s = filepath.Join(st.cwd, s)
			}
			roots = append(roots, filepath.Clean(s))
		}
	}
	if !st.fc.Finish(roots) {
		return
	}
	if err := st.fc.Save(st.fcPath); err != nil {
		st.prog.println(fmt.Sprintf("cairn: could not save the files cache: %v", err))
	}
}

// cacheKey is j's key in the files cache: its absolute local path.
func (st *putState) cacheKey(j putJob) string {
	if filepath.IsAbs(j.src) {
		return filepath.Clean(j.src)
	}
	return filepath.Join(st.cwd, j.src)
}

// skip counts an unchanged file skipped.
func (st *putState) skip(j putJob) {
	atomic.AddInt64(&st.sum.Skipped, 1)
	st.prog.add(1, j.info.Size(), 0)
}

// remember records in the files cache that j's file, as walk saw it, is
// the current version of e (just committed, or found unchanged): unless
// the file is racy (racyWindow) or e's revision is unknown.
func (st *putState) remember(j putJob, e *meta.Entry) {
	if st.fc == nil || e == nil || e.Rev <= 0 {
		return
	}
	cur := e.Current()
	if cur == nil {
		return
	}
	s := statOf(j.info)
	if max(s.Mtime, s.Ctime) >= st.start.UnixNano()-racyWindow {
		return
	}
	st.fc.Record(st.cacheKey(j), filescache.Entry{Stat: s, Parent: j.dir.Ino, Rev: e.Rev, Ino: e.Ino, N: cur.N, Manifest: cur.Manifest})
}

// prefetchRevs asks for the ModRevisions of directory ino's entries
// ahead of the workers that compare them: the directories asked for are
// read many per round trip (readRevs), instead of one round trip each
// when the first worker reaches the directory.
func (st *putState) prefetchRevs(ino uint64) {
	if st.fc == nil || st.fc.Len() == 0 {
		return
	}
	st.revMu.Lock()
	_, done := st.revs[ino]
	_, asked := st.revWait[ino]
	if !done && !asked {
		st.revWait[ino] = make(chan struct{})
		st.revAsk = append(st.revAsk, ino)
	}
	st.revMu.Unlock()
	select {
	case st.revKick <- struct{}{}:
	default:
	}
}

// readRevs reads the directories prefetchRevs asks for until ctx ends. A
// directory whose read fails is left to entryRevs, which reads it again
// and reports the error.
func (st *putState) readRevs(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			st.revMu.Lock()
			for ino, ch := range st.revWait {
				close(ch)
				delete(st.revWait, ino)
			}
			st.revMu.Unlock()
			return
		case <-st.revKick:
		}
		st.revMu.Lock()
		ask := st.revAsk
		st.revAsk = nil
		st.revMu.Unlock()
		if len(ask) == 0 {
			continue
		}
		got, _, err := st.v.Meta.EntryRevsOf(ctx, ask)
		st.revMu.Lock()
		for _, ino := range ask {
			if err == nil {
				st.revs[ino] = got[ino]
			}
			if ch, ok := st.revWait[ino]; ok {
				close(ch)
				delete(st.revWait, ino)
			}
		}
		st.revMu.Unlock()
	}
}

// entryRevs returns the ModRevisions of directory ino's entries, read
// once per put.
func (st *putState) entryRevs(ctx context.Context, ino uint64) (map[string]int64, error) {
	st.revMu.Lock()
	m, ok := st.revs[ino]
	ch := st.revWait[ino]
	st.revMu.Unlock()
	if ok {
		return m, nil
	}
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		st.revMu.Lock()
		m, ok = st.revs[ino]
		st.revMu.Unlock()
		if ok {
			return m, nil
		}
	}
	v, err, _ := st.revRead.Do(fmt.Sprint(ino), func() (any, error) {
		revs, _, err := st.v.Meta.EntryRevs(ctx, ino)
		if err != nil {
			return nil, err
		}
		st.revMu.Lock()
		st.revs[ino] = revs
		st.revMu.Unlock()
		return revs, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(map[string]int64), nil
}

// statOf is what the files cache compares of a local file.
func statOf(info iofs.FileInfo) filescache.Stat {
	s := filescache.Stat{Size: info.Size(), Mtime: info.ModTime().UnixNano()}
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		s.Dev, s.Ino = uint64(sys.Dev), sys.Ino
		s.Ctime = sys.Ctim.Sec*1e9 + sys.Ctim.Nsec
	}
	return s
}
