package meta

import (
	"context"
	"errors"
	"sort"
	"time"

	json "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// MaxLinks is the most names an inode may have: every change to it
// rewrites every name's record in one transaction, and etcd's default
// limit is 128 operations a transaction.
const MaxLinks = 64

// ErrTooManyLinks is returned (wrapped, Kind Invalid) by Link for an
// inode that has MaxLinks names already (EMLINK).
var ErrTooManyLinks = errors.New("too many links")

// ErrLinkDir is returned (wrapped, Kind Permission) by Link for a
// directory (EPERM).
var ErrLinkDir = errors.New("hard links to directories are not allowed")

// errCopyChanged: a name of the inode changed between its read and the
// transaction's; the caller reads again.
var errCopyChanged = errors.New("another name of the file changed concurrently")

func linkOf(e *Entry) Link { return Link{Parent: e.Parent, Name: e.Name} }

func sortLinks(ls []Link) {
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].Parent != ls[j].Parent {
			return ls[i].Parent < ls[j].Parent
		}
		return ls[i].Name < ls[j].Name
	})
}

// withoutLink returns ls without l; one name left is no Links at all.
func withoutLink(ls []Link, l Link) []Link {
	var out []Link
	for _, x := range ls {
		if x != l {
			out = append(out, x)
		}
	}
	if len(out) < 2 {
		return nil
	}
	return out
}

// copies reads, in one read, the records of e's other names (e.Links but
// its own). A name missing or holding another inode is Conflict
// (errCopyChanged): e was stale.
func (v *Vol) copies(ctx context.Context, op string, e *Entry) ([]*Entry, error) {
	if len(e.Links) < 2 {
		return nil, nil
	}
	own := linkOf(e)
	var gets []clientv3.Op
	var keys []string
	for _, l := range e.Links {
		if l == own {
			continue
		}
		k := v.entryKey(l.Parent, l.Name)
		keys = append(keys, k)
		gets = append(gets, clientv3.OpGet(k))
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).Then(gets...).Commit()
	if err != nil {
		return nil, etcdErr(op, e.Name, err)
	}
	out := make([]*Entry, 0, len(keys))
	for i := range keys {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil, cairn.E(op, cairn.Conflict, e.Name, errCopyChanged)
		}
		c, derr := v.decode(op, kvs[0].Key, kvs[0].Value, kvs[0].ModRevision)
		if derr != nil {
			return nil, derr
		}
		if c.Ino != e.Ino {
			return nil, cairn.E(op, cairn.Conflict, e.Name, errCopyChanged)
		}
		out = append(out, c)
	}
	return out, nil
}

// copyOps returns the compares and puts that write inode n (as the record
// of one of its names) to each name of names, each compared with its
// record as read (its Rev), so that every copy of the inode changes in
// the caller's transaction or none does.
func (v *Vol) copyOps(n *Entry, names []*Entry) ([]clientv3.Cmp, []clientv3.Op) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, s := range names {
		c := *n
		c.Parent, c.Name, c.Rev, c.Touch = s.Parent, s.Name, 0, false
		k := v.keyOf(s)
		b, _ := json.Marshal(c)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", s.Rev))
		ops = append(ops, clientv3.OpPut(k, string(b)))
	}
	return cmps, ops
}

