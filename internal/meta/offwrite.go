package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/journal"
)

// Offline writes (doc/offline.md, "Offline writes and reconciliation").
// While the Service is offline, a volume with a usable local copy and an
// offline log (Vol.UseOfflineLog) decides its namespace changes against
// the copy: the change is checked as the online call would check it,
// made in the copy at once (later reads see it), and appended to the
// log, the one journal (internal/journal) in which this device keeps the
// offline work of the volume, each record naming its base (the version
// the change was made on). Replay (replay.go) applies the log once the
// service is back.

// OfflineRecordVersion is the format version of an offline change's
// record (doc/format.md, "Offline change").
const OfflineRecordVersion = 1

// The operations of an offline change.
const (
	OffCreate = "create" // Entry made in Parent (a directory, symlink, special or empty file)
	OffCommit = "commit" // Version made the current version of Name (the file Ino)
	OffUpdate = "update" // Entry's attributes (mode, owner, mtime, target) set on Name
	OffRemove = "remove" // Name (Ino) removed
	OffRename = "rename" // Name (Ino) moved to DstName in DstParent
)

// OfflineRecord is one change made offline: a JSON record in the
// offline log (doc/format.md, "Offline change").
type OfflineRecord struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	At int64  `json:"at"` // when it was made, unix ns
	// Parent is the directory that held Name, whose own record was
	// DirName in DirParent (the root: 0 and ""); Path its path then.
	Parent    uint64 `json:"parent"`
	DirParent uint64 `json:"dir_parent"`
	DirName   string `json:"dir_name"`
	Name      string `json:"name"`
	Path      string `json:"path,omitempty"`
	Ino       uint64 `json:"ino"`
	Type      Type   `json:"type"`
	// Base is the manifest of the file's current version the change was
	// made on ("" : a file with none, or not a file); New says the entry
	// was absent (a create, or a commit that made the file).
	Base string `json:"base,omitempty"`
	New  bool   `json:"new,omitempty"`
	// Entry is the record made (create) or the attributes set (update).
	Entry *Entry `json:"entry,omitempty"`
	// Version is the version a commit made current; Mode, UID and GID
	// its file's (when the commit made it).
	Version *Version `json:"version,omitempty"`
	// Rename: the destination, and the entry it replaced (DstIno 0:
	// none) with that one's base.
	DstParent    uint64 `json:"dst_parent,omitempty"`
	DstDirParent uint64 `json:"dst_dir_parent,omitempty"`
	DstDirName   string `json:"dst_dir_name,omitempty"`
	DstName      string `json:"dst_name,omitempty"`
	DstPath      string `json:"dst_path,omitempty"`
	DstIno       uint64 `json:"dst_ino,omitempty"`
	DstBase      string `json:"dst_base,omitempty"`
	// Pending: a rename of a file whose content was still to be
	// committed (Vol.RenamePending): it takes the replaced file's history.
	Pending bool `json:"pending,omitempty"`
}

// DecodeOfflineRecord reads one record of the offline log.
func DecodeOfflineRecord(b []byte) (*OfflineRecord, error) {
	var r OfflineRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, cairn.E("offline record", cairn.Corrupt, "", err)
	}
	if r.V != OfflineRecordVersion {
		return nil, cairn.E("offline record", cairn.Corrupt, "", fmt.Errorf("format version %d (this cairn reads %d)", r.V, OfflineRecordVersion))
	}
	switch r.Op {
	case OffCreate, OffUpdate:
		if r.Entry == nil {
			return nil, cairn.E("offline record", cairn.Corrupt, r.Name, fmt.Errorf("a %s without its entry", r.Op))
		}
	case OffCommit:
		if r.Version == nil {
			return nil, cairn.E("offline record", cairn.Corrupt, r.Name, errors.New("a commit without its version"))
		}
	case OffRemove:
	case OffRename:
		if r.DstName == "" {
			return nil, cairn.E("offline record", cairn.Corrupt, r.Name, errors.New("a rename without its destination"))
		}
	default:
		return nil, cairn.E("offline record", cairn.Corrupt, r.Name, fmt.Errorf("unknown operation %q", r.Op))
	}
	if (r.Name == "" && !(r.Op == OffUpdate && r.Parent == 0 && r.Ino == RootIno)) || r.Ino == 0 {
		return nil, cairn.E("offline record", cairn.Corrupt, r.Name, errors.New("no name or inode"))
	}
	return &r, nil
}

