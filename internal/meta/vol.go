package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	json "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
)

// Vol is a handle on one volume's namespace.
type Vol struct {
	s    *Service
	V    Volume
	base string // <prefix>v/<volID>/

	// local is the copy v answers from offline (offline.go).
	locOnce sync.Once
	local   *volLocal

	// acl caches ACL decisions and the paths of inodes seen (acl.go).
	aclOnce sync.Once
	acl     *aclState
}

func inoHex(ino uint64) string { return fmt.Sprintf("%016x", ino) }

// entryKey is where the entry named name in directory parent lives.
func (v *Vol) entryKey(parent uint64, name string) string {
	if parent == 0 {
		return v.base + "root"
	}
	return v.base + "e/" + inoHex(parent) + "/" + name
}

// dirPrefix is the prefix of all entries in directory ino.
func (v *Vol) dirPrefix(ino uint64) string { return v.base + "e/" + inoHex(ino) + "/" }

func (v *Vol) keyOf(e *Entry) string { return v.entryKey(e.Parent, e.Name) }

// touchOps returns, for each directory of dirs that asks for it (Touch,
// with its record as read: Rev), an operation that advances its mtime and
// ctime to now: a transaction nested in the change's that writes its
// record only if it is still the one read. A directory changed meanwhile
// (another entry made in it at the same moment, say) keeps its times, and
// costs the change no conflict. A key in skip (written by the change
// itself) is not touched: a transaction writes a key once. It returns the
// directories touched, for touchedDirs.
func (v *Vol) touchOps(now int64, skip map[string]bool, dirs ...*Entry) ([]clientv3.Op, []touch) {
	ts := make([]touch, len(dirs))
	for i, d := range dirs {
		ts[i] = touch{d, now}
	}
	return v.touchOpsAt(skip, ts)
}

// touch is a directory to touch, and the time to give it.
type touch struct {
	d *Entry
	t int64
}

// touchOpsAt is touchOps with a time per directory (the latest of those
// given for a directory twice).
func (v *Vol) touchOpsAt(skip map[string]bool, ts []touch) ([]clientv3.Op, []touch) {
	var ops []clientv3.Op
	var touched []touch
	at := map[string]int{}
	for _, x := range ts {
		d := x.d
		if d == nil || !d.Touch || d.Rev == 0 || !d.IsDir() {
			continue
		}
		k := v.keyOf(d)
		if skip[k] {
			continue
		}
		if i, ok := at[k]; ok {
			touched[i].t = max(touched[i].t, x.t)
			continue
		}
		at[k] = len(touched)
		touched = append(touched, x)
	}
	for _, x := range touched {
		k := v.keyOf(x.d)
		n := *x.d
		n.Mtime, n.Ctime = max(n.Mtime, x.t), max(n.Ctime, x.t)
		b, _ := json.Marshal(n)
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", x.d.Rev)},
			[]clientv3.Op{clientv3.OpPut(k, string(b))}, nil))
	}
	return ops, touched
}

// touchedDirs updates the directories of a transaction that succeeded
// whose records its touchOps (from index at of its operations) wrote:
// their times and Rev are what was written, so that a caller can keep
// them (Entry.Touch).
func touchedDirs(resp *clientv3.TxnResponse, at int, ts []touch) {
	for i, x := range ts {
		if at+i >= len(resp.Responses) {
			return
		}
		if r := resp.Responses[at+i].GetResponseTxn(); r != nil && r.Succeeded {
			d := x.d
			d.Mtime, d.Ctime, d.Rev = max(d.Mtime, x.t), max(d.Ctime, x.t), resp.Header.Revision
		}
	}
}

// decode reads the entry stored at key k. The key, not the value, says
// where an entry is: a value whose name or parent differ from its key's
// (a hostile or damaged record), or whose name could not be one element of
// a path, is Corrupt, so that nothing downstream (get, the mount) ever
// treats "../x" or "a/f" as a name.
func (v *Vol) decode(op string, k, val []byte, rev int64) (*Entry, error) {
	var e Entry
	if err := unmarshalFast(val, &e); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, strings.TrimPrefix(string(k), v.s.opts.Prefix), err)
	}
	if err := v.checkKey(string(k), &e); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, strings.TrimPrefix(string(k), v.s.opts.Prefix), err)
	}
	if err := e.checkType(); err != nil {
		// A type this binary does not know would be taken for a file
		// (or worse) by everything downstream.
		return nil, cairn.E(op, cairn.Corrupt, strings.TrimPrefix(string(k), v.s.opts.Prefix), err)
	}
	e.Rev = rev
	return &e, nil
}

// checkKey checks that entry e may be stored at key k.
func (v *Vol) checkKey(k string, e *Entry) error {
	parent, name, ok := v.parseEntryKey(k)
	if !ok {
		return errors.New("not an entry key")
	}
	if parent == 0 && name != "" {
		// Only the root record ("root") has parent 0: no directory has
		// inode 0, so an entry key naming it is not one cairn writes.
		return errors.New("entry key in directory 0000000000000000")
	}
	if parent == 0 {
		if e.Name != "" || e.Parent != 0 {
			return fmt.Errorf("root record names %q in directory %s", e.Name, inoHex(e.Parent))
		}
		return nil
	}
	if err := checkName(name); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	if e.Name != name {
		return fmt.Errorf("record names %q, its key %q", e.Name, name)
	}
	if e.Parent != parent {
		return fmt.Errorf("record's parent is %s, its key's %s", inoHex(e.Parent), inoHex(parent))
	}
	return nil
}

// checkName rejects what can never be one element of a path. (Length and
// UTF-8 are checked where names come in, by vpath.ValidName; records
// written before those checks still read.)
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case name == "." || name == "..":
		return fmt.Errorf("name %q", name)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("name %q contains '/' or NUL", name)
	}
	return nil
}

// checkNew checks an entry about to be written and, for a special file,
// raises the realm's record format to 2 first.
func (v *Vol) checkNew(ctx context.Context, op string, e *Entry) error {
	if err := e.checkType(); err != nil {
		return cairn.E(op, cairn.Invalid, e.Name, err)
	}
	if e.Type.Special() {
		return v.s.UseFormat(ctx, 2)
	}
	return nil
}

// Root returns the root directory's entry.
func (v *Vol) Root(ctx context.Context) (*Entry, error) { return v.Get(ctx, 0, "") }

// Get returns the entry name in directory parent (parent 0: the root).
func (v *Vol) Get(ctx context.Context, parent uint64, name string) (*Entry, error) {
	e, err := v.get(ctx, parent, name)
	if err != nil {
		return nil, err
	}
	path := v.childPath(parent, name)
	if err := v.authRead(ctx, "lookup", path); err != nil {
		return nil, err
	}
	v.notePath(e, path)
	return e, nil
}

