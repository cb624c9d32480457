package meta

// The store registry: stores a realm keeps data in besides its nodes' own
// (cloud buckets, directories), each at store/<name>, with the URL devices
// open it by. Credentials are never recorded: each device takes them from
// its environment (doc/format.md, "Cloud stores"). Per device, cumulative
// request counts at storereq/<name>/<device>, for `cairn store ls`.

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// StoreRecord is a store's entry in the registry.
type StoreRecord struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// Added is when it was added (unix ns), AddedBy the device that did.
	Added   int64  `json:"added"`
	AddedBy string `json:"added_by,omitempty"`
	// Draining is set while `cairn store remove` moves its data away:
	// no new data goes to it.
	Draining bool `json:"draining,omitempty"`
}

var storeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckStoreName says whether name can name a store: 1 to 63 of a-z 0-9 .
// _ -, not starting with a punctuation mark, and not "local".
func CheckStoreName(name string) error {
	if !storeNameRE.MatchString(name) || name == "local" {
		return cairn.E("store name", cairn.Invalid, name, errors.New("a store name is 1 to 63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit, and not 'local'"))
	}
	return nil
}

// AddStore records a new store. A name already used by a store or a node
// is refused (Exist): versions name the stores and nodes that hold their
// data in one list.
func (s *Service) AddStore(ctx context.Context, rec StoreRecord) error {
	const op = "add store"
	if err := CheckStoreName(rec.Name); err != nil {
		return err
	}
	if _, err := s.Node(ctx, rec.Name); err == nil {
		return cairn.E(op, cairn.Exist, rec.Name, errors.New("a node of the realm has this name"))
	} else if !errors.Is(err, cairn.ErrNotFound) {
		return err
	}
	b, _ := json.Marshal(rec)
	k := s.key("store", rec.Name)
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(b))).Commit()
	if err != nil {
		return etcdErr(op, rec.Name, err)
	}
	if !resp.Succeeded {
		return cairn.E(op, cairn.Exist, rec.Name, errors.New("a store of this name is already in the realm"))
	}
	return nil
}

// Store returns the record of store name (NotFound if none).
func (s *Service) Store(ctx context.Context, name string) (*StoreRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("store", name))
	if err != nil {
		return nil, etcdErr("store", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("store", cairn.NotFound, name, errors.New("no such store in the realm (see 'cairn store ls')"))
	}
	var rec StoreRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return nil, cairn.E("store", cairn.Corrupt, name, err)
	}
	return &rec, nil
}

// Stores lists every store record, by name.
func (s *Service) Stores(ctx context.Context) ([]StoreRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("store") + "/"
	resp, err := s.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("list stores", "", err)
	}
	out := make([]StoreRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var rec StoreRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, cairn.E("list stores", cairn.Corrupt, strings.TrimPrefix(string(kv.Key), p), err)
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// SetStoreDraining marks store name as being drained (or not).
func (s *Service) SetStoreDraining(ctx context.Context, name string, draining bool) error {
	return s.updateStore(ctx, name, func(r *StoreRecord) { r.Draining = draining })
}

func (s *Service) updateStore(ctx context.Context, name string, fn func(*StoreRecord)) error {
	return s.casUpdate(ctx, "update store", name, s.key("store", name), func(old []byte, exists bool) ([]byte, error) {
		if !exists {
			return nil, cairn.E("update store", cairn.NotFound, name, errors.New("no such store in the realm"))
		}
		var rec StoreRecord
		if err := json.Unmarshal(old, &rec); err != nil {
			return nil, cairn.E("update store", cairn.Corrupt, name, err)
		}
		fn(&rec)
		b, _ := json.Marshal(rec)
		return b, nil
	})
}

// casUpdate replaces the value at k with what fn makes of the current one,
// by compare-and-swap on its revision, reading again on a concurrent change.
func (s *Service) casUpdate(ctx context.Context, op, name, k string, fn func(old []byte, exists bool) ([]byte, error)) error {
	for attempt := 0; attempt < 20; attempt++ {
		cctx, cancel := s.opCtx(ctx)
		resp, err := s.cli.Get(cctx, k)
		if err != nil {
			cancel()
			return etcdErr(op, name, err)
		}
		var old []byte
		var rev int64
		if len(resp.Kvs) > 0 {
			old, rev = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
		}
		b, err := fn(old, len(resp.Kvs) > 0)
		if err != nil {
			cancel()
			return err
		}
		tr, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, string(b))).Commit()
		cancel()
		if err != nil {
			return etcdErr(op, name, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
	return cairn.E(op, cairn.Conflict, name, errors.New("too many concurrent changes"))
}

// DeleteStore removes store name's record and its request counts. The
// caller has moved its data away first.
func (s *Service) DeleteStore(ctx context.Context, name string) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	_, err := s.cli.Txn(ctx).Then(
		clientv3.OpDelete(s.key("store", name)),
		clientv3.OpDelete(s.key("storereq", name)+"/", clientv3.WithPrefix())).Commit()
	return etcdErr("remove store", name, err)
}

// AddStoreRequests adds counts (request class → number) to what device
// has recorded for store name.
func (s *Service) AddStoreRequests(ctx context.Context, name, device string, counts map[string]int64) error {
	if len(counts) == 0 {
		return nil
	}
	if device == "" {
		device = "local"
	}
	return s.casUpdate(ctx, "record store requests", name, s.key("storereq", name, device), func(old []byte, exists bool) ([]byte, error) {
		cur := map[string]int64{}
		if exists && json.Unmarshal(old, &cur) != nil {
			cur = map[string]int64{} // damaged counts are only statistics: start again
		}
		for c, n := range counts {
			cur[c] += n
		}
		b, _ := json.Marshal(cur)
		return b, nil
	})
}

// StoreRequests returns the request counts every device recorded for
// store name, summed by class.
func (s *Service) StoreRequests(ctx context.Context, name string) (map[string]int64, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("storereq", name)+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("store requests", name, err)
	}
	sum := map[string]int64{}
	for _, kv := range resp.Kvs {
		var m map[string]int64
		if json.Unmarshal(kv.Value, &m) == nil {
			for c, n := range m {
				sum[c] += n
			}
		}
	}
	return sum, nil
}
