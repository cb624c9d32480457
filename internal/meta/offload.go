package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// OffloadFormat is the format of offload entries this cairn writes
// (doc/format.md, "Offload entries").
const OffloadFormat = 1

// Offload is an offload entry (doc/director.md, "Offload and reclaim"): a
// committed version whose chunks and manifest were written to an awake
// store (Now) because the store its write was meant for (Home) was not
// awake. Stored at offload/<volID>/<ino, 16 hex>/<n, 16 hex>, in the
// transaction that commits the version, and deleted, in the transaction
// that rewrites the version's stores from Now to Home, by reclaim.
type Offload struct {
	Format int    `json:"format"`
	Vol    string `json:"vol"`    // the volume's name, for people
	VolID  string `json:"vol_id"` // the volume's ID (the key's)
	Ino    uint64 `json:"ino"`
	// Parent and Name are where the file was at the commit: reclaim looks
	// there first, then walks the volume for Ino.
	Parent   uint64   `json:"parent"`
	Name     string   `json:"name"`
	N        uint64   `json:"n"`        // the version's number at the commit
	Manifest cairn.ID `json:"manifest"` // identifies the version wherever it moved
	Chunks   int      `json:"chunks"`
	Bytes    int64    `json:"bytes"`
	Home     string   `json:"home"` // the node or store the write was meant for
	Now      string   `json:"now"`  // the node or store that holds it now
	// Stores and HomeStores, for a version written under a copies
	// policy one of whose members (Home) slept: the name the version
	// records now (the policy with Now in Home's place) and the one it
	// records once reclaimed (the policy). Empty: Now and Home.
	Stores     string `json:"stores,omitempty"`
	HomeStores string `json:"home_stores,omitempty"`
	Since      int64  `json:"since"`
	// Move, if set, is the path ("/a/b") a move ('cairn move') relocates
	// to Home: the version was at Now before the move, not offloaded.
	// While a volume has entries of a move, new versions of files under
	// its path are offloaded (doc/director.md, "Moves").
	Move string `json:"move,omitempty"`
	// Rev is the key's ModRevision as read (not stored).
	Rev int64 `json:"-"`
}

// OffloadTo, in a Commit, says the version was written to the store the
// version names (Now) instead of Home: the commit records an offload entry
// in its own transaction.
type OffloadTo struct {
	Home string
	// Now and HomeStores, for a member of a copies policy that slept: the
	// store that took its copy and the policy string the version records
	// once reclaimed (Offload.Stores is then the version's own name).
	// Empty: the version names Now itself, and will name Home.
	Now, HomeStores string
}

// Names returns the name the version records now and the one it records
// once reclaimed.
func (o *Offload) Names() (now, home string) {
	if o.Stores != "" {
		return o.Stores, o.HomeStores
	}
	return o.Now, o.Home
}

func (s *Service) offloadKey(volID string, ino, n uint64) string {
	return s.key("offload", volID, inoHex(ino), fmt.Sprintf("%016x", n))
}

// offloadOp is the put of the offload entry of version ver of file e,
// committed now.
func (v *Vol) offloadOp(o *OffloadTo, e *Entry, ver Version) (clientv3.Op, error) {
	if o.Home == "" || len(ver.Stores) != 1 || ver.Stores[0] == o.Home || (o.Now == "") != (o.HomeStores == "") || o.Now == o.Home ||
		(o.HomeStores != "" && o.HomeStores == ver.Stores[0]) {
		return clientv3.Op{}, cairn.E("commit", cairn.Invalid, e.Name, errors.New("an offload needs a home other than the one store the version names"))
	}
	rec := Offload{Format: OffloadFormat, Vol: v.V.Name, VolID: v.V.ID, Ino: e.Ino, Parent: e.Parent, Name: e.Name, N: ver.N,
		Manifest: ver.Manifest, Chunks: ver.Chunks, Bytes: ver.Size, Home: o.Home, Now: ver.Stores[0], Since: ver.Committed}
	if o.Now != "" {
		rec.Now, rec.Stores, rec.HomeStores = o.Now, ver.Stores[0], o.HomeStores
	}
	b, _ := json.Marshal(rec)
	return clientv3.OpPut(v.s.offloadKey(v.V.ID, e.Ino, ver.N), string(b)), nil
}

// DecodeOffload decodes an offload entry stored at key k (the part after
// the realm's prefix: offload/<volID>/<ino>/<n>). A record that does not
// match its key, names no home or no current store, or has a format this
// cairn does not know is Corrupt.
func DecodeOffload(k string, b []byte) (*Offload, error) {
	const op = "read offload entry"
	bad := func(why string) error { return cairn.E(op, cairn.Corrupt, k, errors.New(why)) }
	parts := strings.Split(k, "/")
	if len(parts) != 4 || parts[0] != "offload" || parts[1] == "" || len(parts[2]) != 16 || len(parts[3]) != 16 {
		return nil, bad("not an offload key")
	}
	ino, err1 := strconv.ParseUint(parts[2], 16, 64)
	n, err2 := strconv.ParseUint(parts[3], 16, 64)
	if err1 != nil || err2 != nil {
		return nil, bad("not an offload key")
	}
	var o Offload
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, bad(err.Error())
	}
	switch {
	case o.Format != OffloadFormat:
		return nil, cairn.E(op, cairn.Corrupt, k, fmt.Errorf("offload entry format %d (this cairn reads %d: upgrade cairn on this device)", o.Format, OffloadFormat))
	case o.VolID != parts[1] || o.Ino != ino || o.N != n:
		return nil, bad("the record does not match its key")
	case o.Home == "" || o.Now == "" || o.Home == o.Now:
		return nil, bad("an offload entry needs a home and another store that holds the version now")
	case (o.Stores == "") != (o.HomeStores == "") || (o.Stores != "" && o.Stores == o.HomeStores):
		return nil, bad("an offload entry's stores and home stores go together and differ")
	case o.Name == "" || strings.ContainsAny(o.Name, "/\x00"):
		return nil, bad("bad file name")
	case o.Move != "" && !CleanPath(o.Move):
		return nil, bad("a move's path is absolute, without a trailing '/' or an empty, '.' or '..' segment")
	}
	return &o, nil
}

