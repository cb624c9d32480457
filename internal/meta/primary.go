package meta

// Primaries (ZZFS §3.3): every copies:N replica set has one primary
// device, the replica reads ask first. The record is keyed by the
// replica set, the canonical policy string (`primary/<policy>`), since a
// version names its policy string and not the path it was written under:
// every subtree set to the same copies policy shares its primary. A
// device announcing standby hands each primary role it holds to an awake
// replica in one transaction (HandPrimaries), moving no data.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// PrimaryRecordFormat is the format of primary records this cairn writes.
const PrimaryRecordFormat = 1

// PrimaryRecord is the value at primary/<policy>.
type PrimaryRecord struct {
	Format  int    `json:"format"`
	Policy  string `json:"policy"`  // canonical copies policy (Policy.String)
	Primary string `json:"primary"` // a node the policy names
	Set     int64  `json:"set"`     // unix ns
	SetBy   string `json:"set_by,omitempty"`
	// Why says how the role came there: "set" (cairn policy set) or
	// "standby of NAME" (handed over by NAME's announced standby).
	Why string `json:"why,omitempty"`
	// Rev is the record's etcd ModRevision (not stored): HandPrimaries
	// compares it.
	Rev int64 `json:"-"`
}

// DecodePrimary decodes a primary record; Kind Corrupt if it is not one
// this cairn knows (another format, no primary, a policy that is not a
// copies policy naming the primary).
func DecodePrimary(b []byte) (PrimaryRecord, error) {
	var r PrimaryRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return PrimaryRecord{}, cairn.E("primary", cairn.Corrupt, "", err)
	}
	if r.Format != PrimaryRecordFormat {
		return PrimaryRecord{}, cairn.E("primary", cairn.Corrupt, r.Policy, fmt.Errorf("primary record of format %d; this cairn reads format %d", r.Format, PrimaryRecordFormat))
	}
	if err := checkPrimary(r.Policy, r.Primary); err != nil {
		return PrimaryRecord{}, cairn.E("primary", cairn.Corrupt, r.Policy, err)
	}
	return r, nil
}

// checkPrimary checks that policy is a canonical copies policy naming
// primary.
func checkPrimary(policy, primary string) error {
	p, err := ParsePolicy(policy)
	if err != nil {
		return err
	}
	if p.Kind != PolicyCopies || p.String() != policy {
		return fmt.Errorf("a primary belongs to a canonical copies policy, not %q", policy)
	}
	for _, s := range p.Stores {
		if s == primary {
			return nil
		}
	}
	return fmt.Errorf("the primary %q is not one of the policy's stores", primary)
}

func (s *Service) primaryKey(policy string) string { return s.key("primary", policy) }

// SetPrimary records rec.Primary as the primary of rec.Policy (a
// canonical copies policy naming it), replacing what was there.
func (s *Service) SetPrimary(ctx context.Context, rec PrimaryRecord) error {
	if err := checkPrimary(rec.Policy, rec.Primary); err != nil {
		return cairn.E("set primary", cairn.Invalid, rec.Policy, err)
	}
	rec.Format = PrimaryRecordFormat
	b, _ := json.Marshal(rec)
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	_, err := s.cli.Put(ctx, s.primaryKey(rec.Policy), string(b))
	return etcdErr("set primary", rec.Policy, err)
}

// Primary returns the primary record of policy; Kind NotFound if it has
// none.
func (s *Service) Primary(ctx context.Context, policy string) (*PrimaryRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.primaryKey(policy))
	if err != nil {
		return nil, etcdErr("primary", policy, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("primary", cairn.NotFound, policy, errors.New("the policy has no primary"))
	}
	r, err := DecodePrimary(resp.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	r.Rev = resp.Kvs[0].ModRevision
	return &r, nil
}

// Primaries returns every primary record (one range read), by policy.
func (s *Service) Primaries(ctx context.Context) ([]PrimaryRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	pre := s.key("primary") + "/"
	resp, err := s.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, etcdErr("primaries", "", err)
	}
	out := make([]PrimaryRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := DecodePrimary(kv.Value)
		if err != nil {
			return nil, cairn.E("primaries", cairn.Corrupt, strings.TrimPrefix(string(kv.Key), pre), err)
		}
		r.Rev = kv.ModRevision
		out = append(out, r)
	}
	return out, nil
}

// PrimaryMove hands the primary of From.Policy (the record as read, its
// Rev compared) to To.
type PrimaryMove struct {
	From PrimaryRecord
	To   string
}

// HandPrimaries moves every primary role of moves in one transaction,
// each guarded by its record's revision: if any record changed since it
// was read, nothing moves and the error has Kind Conflict. by and why go
// into the new records.
func (s *Service) HandPrimaries(ctx context.Context, moves []PrimaryMove, by, why string, at int64) error {
	if len(moves) == 0 {
		return nil
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, m := range moves {
		if err := checkPrimary(m.From.Policy, m.To); err != nil {
			return cairn.E("hand primaries", cairn.Invalid, m.From.Policy, err)
		}
		rec := PrimaryRecord{Format: PrimaryRecordFormat, Policy: m.From.Policy, Primary: m.To, Set: at, SetBy: by, Why: why}
		b, _ := json.Marshal(rec)
		k := s.primaryKey(m.From.Policy)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", m.From.Rev))
		ops = append(ops, clientv3.OpPut(k, string(b)))
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return etcdErr("hand primaries", "", err)
	}
	if !resp.Succeeded {
		return cairn.E("hand primaries", cairn.Conflict, "", errors.New("a primary record changed meanwhile; read them again"))
	}
	return nil
}