func (v *Vol) get(ctx context.Context, parent uint64, name string) (*Entry, error) {
	if lc := v.offlineCopy(ctx, nil); lc != nil {
		return lc.Get(parent, name)
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	k := v.entryKey(parent, name)
	resp, err := v.s.cli.Get(ctx, k)
	if err != nil {
		err = etcdErr("lookup", name, err)
		if lc := v.offlineCopy(ctx, err); lc != nil {
			return lc.Get(parent, name)
		}
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("lookup", cairn.NotFound, name, nil)
	}
	return v.decode("lookup", resp.Kvs[0].Key, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

// Lookup walks parts from the root. Errors name the path walked so far.
func (v *Vol) Lookup(ctx context.Context, parts []string) (*Entry, error) {
	e, err := v.Root(ctx)
	if err != nil {
		return nil, err
	}
	for i, name := range parts {
		p := v.V.Name + ":/" + strings.Join(parts[:i+1], "/")
		if !e.IsDir() {
			return nil, cairn.E("lookup", cairn.NotDir, v.V.Name+":/"+strings.Join(parts[:i], "/"), nil)
		}
		e, err = v.Get(ctx, e.Ino, name)
		if err != nil {
			if errors.Is(err, cairn.ErrNotFound) {
				return nil, cairn.E("lookup", cairn.NotFound, p, nil)
			}
			return nil, err
		}
	}
	return e, nil
}

// ReadDir returns the entries of directory ino, sorted by name.
func (v *Vol) ReadDir(ctx context.Context, ino uint64) ([]Entry, error) {
	return v.ReadDirSkip(ctx, ino, nil)
}

// ReadDirAt is ReadDir that also returns the etcd revision the listing
// was read at: the directory held exactly these entries then, so a change
// of it at or before that revision (reported late by a watch) is already
// in the listing. A cache kept current by WatchEntries needs it to tell a
// late change from a new one.
func (v *Vol) ReadDirAt(ctx context.Context, ino uint64) ([]Entry, int64, error) {
	return v.readDir(ctx, ino, nil)
}

// ReadDirSkip is ReadDir that, if bad is not nil, passes each record it
// cannot decode (a Corrupt error naming its key) to bad and goes on with
// the others, instead of failing.
func (v *Vol) ReadDirSkip(ctx context.Context, ino uint64, bad func(error)) ([]Entry, error) {
	out, _, err := v.readDir(ctx, ino, bad)
	return out, err
}

func (v *Vol) readDir(ctx context.Context, ino uint64, bad func(error)) ([]Entry, int64, error) {
	if lc := v.offlineCopy(ctx, nil); lc != nil {
		out, err := v.filterRead(ctx, ino, lc.ReadDir(ino))
		return out, lc.State().Rev, err
	}
	out, at, err := v.readDirEtcd(ctx, ino, bad)
	if err != nil {
		if lc := v.offlineCopy(ctx, err); lc != nil {
			outIn, errIn := v.filterRead(ctx, ino, lc.ReadDir(ino))
			return outIn, lc.State().Rev, errIn
		}
		return out, at, err
	}
	if lc := v.LocalCopy(); lc != nil {
		lc.ListedDir(ino, out, at)
	}
	out, err = v.filterRead(ctx, ino, out)
	return out, at, err
}

func (v *Vol) readDirEtcd(ctx context.Context, ino uint64, bad func(error)) ([]Entry, int64, error) {
	var out []Entry
	at, err := v.s.scanAt(ctx, "read dir", v.dirPrefix(ino), func(k, val []byte, rev int64) error {
		e, err := v.decode("read dir", k, val, rev)
		if err != nil {
			if bad != nil && cairn.KindOf(err) == cairn.Corrupt {
				bad(err)
				return nil
			}
			return err
		}
		out = append(out, *e)
		return nil
	})
	sortEntries(out)
	return out, at, err
}

// EntryRevs returns the etcd ModRevision of each entry of directory ino,
// by name, and the ID of the etcd cluster they were read from, with a
// keys-only range read: no record is sent or decoded. An entry whose
// ModRevision, in the same cluster, is one a caller saw is the record it
// saw, unchanged (a put's files cache: doc/format.md "Files cache").
// Offline, the revisions come from the volume's local copy, and the
// cluster ID is 0.
func (v *Vol) EntryRevs(ctx context.Context, ino uint64) (map[string]int64, uint64, error) {
	if lc := v.offlineCopy(ctx, nil); lc != nil {
		return entryRevs(lc.ReadDir(ino)), 0, nil
	}
	prefix := v.dirPrefix(ino)
	revs := map[string]int64{}
	_, cluster, err := v.s.scanOpts(ctx, "read dir", prefix, 10000, func(k, _ []byte, rev int64) error {
		revs[string(k[len(prefix):])] = rev
		return nil
	}, clientv3.WithKeysOnly())
	if err != nil {
		if lc := v.offlineCopy(ctx, err); lc != nil {
			return entryRevs(lc.ReadDir(ino)), 0, nil
		}
		return nil, 0, err
	}
	return revs, cluster, nil
}

// entryRevsBatch is the most directories EntryRevsOf reads in one
// transaction (etcd refuses more than 128 operations in one), and
// entryRevsLimit the most entries it reads of each: a larger directory is
// read by EntryRevs, in pages.
const (
	entryRevsBatch = 64
	entryRevsLimit = 10000
)

// EntryRevsOf is EntryRevs for several directories: one etcd transaction
// of keys-only range reads per 64 directories, instead of a round trip
// each.
func (v *Vol) EntryRevsOf(ctx context.Context, inos []uint64) (map[uint64]map[string]int64, uint64, error) {
	out := make(map[uint64]map[string]int64, len(inos))
	if v.offlineCopy(ctx, nil) != nil {
		for _, ino := range inos {
			revs, _, err := v.EntryRevs(ctx, ino)
			if err != nil {
				return nil, 0, err
			}
			out[ino] = revs
		}
		return out, 0, nil
	}
	var cluster uint64
	for len(inos) > 0 {
		n := min(len(inos), entryRevsBatch)
		batch := inos[:n]
		inos = inos[n:]
		ops := make([]clientv3.Op, len(batch))
		for i, ino := range batch {
			p := v.dirPrefix(ino)
			ops[i] = clientv3.OpGet(p, clientv3.WithRange(clientv3.GetPrefixRangeEnd(p)), clientv3.WithKeysOnly(), clientv3.WithLimit(entryRevsLimit))
		}
		cctx, cancel := v.s.opCtx(ctx)
		resp, err := v.s.cli.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, 0, etcdErr("read dir", v.dirPrefix(batch[0]), err)
		}
		cluster = resp.Header.ClusterId
		for i, ino := range batch {
			rr := resp.Responses[i].GetResponseRange()
			if rr == nil || rr.More {
				revs, c, err := v.EntryRevs(ctx, ino)
				if err != nil {
					return nil, 0, err
				}
				out[ino], cluster = revs, c
				continue
			}
			p := v.dirPrefix(ino)
			revs := make(map[string]int64, len(rr.Kvs))
			for _, kv := range rr.Kvs {
				revs[string(kv.Key[len(p):])] = kv.ModRevision
			}
			out[ino] = revs
		}
	}
	return out, cluster, nil
}

func entryRevs(ents []Entry) map[string]int64 {
	revs := make(map[string]int64, len(ents))
	for _, e := range ents {
		revs[e.Name] = e.Rev
	}
	return revs
}

// Create adds a new directory, symlink, (empty, versionless) file or
// special file (FIFO, socket, device: record format 2, raised first by
// UseFormat) named e.Name in directory parent. It assigns e.Ino and fails with Exist if the
// name is taken. The parent must still be where the caller found it.
func (v *Vol) Create(ctx context.Context, parent *Entry, e Entry) (*Entry, error) {
	ne, _, err := v.create(ctx, parent, e, false)
	return ne, err
}

// CreateLocked is Create for a file that is opened for writing at once: it
// also takes the new file's writer lock (see Lock), in the same
// transaction, so the create and the lock are one write to etcd's log
// instead of two. When the lock cannot be had at once (another goroutine of
// this process waits for or holds the name's lock, or another process does:
// a writer that creates the file by its commit holds the lock of a name
// with no entry) it creates the entry alone and returns a nil Lock: the
// caller then takes the lock with Lock, as it would have.
func (v *Vol) CreateLocked(ctx context.Context, parent *Entry, e Entry) (*Entry, *Lock, error) {
	return v.create(ctx, parent, e, true)
}

func (v *Vol) create(ctx context.Context, parent *Entry, e Entry, locked bool) (*Entry, *Lock, error) {
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offCreate(ctx, lc, l, parent, e, locked, false)
	}
	if err := v.offlineWrite("create", e.Name); err != nil {
		return nil, nil, err
	}
	if !parent.IsDir() {
		return nil, nil, cairn.E("create", cairn.NotDir, parent.Name, nil)
	}
	if err := v.checkNew(ctx, "create", &e); err != nil {
		return nil, nil, err
	}
	now := time.Now().UnixNano()
	e.Parent = parent.Ino
	if e.Ctime == 0 {
		e.Ctime = now
	}
	if e.Mtime == 0 {
		e.Mtime = now
	}
	if e.Ino == 0 || !replaying(ctx) {
		e.Ino = randomIno()
	}
	b, _ := json.Marshal(e)
	k := v.keyOf(&e)
	pk := v.keyOf(parent)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(pk), ">", 0),
	}
	path := v.childPath(parent.Ino, e.Name)
	acmps, err := v.authWrite(ctx, "create", path, false)
	if err != nil {
		return nil, nil, err
	}
	cmps = append(cmps, acmps...)
	tops, touched := v.touchOps(now, nil, parent)
	ops := append([]clientv3.Op{clientv3.OpPut(k, string(b))}, tops...)
	var lk string
	var release func()
	var sess *concurrency.Session
	if locked {
		lk = v.lockKey(parent.Ino, e.Name)
		if rel, ok := v.s.local.tryLock(lk); ok {
			var errIn error
			if sess, errIn = v.s.sess(ctx); errIn != nil {
				rel()
				return nil, nil, errIn
			}
			release = rel
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(lk), "=", 0))
			ops = append(ops, clientv3.OpPut(lk, lockHolder(), clientv3.WithLease(sess.Lease())))
		}
	}
	ops = append(ops, replayOps(ctx)...)
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).
		Else(clientv3.OpGet(k), clientv3.OpGet(pk, clientv3.WithCountOnly())).Commit()
	if err != nil {
		if release != nil {
			release()
		}
		return nil, nil, etcdErr("create", e.Name, err)
	}
	if !resp.Succeeded {
		if release != nil {
			release()
		}
		if v.aclStale(ctx, acmps) {
			// Decided on ACLs that changed since: decide again.
			return v.create(ctx, parent, e, locked)
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			old, derr := v.decode("create", kvs[0].Key, kvs[0].Value, kvs[0].ModRevision)
			if derr != nil {
				return nil, nil, derr
			}
			return old, nil, cairn.E("create", cairn.Exist, e.Name, nil)
		}
		if resp.Responses[1].GetResponseRange().Count > 0 && release != nil {
			// Only the lock was in the way: create alone.
			return v.create(ctx, parent, e, false)
		}
		return nil, nil, cairn.E("create", cairn.NotFound, parent.Name, errors.New("parent directory was removed"))
	}
	e.Rev = resp.Header.Revision
	v.notePath(&e, path)
	touchedDirs(resp, 1, touched)
	var l *Lock
	if release != nil {
		l = &Lock{s: v.s, key: lk, rev: resp.Header.Revision, sess: sess, release: release}
	}
	return &e, l, nil
}