// Offloads lists the realm's offload entries, oldest first (by Since).
func (s *Service) Offloads(ctx context.Context) ([]*Offload, error) {
	const op = "list offload entries"
	cctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.key("offload")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr(op, "", err)
	}
	var out []*Offload
	for _, kv := range resp.Kvs {
		o, err := DecodeOffload(strings.TrimPrefix(string(kv.Key), s.opts.Prefix), kv.Value)
		if err != nil {
			return nil, err
		}
		o.Rev = kv.ModRevision
		out = append(out, o)
	}
	slices.SortStableFunc(out, func(a, b *Offload) int {
		if a.Since != b.Since {
			return cmpInt64(a.Since, b.Since)
		}
		return strings.Compare(a.Vol+a.Name, b.Vol+b.Name)
	})
	return out, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// DropOffload deletes offload entry o if it is still as read (its Rev):
// for an entry whose version no longer exists (dropped, purged, or never
// committed). Kind Conflict if it changed.
func (s *Service) DropOffload(ctx context.Context, o *Offload) error {
	const op = "drop offload entry"
	cctx, cancel := s.opCtx(ctx)
	defer cancel()
	k := s.offloadKey(o.VolID, o.Ino, o.N)
	resp, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", o.Rev)).Then(clientv3.OpDelete(k)).Commit()
	if err != nil {
		return etcdErr(op, o.Name, err)
	}
	if !resp.Succeeded {
		return cairn.E(op, cairn.Conflict, o.Name, errors.New("the offload entry changed"))
	}
	return nil
}

// SettleOffload records that the version o describes, version index i of
// file e (as read), is now held by o.Home instead of o.Now: it rewrites
// the version's stores (every copy of the inode) and deletes the offload
// entry, in one transaction compared on both (Kind Conflict if either
// changed: read again and retry).
func (v *Vol) SettleOffload(ctx context.Context, e *Entry, i int, o *Offload) (*Entry, error) {
	const op = "settle offload"
	if i < 0 || i >= len(e.Versions) || e.Versions[i].Manifest != o.Manifest {
		return nil, cairn.E(op, cairn.Invalid, e.Name, errors.New("not the offloaded version"))
	}
	next := *e
	next.Versions = append([]Version(nil), e.Versions...)
	ver := next.Versions[i]
	now, home := o.Names()
	stores := make([]string, 0, len(ver.Stores))
	for _, s := range ver.Stores {
		if s == now {
			s = home
		}
		if !slices.Contains(stores, s) {
			stores = append(stores, s)
		}
	}
	ver.Stores = stores
	next.Versions[i] = ver
	k := v.keyOf(e)
	ok := v.s.offloadKey(o.VolID, o.Ino, o.N)
	b, _ := json.Marshal(next)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", e.Rev), clientv3.Compare(clientv3.ModRevision(ok), "=", o.Rev)}
	ops := []clientv3.Op{clientv3.OpPut(k, string(b)), clientv3.OpDelete(ok)}
	if len(e.Links) > 1 {
		others, err := v.copies(ctx, op, e)
		if err != nil {
			return nil, err
		}
		ccmps, cops := v.copyOps(&next, others)
		cmps, ops = append(cmps, ccmps...), append(ops, cops...)
	}
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(cctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return nil, etcdErr(op, e.Name, err)
	}
	if !resp.Succeeded {
		return nil, cairn.E(op, cairn.Conflict, e.Name, errors.New("the file or its offload entry changed"))
	}
	next.Rev = resp.Header.Revision
	return &next, nil
}

// CleanPath reports whether p is "/" or "/a/b" with no empty, "." or ".."
// segment and no trailing '/' (the paths policies and moves are set on).
func CleanPath(p string) bool {
	_, err := cleanPolicyPath(p)
	return err == nil && !strings.ContainsRune(p, 0)
}

// maxOpsPerTxn bounds the operations of one transaction PutOffloads
// makes (etcd's default limit is 128).
const maxOpsPerTxn = 100

// PutOffloads records offload entries made by a move ('cairn move'):
// each at its key, replacing an entry already there for the same version
// (an offloaded version being moved gets the move's home). Entries go in
// transactions of at most 100; a failure leaves the earlier batches
// recorded (a move run again records them again, idempotently).
func (s *Service) PutOffloads(ctx context.Context, list []*Offload) error {
	const op = "record move"
	for start := 0; start < len(list); start += maxOpsPerTxn {
		var ops []clientv3.Op
		for _, o := range list[start:min(len(list), start+maxOpsPerTxn)] {
			c := *o
			c.Format = OffloadFormat
			b, _ := json.Marshal(c)
			k := s.offloadKey(c.VolID, c.Ino, c.N)
			if _, err := DecodeOffload(strings.TrimPrefix(k, s.opts.Prefix), b); err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(k, string(b)))
		}
		cctx, cancel := s.opCtx(ctx)
		_, err := s.cli.Txn(cctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return etcdErr(op, "", err)
		}
	}
	return nil
}
