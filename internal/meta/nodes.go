package meta

// The node registry (DESIGN: "Devices that sleep"): every node of the realm
// has a record at node/<name>; a node that runs (cairn node serve) holds
// alive/<name> bound to its lease, its heartbeat: it is awake. A node that
// announces it is going to sleep records when (standby) and how it can be
// woken, and ends its lease: it is in standby. A node whose lease lapses
// unannounced is offline; a node removed by its owner keeps its record, marked removed,
// and its certificates are revoked under revoked/serial/<hex> (revoke.go;
// a record of format 1 has its name revoked, revoked/name/<name>). Key
// layout: doc/format.md, "Metadata keys", node registry.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	goccy "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// NodeRecordFormat is the format of node records this cairn writes: 2
// records the serials of the node's certificates (Serials), and a removal
// revokes those. A record without a format is of format 1 (no serials
// recorded at join): its removal revokes the node's name, as format 1 did.
// 3 adds the power state: Standby and Wake (absent in records of formats 1
// and 2, which read as a node that never announced a sleep and has no wake
// method). A record of format 1 stays of format 1 when this cairn writes
// its power fields: the format says how its removal revokes. 4 adds
// AlwaysOn (absent in records of formats 1 to 3, which read as a node not
// marked always-on). 5 adds Donated (absent in records of formats 1 to
// 4, which read as a node that reported no donation).
const NodeRecordFormat = 5

// nodeFormatSerials is the first format whose records list the node's
// certificate serials: a removal revokes those, not the name.
const nodeFormatSerials = 2

// NodeRecord is a node's entry in the registry, at node/<name>.
type NodeRecord struct {
	// Format is NodeRecordFormat for a record made by this cairn; 0 reads
	// as 1 (see NodeRecordFormat).
	Format int    `json:"format,omitempty"`
	Name   string `json:"name"`
	Role   string `json:"role"` // device, benefactor or surrogate
	// Addr is where the node's chunk service listens (host:port); empty
	// until it first serves.
	Addr string `json:"addr,omitempty"`
	// Gateway is where the node serves the metadata gateway (etcd over
	// mutual TLS, devices only), if it does.
	Gateway string `json:"gateway,omitempty"`
	// Capacity and Free are the bytes of the file system that holds the
	// node's store (statfs); Used is what the store takes on it.
	Capacity int64 `json:"capacity,omitempty"`
	Free     int64 `json:"free,omitempty"`
	Used     int64 `json:"used,omitempty"`
	// Rate is the measured serving rate, bytes per second (a moving
	// average over the report intervals in which the node served data);
	// Served is the bytes it served since it started.
	Rate   float64 `json:"rate,omitempty"`
	Served int64   `json:"served,omitempty"`
	// Donated is the space a benefactor offers (node serve --donate): it
	// refuses writes past it. 0: no donation reported (a device, a
	// surrogate, a benefactor serving without --donate, or a record of
	// format 1 to 4). Format 5.
	Donated int64 `json:"donated,omitempty"`
	// Registered is when the node joined (or the realm was created, for
	// the first device); LastSeen its last heartbeat report; Removed when
	// its owner removed it (0: not removed). All unix ns.
	Registered int64 `json:"registered"`
	LastSeen   int64 `json:"last_seen,omitempty"`
	Removed    int64 `json:"removed,omitempty"`
	// Lease is the running node's heartbeat lease (ns); it reports every
	// Lease/3.
	Lease int64 `json:"lease,omitempty"`
	// Serials are the serial numbers (hex) of the certificates the realm
	// CA issued to the node (at join; a WebDAV gateway's own), recorded
	// when they are issued: RemoveNode revokes exactly these.
	Serials []string `json:"serials,omitempty"`
	// Standby is when the node announced it was going to sleep (unix ns;
	// 0: it did not, or it is awake again): its lease ended cleanly, and
	// nobody contacts it until it is woken. Format 3.
	Standby int64 `json:"standby,omitempty"`
	// Wake is how the node can be woken (nil: no wake method known).
	// Format 3.
	Wake *WakeInfo `json:"wake,omitempty"`
	// AlwaysOn marks a node its owner keeps running (a home server, a
	// NAS): the metadata service goes there first when its host sleeps,
	// and it is the default wake proxy of its LAN (doc/power.md). Set by
	// `node serve --always-on` or `node set-always-on`. Format 4.
	AlwaysOn bool `json:"always_on,omitempty"`
}