// MkdirAll makes sure every directory of parts exists and returns the last.
// Existing directories are kept as they are; a file in the way is NotDir.
func (v *Vol) MkdirAll(ctx context.Context, parts []string, mode, uid, gid uint32) (*Entry, error) {
	e, err := v.Root(ctx)
	if err != nil {
		return nil, err
	}
	for i, name := range parts {
		p := v.V.Name + ":/" + strings.Join(parts[:i+1], "/")
		next, err := v.Get(ctx, e.Ino, name)
		if errors.Is(err, cairn.ErrNotFound) {
			next, err = v.Create(ctx, e, Entry{Name: name, Type: TypeDir, Mode: mode, UID: uid, GID: gid})
			if errors.Is(err, cairn.ErrExist) && next != nil {
				err = nil // someone else made it first
			}
		}
		if err != nil {
			return nil, relabel(err, p)
		}
		if !next.IsDir() {
			return nil, cairn.E("mkdir", cairn.NotDir, p, nil)
		}
		e = next
	}
	return e, nil
}

// relabel sets the path of a cairn error to p when it names only a bare name.
func relabel(err error, p string) error {
	var ce *cairn.Error
	if errors.As(err, &ce) {
		return cairn.E(ce.Op, ce.Kind, p, ce.Err)
	}
	return err
}

// Commit describes a new version of a regular file.
type Commit struct {
	Version Version
	Mode    uint32
	UID     uint32
	GID     uint32
	// Gen is the GC fence generation read (with Service.WriteGen) before any
	// of the version's objects were written. If a garbage collection ran
	// since, the commit fails with ErrFenced and the caller must write its
	// objects again.
	Gen int64
	// Lock, if not nil, must still be held for the commit to succeed; a
	// successful commit releases it.
	Lock *Lock
	// Cur, if not nil, is the file's entry as the caller just read it (nil
	// entry: absent), saving a read; a stale one only costs a retry.
	Cur *Known
	// KeepAttrs: an existing file keeps its own mode and owner (Mode, UID
	// and GID apply only to a file the commit creates), so that a chmod or
	// chown racing the commit is not undone by its retry.
	KeepAttrs bool
	// Unlocked, for a commit without a Lock: it succeeds only while nobody
	// holds the file's writer lock, and fails with ErrLocked otherwise (a
	// writer that could not wait for the lock, such as the upload queue's
	// drain, leaves the version for later instead of committing under
	// someone else's lock).
	Unlocked bool
	// Ino, if not zero, is the file's inode number: the commit creates
	// the file under it (a new file a write-back mount showed before its
	// first commit, under the number it gave it), or commits onto the
	// file of that number; a name that holds another file fails with
	// Kind Exist (and that entry).
	Ino uint64
	// Ctime, if not zero, is the change time (unix ns) to record instead
	// of the commit's own (never before the file's): a commit queued by a
	// mount records when the file changed there, which the mount already
	// showed.
	Ctime int64
	// Offload, if set, says the version's data was written to the one
	// store it names instead of Offload.Home, which was not awake: the
	// commit records an offload entry (offload.go) in its own
	// transaction, so that a committed offloaded version always has one.
	Offload *OffloadTo
}

