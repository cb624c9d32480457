package meta

// Placement policies: where the data of the files under a path goes
// (DESIGN.md, "placement policy"). A policy is set on a volume's root or on
// a directory path, at v/<volID>/policy/<path> (value: PolicyRecord), and
// the policy in force for a file is the one set on the longest prefix of
// its path. Policies are keyed by path, not by directory: renaming a
// directory leaves its policy on the old path (doc/format.md, "Metadata
// keys"). A policy decides where new versions go; each version records the
// policy it was written under in its stores list, so any device can read it
// back whatever policies say later.

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

// Policy kinds.
const (
	PolicyLocal  = "local"  // the writing device's store (the default)
	PolicyCopies = "copies" // copies:N@s1,...,sn: N whole copies on N of the n stores
	PolicyEC     = "ec"     // ec:K+M@s1,...,sN: Reed-Solomon, shard i on store i, N = K+M
	PolicyStripe = "stripe" // stripe:W[,greedy][@b1,...]: morsels round-robin over W benefactors
)

// StripeGreedy is the greedy striping strategy (FreeLoader 4.1.2), the
// only one so far.
const StripeGreedy = "greedy"

// MaxPolicyStores bounds the stores one policy names.
const MaxPolicyStores = 255

// Policy is a parsed placement policy.
type Policy struct {
	Kind  string // PolicyLocal, PolicyCopies or PolicyEC
	N     int    // copies: copies to keep
	K, M  int    // ec: data and parity shards
	W     int    // stripe: the stripe width
	Strat string // stripe: the strategy (StripeGreedy)
	// Stores: copies and ec: member stores (registered stores or nodes),
	// in order. stripe: none in a policy a person sets; in the policy a
	// version records, the benefactors its morsels went to (the stripe
	// node set), in the order they were chosen.
	Stores []string
}

// String is the policy's canonical form, the one versions record.
func (p Policy) String() string {
	switch p.Kind {
	case PolicyCopies:
		return fmt.Sprintf("copies:%d@%s", p.N, strings.Join(p.Stores, ","))
	case PolicyEC:
		return fmt.Sprintf("ec:%d+%d@%s", p.K, p.M, strings.Join(p.Stores, ","))
	case PolicyStripe:
		s := fmt.Sprintf("stripe:%d,%s", p.W, p.Strat)
		if len(p.Stores) > 0 {
			s += "@" + strings.Join(p.Stores, ",")
		}
		return s
	}
	return PolicyLocal
}

// IsPolicyName reports whether a name in a version's stores list is a
// copies or ec policy (store and node names hold no ':').
func IsPolicyName(name string) bool {
	return strings.HasPrefix(name, PolicyCopies+":") || strings.HasPrefix(name, PolicyEC+":") || strings.HasPrefix(name, PolicyStripe+":")
}

// ParsePolicy parses local, copies:N@a,b,... or ec:K+M@a,b,... and checks
// its form: N ≥ 1 and at least N stores; K, M ≥ 1 and exactly K+M stores;
// at most MaxPolicyStores stores, each a valid store or node name, none
// twice. Whether the stores exist is the caller's business.
func ParsePolicy(s string) (Policy, error) {
	bad := func(why string) (Policy, error) {
		return Policy{}, cairn.E("parse policy", cairn.Invalid, s, errors.New(why))
	}
	if s == PolicyLocal {
		return Policy{Kind: PolicyLocal}, nil
	}
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || (kind != PolicyCopies && kind != PolicyEC && kind != PolicyStripe) {
		return bad("a policy is local, copies:N@STORE,STORE,..., ec:K+M@STORE,...,STORE (K+M stores) or stripe:W[,greedy]")
	}
	if kind == PolicyStripe {
		return parseStripe(s, rest)
	}
	params, list, ok := strings.Cut(rest, "@")
	if !ok || list == "" {
		return bad("the stores follow an '@': " + kind + ":...@STORE,STORE,...")
	}
	p := Policy{Kind: kind, Stores: strings.Split(list, ",")}
	if len(p.Stores) > MaxPolicyStores {
		return bad(fmt.Sprintf("at most %d stores", MaxPolicyStores))
	}
	for i, name := range p.Stores {
		if err := CheckStoreName(name); err != nil {
			return bad(fmt.Sprintf("store %q: a store or node name is 1 to 63 of a-z, 0-9, '.', '_', '-'", name))
		}
		if slices.Contains(p.Stores[:i], name) {
			return bad(fmt.Sprintf("store %q is named twice", name))
		}
	}
	num := func(t string) (int, bool) {
		n, err := strconv.Atoi(t)
		return n, err == nil && n >= 1 && n <= MaxPolicyStores && strconv.Itoa(n) == t
	}
	switch kind {
	case PolicyCopies:
		n, ok := num(params)
		if !ok {
			return bad("copies:N wants N from 1 to 255")
		}
		if n > len(p.Stores) {
			return bad(fmt.Sprintf("%d copies need at least %d stores, %d named", n, n, len(p.Stores)))
		}
		p.N = n
	case PolicyEC:
		ks, ms, ok := strings.Cut(params, "+")
		k, ok1 := num(ks)
		m, ok2 := num(ms)
		if !ok || !ok1 || !ok2 {
			return bad("ec:K+M wants K ≥ 1 data shards and M ≥ 1 parity shards")
		}
		if k+m > MaxPolicyStores {
			return bad(fmt.Sprintf("K+M is at most %d", MaxPolicyStores))
		}
		if len(p.Stores) != k+m {
			return bad(fmt.Sprintf("ec:%d+%d needs exactly %d stores (shard i goes to store i), %d named", k, m, k+m, len(p.Stores)))
		}
		p.K, p.M = k, m
	}
	return p, nil
}

