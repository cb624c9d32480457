package meta

// Where the realm's metadata service is (DESIGN decision 13): the record at
// metasvc lists the devices that serve it, each with its metadata gateway's
// address. Devices reaching the metadata through a gateway cache the list
// in their realm.json when they connect, so that a service that moves to
// another device (cairn meta move) is found again without a manual edit.
// Key layout: doc/format.md, "Metadata keys".

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

// SetMetaMember records that m.Node serves the metadata: it updates its
// entry (gateway and peer addresses), or adds one. The first device
// records itself so when its node first serves.
func (s *Service) SetMetaMember(ctx context.Context, m MetaMember) error {
	if m.Node == "" || m.Gateway == "" {
		return cairn.E("record metadata service", cairn.Invalid, m.Node, fmt.Errorf("node %q, gateway %q", m.Node, m.Gateway))
	}
	return s.UpdateMetaService(ctx, func(rec *MetaServiceRecord) bool {
		i := slices.IndexFunc(rec.Members, func(o MetaMember) bool { return o.Node == m.Node })
		if i < 0 {
			rec.Members = append(rec.Members, m)
			return true
		}
		if rec.Members[i] == m {
			return false
		}
		rec.Members[i] = m
		return true
	})
}

// WatchMetaService calls f with the record as it is, then each time it
// changes, until ctx ends. (A device reaching the metadata through
// gateways follows the service with it: realm.) It misses no change: a
// watch that ends (no leader for a moment, a connection that moved) is
// taken up again after the last revision it saw, and the record is read
// again if that revision was compacted. Errors end a watch quietly; f is
// not called for a record it cannot read.
func (s *Service) WatchMetaService(ctx context.Context, f func(*MetaServiceRecord)) {
	k := s.metaSvcKey()
	call := func(v []byte) {
		var rec MetaServiceRecord
		if json.Unmarshal(v, &rec) == nil {
			f(&rec)
		}
	}
	var rev int64 // the last revision seen; 0: read the record first
	for ctx.Err() == nil {
		if rev == 0 {
			octx, cancel := s.opCtx(ctx)
			resp, err := s.cli.Get(octx, k)
			cancel()
			if err == nil {
				rev = resp.Header.Revision
				if len(resp.Kvs) == 1 {
					call(resp.Kvs[0].Value)
				}
			}
		}
		if rev != 0 {
			wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			for ev := range s.cli.Watch(wctx, k, clientv3.WithRev(rev+1)) {
				if ev.CompactRevision != 0 {
					rev = 0 // changes lost: read the record again
					break
				}
				for _, e := range ev.Events {
					rev = e.Kv.ModRevision
					if e.Type == clientv3.EventTypePut {
						call(e.Kv.Value)
					}
				}
			}
			wcancel()
		}
		// The watch ended: watch again.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// MetaJoin asks a device to start a member of the realm's etcd that joins
// the cluster (cairn meta move): at metasvc/join/<node>.
type MetaJoin struct {
	// ID is the member's ID (hex), as etcd's MemberAddAsLearner gave it.
	ID string `json:"id"`
	// InitialCluster is etcd's initial cluster for it.
	InitialCluster string `json:"initial_cluster"`
	// Joined is where its metadata gateway listens, set by the device once
	// its member runs.
	Joined string `json:"joined,omitempty"`
}

func (s *Service) metaPeerKey(node string) string { return s.key("metasvc", "peer", node) }
func (s *Service) metaJoinKey(node string) string { return s.key("metasvc", "join", node) }

// SetMetaPeer records where node serves its raft peer gateway (every
// device's node does, so that a member can move to it).
func (s *Service) SetMetaPeer(ctx context.Context, node, addr string) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.cli.Put(ctx, s.metaPeerKey(node), addr); err != nil {
		return etcdErr("record peer gateway", node, err)
	}
	return nil
}

// MetaPeer returns where node serves its raft peer gateway.
func (s *Service) MetaPeer(ctx context.Context, node string) (string, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.metaPeerKey(node))
	if err != nil {
		return "", etcdErr("peer gateway", node, err)
	}
	if len(resp.Kvs) == 0 {
		return "", cairn.E("peer gateway", cairn.NotFound, node, errors.New("its node has not served since it could host the metadata: run 'cairn node serve' there"))
	}
	return string(resp.Kvs[0].Value), nil
}

// PutMetaJoin writes (or, with Joined set, answers) node's join request.
func (s *Service) PutMetaJoin(ctx context.Context, node string, j MetaJoin) error {
	b, _ := json.Marshal(j)
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.cli.Put(ctx, s.metaJoinKey(node), string(b)); err != nil {
		return etcdErr("record metadata join", node, err)
	}
	return nil
}

// DeleteMetaJoin removes node's join request.
func (s *Service) DeleteMetaJoin(ctx context.Context, node string) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.cli.Delete(ctx, s.metaJoinKey(node)); err != nil {
		return etcdErr("remove metadata join", node, err)
	}
	return nil
}

// WatchMetaJoin calls f with node's join request, the current one first
// (if any) and then each change, until ctx ends or f returns false.
func (s *Service) WatchMetaJoin(ctx context.Context, node string, f func(MetaJoin) bool) error {
	k := s.metaJoinKey(node)
	gctx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Get(gctx, k)
	cancel()
	if err != nil {
		return etcdErr("watch metadata join", node, err)
	}
	if len(resp.Kvs) > 0 {
		var j MetaJoin
		if json.Unmarshal(resp.Kvs[0].Value, &j) == nil && !f(j) {
			return nil
		}
	}
	// The watch requires a leader; it is opened again from where it was
	// while the cluster elects one (a membership change on a loaded
	// machine: 'meta add' failed with "no leader" while waiting here),
	// for metaJoinLeaderless at most in a row.
	rev := resp.Header.Revision
	var leaderless time.Time
	for {
		wctx, wcancel := context.WithCancel(ctx)
		var werr error
		for ev := range s.cli.Watch(clientv3.WithRequireLeader(wctx), k, clientv3.WithRev(rev+1)) {
			if werr = ev.Err(); werr != nil {
				break
			}
			leaderless = time.Time{}
			for _, e := range ev.Events {
				rev = e.Kv.ModRevision
				var j MetaJoin
				if e.Type == clientv3.EventTypePut && json.Unmarshal(e.Kv.Value, &j) == nil && !f(j) {
					wcancel()
					return nil
				}
			}
		}
		wcancel()
		if err := ctx.Err(); err != nil {
			return cairn.E("watch metadata join", cairn.Canceled, node, err)
		}
		if werr == nil {
			werr = errors.New("watch ended")
		} else if !errors.Is(werr, rpctypes.ErrNoLeader) && !strings.Contains(werr.Error(), rpctypes.ErrNoLeader.Error()) {
			return etcdErr("watch metadata join", node, werr)
		}
		if leaderless.IsZero() {
			leaderless = time.Now()
		} else if time.Since(leaderless) > metaJoinLeaderless {
			return etcdErr("watch metadata join", node, werr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// metaJoinLeaderless bounds how long WatchMetaJoin waits for a leader.
const metaJoinLeaderless = 30 * time.Second