// Link gives file src a new name, name in directory dstParent (link(2)).
// Every name of an inode has a record that is a full copy of it (Links
// lists them all): the new record and the rewritten ones are written in
// one transaction, compared with src's records as read, with the inode's
// ctime advanced. The realm's record format is raised to 2 first (see
// Service.UseFormat). A directory is refused (Kind Permission,
// ErrLinkDir), as are symlinks and an inode with MaxLinks names (Kind
// Invalid, ErrTooManyLinks); a name taken is Exist; a stale src is
// Conflict.
func (v *Vol) Link(ctx context.Context, src *Entry, dstParent *Entry, name string) (*Entry, error) {
	if err := v.offlineWrite("link", name); err != nil {
		return nil, err
	}
	if src.IsDir() {
		return nil, cairn.E("link", cairn.Permission, src.Name, ErrLinkDir)
	}
	if src.Type != TypeFile {
		return nil, cairn.E("link", cairn.Permission, src.Name, errors.New("only regular files can have several names"))
	}
	if !dstParent.IsDir() {
		return nil, cairn.E("link", cairn.NotDir, dstParent.Name, nil)
	}
	if err := checkName(name); err != nil {
		return nil, cairn.E("link", cairn.Invalid, name, err)
	}
	if src.Rev == 0 {
		return nil, cairn.E("link", cairn.Invalid, src.Name, errors.New("an entry not read from the metadata (no revision)"))
	}
	if src.Nlink() >= MaxLinks {
		return nil, cairn.E("link", cairn.Invalid, name, ErrTooManyLinks)
	}
	if err := v.s.UseFormat(ctx, 2); err != nil {
		return nil, err
	}
	others, err := v.copies(ctx, "link", src)
	if err != nil {
		return nil, err
	}
	now := time.Now().UnixNano()
	n := *src
	n.Touch = false
	if len(n.Links) < 2 {
		n.Links = []Link{linkOf(src)}
	} else {
		n.Links = append([]Link(nil), src.Links...)
	}
	n.Links = append(n.Links, Link{Parent: dstParent.Ino, Name: name})
	sortLinks(n.Links)
	n.Ctime = max(now, src.Ctime)
	sk, dk, pk := v.keyOf(src), v.entryKey(dstParent.Ino, name), v.keyOf(dstParent)
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(sk), "=", src.Rev),
		clientv3.Compare(clientv3.CreateRevision(dk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(pk), ">", 0),
	}
	ccmps, cops := v.copyOps(&n, append([]*Entry{src, {Parent: dstParent.Ino, Name: name}}, others...))
	// The new name's copy has no record to compare (CreateRevision above).
	cmps = append(cmps, ccmps[2:]...)
	acmps, errs, err := v.authWriteMany(ctx, "link", []string{v.childPath(src.Parent, src.Name), v.childPath(dstParent.Ino, name)})
	if err != nil {
		return nil, err
	}
	if errIn := errors.Join(errs...); errIn != nil {
		return nil, errs[0]
	}
	cmps = append(cmps, acmps...)
	ops := cops
	at := len(ops)
	tops, touched := v.touchOps(now, map[string]bool{sk: true, dk: true}, dstParent)
	ops = append(ops, tops...)
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).
		Else(clientv3.OpGet(dk, clientv3.WithCountOnly()), clientv3.OpGet(pk, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return nil, etcdErr("link", name, err)
	}
	if !resp.Succeeded {
		if resp.Responses[0].GetResponseRange().Count > 0 {
			return nil, cairn.E("link", cairn.Exist, name, nil)
		}
		if resp.Responses[1].GetResponseRange().Count == 0 {
			return nil, cairn.E("link", cairn.NotFound, dstParent.Name, errors.New("directory was removed"))
		}
		return nil, cairn.E("link", cairn.Conflict, src.Name, errors.New("changed concurrently; try again"))
	}
	touchedDirs(resp, at, touched)
	n.Parent, n.Name, n.Rev = dstParent.Ino, name, resp.Header.Revision
	return &n, nil
}

// unlinkOps returns what drops name e (one of several of its inode, others
// the records of the rest, as read) in one transaction: e's record
// deleted, the others rewritten without it, with ctime now. The inode and
// its extended attributes live on.
func (v *Vol) unlinkOps(e *Entry, others []*Entry, now int64) ([]clientv3.Cmp, []clientv3.Op) {
	n := *e
	n.Links = withoutLink(e.Links, linkOf(e))
	n.Ctime = max(now, e.Ctime)
	k := v.keyOf(e)
	cmps, ops := v.copyOps(&n, others)
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", e.Rev))
	ops = append(ops, clientv3.OpDelete(k))
	return cmps, ops
}

// dropName removes the name of a file with several names that sits in a
// directory being purged: its other names stay, without it. It reports
// whether the inode had other names (whose extended attributes must then
// stay).
func (v *Vol) dropName(ctx context.Context, parent uint64, name string) (bool, error) {
	for attempt := 0; ; attempt++ {
		e, err := v.Get(ctx, parent, name)
		if errors.Is(err, cairn.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if e.Nlink() < 2 {
			return false, nil
		}
		others, err := v.copies(ctx, "purge trash", e)
		if err == nil {
			cmps, ops := v.unlinkOps(e, others, time.Now().UnixNano())
			cctx, cancel := v.s.opCtx(ctx)
			var resp *clientv3.TxnResponse
			resp, err = v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
			cancel()
			if err != nil {
				return false, etcdErr("purge trash", name, err)
			}
			if resp.Succeeded {
				return true, nil
			}
		} else if !errors.Is(err, cairn.ErrConflict) {
			return false, err
		}
		if attempt > 50 {
			return false, cairn.E("purge trash", cairn.Conflict, name, errors.New("too many concurrent changes"))
		}
	}
}
