package meta

import (
	"context"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// Extended attributes of an entry live beside the namespace, one key each at
// v/<volID>/x/<ino>/<name> (value: the raw attribute bytes), so they follow
// the inode through renames, an entry record stays small, and one attribute
// changes without rewriting the entry. The mount keeps user.* attributes
// here; the WebDAV gateway keeps dead properties under its own names.

// MaxXattrValue bounds one attribute's value (Linux's own limit is 64 KiB).
const MaxXattrValue = 64 << 10

// MaxXattrName bounds an attribute's name (Linux: 255 bytes).
const MaxXattrName = 255

// XattrFlag says whether SetXattr may create, replace, or both.
type XattrFlag int

const (
	XattrAny     XattrFlag = iota // create or replace
	XattrCreate                   // fail with Exist if it is there
	XattrReplace                  // fail with NotFound if it is not
)

func (v *Vol) xattrPrefix(ino uint64) string { return v.base + "x/" + inoHex(ino) + "/" }

func checkXattrName(op, name string) error {
	if name == "" || len(name) > MaxXattrName {
		return cairn.E(op, cairn.Invalid, name, errors.New("attribute name must be 1 to 255 bytes"))
	}
	return nil
}

// Xattrs returns every extended attribute of inode ino.
func (v *Vol) Xattrs(ctx context.Context, ino uint64) (map[string][]byte, error) {
	if v.s.isOffline() {
		return nil, cairn.E("listxattr", cairn.Unavailable, "", errOfflineXattrs)
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	p := v.xattrPrefix(ino)
	resp, err := v.s.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("listxattr", "", err)
	}
	out := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key[len(p):])] = kv.Value
	}
	return out, nil
}

// Xattr returns one attribute, or NotFound.
func (v *Vol) Xattr(ctx context.Context, ino uint64, name string) ([]byte, error) {
	if err := checkXattrName("getxattr", name); err != nil {
		return nil, err
	}
	if v.s.isOffline() {
		return nil, cairn.E("getxattr", cairn.Unavailable, name, errOfflineXattrs)
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Get(ctx, v.xattrPrefix(ino)+name)
	if err != nil {
		return nil, etcdErr("getxattr", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("getxattr", cairn.NotFound, name, nil)
	}
	return resp.Kvs[0].Value, nil
}

// SetXattr sets attribute name of inode ino, as flag allows.
func (v *Vol) SetXattr(ctx context.Context, ino uint64, name string, value []byte, flag XattrFlag) error {
	if err := v.offlineWrite("setxattr", name); err != nil {
		return err
	}
	if err := checkXattrName("setxattr", name); err != nil {
		return err
	}
	if len(value) > MaxXattrValue {
		return cairn.E("setxattr", cairn.Invalid, name, errors.New("attribute value is larger than 64 KiB"))
	}
	path, _ := v.dirPath(ino)
	acmps, err := v.authWrite(ctx, "setxattr", path, false)
	if err != nil {
		return err
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	k := v.xattrPrefix(ino) + name
	put := clientv3.OpPut(k, string(value))
	var resp *clientv3.TxnResponse
	switch flag {
	case XattrCreate:
		resp, err = v.s.cli.Txn(ctx).If(append(acmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))...).Then(put).Commit()
	case XattrReplace:
		resp, err = v.s.cli.Txn(ctx).If(append(acmps, clientv3.Compare(clientv3.CreateRevision(k), ">", 0))...).Then(put).Commit()
	default:
		resp, err = v.s.cli.Txn(ctx).If(acmps...).Then(put).Commit()
	}
	if err != nil {
		return etcdErr("setxattr", name, err)
	}
	if !resp.Succeeded {
		if flag == XattrCreate {
			return cairn.E("setxattr", cairn.Exist, name, nil)
		}
		return cairn.E("setxattr", cairn.NotFound, name, nil)
	}
	return nil
}

// RemoveXattr removes attribute name of inode ino, or returns NotFound.
func (v *Vol) RemoveXattr(ctx context.Context, ino uint64, name string) error {
	if err := v.offlineWrite("removexattr", name); err != nil {
		return err
	}
	if err := checkXattrName("removexattr", name); err != nil {
		return err
	}
	path, _ := v.dirPath(ino)
	acmps, err := v.authWrite(ctx, "removexattr", path, false)
	if err != nil {
		return err
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(ctx).If(acmps...).Then(clientv3.OpDelete(v.xattrPrefix(ino) + name)).Commit()
	if err != nil {
		return etcdErr("removexattr", name, err)
	}
	if !resp.Succeeded {
		return cairn.E("removexattr", cairn.Conflict, name, errors.New("the volume's ACLs changed meanwhile: try again"))
	}
	if resp.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return cairn.E("removexattr", cairn.NotFound, name, nil)
	}
	return nil
}

// deleteXattrs drops every attribute of ino (when its entry is purged).
func (v *Vol) deleteXattrs(ctx context.Context, ino uint64) error {
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	_, err := v.s.cli.Delete(ctx, v.xattrPrefix(ino), clientv3.WithPrefix())
	return etcdErr("purge trash", "", err)
}
