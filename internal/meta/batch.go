package meta

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
)

// MaxBatch is the most entries PutBatch takes at once: etcd refuses a
// transaction with more than 128 compares or 128 operations (its default
// --max-txn-ops), and each entry brings up to three compares (its name,
// its directory, its writer lock) and two operations (its record, its
// lock).
const MaxBatch = 42

// maxTxnOps is etcd's default limit on the operations (and on the
// compares) of one transaction.
const maxTxnOps = 128

// NewIno returns a fresh inode number, as Create assigns: for a caller
// that decides an entry's creation itself and writes it with PutBatch.
func NewIno() uint64 { return randomIno() }

// BatchPut is one entry of PutBatch. Entry is the whole record to write
// (its Ctime as given). Entry.Rev says what the name must hold for the
// write to happen: 0, nothing (a new entry, as Create); otherwise the
// record at that ModRevision (a change, as Update). Dir is the directory
// that holds it, as the calls that take a parent want it (its Ino, and
// where its own record lives): a new entry needs it to exist, unless an
// earlier entry of the batch makes it; Dir.Touch (with its record as
// read) advances its times with a new entry's creation (Entry.Touch).
// Lock asks for a new file's writer
// lock in the same transaction, as CreateLocked takes it.
type BatchPut struct {
	Entry Entry
	Dir   Entry
	Lock  bool
}

// BatchResult is what PutBatch wrote: at revision Rev, with the writer
// locks asked for (Locks[i] for puts[i]; nil where none was asked or one
// could not be had at once, as with CreateLocked). Old is, for a single
// entry refused with Exist, the entry that holds the name.
type BatchResult struct {
	Rev   int64
	Locks []*Lock
	Old   *Entry
}

// PutBatch writes every entry of puts in one transaction, in one write to
// etcd's log, or none of them: the way a mount that decides creates and
// attribute changes locally (write-back) commits them in bulk. puts holds
// at most MaxBatch entries, no name twice. When a condition does not hold,
// nothing is written and the error is of Kind Conflict for a batch of
// several entries (the caller writes them one at a time to learn which);
// for a single entry it says which: Exist (Old is the entry that holds the
// name), NotFound (the directory, or the entry changed, is gone), Conflict
// (the record changed since Rev) or, for a new file whose lock was asked
// for, ErrLocked (another writer holds the name's lock: write it without).
func (v *Vol) PutBatch(ctx context.Context, puts []BatchPut) (BatchResult, error) {
	t0 := time.Now()
	res, err := v.putBatch(ctx, puts)
	if len(puts) > 0 {
		metrics.Default().ObserveCommit(t0, err) // one transaction: cairn_commit_duration_seconds
	}
	return res, err
}