// ErrLocked is returned (wrapped, Kind Conflict) by CommitVersion when
// Commit.Unlocked is set and another writer holds the file's lock.
var ErrLocked = errors.New("another writer holds this file's lock")

// Known wraps an entry read earlier (nil: the name was absent).
type Known struct{ entry *Entry }

// KnownEntry returns a Known for e (nil e: known absent).
func KnownEntry(e *Entry) *Known { return &Known{entry: e} }

// ErrFenced is returned (wrapped) by CommitVersion when a garbage collection
// ran after the writer read its generation: the objects it wrote may have
// been collected, so it must write them again and retry.
var ErrFenced = errors.New("a garbage collection ran during the write")

// CommitVersion makes c.Version the current version of the file name in
// directory parent, creating the file if needed, atomically (compare-and-swap
// on the file's record). It keeps the newest KeepVersions versions and
// returns the ones it dropped. Directories and symlinks are refused.
func (v *Vol) CommitVersion(ctx context.Context, parent *Entry, name string, c Commit) (*Entry, []Version, error) {
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offCommit(ctx, lc, l, parent, name, c)
	}
	if err := v.offlineWrite("commit", name); err != nil {
		return nil, nil, err
	}
	if c.Lock != nil && c.Lock.offline {
		// Taken offline: this process's alone, nothing in etcd to release.
		c.Lock.markReleased()
		c.Lock = nil
	}
	t0 := time.Now()
	e, dropped, err := v.commitVersion(ctx, parent, name, c)
	metrics.Default().ObserveCommit(t0, err) // cairn_commit_duration_seconds
	return e, dropped, err
}

func (v *Vol) commitVersion(ctx context.Context, parent *Entry, name string, c Commit) (*Entry, []Version, error) {
	if !parent.IsDir() {
		return nil, nil, cairn.E("commit", cairn.NotDir, parent.Name, nil)
	}
	for attempt := 0; ; attempt++ {
		var cur *Entry
		var err error
		if attempt == 0 && c.Cur != nil {
			cur, c.Cur = c.Cur.entry, nil
		} else {
			cur, err = v.Get(ctx, parent.Ino, name)
			if err != nil && !errors.Is(err, cairn.ErrNotFound) {
				return nil, nil, err
			}
		}
		if c.Ino != 0 && cur != nil && cur.Ino != c.Ino {
			return cur, nil, cairn.E("commit", cairn.Exist, name, errors.New("the name holds another file"))
		}
		next, cmps, dropped, err := v.nextVersion(parent, name, cur, &c)
		if err != nil {
			return nil, nil, err
		}
		k := v.entryKey(parent.Ino, name)
		cmps = append(cmps, v.s.fenceCmps(c.Gen)...)
		acmps, err := v.authWrite(ctx, "commit", v.childPath(parent.Ino, name), false)
		if err != nil {
			return nil, nil, err
		}
		cmps = append(cmps, acmps...)
		b, _ := json.Marshal(next)
		ops := []clientv3.Op{clientv3.OpPut(k, string(b))}
		var offloaded int64
		if ver := next.Current(); c.Offload != nil && (cur == nil || cur.Current() == nil || cur.Current().N != ver.N) {
			// A version added (not the same content again) whose data
			// went elsewhere than its home: its offload entry, in this
			// transaction.
			op, oerr := v.offloadOp(c.Offload, &next, *ver)
			if oerr != nil {
				return nil, nil, oerr
			}
			ops = append(ops, op)
			offloaded = ver.Size
		}
		if cur != nil && len(cur.Links) > 1 {
			// The version belongs to the inode: every name's copy gets it.
			others, cerr := v.copies(ctx, "commit", cur)
			if errors.Is(cerr, cairn.ErrConflict) && attempt <= 50 {
				continue
			}
			if cerr != nil {
				return nil, nil, cerr
			}
			ccmps, cops := v.copyOps(&next, others)
			cmps, ops = append(cmps, ccmps...), append(ops, cops...)
		}
		if c.Lock != nil {
			// The commit releases the lock in the same transaction.
			cmps = append(cmps, c.Lock.owned())
			ops = append(ops, clientv3.OpDelete(c.Lock.key))
		} else if c.Unlocked {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(v.lockKey(parent.Ino, name)), "=", 0))
		}
		ops = append(ops, replayOps(ctx)...)
		cctx, cancel := v.s.opCtx(ctx)
		resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
		cancel()
		if err != nil {
			return nil, nil, etcdErr("commit", name, err)
		}
		if resp.Succeeded {
			if c.Lock != nil {
				c.Lock.markReleased()
			}
			next.Rev = resp.Header.Revision
			metrics.Default().OffloadBytes.Add(float64(offloaded)) // cairn_offload_bytes_total
			return &next, dropped, nil
		}
		// Find out which condition failed.
		if gen, err := v.s.currentGen(ctx); err == nil && gen != c.Gen {
			return nil, nil, cairn.E("commit", cairn.Conflict, name, ErrFenced)
		}
		if c.Lock != nil && c.Lock.Lost() {
			return nil, nil, cairn.E("commit", cairn.Conflict, name, errors.New("writer lock lost (lease expired)"))
		}
		if c.Lock == nil && c.Unlocked {
			if held, err := v.lockHeld(ctx, parent.Ino, name); err != nil {
				return nil, nil, err
			} else if held {
				return nil, nil, cairn.E("commit", cairn.Conflict, name, ErrLocked)
			}
		}
		if parent.Parent != 0 {
			if pe, perr := v.Get(ctx, parent.Parent, parent.Name); perr != nil || pe.Ino != parent.Ino {
				return nil, nil, cairn.E("commit", cairn.NotFound, name, errors.New("parent directory was removed or moved"))
			}
		}
		if attempt > 50 {
			return nil, nil, cairn.E("commit", cairn.Conflict, name, errors.New("too many concurrent changes"))
		}
		// A concurrent attribute change or commit won: read again and retry.
	}
}

