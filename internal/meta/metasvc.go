package meta

// Where the realm's metadata service is (DESIGN decision 13): the record at
// metasvc lists the devices that serve it, each with its metadata gateway's
// address. Devices reaching the metadata through a gateway cache the list
// in their realm.json when they connect, so that a service that moves to
// another device (cairn meta move) is found again without a manual edit.
// Key layout: doc/format.md, "Metadata keys".

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	json "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// MetaMember is one device that serves the realm's metadata.
type MetaMember struct {
	// Node is the device's node name (its gateway's certificate names it).
	Node string `json:"node"`
	// Gateway is where its metadata gateway listens (host:port); empty
	// until its node first serves.
	Gateway string `json:"gateway,omitempty"`
	// Peer is its etcd member's peer URL, for a member of a cluster of
	// more than one (cairn meta move, cairn meta add); empty for the
	// single member a realm starts with.
	Peer string `json:"peer,omitempty"`
}

// MetaServiceRecord is the record at metasvc.
type MetaServiceRecord struct {
	Members []MetaMember `json:"members"`
	// Updated is when the record last changed (unix ns).
	Updated int64 `json:"updated"`
}

// Gateways returns the members' gateway addresses, in order, those not yet
// known left out.
func (r *MetaServiceRecord) Gateways() []string {
	var out []string
	for _, m := range r.Members {
		if m.Gateway != "" {
			out = append(out, m.Gateway)
		}
	}
	return out
}

func (s *Service) metaSvcKey() string { return s.key("metasvc") }

// MetaService returns where the realm's metadata service is. A realm whose
// serving device has not run 'cairn node serve' since this record was
// introduced has none: NotFound.
func (s *Service) MetaService(ctx context.Context) (*MetaServiceRecord, error) {
	var rec MetaServiceRecord
	if _, err := s.getJSON(ctx, "metadata service", s.metaSvcKey(), &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// UpdateMetaService changes the record with f, under a compare-and-swap on
// its revision (retried if another device changed it meanwhile). f gets
// the current record (empty if there is none) and changes it in place; it
// returns false to leave it as it is.
func (s *Service) UpdateMetaService(ctx context.Context, f func(*MetaServiceRecord) bool) error {
	const op = "record metadata service"
	k := s.metaSvcKey()
	for {
		octx, cancel := s.opCtx(ctx)
		resp, err := s.cli.Get(octx, k)
		cancel()
		if err != nil {
			return etcdErr(op, "metasvc", err)
		}
		var rec MetaServiceRecord
		var rev int64
		if len(resp.Kvs) > 0 {
			if uerr := json.Unmarshal(resp.Kvs[0].Value, &rec); uerr != nil {
				return cairn.E(op, cairn.Corrupt, "metasvc", uerr)
			}
			rev = resp.Kvs[0].ModRevision
		}
		if !f(&rec) {
			return nil
		}
		for _, m := range rec.Members {
			if m.Node == "" {
				return cairn.E(op, cairn.Invalid, "metasvc", errors.New("a member without a node name"))
			}
		}
		rec.Updated = time.Now().UnixNano()
		b, err := json.Marshal(&rec)
		if err != nil {
			return cairn.E(op, cairn.Other, "metasvc", err)
		}
		octx, cancel = s.opCtx(ctx)
		tr, err := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).Then(clientv3.OpPut(k, string(b))).Commit()
		cancel()
		if err != nil {
			return etcdErr(op, "metasvc", err)
		}
		if tr.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return cairn.E(op, cairn.Canceled, "metasvc", err)
		}
	}
}

// SetMetaGateway records that node serves the metadata gateway at addr: it
// updates node's entry, or adds one. The first device records itself so
// when its node first serves.
func (s *Service) SetMetaGateway(ctx context.Context, node, addr string) error {
	if node == "" || addr == "" {
		return cairn.E("record metadata service", cairn.Invalid, node, fmt.Errorf("node %q, gateway %q", node, addr))
	}
	return s.UpdateMetaService(ctx, func(rec *MetaServiceRecord) bool {
		i := slices.IndexFunc(rec.Members, func(m MetaMember) bool { return m.Node == node })
		if i < 0 {
			rec.Members = append(rec.Members, MetaMember{Node: node, Gateway: addr})
			return true
		}
		if rec.Members[i].Gateway == addr {
			return false
		}
		rec.Members[i].Gateway = addr
		return true
	})
}