func (v *Vol) putBatch(ctx context.Context, puts []BatchPut) (BatchResult, error) {
	var res BatchResult
	if lc, l := v.offWriting(ctx); l != nil {
		return v.offPutBatch(ctx, lc, l, puts)
	}
	if err := v.offlineWrite("put batch", v.V.Name); err != nil {
		return res, err
	}
	if len(puts) == 0 {
		return res, nil
	}
	if len(puts) > MaxBatch {
		return res, cairn.E("put batch", cairn.Invalid, "", errors.New("too many entries for one transaction"))
	}
	made := map[uint64]bool{}
	seen := map[string]bool{}
	dirs := map[string]bool{}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	var releases []func()
	lockKeys := make([]string, len(puts))
	defer func() {
		if res.Rev == 0 {
			for _, rel := range releases {
				rel()
			}
		}
	}()
	var sess *concurrency.Session
	var toTouch []touch
	var linked []int // puts of files with several names
	// Every entry's path, for the ACL decision: a directory the batch
	// makes gives its path to the entries it makes below it.
	made0 := map[uint64]string{}
	paths := make([]string, len(puts))
	for i := range puts {
		e := &puts[i].Entry
		d, ok := made0[e.Parent]
		if !ok {
			d, ok = v.dirPath(e.Parent)
		}
		if ok {
			paths[i] = joinPath(d, e.Name)
			if e.IsDir() {
				made0[e.Ino] = paths[i]
			}
		}
	}
	acmps, aerrs, err := v.authWriteMany(ctx, "put batch", paths)
	if err != nil {
		return res, err
	}
	if errIn := errors.Join(aerrs...); errIn != nil {
		for _, e := range aerrs {
			if e != nil {
				return res, e
			}
		}
	}
	cmps = append(cmps, acmps...)
	for i := range puts {
		p := &puts[i]
		e := p.Entry
		k := v.keyOf(&e)
		if seen[k] {
			return res, cairn.E("put batch", cairn.Invalid, e.Name, errors.New("one name twice in a batch"))
		}
		seen[k] = true
		if errIn := v.checkNew(ctx, "put batch", &e); errIn != nil {
			return res, errIn
		}
		if e.Rev == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			if dk := v.keyOf(&p.Dir); !made[p.Dir.Ino] && !dirs[dk] {
				dirs[dk] = true
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(dk), ">", 0))
			}
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", e.Rev))
		}
		if p.Lock && e.Rev == 0 && e.Type == TypeFile {
			lk := v.lockKey(e.Parent, e.Name)
			if rel, ok := v.s.local.tryLock(lk); ok {
				releases = append(releases, rel)
				if sess == nil {
					var errIn error
					if sess, errIn = v.s.sess(ctx); errIn != nil {
						return res, errIn
					}
				}
				lockKeys[i] = lk
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(lk), "=", 0))
				ops = append(ops, clientv3.OpPut(lk, lockHolder(), clientv3.WithLease(sess.Lease())))
			}
		}
		if e.Rev == 0 {
			// As of the entry's making: a mount that made it earlier
			// (write-back) showed the directory's times change then.
			t := e.Ctime
			if t == 0 {
				t = time.Now().UnixNano()
			}
			toTouch = append(toTouch, touch{&p.Dir, t})
		}
		if e.IsDir() {
			made[e.Ino] = true
		}
		if len(e.Links) > 1 {
			if e.Rev == 0 {
				return res, cairn.E("put batch", cairn.Invalid, e.Name, errors.New("a new entry with links (use Link)"))
			}
			linked = append(linked, i)
		}
		e.Rev = 0
		b, _ := json.Marshal(e)
		ops = append(ops, clientv3.OpPut(k, string(b)))
	}
	// A change to a file with several names goes to every name's copy
	// (unless the batch writes that name itself).
	for _, i := range linked {
		e := puts[i].Entry
		others, errIn := v.copies(ctx, "put batch", &e)
		if errIn != nil {
			return res, errIn
		}
		var rest []*Entry
		for _, o := range others {
			if k := v.keyOf(o); !seen[k] {
				seen[k] = true
				rest = append(rest, o)
			}
		}
		ccmps, cops := v.copyOps(&e, rest)
		cmps, ops = append(cmps, ccmps...), append(ops, cops...)
	}
	var fresh []touch // directories the batch does not make
	for _, x := range toTouch {
		if !made[x.d.Ino] {
			fresh = append(fresh, x)
		}
	}
	at := len(ops)
	tops, touched := v.touchOpsAt(seen, fresh)
	ops = append(ops, tops...)
	if len(ops) > maxTxnOps || len(cmps) > maxTxnOps {
		return res, cairn.E("put batch", cairn.Conflict, "", errors.New("too many operations for one transaction; write the entries one at a time"))
	}
	var els []clientv3.Op
	if len(puts) == 1 {
		els = []clientv3.Op{clientv3.OpGet(v.keyOf(&puts[0].Entry)), clientv3.OpGet(v.keyOf(&puts[0].Dir), clientv3.WithCountOnly())}
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Else(els...).Commit()
	if err != nil {
		return res, etcdErr("put batch", puts[0].Entry.Name, err)
	}
	if resp.Succeeded {
		res.Rev = resp.Header.Revision
		for i := range puts {
			v.notePath(&puts[i].Entry, paths[i])
		}
		touchedDirs(resp, at, touched)
		res.Locks = make([]*Lock, len(puts))
		r := 0
		for i, lk := range lockKeys {
			if lk != "" {
				res.Locks[i] = &Lock{s: v.s, key: lk, rev: res.Rev, sess: sess, release: releases[r]}
				r++
			}
		}
		return res, nil
	}
	if len(puts) > 1 {
		return res, cairn.E("put batch", cairn.Conflict, "", errors.New("a name or directory changed concurrently"))
	}
	if v.aclStale(ctx, acmps) {
		return res, cairn.E("put batch", cairn.Conflict, puts[0].Entry.Name, errors.New("the volume's ACLs changed meanwhile: try again"))
	}
	e := &puts[0].Entry
	kvs := resp.Responses[0].GetResponseRange().Kvs
	dirThere := resp.Responses[1].GetResponseRange().Count > 0
	switch {
	case len(kvs) > 0 && e.Rev == 0:
		old, derr := v.decode("put batch", kvs[0].Key, kvs[0].Value, kvs[0].ModRevision)
		if derr != nil {
			return res, derr
		}
		res.Old = old
		return res, cairn.E("put batch", cairn.Exist, e.Name, nil)
	case len(kvs) > 0:
		return res, cairn.E("put batch", cairn.Conflict, e.Name, errors.New("changed concurrently"))
	case e.Rev != 0:
		return res, cairn.E("put batch", cairn.NotFound, e.Name, errors.New("the entry was removed"))
	case !dirThere:
		return res, cairn.E("put batch", cairn.NotFound, puts[0].Dir.Name, errors.New("parent directory was removed"))
	}
	return res, cairn.E("put batch", cairn.Conflict, e.Name, ErrLocked)
}