// nextVersion is the entry a commit of c onto cur (the file's entry as
// read; nil: absent) writes, the compares that make it valid (the name
// holds cur, the directory is there; not the GC fence, the writer lock nor
// the copies of other names) and the versions it drops.
func (v *Vol) nextVersion(parent *Entry, name string, cur *Entry, c *Commit) (Entry, []clientv3.Cmp, []Version, error) {
	now := time.Now().UnixNano()
	if c.Ctime != 0 {
		now = c.Ctime
		if cur != nil {
			now = max(now, cur.Ctime)
		}
	}
	var next Entry
	var cmps []clientv3.Cmp
	k := v.entryKey(parent.Ino, name)
	if cur == nil {
		ino := c.Ino
		if ino == 0 {
			ino = randomIno()
		}
		next = Entry{Name: name, Parent: parent.Ino, Ino: ino, Type: TypeFile,
			Mode: c.Mode, UID: c.UID, GID: c.GID, Ctime: now}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(v.keyOf(parent)), ">", 0))
	} else {
		if cur.Type != TypeFile {
			kind := cairn.IsDir
			if cur.Type != TypeDir {
				kind = cairn.Exist
			}
			return Entry{}, nil, nil, cairn.E("commit", kind, name, errors.New("not a regular file"))
		}
		next = *cur
		next.Versions = append([]Version(nil), cur.Versions...)
		if !c.KeepAttrs {
			next.Mode, next.UID, next.GID = c.Mode, c.UID, c.GID
		}
		next.Ctime = now
		// The directory must still be where the caller found it: a
		// trashed directory keeps its entries, and a commit into one
		// would succeed unseen.
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", cur.Rev),
			clientv3.Compare(clientv3.CreateRevision(v.keyOf(parent)), ">", 0))
	}
	ver := c.Version
	ver.N = 1
	last := next.Current()
	if last != nil {
		ver.N = last.N + 1
	}
	if ver.Committed == 0 {
		ver.Committed = now
	}
	if last != nil && ver.Digest != "" && ver.Digest == last.Digest && ver.Size == last.Size {
		// Same content: refresh the current version, add none.
		last.Mtime, last.Src = ver.Mtime, ver.Src
		ver = *last
	} else {
		next.Versions = append(next.Versions, ver)
	}
	var dropped []Version
	if keep := v.V.KeepVersions; keep > 0 && len(next.Versions) > keep {
		dropped = append(dropped, next.Versions[:len(next.Versions)-keep]...)
		next.Versions = next.Versions[len(next.Versions)-keep:]
	}
	next.Size, next.Mtime = ver.Size, ver.Mtime
	return next, cmps, dropped, nil
}

// Update replaces an entry's attributes (mode, uid, gid, mtime, target)
// with a compare-and-swap on the revision it was read at.
func (v *Vol) Update(ctx context.Context, e *Entry) (*Entry, error) {
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offUpdate(ctx, lc, l, e)
	}
	if err := v.offlineWrite("update", e.Name); err != nil {
		return nil, err
	}
	if e.Rev == 0 {
		// ModRevision 0 would also match a name with no record at all.
		return nil, cairn.E("update", cairn.Invalid, e.Name, errors.New("an entry not read from the metadata (no revision)"))
	}
	if err := v.checkNew(ctx, "update", e); err != nil {
		return nil, err
	}
	n := *e
	n.Ctime = time.Now().UnixNano()
	b, _ := json.Marshal(n)
	k := v.keyOf(e)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", e.Rev)}
	acmps, err := v.authWrite(ctx, "update", v.childPath(e.Parent, e.Name), false)
	if err != nil {
		return nil, err
	}
	cmps = append(cmps, acmps...)
	ops := []clientv3.Op{clientv3.OpPut(k, string(b))}
	if len(e.Links) > 1 {
		// Attributes belong to the inode: every name's copy gets them.
		others, errIn := v.copies(ctx, "update", e)
		if errIn != nil {
			return nil, errIn
		}
		ccmps, cops := v.copyOps(&n, others)
		cmps, ops = append(cmps, ccmps...), append(ops, cops...)
	}
	ops = append(ops, replayOps(ctx)...)
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, etcdErr("update", e.Name, err)
	}
	if !resp.Succeeded {
		return nil, cairn.E("update", cairn.Conflict, e.Name, errors.New("changed concurrently"))
	}
	n.Rev = resp.Header.Revision
	return &n, nil
}

// ---- remove, trash, restore ----

// Remove moves the entry name of directory parent to the trash. A non-empty
// directory needs recursive. path is recorded for people and restore. A
// name of a file that has others is unlinked instead (see unlink): the
// file lives on, nothing is trashed, and the TrashItem is nil.
func (v *Vol) Remove(ctx context.Context, parent *Entry, name, path string, recursive bool) (*TrashItem, error) {
	return v.RemoveKnown(ctx, parent, name, path, recursive, nil)
}

// RemoveKnown is Remove with the entry as the caller knows it (e, from a
// cache kept current by a watch), saving its read; nil: read it. A stale
// one fails the remove with Conflict, and the caller tries again without.
func (v *Vol) RemoveKnown(ctx context.Context, parent *Entry, name, path string, recursive bool, e *Entry) (*TrashItem, error) {
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offRemove(ctx, lc, l, parent, name, path, recursive)
	}
	if err := v.offlineWrite("remove", path); err != nil {
		return nil, err
	}
	if e == nil || e.Parent != parent.Ino || e.Name != name {
		var err error
		if e, err = v.Get(ctx, parent.Ino, name); err != nil {
			return nil, relabel(err, path)
		}
	}
	now := time.Now().UnixNano()
	acmps, err := v.authWrite(ctx, "remove", v.childPath(parent.Ino, name), e.IsDir())
	if err != nil {
		return nil, err
	}
	if e.Nlink() > 1 {
		return nil, v.unlink(ctx, parent, e, path, now, acmps)
	}
	item := TrashItem{ID: fmt.Sprintf("%016x-%s", now, randomID()[:8]), Path: path, Deleted: now, Entry: *e}
	b, _ := json.Marshal(item)
	k := v.keyOf(e)
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", e.Rev)}, acmps...)
	if e.IsDir() && !recursive {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(v.dirPrefix(e.Ino)), "=", 0).WithPrefix())
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	tops, touched := v.touchOps(now, map[string]bool{k: true}, parent)
	ops := append([]clientv3.Op{clientv3.OpDelete(k), clientv3.OpPut(v.base+"trash/"+item.ID, string(b))}, tops...)
	ops = append(ops, replayOps(ctx)...)
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, etcdErr("remove", path, err)
	}
	if !resp.Succeeded {
		if e.IsDir() && !recursive {
			if kids, err := v.ReadDir(ctx, e.Ino); err == nil && len(kids) > 0 {
				return nil, cairn.E("remove", cairn.NotEmpty, path, errors.New("use -r to remove a directory and its contents"))
			}
		}
		return nil, cairn.E("remove", cairn.Conflict, path, errors.New("changed concurrently; try again"))
	}
	touchedDirs(resp, 2, touched)
	return &item, nil
}

// unlink removes name e of a file that has other names: e's record goes,
// the others are rewritten without it (with ctime now), in one
// transaction; nothing goes to the trash, since the inode lives on under
// its other names (the last name's removal trashes it as any file's).
func (v *Vol) unlink(ctx context.Context, parent, e *Entry, path string, now int64, acmps []clientv3.Cmp) error {
	others, err := v.copies(ctx, "remove", e)
	if err != nil {
		return relabel(err, path)
	}
	cmps, ops := v.unlinkOps(e, others, now)
	cmps = append(cmps, acmps...)
	k := v.keyOf(e)
	at := len(ops)
	skip := map[string]bool{k: true}
	for _, o := range others {
		skip[v.keyOf(o)] = true
	}
	tops, touched := v.touchOps(now, skip, parent)
	ops = append(ops, tops...)
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return etcdErr("remove", path, err)
	}
	if !resp.Succeeded {
		return cairn.E("remove", cairn.Conflict, path, errors.New("changed concurrently; try again"))
	}
	touchedDirs(resp, at, touched)
	return nil
}