// OfflineLog is a volume's log of offline changes on this device: a
// journal directory, held by one process at a time (its flock).
type OfflineLog struct {
	dir    string
	id     string // names the log in the replay's progress mark (replay.go)
	device string
	sync   bool
	lock   *os.File
	j      *journal.Journal

	mu sync.Mutex // orders a change's check, copy update and append
}

// OfflineLogOptions configure an offline log.
type OfflineLogOptions struct {
	// Device names this device in conflict copies' names and records.
	Device string
	// NoSync leaves each record unsynced (write-back mode: the mount's
	// fsync, Sync, makes them durable); by default each change is
	// fsynced before it is acknowledged.
	NoSync bool
}

// OfflineLogDir is where the offline log of volume id is kept, beside its
// local copy in dir.
func OfflineLogDir(dir, id string) string { return filepath.Join(dir, id+".log") }

// OpenOfflineLog opens (creating it) the offline log in dir. Another
// process holding it is an error of Kind Conflict; damage the journal
// found (a torn tail is not damage: it is cut away, never applied) is
// returned by Damage.
func OpenOfflineLog(ctx context.Context, dir string, o OfflineLogOptions) (*OfflineLog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E("open offline log", cairn.IO, dir, err)
	}
	lf, ok, err := journal.Lock(filepath.Join(dir, "lock"))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, cairn.E("open offline log", cairn.Conflict, dir, journal.ErrBusy)
	}
	idPath := filepath.Join(dir, "id")
	id, err := os.ReadFile(idPath)
	if errors.Is(err, os.ErrNotExist) {
		id = []byte(randomID())
		err = writeFileSync(idPath, id)
	}
	if err != nil || len(strings.TrimSpace(string(id))) == 0 {
		lf.Close()
		return nil, cairn.E("open offline log", cairn.IO, idPath, fmt.Errorf("log id: %v", err))
	}
	j, err := journal.Open(ctx, filepath.Join(dir, "journal"), journal.Options{})
	if err != nil {
		lf.Close()
		return nil, err
	}
	dev := o.Device
	if dev == "" {
		dev, _ = os.Hostname()
	}
	return &OfflineLog{dir: dir, id: strings.TrimSpace(string(id)), device: dev, sync: !o.NoSync, lock: lf, j: j}, nil
}

// Damage returns what the journal's open found damaged (Kind Corrupt).
func (l *OfflineLog) Damage() []error { return l.j.Damage() }

// Len returns how many changes wait for the replay.
func (l *OfflineLog) Len() int { return l.j.Len() }

// Device is the device name the log's conflict copies carry.
func (l *OfflineLog) Device() string { return l.device }

// Sync makes every change appended so far durable.
func (l *OfflineLog) Sync(ctx context.Context) error { return l.j.Sync(ctx) }

// Close closes the log (fsyncing it) and lets its lock go.
func (l *OfflineLog) Close() error {
	err := l.j.Sync(context.Background())
	if cerr := l.j.Close(); err == nil {
		err = cerr
	}
	l.lock.Close()
	return err
}

// Records returns the changes not replayed yet, in order (a record that
// cannot be decoded is left out: Replay reports it).
func (l *OfflineLog) Records() []OfflineRecord {
	var out []OfflineRecord
	for _, r := range l.j.Pending() {
		if rec, err := DecodeOfflineRecord(r.Payload); err == nil {
			out = append(out, *rec)
		}
	}
	return out
}

func (l *OfflineLog) append(ctx context.Context, r *OfflineRecord) error {
	r.V = OfflineRecordVersion
	if r.At == 0 {
		r.At = time.Now().UnixNano()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return cairn.E("offline "+r.Op, cairn.Invalid, r.Name, err)
	}
	if _, err := l.j.Append(ctx, b); err != nil {
		return err
	}
	if l.sync {
		return l.j.Sync(ctx)
	}
	return nil
}