// WakeInfo says how a sleeping node can be woken: a Wake-on-LAN magic
// packet for MAC, sent to Broadcast (by Proxy, if set, a node awake on the
// sleeper's LAN: the Somniloquy role of DESIGN's "Devices that sleep").
type WakeInfo struct {
	// MAC is the hardware address of the interface that carries the
	// node's address (aa:bb:cc:dd:ee:ff).
	MAC string `json:"mac"`
	// Broadcast is the IPv4 broadcast address of that interface's
	// network (where the magic packet goes); empty if it has none.
	Broadcast string `json:"broadcast,omitempty"`
	// Proxy names the node that sends the packet (empty: none chosen
	// yet; the waker must be on the sleeper's LAN).
	Proxy string `json:"proxy,omitempty"`
	// Set is true if the owner set this by hand (SetNodeWake): a
	// registration then keeps it instead of what it learns.
	Set bool `json:"set,omitempty"`
}

// keep carries what a report does not know from the record it replaces:
// its format, serials and registration time, and its wake method if the
// report learned none or the owner set it by hand, and its always-on mark
// unless the report sets it. Standby is not kept: a report is made by a
// node that is awake.
func (rec *NodeRecord) keep(old *NodeRecord) {
	rec.Format, rec.Serials, rec.Registered = old.Format, old.Serials, old.Registered
	rec.AlwaysOn = rec.AlwaysOn || old.AlwaysOn
	if rec.Format >= nodeFormatSerials {
		rec.Format = NodeRecordFormat
	}
	if old.Wake != nil && (rec.Wake == nil || old.Wake.Set) {
		rec.Wake = old.Wake
	}
}

// DonorFree is the space a benefactor can still take: its donation less
// what its store holds, and never more than its disk has free; without a
// donation, its disk's free space. Reservations (reserve.go) are not
// subtracted here.
func (rec *NodeRecord) DonorFree() int64 {
	free := rec.Free
	if rec.Donated > 0 {
		d := rec.Donated - rec.Used
		if rec.Capacity == 0 || d < free {
			free = d
		}
	}
	return max(free, 0)
}

// Node states, as `cairn devices` shows them (doc/power.md).
const (
	NodeAwake   = "awake"   // its lease is alive
	NodeStandby = "standby" // it announced it was going to sleep, and ended its lease
	NodeOffline = "offline" // no lease, unannounced: stopped, crashed or unreachable
	NodeRemoved = "removed" // removed by its owner; its certificates are revoked

	// NodeOnline is NodeAwake, under the name it had before power states.
	NodeOnline = NodeAwake
)

// NodeStatus is a record and the state derived from the liveness key.
type NodeStatus struct {
	NodeRecord
	State string `json:"state"`
	// Since is when the node entered State, as far as the registry
	// knows (unix ns; 0: unknown): awake, since its registration (its
	// liveness key's since); standby, since its announcement; offline,
	// since its last report; removed, since its removal.
	Since int64 `json:"since,omitempty"`
}

// status derives a node's state and since from its record and its
// liveness key (alive: the key exists; aliveSince: its since).
func status(rec NodeRecord, alive bool, aliveSince int64, now time.Time) NodeStatus {
	st := NodeStatus{NodeRecord: rec, State: nodeState(&rec, alive, now)}
	switch st.State {
	case NodeAwake:
		st.Since = aliveSince
	case NodeStandby:
		st.Since = rec.Standby
	case NodeOffline:
		st.Since = rec.LastSeen
	case NodeRemoved:
		st.Since = rec.Removed
	}
	return st
}