// Trash lists the removed entries, oldest first.
func (v *Vol) Trash(ctx context.Context) ([]TrashItem, error) {
	var out []TrashItem
	err := v.s.scan(ctx, "list trash", v.base+"trash/", func(k, val []byte, _ int64) error {
		var t TrashItem
		if err := unmarshalFast(val, &t); err != nil {
			return cairn.E("list trash", cairn.Corrupt, string(k), err)
		}
		out = append(out, t)
		return nil
	})
	if err != nil {
		return out, err
	}
	// Removed entries the principal may not read are not listed.
	sn, p, err := v.readSnap(ctx)
	if sn == nil || err != nil || !sn.named {
		return out, err
	}
	kept := out[:0]
	for _, t := range out {
		if tp := v.trashPath(&t); tp != "" {
			if have, _ := sn.Access(sn.user, p.Device, tp); have.Allows(PermRead) {
				kept = append(kept, t)
			}
		}
	}
	return kept, nil
}

// trashPath is where trash item t was in the volume ("" if its Path, kept
// for people as VOLUME:/a/b, does not say).
func (v *Vol) trashPath(t *TrashItem) string {
	p, ok := strings.CutPrefix(t.Path, v.V.Name+":")
	if !ok {
		return ""
	}
	if pIn, err := CleanACLPath(p); err == nil {
		return pIn
	}
	return ""
}

// RestoreTrash puts trash item id back as name in directory parent.
func (v *Vol) RestoreTrash(ctx context.Context, id string, parent *Entry, name string) (*Entry, error) {
	if err := v.offlineWrite("restore", name); err != nil {
		return nil, err
	}
	var item TrashItem
	tk := v.base + "trash/" + id
	trev, err := v.s.getJSON(ctx, "restore", tk, &item)
	if err != nil {
		return nil, err
	}
	if !parent.IsDir() {
		return nil, cairn.E("restore", cairn.NotDir, parent.Name, nil)
	}
	e := item.Entry
	e.Parent, e.Name, e.Ctime = parent.Ino, name, time.Now().UnixNano()
	b, _ := json.Marshal(e)
	k := v.keyOf(&e)
	// Restoring needs rw where it was (its ACLs and those below) and
	// where it goes: else a removed file of a denied path could be put
	// back in a readable one.
	if _, errIn := v.authWrite(ctx, "restore", v.trashPath(&item), e.IsDir()); errIn != nil {
		return nil, errIn
	}
	acmps, err := v.authWrite(ctx, "restore", v.childPath(parent.Ino, name), e.IsDir())
	if err != nil {
		return nil, err
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(append([]clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(tk), "=", trev),
		clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(v.keyOf(parent)), ">", 0),
	}, acmps...)...).Then(clientv3.OpDelete(tk), clientv3.OpPut(k, string(b))).Commit()
	if err != nil {
		return nil, etcdErr("restore", item.Path, err)
	}
	if !resp.Succeeded {
		if _, err := v.Get(ctx, parent.Ino, name); err == nil {
			return nil, cairn.E("restore", cairn.Exist, item.Path, errors.New("a file of that name exists; restore to another name"))
		}
		return nil, cairn.E("restore", cairn.Conflict, item.Path, errors.New("changed concurrently; try again"))
	}
	e.Rev = resp.Header.Revision
	return &e, nil
}