// parseStripe parses what follows "stripe:": W[,greedy][@b1,...,bn],
// 1 <= W <= MaxPolicyStores; the benefactors (what a version records) are
// valid node names, none twice.
func parseStripe(s, rest string) (Policy, error) {
	bad := func(why string) (Policy, error) {
		return Policy{}, cairn.E("parse policy", cairn.Invalid, s, errors.New(why))
	}
	params, list, hasList := strings.Cut(rest, "@")
	ws, strat, hasStrat := strings.Cut(params, ",")
	w, err := strconv.Atoi(ws)
	if err != nil || w < 1 || w > MaxPolicyStores || strconv.Itoa(w) != ws {
		return bad("stripe:W wants a width W from 1 to 255 (stripe:W or stripe:W,greedy)")
	}
	if !hasStrat {
		strat = StripeGreedy
	}
	if strat != StripeGreedy {
		return bad(fmt.Sprintf("striping strategy %q: this cairn knows greedy only", strat))
	}
	p := Policy{Kind: PolicyStripe, W: w, Strat: strat}
	if hasList {
		p.Stores = strings.Split(list, ",")
		if len(p.Stores) > MaxPolicyStores {
			return bad(fmt.Sprintf("at most %d benefactors", MaxPolicyStores))
		}
		for i, name := range p.Stores {
			if err := CheckStoreName(name); err != nil {
				return bad(fmt.Sprintf("benefactor %q: a node name is 1 to 63 of a-z, 0-9, '.', '_', '-'", name))
			}
			if slices.Contains(p.Stores[:i], name) {
				return bad(fmt.Sprintf("benefactor %q is named twice", name))
			}
		}
	}
	return p, nil
}

// PolicyRecord is the value at v/<volID>/policy/<path>.
type PolicyRecord struct {
	Path   string `json:"path"`   // "/" or "/a/b", as keyed
	Policy string `json:"policy"` // canonical (Policy.String)
	Set    int64  `json:"set"`    // unix ns
	SetBy  string `json:"set_by,omitempty"`
}

func (v *Vol) policyPrefix() string { return v.base + "policy/" }

// cleanPolicyPath checks a policy's path: "/" or "/a/b", no empty, "." or
// ".." segment, no trailing slash.
func cleanPolicyPath(p string) (string, error) {
	if p == "/" {
		return p, nil
	}
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return "", cairn.E("policy", cairn.Invalid, p, errors.New("a policy's path is absolute, without a trailing '/'"))
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", cairn.E("policy", cairn.Invalid, p, errors.New("a policy's path has no empty, '.' or '..' segment"))
		}
	}
	return p, nil
}

// SetPolicy records rec.Policy (which the caller has parsed and checked)
// for rec.Path, replacing what was set there.
func (v *Vol) SetPolicy(ctx context.Context, rec PolicyRecord) error {
	p, err := cleanPolicyPath(rec.Path)
	if err != nil {
		return err
	}
	if _, err = ParsePolicy(rec.Policy); err != nil {
		return err
	}
	rec.Path = p
	b, _ := json.Marshal(rec)
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	_, err = v.s.cli.Put(ctx, v.policyPrefix()+p, string(b))
	return etcdErr("set policy", p, err)
}

// DeletePolicy removes the policy set on path exactly (NotFound if none).
func (v *Vol) DeletePolicy(ctx context.Context, path string) error {
	p, err := cleanPolicyPath(path)
	if err != nil {
		return err
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Delete(ctx, v.policyPrefix()+p)
	if err != nil {
		return etcdErr("unset policy", p, err)
	}
	if resp.Deleted == 0 {
		return cairn.E("unset policy", cairn.NotFound, v.V.Name+":"+p, errors.New("no policy is set on this path"))
	}
	return nil
}

// Policies returns every policy set in the volume, by path (one range read).
// Offline, with an offline log, it returns the policies it last read (none
// read: none, so that an offline write goes to this device's store).
func (v *Vol) Policies(ctx context.Context) ([]PolicyRecord, error) {
	if _, l := v.offWriting(ctx); l != nil {
		if p := v.loc().policies.Load(); p != nil {
			return append([]PolicyRecord(nil), (*p)...), nil
		}
		return nil, nil
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	pre := v.policyPrefix()
	resp, err := v.s.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		err = etcdErr("policies", v.V.Name, err)
		if _, l := v.offWriting(ctx); l != nil && cairn.KindOf(err) == cairn.Unavailable {
			return v.Policies(ctx)
		}
		return nil, err
	}
	out := make([]PolicyRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var rec PolicyRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, cairn.E("policies", cairn.Corrupt, strings.TrimPrefix(string(kv.Key), pre), err)
		}
		rec.Path = strings.TrimPrefix(string(kv.Key), pre)
		out = append(out, rec)
	}
	keep := append([]PolicyRecord(nil), out...)
	v.loc().policies.Store(&keep)
	return out, nil
}

// PolicyFor returns the record in force for path ("/a/b/file") among recs:
// the one on the longest prefix of path (whole segments), or nil (local).
func PolicyFor(recs []PolicyRecord, path string) *PolicyRecord {
	var best *PolicyRecord
	for i := range recs {
		r := &recs[i]
		if r.Path != "/" && path != r.Path && !strings.HasPrefix(path, r.Path+"/") {
			continue
		}
		if best == nil || len(r.Path) > len(best.Path) {
			best = r
		}
	}
	return best
}