// aliveSince reads the since of a liveness key's value (0 if unreadable).
func aliveSince(v []byte) int64 {
	var a struct {
		Since int64 `json:"since"`
	}
	_ = json.Unmarshal(v, &a)
	return a.Since
}

func (s *Service) nodeKey(name string) string  { return s.key("node", name) }
func (s *Service) aliveKey(name string) string { return s.key("alive", name) }

// PutNode records a node that joins (or the realm's first device): a fresh
// record, replacing any earlier one of that name (a removed node invited
// again under its old name). A record given no Serials is of format 1:
// its removal revokes the name.
func (s *Service) PutNode(ctx context.Context, rec NodeRecord) error {
	if rec.Name == "" {
		return cairn.E("register node", cairn.Invalid, "", errors.New("no name"))
	}
	if rec.Registered == 0 {
		rec.Registered = time.Now().UnixNano()
	}
	// Format 2 only with the serials given: without them a removal must
	// revoke the name (format 1).
	rec.Format = 0
	if len(rec.Serials) > 0 {
		rec.Format = NodeRecordFormat
	}
	b, _ := goccy.Marshal(rec)
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.cli.Put(ctx, s.nodeKey(rec.Name), string(b)); err != nil {
		return etcdErr("register node", rec.Name, err)
	}
	return nil
}

// ClaimNode records a node that joins under rec.Name, unless the registry
// already has a node of that name that is not removed (Kind Exist): of
// concurrent claims of one name exactly one succeeds (compare-and-swap on
// the record's revision). A removed node's record is replaced. undo puts
// back what was there before (nothing, or the removed node's record) if
// the record is still the one the claim wrote: for a join that fails
// after its claim. The record is of format 2: the caller records the
// certificate it issues (AddNodeSerial) before handing it out.
func (s *Service) ClaimNode(ctx context.Context, rec NodeRecord) (func(context.Context) error, error) {
	const op = "register node"
	if rec.Name == "" {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("no name"))
	}
	if rec.Registered == 0 {
		rec.Registered = time.Now().UnixNano()
	}
	rec.Format = NodeRecordFormat
	b, _ := goccy.Marshal(rec)
	k := s.nodeKey(rec.Name)
	octx, cancel := s.opCtx(ctx)
	defer cancel()
	for {
		resp, err := s.cli.Get(octx, k)
		if err != nil {
			return nil, etcdErr(op, rec.Name, err)
		}
		var modRev int64
		var prev []byte
		if len(resp.Kvs) > 0 {
			var old NodeRecord
			if jerr := json.Unmarshal(resp.Kvs[0].Value, &old); jerr != nil {
				return nil, cairn.E(op, cairn.Corrupt, rec.Name, jerr)
			}
			if old.Removed == 0 {
				return nil, cairn.E(op, cairn.Exist, rec.Name, fmt.Errorf("the realm already has a %s named %s", old.Role, rec.Name))
			}
			modRev, prev = resp.Kvs[0].ModRevision, resp.Kvs[0].Value
		}
		tr, err := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", modRev)).Then(clientv3.OpPut(k, string(b))).Commit()
		if err != nil {
			return nil, etcdErr(op, rec.Name, err)
		}
		if !tr.Succeeded {
			continue // claimed or changed in between: look again
		}
		mine := tr.Header.Revision
		return func(ctx context.Context) error {
			ctx, ucancel := s.opCtx(ctx)
			defer ucancel()
			put := clientv3.OpDelete(k)
			if prev != nil {
				put = clientv3.OpPut(k, string(prev))
			}
			if _, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", mine)).Then(put).Commit(); err != nil {
				return etcdErr("undo register node", rec.Name, err)
			}
			return nil
		}, nil
	}
}