// maxTxnBytes bounds the records one CommitVersions transaction writes,
// under etcd's default limit on a request (--max-request-bytes, 1.5 MiB).
const maxTxnBytes = 1 << 20

// BatchCommit is one commit of CommitVersions: c as CommitVersion takes
// it for the file name in directory Parent.
type BatchCommit struct {
	Parent *Entry
	Name   string
	Commit Commit
}

// CommitResult is what CommitVersions did for one BatchCommit: the entry
// committed, or the error CommitVersion would have returned.
type CommitResult struct {
	Entry *Entry
	Err   error
}

// commitTxn is a transaction of CommitVersions: the commits at idx, with
// the entries they write.
type commitTxn struct {
	idx   []int
	next  []Entry
	cmps  []clientv3.Cmp
	ops   []clientv3.Op
	bytes int
	gen   int64
	keys  map[string]bool
}

// commitTxnConcurrency bounds the transactions CommitVersions sends at
// once, and commitSingleConcurrency the commits it then makes one at a
// time.
const (
	commitTxnConcurrency    = 4
	commitSingleConcurrency = 16
)

// CommitVersions makes each commit of cs as CommitVersion does, many per
// etcd transaction (each commit whole or not at all: a transaction writes
// all of its commits or none): a put of many small files then costs one
// round trip and one write of etcd's log per few dozen files instead of one
// per file. A commit whose Commit.Cur is set is batched with it; one
// without (or of a file with several names, or offloaded) is made alone. A transaction
// whose conditions do not all hold (a name changed since its Cur was read,
// a writer lock, the GC fence) writes nothing, and each of its commits is
// then made alone by CommitVersion, which reads the entry again and says
// which condition failed. Results are in the order of cs.
func (v *Vol) CommitVersions(ctx context.Context, cs []BatchCommit) []CommitResult {
	res := make([]CommitResult, len(cs))
	if v.s.isOffline() {
		for i := range cs {
			if lc, l := v.offWriting(ctx); l != nil {
				res[i].Entry, _, res[i].Err = v.offCommit(ctx, lc, l, cs[i].Parent, cs[i].Name, cs[i].Commit)
				continue
			}
			res[i].Err = v.offlineWrite("commit", cs[i].Name)
		}
		return res
	}
	var single []int
	var txns []*commitTxn
	var t *commitTxn
	paths := make([]string, len(cs))
	for i := range cs {
		paths[i] = v.childPath(cs[i].Parent.Ino, cs[i].Name)
	}
	acmps, aerrs, err := v.authWriteMany(ctx, "commit", paths)
	if err != nil {
		for i := range cs {
			res[i].Err = err
		}
		return res
	}
	for i := range cs {
		bc := &cs[i]
		c := &bc.Commit
		if aerrs[i] != nil {
			res[i].Err = aerrs[i]
			continue
		}
		if c.Cur == nil || !bc.Parent.IsDir() || c.Offload != nil {
			// (An offloaded version's entry is written by CommitVersion's
			// own transaction.)
			single = append(single, i)
			continue
		}
		cur := c.Cur.entry
		if cur != nil && (len(cur.Links) > 1 || cur.Type != TypeFile) || c.Ino != 0 && cur != nil && cur.Ino != c.Ino {
			single = append(single, i)
			continue
		}
		next, cmps, _, err := v.nextVersion(bc.Parent, bc.Name, cur, c)
		if err != nil {
			single = append(single, i)
			continue
		}
		k := v.entryKey(bc.Parent.Ino, bc.Name)
		b, _ := json.Marshal(next)
		ops := []clientv3.Op{clientv3.OpPut(k, string(b))}
		if c.Lock != nil {
			cmps = append(cmps, c.Lock.owned())
			ops = append(ops, clientv3.OpDelete(c.Lock.key))
		} else if c.Unlocked {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(v.lockKey(bc.Parent.Ino, bc.Name)), "=", 0))
		}
		if t == nil || t.gen != c.Gen || t.keys[k] || len(t.ops)+len(ops) > maxTxnOps ||
			len(t.cmps)+len(cmps) > maxTxnOps || t.bytes+len(b) > maxTxnBytes && len(t.idx) > 0 {
			t = &commitTxn{gen: c.Gen, keys: map[string]bool{}, cmps: append(v.s.fenceCmps(c.Gen), acmps...)}
			txns = append(txns, t)
		}
		t.idx = append(t.idx, i)
		t.next = append(t.next, next)
		t.cmps = append(t.cmps, cmps...)
		t.ops = append(t.ops, ops...)
		t.bytes += len(b)
		t.keys[k] = true
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, commitTxnConcurrency)
	for _, t := range txns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := v.s.opCtx(ctx)
			t0 := time.Now()
			resp, err := v.s.cli.Txn(cctx).If(t.cmps...).Then(t.ops...).Commit()
			cancel()
			metrics.Default().ObserveCommit(t0, err) // one transaction: cairn_commit_duration_seconds
			switch {
			case err != nil:
				for _, i := range t.idx {
					res[i].Err = etcdErr("commit", cs[i].Name, err)
				}
			case resp.Succeeded:
				for n, i := range t.idx {
					if l := cs[i].Commit.Lock; l != nil {
						l.markReleased()
					}
					e := t.next[n]
					e.Rev = resp.Header.Revision
					res[i].Entry = &e
				}
			default:
				mu.Lock()
				single = append(single, t.idx...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sem = make(chan struct{}, commitSingleConcurrency)
	for _, i := range single {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c := cs[i].Commit
			c.Cur = nil // read it again: it may be why the batch failed
			res[i].Entry, _, res[i].Err = v.CommitVersion(ctx, cs[i].Parent, cs[i].Name, c)
		})
	}
	wg.Wait()
	return res
}