// UseOfflineLog makes v take its namespace changes into l (and its local
// copy) while the Service is offline; nil: refuse them (ErrOfflineWrites).
// The log's pending changes are made again in the copy (a copy saved
// before them, or replaced since, lacks them), and are again each time
// the copy is replaced by a listing, until they are replayed.
func (v *Vol) UseOfflineLog(l *OfflineLog) {
	v.loc().log.Store(l)
	if lc := v.LocalCopy(); lc != nil && l != nil {
		lc.setOverlay(func(c *LocalCopy) {
			for _, r := range l.Records() {
				c.redoLocked(&r)
			}
		})
	}
}

// OfflineLog returns the log v takes offline changes into (nil: none).
func (v *Vol) OfflineLog() *OfflineLog { return v.loc().log.Load() }

// offWriting returns the copy and log to take a change into: the Service
// is offline and v has both (the copy usable).
func (v *Vol) offWriting(ctx context.Context) (*LocalCopy, *OfflineLog) {
	if replaying(ctx) {
		return nil, nil
	}
	if !v.s.isOffline() {
		return nil, nil
	}
	l := v.OfflineLog()
	lc := v.LocalCopy()
	if l == nil || lc == nil || !lc.Usable() {
		return nil, nil
	}
	return lc, l
}

// curBase is the manifest of e's current version ("" : none).
func curBase(e *Entry) string {
	if e == nil {
		return ""
	}
	if c := e.Current(); c != nil {
		return c.Manifest.String()
	}
	return ""
}

// offDir checks that parent is a directory of the copy and returns its
// place and path.
func (c *LocalCopy) offDirLocked(op string, parent *Entry) (dirParent uint64, dirName, path string, err error) {
	if parent == nil || !parent.IsDir() {
		return 0, "", "", cairn.E(op, cairn.NotDir, "", nil)
	}
	if parent.Ino == RootIno {
		return 0, "", "/", nil
	}
	p, ok := c.dirs[parent.Ino]
	if !ok {
		return 0, "", "", cairn.E(op, cairn.NotFound, parent.Name, errors.New("parent directory was removed"))
	}
	return p.parent, p.name, c.pathLocked(parent.Ino), nil
}