// Node returns one node's record and state; NotFound if there is none.
func (s *Service) Node(ctx context.Context, name string) (*NodeStatus, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.nodeKey(name)), clientv3.OpGet(s.aliveKey(name))).Commit()
	if err != nil {
		return nil, etcdErr("node", name, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, cairn.E("node", cairn.NotFound, name, errors.New("no such node (see 'cairn devices')"))
	}
	var rec NodeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return nil, cairn.E("node", cairn.Corrupt, name, err)
	}
	var since int64
	akvs := resp.Responses[1].GetResponseRange().Kvs
	if len(akvs) > 0 {
		since = aliveSince(akvs[0].Value)
	}
	st := status(rec, len(akvs) > 0, since, time.Now())
	return &st, nil
}

// StaleAfter is how many leases after its last report a node whose
// liveness key still exists is nevertheless shown offline. etcd extends
// every lease when it starts, so an embedded etcd that restarts while a
// node is dead would keep the dead node's key alive; its reports, every
// lease/3, stop all the same. Two leases leave room for clock skew between
// the node and the reader.
const StaleAfter = 2

func nodeState(r *NodeRecord, alive bool, now time.Time) string {
	switch {
	case r.Removed != 0:
		return NodeRemoved
	case alive && (r.Lease == 0 || now.UnixNano()-r.LastSeen <= StaleAfter*r.Lease):
		return NodeAwake
	case r.Standby != 0:
		return NodeStandby
	}
	return NodeOffline
}