// PurgeTrash deletes trash items removed before cutoff, with their whole
// subtrees. It returns how many items it purged. Subtrees go first and the
// trash record last, so a crash part way leaves the item to purge again.
func (v *Vol) PurgeTrash(ctx context.Context, cutoff time.Time) (int, error) {
	items, err := v.Trash(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, it := range items {
		if it.Deleted >= cutoff.UnixNano() {
			continue
		}
		if it.Entry.IsDir() {
			if err := v.deleteSubtree(ctx, it.Entry.Ino); err != nil {
				return n, err
			}
		}
		if err := v.deleteXattrs(ctx, it.Entry.Ino); err != nil {
			return n, err
		}
		cctx, cancel := v.s.opCtx(ctx)
		_, err := v.s.cli.Delete(cctx, v.base+"trash/"+it.ID)
		cancel()
		if err != nil {
			return n, etcdErr("purge trash", it.Path, err)
		}
		n++
	}
	return n, nil
}

func (v *Vol) deleteSubtree(ctx context.Context, ino uint64) error {
	kids, err := v.ReadDir(ctx, ino)
	if err != nil {
		return err
	}
	for _, k := range kids {
		if k.IsDir() {
			if err = v.deleteSubtree(ctx, k.Ino); err != nil {
				return err
			}
		}
		if k.Nlink() > 1 {
			// A file with names outside the subtree lives on there.
			kept, derr := v.dropName(ctx, ino, k.Name)
			if derr != nil {
				return derr
			}
			if kept {
				continue
			}
		}
		if err = v.deleteXattrs(ctx, k.Ino); err != nil {
			return err
		}
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	_, err = v.s.cli.Delete(cctx, v.dirPrefix(ino), clientv3.WithPrefix())
	return etcdErr("purge trash", "", err)
}

// ---- rename ----

// Rename moves src (name srcName in srcParent) to dstName in dstParent.
// An existing destination directory must be empty and is replaced by a
// directory only. The caller checks that a directory is not moved below
// itself.
//
// Versions follow the path: a file renamed over an existing file (an
// editor's save: a temporary file renamed over the original) becomes the
// destination's next version(s), in the same transaction. The name then
// has the source's inode, mode and owner (as on a local disk), the
// destination's kept versions followed by the source's, renumbered after
// them (oldest first; a source whose first version has the content of the
// destination's current one adds no version for it), at most
// KeepVersions of them; nothing goes to the trash, and the replaced
// inode's extended attributes go. A source with no version (an empty file
// nobody is about to commit: see RenamePending) replaces the destination,
// which goes to the trash, as does a file replaced by a symlink.
//
// Hard links: a name of a file with several names moves in every copy's
// Links. Renamed onto another name of its own inode, nothing happens (as
// POSIX says). A file with several names, or a destination with several,
// never follows the path: a destination with other names is unlinked
// (its inode and versions live on under them) and the source moves in
// with its own history; a source with other names replacing a file of
// one name sends that file to the trash.
func (v *Vol) Rename(ctx context.Context, srcParent *Entry, srcName string, dstParent *Entry, dstName, dstPath string) error {
	_, err := v.RenameKnown(ctx, srcParent, srcName, nil, dstParent, dstName, dstPath, nil)
	return err
}

// RenamePending is RenameKnown for a source file whose content the caller
// is about to commit (written, its commit queued or still to come at its
// close): a source with no version yet takes the destination's history
// too, so that its commit, which lands under the new name, is the next
// version of it. Until then the name's current version is the
// destination's.
func (v *Vol) RenamePending(ctx context.Context, srcParent *Entry, srcName string, src *Entry, dstParent *Entry, dstName, dstPath string, known *Known) (*Entry, error) {
	return v.rename(ctx, srcParent, srcName, src, dstParent, dstName, dstPath, known, renameOpts{pending: true})
}

// RenameKnown is Rename with the source's entry (src) and the
// destination's (dst: known present or absent) as the caller knows them,
// from a cache kept current by a watch, saving their reads; nil: read
// them. The rename compares both with what is current: a stale one
// fails it with Conflict, and the caller tries again without.
//
// It returns the entry the destination name holds after the rename, with
// the rename's revision (a cache keeps it: the mount's entry cache), or
// nil when the rename did nothing (onto another name of the same inode).
func (v *Vol) RenameKnown(ctx context.Context, srcParent *Entry, srcName string, src *Entry, dstParent *Entry, dstName, dstPath string, known *Known) (*Entry, error) {
	return v.rename(ctx, srcParent, srcName, src, dstParent, dstName, dstPath, known, renameOpts{})
}

// RenameNoReplace is RenameKnown that never replaces (renameat2's
// RENAME_NOREPLACE): the destination's absence is part of the rename's
// compare-and-swap, so a name made meanwhile by anyone is never replaced.
// A destination present fails it with Kind Exist; a stale src with
// Conflict.
func (v *Vol) RenameNoReplace(ctx context.Context, srcParent *Entry, srcName string, src *Entry, dstParent *Entry, dstName, dstPath string) (*Entry, error) {
	return v.rename(ctx, srcParent, srcName, src, dstParent, dstName, dstPath, KnownEntry(nil), renameOpts{noReplace: true})
}

// renameOpts are the variants of rename: noReplace (RenameNoReplace),
// pending (RenamePending).
type renameOpts struct{ noReplace, pending bool }

// FollowsPath reports whether src renamed over dst becomes dst's next
// version(s) (Rename; pending: RenamePending) rather than sending dst to
// the trash.
func FollowsPath(src, dst *Entry, pending bool) bool {
	return src.Type == TypeFile && dst.Type == TypeFile && src.Nlink() < 2 && dst.Nlink() < 2 &&
		(len(src.Versions) > 0 || len(dst.Versions) == 0 || pending)
}

// appendHistory returns the versions of a file renamed over another:
// older's, then newer's renumbered after them (newer's first one dropped
// if it has the content of older's current one, whose mtime and source
// it then takes), the newest keep of them (keep 0: all).
func appendHistory(older, newer []Version, keep int) []Version {
	out := append([]Version(nil), older...)
	var n uint64
	if len(out) > 0 {
		n = out[len(out)-1].N
	}
	for i, ver := range newer {
		if last := len(out) - 1; i == 0 && last >= 0 && ver.Digest != "" && ver.Digest == out[last].Digest && ver.Size == out[last].Size {
			out[last].Mtime, out[last].Src = ver.Mtime, ver.Src
			continue
		}
		n++
		ver.N = n
		out = append(out, ver)
	}
	if keep > 0 && len(out) > keep {
		out = out[len(out)-keep:]
	}
	return out
}

func (v *Vol) rename(ctx context.Context, srcParent *Entry, srcName string, src *Entry, dstParent *Entry, dstName, dstPath string, known *Known, o renameOpts) (*Entry, error) {
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offRename(ctx, lc, l, srcParent, srcName, dstParent, dstName, known, o)
	}
	if err := v.offlineWrite("rename", dstPath); err != nil {
		return nil, err
	}
	noReplace := o.noReplace
	if !dstParent.IsDir() {
		return nil, cairn.E("rename", cairn.NotDir, dstPath, nil)
	}
	var err error
	if src == nil || src.Parent != srcParent.Ino || src.Name != srcName {
		if src, err = v.Get(ctx, srcParent.Ino, srcName); err != nil {
			return nil, err
		}
	}
	var dst *Entry
	if known != nil {
		dst = known.entry
		if dst != nil && dst.Ino == src.Ino && src.Nlink() < 2 {
			// A rename onto itself is a no-op, but a cached destination
			// naming the source's inode is stale (a file of one name
			// cannot be at both): read it.
			known = nil
		}
	}
	if known == nil {
		if dst, err = v.Get(ctx, dstParent.Ino, dstName); err != nil && !errors.Is(err, cairn.ErrNotFound) {
			return nil, err
		}
	}
	if dst != nil && dst.Ino == src.Ino {
		// Onto itself, or onto another name of its inode: POSIX says
		// rename then does nothing.
		return nil, nil
	}
	now := time.Now().UnixNano()
	n := *src
	n.Parent, n.Name, n.Ctime = dstParent.Ino, dstName, now
	var srcOthers, dstOthers []*Entry
	if src.Nlink() > 1 {
		// The moved name changes in every copy's Links.
		if srcOthers, err = v.copies(ctx, "rename", src); err != nil {
			return nil, relabel(err, dstPath)
		}
		n.Links = make([]Link, 0, len(src.Links))
		for _, l := range src.Links {
			if l == linkOf(src) {
				l = Link{Parent: dstParent.Ino, Name: dstName}
			}
			n.Links = append(n.Links, l)
		}
		sortLinks(n.Links)
	}
	if dst != nil && dst.Nlink() > 1 {
		if dstOthers, err = v.copies(ctx, "rename", dst); err != nil {
			return nil, relabel(err, dstPath)
		}
	}
	follow := dst != nil && FollowsPath(src, dst, o.pending)
	if follow {
		n.Versions = appendHistory(dst.Versions, src.Versions, v.V.KeepVersions)
		if cur := n.Current(); cur != nil {
			n.Size, n.Mtime = cur.Size, cur.Mtime
		}
	}
	b, _ := json.Marshal(n)
	sk, dk := v.keyOf(src), v.entryKey(dstParent.Ino, dstName)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(sk), "=", src.Rev),
		clientv3.Compare(clientv3.CreateRevision(v.keyOf(dstParent)), ">", 0),
	}
	srcPath, newPath := v.childPath(srcParent.Ino, srcName), v.childPath(dstParent.Ino, dstName)
	acmps, err := v.authWrite(ctx, "rename", srcPath, src.IsDir())
	if err != nil {
		return nil, err
	}
	if _, errIn := v.authWrite(ctx, "rename", newPath, true); errIn != nil {
		return nil, errIn
	}
	cmps = append(cmps, acmps...)
	ops := []clientv3.Op{clientv3.OpDelete(sk), clientv3.OpPut(dk, string(b))}
	if dst == nil {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dk), "=", 0))
	} else {
		switch {
		case dst.IsDir() && !src.IsDir():
			return nil, cairn.E("rename", cairn.IsDir, dstPath, nil)
		case !dst.IsDir() && src.IsDir():
			return nil, cairn.E("rename", cairn.NotDir, dstPath, nil)
		case dst.IsDir():
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(v.dirPrefix(dst.Ino)), "=", 0).WithPrefix())
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(dk), "=", dst.Rev))
		if dst.Nlink() > 1 {
			// The destination name is unlinked from its inode, which lives
			// on under its other names (histories are not merged).
			d := *dst
			d.Links = withoutLink(dst.Links, linkOf(dst))
			d.Ctime = max(now, dst.Ctime)
			ccmps, cops := v.copyOps(&d, dstOthers)
			cmps, ops = append(cmps, ccmps...), append(ops, cops...)
		} else if follow {
			// The replaced inode is gone; its history lives on in n.
			ops = append(ops, clientv3.OpDelete(v.xattrPrefix(dst.Ino), clientv3.WithPrefix()))
		} else {
			item := TrashItem{ID: fmt.Sprintf("%016x-%s", time.Now().UnixNano(), randomID()[:8]), Path: dstPath, Deleted: time.Now().UnixNano(), Entry: *dst}
			tb, _ := json.Marshal(item)
			ops = append(ops, clientv3.OpPut(v.base+"trash/"+item.ID, string(tb)))
		}
	}
	if len(srcOthers) > 0 {
		ccmps, cops := v.copyOps(&n, srcOthers)
		cmps, ops = append(cmps, ccmps...), append(ops, cops...)
	}
	at := len(ops)
	tops, touched := v.touchOps(now, map[string]bool{sk: true, dk: true}, srcParent, dstParent)
	ops = append(ops, tops...)
	ops = append(ops, replayOps(ctx)...)
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, etcdErr("rename", dstPath, err)
	}
	if !resp.Succeeded {
		if dst != nil && dst.IsDir() {
			if kids, err := v.ReadDir(ctx, dst.Ino); err == nil && len(kids) > 0 {
				return nil, cairn.E("rename", cairn.NotEmpty, dstPath, nil)
			}
		}
		if noReplace {
			if _, err := v.Get(ctx, dstParent.Ino, dstName); err == nil {
				return nil, cairn.E("rename", cairn.Exist, dstPath, nil)
			}
		}
		return nil, cairn.E("rename", cairn.Conflict, dstPath, errors.New("changed concurrently; try again"))
	}
	touchedDirs(resp, at, touched)
	n.Rev = resp.Header.Revision
	v.notePath(&n, newPath)
	if n.IsDir() {
		v.movePaths(srcPath, newPath)
	}
	return &n, nil
}