func (v *Vol) offCreate(ctx context.Context, lc *LocalCopy, l *OfflineLog, parent *Entry, e Entry, locked, keepIno bool) (*Entry, *Lock, error) {
	if err := e.checkType(); err != nil {
		return nil, nil, cairn.E("create", cairn.Invalid, e.Name, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	dp, dn, dpath, err := lc.offDirLocked("create", parent)
	if err != nil {
		return nil, nil, err
	}
	if old := lc.ents[parent.Ino][e.Name]; old != nil {
		return cloneEntry(old), nil, cairn.E("create", cairn.Exist, e.Name, nil)
	}
	now := time.Now().UnixNano()
	e.Parent = parent.Ino
	if e.Ino == 0 || !keepIno {
		e.Ino = randomIno()
	}
	if e.Ctime == 0 {
		e.Ctime = now
	}
	if e.Mtime == 0 {
		e.Mtime = now
	}
	e.Rev = lc.rev + 1
	rec := &OfflineRecord{Op: OffCreate, At: now, Parent: parent.Ino, DirParent: dp, DirName: dn, Name: e.Name,
		Path: joinPath(dpath, e.Name), Ino: e.Ino, Type: e.Type, New: true, Entry: &e}
	if err := l.append(ctx, rec); err != nil {
		return nil, nil, err
	}
	ne := e
	lc.setLocked(parent.Ino, e.Name, &ne)
	lc.dirty = true
	var lk *Lock
	if locked {
		lk = v.offLock(parent.Ino, e.Name)
	}
	return cloneEntry(&e), lk, nil
}

// offLock is a writer lock taken offline: this process's alone (no other
// device can write meanwhile; the replay settles what they did).
func (v *Vol) offLock(parent uint64, name string) *Lock {
	rel, ok := v.s.local.tryLock(v.lockKey(parent, name))
	if !ok {
		rel = func() {}
	}
	return &Lock{s: v.s, key: v.lockKey(parent, name), release: rel, offline: true}
}

func (v *Vol) offCommit(ctx context.Context, lc *LocalCopy, l *OfflineLog, parent *Entry, name string, c Commit) (*Entry, []Version, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	dp, dn, dpath, err := lc.offDirLocked("commit", parent)
	if err != nil {
		return nil, nil, err
	}
	var cur *Entry
	if e := lc.ents[parent.Ino][name]; e != nil {
		cur = cloneEntry(e)
	}
	if c.Ino != 0 && cur != nil && cur.Ino != c.Ino {
		return cur, nil, cairn.E("commit", cairn.Exist, name, errors.New("the name holds another file"))
	}
	next, _, _, err := v.nextVersion(parent, name, cur, &c)
	if err != nil {
		return nil, nil, err
	}
	next.Rev = lc.rev + 1
	ver := *next.Current()
	rec := &OfflineRecord{Op: OffCommit, At: time.Now().UnixNano(), Parent: parent.Ino, DirParent: dp, DirName: dn, Name: name,
		Path: joinPath(dpath, name), Ino: next.Ino, Type: TypeFile, Base: curBase(cur), New: cur == nil, Version: &ver,
		Entry: &Entry{Mode: next.Mode, UID: next.UID, GID: next.GID}}
	if err := l.append(ctx, rec); err != nil {
		return nil, nil, err
	}
	ne := next
	lc.setLocked(parent.Ino, name, &ne)
	lc.dirty = true
	if c.Lock != nil {
		c.Lock.markReleased()
	}
	// Versions a keep-versions limit drops are not given back: the
	// replay's commit drops them, and the collector takes their data.
	return &next, nil, nil
}

func (v *Vol) offUpdate(ctx context.Context, lc *LocalCopy, l *OfflineLog, e *Entry) (*Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	cur := lc.ents[e.Parent][e.Name]
	if cur == nil || cur.Ino != e.Ino {
		return nil, cairn.E("update", cairn.Conflict, e.Name, errors.New("changed concurrently"))
	}
	if len(cur.Links) > 1 {
		return nil, cairn.E("update", cairn.Unavailable, e.Name, errOfflineLinks)
	}
	var dp uint64
	var dn, dpath string
	if e.Parent != 0 {
		var err error
		if dp, dn, dpath, err = lc.offDirLocked("update", &Entry{Ino: e.Parent, Type: TypeDir, Name: ""}); err != nil {
			return nil, err
		}
	}
	n := *cloneEntry(cur)
	n.Mode, n.UID, n.GID, n.Mtime, n.Target = e.Mode, e.UID, e.GID, e.Mtime, e.Target
	n.Ctime = time.Now().UnixNano()
	n.Rev = lc.rev + 1
	attrs := Entry{Mode: n.Mode, UID: n.UID, GID: n.GID, Mtime: n.Mtime, Target: n.Target}
	rec := &OfflineRecord{Op: OffUpdate, At: n.Ctime, Parent: e.Parent, DirParent: dp, DirName: dn, Name: e.Name,
		Path: joinPath(dpath, e.Name), Ino: n.Ino, Type: n.Type, Base: curBase(cur), Entry: &attrs}
	if err := l.append(ctx, rec); err != nil {
		return nil, err
	}
	lc.setLocked(e.Parent, e.Name, &n)
	lc.dirty = true
	return cloneEntry(&n), nil
}

// errOfflineLinks is why a change of a file with several names is
// refused offline.
var errOfflineLinks = errors.New("offline: files with several names (hard links) change only online")

func (v *Vol) offRemove(ctx context.Context, lc *LocalCopy, l *OfflineLog, parent *Entry, name, path string, recursive bool) (*TrashItem, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	dp, dn, dpath, err := lc.offDirLocked("remove", parent)
	if err != nil {
		return nil, err
	}
	cur := lc.ents[parent.Ino][name]
	if cur == nil {
		return nil, cairn.E("remove", cairn.NotFound, path, nil)
	}
	if len(cur.Links) > 1 {
		return nil, cairn.E("remove", cairn.Unavailable, path, errOfflineLinks)
	}
	if cur.IsDir() && len(lc.ents[cur.Ino]) > 0 {
		// Recursive or not: offline, a directory goes once it is empty
		// (each entry's removal is its own change, with its own base).
		return nil, cairn.E("remove", cairn.NotEmpty, path, errors.New("offline: remove its entries first"))
	}
	now := time.Now().UnixNano()
	rec := &OfflineRecord{Op: OffRemove, At: now, Parent: parent.Ino, DirParent: dp, DirName: dn, Name: name,
		Path: joinPath(dpath, name), Ino: cur.Ino, Type: cur.Type, Base: curBase(cur)}
	if err := l.append(ctx, rec); err != nil {
		return nil, err
	}
	item := TrashItem{ID: fmt.Sprintf("%016x-offline", now), Path: path, Deleted: now, Entry: *cloneEntry(cur)}
	lc.delLocked(parent.Ino, name)
	lc.dirty = true
	return &item, nil
}

func (v *Vol) offRename(ctx context.Context, lc *LocalCopy, l *OfflineLog, srcParent *Entry, srcName string, dstParent *Entry, dstName string, known *Known, o renameOpts) (*Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	sp, sn, spath, err := lc.offDirLocked("rename", srcParent)
	if err != nil {
		return nil, err
	}
	dp, dn, dpath, err := lc.offDirLocked("rename", dstParent)
	if err != nil {
		return nil, err
	}
	src := lc.ents[srcParent.Ino][srcName]
	if src == nil {
		return nil, cairn.E("rename", cairn.NotFound, joinPath(spath, srcName), nil)
	}
	dst := lc.ents[dstParent.Ino][dstName]
	if dst != nil && dst.Ino == src.Ino {
		return nil, nil
	}
	if len(src.Links) > 1 || (dst != nil && len(dst.Links) > 1) {
		return nil, cairn.E("rename", cairn.Unavailable, joinPath(dpath, dstName), errOfflineLinks)
	}
	if src.IsDir() {
		// Not into itself or below it.
		for d := dstParent.Ino; d != RootIno && d != 0; {
			if d == src.Ino {
				return nil, cairn.E("rename", cairn.Invalid, joinPath(dpath, dstName), errors.New("a directory cannot move into itself"))
			}
			p, ok := lc.dirs[d]
			if !ok {
				break
			}
			d = p.parent
		}
	}
	if dst != nil {
		switch {
		case o.noReplace:
			return nil, cairn.E("rename", cairn.Exist, joinPath(dpath, dstName), nil)
		case dst.IsDir() && !src.IsDir():
			return nil, cairn.E("rename", cairn.IsDir, joinPath(dpath, dstName), nil)
		case !dst.IsDir() && src.IsDir():
			return nil, cairn.E("rename", cairn.NotDir, joinPath(dpath, dstName), nil)
		case dst.IsDir() && len(lc.ents[dst.Ino]) > 0:
			return nil, cairn.E("rename", cairn.NotEmpty, joinPath(dpath, dstName), nil)
		}
	}
	now := time.Now().UnixNano()
	n := *cloneEntry(src)
	n.Parent, n.Name, n.Ctime = dstParent.Ino, dstName, now
	if dst != nil && FollowsPath(src, dst, o.pending) {
		n.Versions = appendHistory(dst.Versions, src.Versions, v.V.KeepVersions)
		if cur := n.Current(); cur != nil {
			n.Size, n.Mtime = cur.Size, cur.Mtime
		}
	}
	n.Rev = lc.rev + 1
	rec := &OfflineRecord{Op: OffRename, At: now, Parent: srcParent.Ino, DirParent: sp, DirName: sn, Name: srcName,
		Path: joinPath(spath, srcName), Ino: src.Ino, Type: src.Type, Base: curBase(src),
		DstParent: dstParent.Ino, DstDirParent: dp, DstDirName: dn, DstName: dstName, DstPath: joinPath(dpath, dstName), Pending: o.pending}
	if dst != nil {
		rec.DstIno, rec.DstBase = dst.Ino, curBase(dst)
	}
	if err := l.append(ctx, rec); err != nil {
		return nil, err
	}
	lc.delLocked(srcParent.Ino, srcName)
	if dst != nil {
		lc.delLocked(dstParent.Ino, dstName)
	}
	ne := n
	lc.setLocked(dstParent.Ino, dstName, &ne)
	lc.dirty = true
	return cloneEntry(&n), nil
}

func joinPath(dir, name string) string {
	if dir == "/" || dir == "" {
		return "/" + name
	}
	return dir + "/" + name
}

// redoLocked makes change r in the copy again (UseOfflineLog): each
// operation sets the state it made, so doing it again, on a copy that
// has it or not, gives the same copy.
func (c *LocalCopy) redoLocked(r *OfflineRecord) {
	now := c.rev + 1
	switch r.Op {
	case OffCreate:
		if _, ok := c.ents[r.Parent][r.Name]; ok {
			return
		}
		e := *r.Entry
		e.Rev = now
		c.setLocked(r.Parent, r.Name, &e)
	case OffCommit:
		cur := c.ents[r.Parent][r.Name]
		if cur != nil && cur.Ino != r.Ino {
			return
		}
		var n Entry
		if cur == nil {
			n = Entry{Name: r.Name, Parent: r.Parent, Ino: r.Ino, Type: TypeFile, Mode: r.Entry.Mode, UID: r.Entry.UID, GID: r.Entry.GID, Ctime: r.At}
		} else {
			n = *cloneEntry(cur)
			for _, ver := range n.Versions {
				if ver.Manifest == r.Version.Manifest {
					return
				}
			}
		}
		n.Versions = append(n.Versions, *r.Version)
		n.Size, n.Mtime, n.Rev = r.Version.Size, r.Version.Mtime, now
		c.setLocked(r.Parent, r.Name, &n)
	case OffUpdate:
		cur := c.ents[r.Parent][r.Name]
		if cur == nil || cur.Ino != r.Ino {
			return
		}
		n := *cloneEntry(cur)
		n.Mode, n.UID, n.GID, n.Mtime, n.Target, n.Rev = r.Entry.Mode, r.Entry.UID, r.Entry.GID, r.Entry.Mtime, r.Entry.Target, now
		c.setLocked(r.Parent, r.Name, &n)
	case OffRemove:
		if cur := c.ents[r.Parent][r.Name]; cur != nil && cur.Ino == r.Ino {
			c.delLocked(r.Parent, r.Name)
		}
	case OffRename:
		cur := c.ents[r.Parent][r.Name]
		if cur == nil || cur.Ino != r.Ino {
			return
		}
		n := *cloneEntry(cur)
		n.Parent, n.Name, n.Rev = r.DstParent, r.DstName, now
		if d := c.ents[r.DstParent][r.DstName]; d != nil && FollowsPath(cur, d, r.Pending) {
			n.Versions = appendHistory(d.Versions, cur.Versions, c.vol.KeepVersions)
		}
		c.delLocked(r.Parent, r.Name)
		c.delLocked(r.DstParent, r.DstName)
		c.setLocked(r.DstParent, r.DstName, &n)
	}
	c.dirty = true
}

// offPutBatch takes a write-back batch offline: each new entry (Rev 0) as
// a create under the inode number the mount gave it, each change as an
// attribute change; one at a time, the first refusal ends it (nothing of
// it is undone: each change taken is in the log).
func (v *Vol) offPutBatch(ctx context.Context, lc *LocalCopy, l *OfflineLog, puts []BatchPut) (BatchResult, error) {
	res := BatchResult{Locks: make([]*Lock, len(puts))}
	for i := range puts {
		p := &puts[i]
		if p.Entry.Rev == 0 {
			ne, lk, err := v.offCreate(ctx, lc, l, &p.Dir, p.Entry, p.Lock, true)
			if err != nil {
				if cairn.KindOf(err) == cairn.Exist {
					res.Old = ne
				}
				return res, err
			}
			res.Locks[i] = lk
			continue
		}
		e := p.Entry
		if _, err := v.offUpdate(ctx, lc, l, &e); err != nil {
			return res, err
		}
	}
	lc.mu.Lock()
	res.Rev = lc.rev + 1
	lc.mu.Unlock()
	return res, nil
}