// Nodes lists every node of the realm, by name, with its state.
func (s *Service) Nodes(ctx context.Context) ([]NodeStatus, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	np, ap := s.key("node")+"/", s.key("alive")+"/"
	// One transaction: records and liveness keys of one revision.
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(np, clientv3.WithPrefix()), clientv3.OpGet(ap, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, etcdErr("list nodes", "", err)
	}
	alive := map[string]int64{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		alive[string(kv.Key[len(ap):])] = aliveSince(kv.Value)
	}
	var out []NodeStatus
	now := time.Now()
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec NodeRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, cairn.E("list nodes", cairn.Corrupt, string(kv.Key), err)
		}
		since, ok := alive[rec.Name]
		out = append(out, status(rec, ok, since, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveNode marks a node removed, ends its liveness key and revokes its
// certificates, in one transaction: the serials its record lists (format
// 2), compared with nothing but themselves; for a record of format 1 (no
// serials recorded at join), its name as of at, which compares at (this
// machine's clock) with the issuing CA host's clock. at is the removal
// time (0: now). NotFound if the registry has no such node.
func (s *Service) RemoveNode(ctx context.Context, name string, at time.Time) error {
	if at.IsZero() {
		at = time.Now()
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	for {
		resp, err := s.cli.Get(ctx, s.nodeKey(name))
		if err != nil {
			return etcdErr("remove node", name, err)
		}
		if len(resp.Kvs) == 0 {
			return cairn.E("remove node", cairn.NotFound, name, errors.New("no such node (see 'cairn devices')"))
		}
		var rec NodeRecord
		if jerr := json.Unmarshal(resp.Kvs[0].Value, &rec); jerr != nil {
			return cairn.E("remove node", cairn.Corrupt, name, jerr)
		}
		rec.Removed = at.UnixNano()
		b, _ := goccy.Marshal(rec)
		rb, _ := goccy.Marshal(revocation{At: at.UTC()})
		k := s.nodeKey(name)
		ops := []clientv3.Op{clientv3.OpPut(k, string(b)), clientv3.OpDelete(s.aliveKey(name))}
		for _, serial := range rec.Serials {
			ops = append(ops, clientv3.OpPut(s.key("revoked", "serial", serial), string(rb)))
		}
		if rec.Format < nodeFormatSerials {
			ops = append(ops, clientv3.OpPut(s.revokedNameKey(name), string(rb)))
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)).Then(ops...).Commit()
		if err != nil {
			return etcdErr("remove node", name, err)
		}
		if tr.Succeeded {
			return nil
		}
		// The node reported in between: apply the removal to its new record.
	}
}

// AddNodeSerial records, in node name's record, the serial (hex) of a
// certificate the realm CA issued to it, so that its removal revokes it.
// Permission if the node was removed, NotFound if it has no record.
func (s *Service) AddNodeSerial(ctx context.Context, name, serial string) error {
	return s.updateNode(ctx, "record certificate", name, noSuchNode, func(rec *NodeRecord) bool {
		if slices.Contains(rec.Serials, serial) {
			return false
		}
		rec.Serials = append(rec.Serials, serial)
		return true
	})
}

// Registration is a running node's presence in the registry: its
// liveness key, bound to a lease kept alive until Close.
type Registration struct {
	s      *Service
	name   string
	since  int64 // unix ns of Register
	ttl    time.Duration
	lease  clientv3.LeaseID
	cancel context.CancelFunc
	lost   chan struct{}
}

// Register starts a node's heartbeat: a lease of ttl (at least 1 s), kept
// alive in the background, holding alive/<name>, and rec written at
// node/<name> (its Registered time kept from an existing record). It fails
// with Permission if the node is removed. The record is written only if it
// is still the one read (compare-and-swap on its revision): a removal made
// in between is never overwritten.
func (s *Service) Register(ctx context.Context, rec NodeRecord, ttl time.Duration) (*Registration, error) {
	const op = "register node"
	if ttl < time.Second {
		return nil, cairn.E(op, cairn.Invalid, rec.Name, fmt.Errorf("lease %v below 1s", ttl))
	}
	octx, ocancel := s.opCtx(ctx)
	defer ocancel()
	lg, err := s.cli.Grant(octx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return nil, etcdErr(op, rec.Name, err)
	}
	fail := func(err error) (*Registration, error) {
		rctx, cancel := s.opCtx(context.WithoutCancel(ctx))
		defer cancel()
		_, _ = s.cli.Revoke(rctx, lg.ID)
		return nil, err
	}
	k := s.nodeKey(rec.Name)
	given := rec.Registered
	var now int64
	for {
		resp, gerr := s.cli.Get(octx, k)
		if gerr != nil {
			return fail(etcdErr(op, rec.Name, gerr))
		}
		var modRev int64 // 0: no record (etcd compares a missing key's revisions as 0)
		// A record Register makes itself knows no serials: format 1, whose
		// removal revokes the name.
		rec.Registered, rec.Format, rec.Serials = given, 0, nil
		if len(resp.Kvs) > 0 {
			var old NodeRecord
			if jerr := json.Unmarshal(resp.Kvs[0].Value, &old); jerr != nil {
				return fail(cairn.E(op, cairn.Corrupt, rec.Name, jerr))
			}
			if old.Removed != 0 {
				return fail(cairn.E(op, cairn.Permission, rec.Name, errors.New("this node was removed from the realm (join again with a new invitation)")))
			}
			rec.keep(&old)
			modRev = resp.Kvs[0].ModRevision
		}
		if testHookRegister != nil {
			testHookRegister()
		}
		now = time.Now().UnixNano()
		if rec.Registered == 0 {
			rec.Registered = now
		}
		rec.LastSeen, rec.Lease = now, int64(ttl)
		b, _ := goccy.Marshal(rec)
		ab, _ := goccy.Marshal(map[string]any{"addr": rec.Addr, "since": now})
		tr, terr := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", modRev)).
			Then(clientv3.OpPut(k, string(b)), clientv3.OpPut(s.aliveKey(rec.Name), string(ab), clientv3.WithLease(lg.ID))).Commit()
		if terr != nil {
			return fail(etcdErr(op, rec.Name, terr))
		}
		if tr.Succeeded {
			break
		}
		// The record changed in between (a removal, another report): read
		// it again.
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := s.cli.KeepAlive(kctx, lg.ID)
	if err != nil {
		cancel()
		return nil, etcdErr(op, rec.Name, err)
	}
	r := &Registration{s: s, name: rec.Name, since: now, ttl: ttl, lease: lg.ID, cancel: cancel, lost: make(chan struct{})}
	go func() {
		for range ch {
		}
		close(r.lost) // the keep-alive ended: canceled, or the lease is gone
	}()
	return r, nil
}

// testHookRegister, if set (tests), runs in Register between reading the
// record and writing it.
var testHookRegister func()

// Lost is closed when the heartbeat ends (Close, or the lease expired
// because etcd could not be reached in time).
func (r *Registration) Lost() <-chan struct{} { return r.lost }

// Update rewrites the node's record with fresh figures (rec.Registered is
// kept, LastSeen set now). It fails with Permission once the node has been
// removed, NotFound if its record is gone.
func (r *Registration) Update(ctx context.Context, rec NodeRecord) error {
	const op = "node report"
	s := r.s
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	for {
		resp, err := s.cli.Get(ctx, s.nodeKey(r.name))
		if err != nil {
			return etcdErr(op, r.name, err)
		}
		if len(resp.Kvs) == 0 {
			return cairn.E(op, cairn.NotFound, r.name, errors.New("the node's registry record is gone"))
		}
		var old NodeRecord
		if err = json.Unmarshal(resp.Kvs[0].Value, &old); err != nil {
			return cairn.E(op, cairn.Corrupt, r.name, err)
		}
		if old.Removed != 0 {
			return cairn.E(op, cairn.Permission, r.name, errors.New("this node was removed from the realm"))
		}
		rec.keep(&old)
		rec.Name, rec.LastSeen, rec.Lease = r.name, time.Now().UnixNano(), int64(r.ttl)
		b, _ := goccy.Marshal(rec)
		k := s.nodeKey(r.name)
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(k, string(b))).Commit()
		if err != nil {
			return etcdErr(op, r.name, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
}

// Standby announces that the node is going to sleep: its record gets
// Standby (now, returned) and wake, unless the owner set a wake method by
// hand (nil: keep the one recorded), and its liveness key is deleted in
// the same transaction, so that it reads as standby, never offline. Then
// the heartbeat ends and the lease is revoked: the Registration is over
// (on resume the node registers again, which clears Standby). Permission
// if the node was removed, NotFound if its record is gone.
func (r *Registration) Standby(ctx context.Context, wake *WakeInfo) (time.Time, error) {
	var now time.Time
	err := r.s.updateNode(ctx, "node standby", r.name, "the node's registry record is gone", func(rec *NodeRecord) bool {
		rec.upgradeFormat()
		if wake != nil && (rec.Wake == nil || !rec.Wake.Set) {
			w := *wake
			w.Set = false
			rec.Wake = &w
		}
		now = time.Now()
		rec.Standby, rec.LastSeen = now.UnixNano(), now.UnixNano()
		return true
	}, clientv3.OpDelete(r.s.aliveKey(r.name)))
	if err != nil {
		return time.Time{}, err
	}
	r.cancel()
	// The liveness key is gone already: a revocation that fails leaves a
	// lease holding nothing, which lapses on its own.
	rctx, cancel := r.s.opCtx(ctx)
	defer cancel()
	_, _ = r.s.cli.Revoke(rctx, r.lease)
	return now, nil
}

// SetNodeWake records how node name can be woken, set by its owner: a
// registration keeps it instead of the method it learns. nil forgets it,
// so that the node's next registration records what it learns. NotFound
// if the node has no record, Permission if it was removed.
func (s *Service) SetNodeWake(ctx context.Context, name string, wake *WakeInfo) error {
	return s.updateNode(ctx, "set wake method", name, noSuchNode, func(rec *NodeRecord) bool {
		rec.upgradeFormat()
		rec.Wake = nil
		if wake != nil {
			w := *wake
			w.Set = true
			rec.Wake = &w
		}
		return true
	})
}

// SetNodeAlwaysOn marks node name always-on (on) or not, in its record.
// NotFound if the node has no record, Permission if it was removed.
func (s *Service) SetNodeAlwaysOn(ctx context.Context, name string, on bool) error {
	return s.updateNode(ctx, "set always-on", name, noSuchNode, func(rec *NodeRecord) bool {
		rec.upgradeFormat()
		rec.AlwaysOn = on
		return true
	})
}

// noSuchNode is why updateNode fails on a node with no record, when a
// person named it.
const noSuchNode = "no such node (see 'cairn devices')"

// upgradeFormat raises a record that has the serials (format 2 or
// later) to the current format before a field of a later format is set;
// a record of format 1 stays 1, read as before.
func (rec *NodeRecord) upgradeFormat() {
	if rec.Format >= nodeFormatSerials {
		rec.Format = NodeRecordFormat
	}
}

// updateNode changes node name's record with fn, compare-and-swapped on
// the revision it read (read again when another change came between), in
// one transaction with the extra operations. fn returns false when the
// record needs no change: nothing is written. NotFound (saying missing)
// if the node has no record, Permission if it was removed.
func (s *Service) updateNode(ctx context.Context, op, name, missing string, fn func(*NodeRecord) bool, extra ...clientv3.Op) error {
	k := s.nodeKey(name)
	octx, cancel := s.opCtx(ctx)
	defer cancel()
	for {
		resp, err := s.cli.Get(octx, k)
		if err != nil {
			return etcdErr(op, name, err)
		}
		if len(resp.Kvs) == 0 {
			return cairn.E(op, cairn.NotFound, name, errors.New(missing))
		}
		var rec NodeRecord
		if err = json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return cairn.E(op, cairn.Corrupt, name, err)
		}
		if rec.Removed != 0 {
			return cairn.E(op, cairn.Permission, name, errors.New("this node was removed from the realm"))
		}
		if !fn(&rec) {
			return nil
		}
		b, _ := goccy.Marshal(rec)
		tr, err := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)).
			Then(append([]clientv3.Op{clientv3.OpPut(k, string(b))}, extra...)...).Commit()
		if err != nil {
			return etcdErr(op, name, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
}

// Close ends the heartbeat and revokes the lease, so the node shows offline
// at once (a node that dies without Close shows offline when its lease
// lapses).
func (r *Registration) Close(ctx context.Context) error {
	r.cancel()
	ctx, cancel := r.s.opCtx(ctx)
	defer cancel()
	if _, err := r.s.cli.Revoke(ctx, r.lease); err != nil {
		return etcdErr("deregister node", r.name, err)
	}
	return nil
}

// ---- realm CA record ----

// CARecord names the realm CA, at pki/ca: written once, when the CA is made,
// so that a second machine of the realm cannot make another.
type CARecord struct {
	Fingerprint string `json:"fingerprint"` // SHA-256 of the CA certificate's DER, hex
	Holder      string `json:"holder"`      // the node name of the device that holds its key
	Created     int64  `json:"created"`     // unix ns
}

// SetCA records the realm CA. It fails with Exist (naming the holder) if
// the realm already has one.
func (s *Service) SetCA(ctx context.Context, rec CARecord) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	k := s.key("pki", "ca")
	b, _ := goccy.Marshal(rec)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(b))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return etcdErr("record ca", "", err)
	}
	if !resp.Succeeded {
		var old CARecord
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &old)
		}
		if old.Fingerprint == rec.Fingerprint {
			return nil
		}
		return cairn.E("record ca", cairn.Exist, old.Holder, fmt.Errorf("the realm already has a CA, held by %s", old.Holder))
	}
	return nil
}

// CA returns the realm CA record, NotFound if the realm has none yet.
func (s *Service) CA(ctx context.Context) (*CARecord, error) {
	var r CARecord
	if _, err := s.getJSON(ctx, "realm ca", s.key("pki", "ca"), &r); err != nil {
		return nil, err
	}
	return &r, nil
}