// ---- walking everything (gc, stats, fsck) ----

// Walk calls fn for every entry of the volume: the root, every entry
// reachable or inside a trashed directory, and every trash item's own entry
// (with trashed true). Order is unspecified.
func (v *Vol) Walk(ctx context.Context, fn func(e *Entry, trashed bool) error) error {
	root, err := v.Root(ctx)
	if err != nil {
		return err
	}
	if err = fn(root, false); err != nil {
		return err
	}
	if err = v.s.scan(ctx, "walk", v.base+"e/", func(k, val []byte, rev int64) error {
		e, derr := v.decode("walk", k, val, rev)
		if derr != nil {
			return derr
		}
		return fn(e, false)
	}); err != nil {
		return err
	}
	items, err := v.Trash(ctx)
	if err != nil {
		return err
	}
	for i := range items {
		if err := fn(&items[i].Entry, true); err != nil {
			return err
		}
	}
	return nil
}

// ---- writer locks ----

// Lock is an ephemeral writer lock on one name: a key bound to the
// Service's lease, so if the holder dies it disappears after LockTTL.
// Acquiring it is one transaction; a commit that succeeds releases it in the
// same transaction.
type Lock struct {
	s        *Service
	key      string
	rev      int64 // the revision that created the key: our ownership
	sess     *concurrency.Session
	release  func()
	mu       sync.Mutex
	released bool
	offline  bool // taken offline (Vol.offLock): this process's alone
}

// owned is the compare that holds only while this lock is ours.
func (l *Lock) owned() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
}

// Lost reports whether the lease behind the lock has expired.
func (l *Lock) Lost() bool {
	if l.offline {
		return false
	}
	select {
	case <-l.sess.Done():
		return true
	default:
		return false
	}
}

// markReleased records that a commit deleted the key; it reports whether
// the lock was still held.
func (l *Lock) markReleased() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return false
	}
	l.released = true
	l.release()
	return true
}

// Unlock releases the lock (a no-op after a commit released it).
func (l *Lock) Unlock(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.mu.Unlock()
	defer l.release()
	if l.offline {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := l.s.cli.Txn(ctx).If(l.owned()).Then(clientv3.OpDelete(l.key)).Commit()
	return etcdErr("unlock", "", err)
}

// Lock waits (until ctx ends) for the writer lock on name in directory
// parent and returns it. Goroutines of one process share the process's
// lease, so they first queue on an in-process lock for the same key; the
// etcd key then serializes processes.
func (v *Vol) Lock(ctx context.Context, parent uint64, name string) (*Lock, error) {
	if _, l := v.offWriting(ctx); l != nil {
		return v.offLock(parent, name), nil
	}
	if err := v.offlineWrite("lock", name); err != nil {
		return nil, err
	}
	key := v.lockKey(parent, name)
	timeout := func() error {
		return cairn.E("lock", cairn.Conflict, name, errors.New("another writer holds this file; timed out waiting"))
	}
	release, err := v.s.local.lock(ctx, key)
	if err != nil {
		return nil, timeout()
	}
	sess, err := v.s.sess(ctx)
	if err != nil {
		release()
		return nil, err
	}
	who := lockHolder()
	for {
		cctx, cancel := v.s.opCtx(ctx)
		resp, err := v.s.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, who, clientv3.WithLease(sess.Lease()))).Commit()
		cancel()
		if err != nil {
			release()
			if ctx.Err() != nil {
				return nil, timeout()
			}
			return nil, etcdErr("lock", name, err)
		}
		if resp.Succeeded {
			return &Lock{s: v.s, key: key, rev: resp.Header.Revision, sess: sess, release: release}, nil
		}
		// Held by another process: wait for its key to go, then try again.
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		for wr := range v.s.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
			done := false
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					done = true
				}
			}
			if done {
				break
			}
		}
		wcancel()
		if ctx.Err() != nil {
			release()
			return nil, timeout()
		}
	}
}

// LockHeld reports whether someone holds the writer lock of name in
// directory parent (a reader tells a file made and still being written
// for the first time, on some device, from one made empty).
func (v *Vol) LockHeld(ctx context.Context, parent uint64, name string) (bool, error) {
	return v.lockHeld(ctx, parent, name)
}

// lockHeld reports whether someone holds the writer lock of name in
// directory parent.
func (v *Vol) lockHeld(ctx context.Context, parent uint64, name string) (bool, error) {
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Get(cctx, v.lockKey(parent, name), clientv3.WithCountOnly())
	if err != nil {
		return false, etcdErr("lock", name, err)
	}
	return resp.Count > 0, nil
}

// lockKey is where the writer lock of name in directory parent lives.
func (v *Vol) lockKey(parent uint64, name string) string {
	return v.base + "lock/" + inoHex(parent) + "/" + name
}

// lockHolder is what a lock key records: who holds it, for people.
func lockHolder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// keyedLocks is a set of in-process mutexes by key, created on demand and
// dropped when nobody holds or waits for them.
type keyedLocks struct {
	mu sync.Mutex
	m  map[string]*keyedLock
}

type keyedLock struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

// tryLock is lock without waiting: ok is false if the key is held.
func (k *keyedLocks) tryLock(key string) (release func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	select {
	case l.ch <- struct{}{}:
	default:
		return nil, false
	}
	l.refs++
	return func() {
		<-l.ch
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}, true
}

func (k *keyedLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedLock{}
	}
	l := k.m[key]
	if l == nil {
		l = &keyedLock{ch: make(chan struct{}, 1)}
		k.m[key] = l
	}
	l.refs++
	k.mu.Unlock()
	drop := func() {
		k.mu.Lock()
		l.refs--
		if l.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}
