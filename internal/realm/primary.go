package realm

// Primaries of copies replica sets (doc/director.md, "Primaries"): set
// with the policy, handed to an awake replica when this device announces
// standby.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// Primary is director.Primaries: the primary of copies policy, "" if it
// has none.
func (e env) Primary(ctx context.Context, policy string) (string, error) {
	rec, err := e.r.Meta.Primary(ctx, policy)
	if errors.Is(err, cairn.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return rec.Primary, nil
}

// Primaries returns every primary record, by policy.
func (r *Realm) Primaries(ctx context.Context) (map[string]meta.PrimaryRecord, error) {
	recs, err := r.Meta.Primaries(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]meta.PrimaryRecord, len(recs))
	for _, rec := range recs {
		out[rec.Policy] = rec
	}
	return out, nil
}

// choosePrimary returns the primary a copies policy gets when it is set:
// want if given (a device the policy names), else this device if the
// policy names it, else the first device the policy names; "" if it names
// no device (registered stores only).
func (r *Realm) choosePrimary(ctx context.Context, pol meta.Policy, want string) (string, error) {
	if want != "" && pol.Kind != meta.PolicyCopies {
		return "", cairn.E("set policy", cairn.Invalid, want, errors.New("only a copies policy has a primary"))
	}
	if pol.Kind != meta.PolicyCopies {
		return "", nil
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return "", err
	}
	device := func(name string) bool {
		return slices.ContainsFunc(nodes, func(n meta.NodeStatus) bool {
			return n.Name == name && n.Role == string(pki.Device) && n.Removed == 0
		})
	}
	if want != "" {
		if !slices.Contains(pol.Stores, want) || !device(want) {
			return "", cairn.E("set policy", cairn.Invalid, want, fmt.Errorf("the primary is one of the devices %s names", pol))
		}
		return want, nil
	}
	if self := r.nodeName(ctx); self != "" && slices.Contains(pol.Stores, self) && device(self) {
		return self, nil
	}
	for _, s := range pol.Stores {
		if device(s) {
			return s, nil
		}
	}
	return "", nil
}

// PrimaryHandoff is what a standby did with the primary roles this device
// held.
type PrimaryHandoff struct {
	Policy string `json:"policy"`
	To     string `json:"to,omitempty"`   // the replica that took the role
	Kept   string `json:"kept,omitempty"` // why the role stayed here
}

// handPrimaries moves every primary role this device (self) holds to an
// awake replica, in one transaction compared on each record's revision
// (tried again if a record changed meanwhile), before the standby is
// recorded; no data moves. The replica chosen is an awake device the
// policy names: an always-on one first (it will not sleep soon), then
// the fastest measured serving rate, then by name. A role with no awake
// replica stays here, with a warning: readers then read the other
// replicas' stores as the copies wrapper orders them.
func (r *Realm) handPrimaries(ctx context.Context, self string) ([]PrimaryHandoff, error) {
	var out []PrimaryHandoff
	for attempt := 0; ; attempt++ {
		out = out[:0]
		recs, err := r.Meta.Primaries(ctx)
		if err != nil {
			return nil, err
		}
		nodes, err := r.Meta.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		byName := map[string]meta.NodeStatus{}
		for _, n := range nodes {
			byName[n.Name] = n
		}
		var moves []meta.PrimaryMove
		for _, rec := range recs {
			if rec.Primary != self {
				continue
			}
			pol, perr := meta.ParsePolicy(rec.Policy)
			if perr != nil {
				continue // DecodePrimary checked it
			}
			var cands []meta.NodeStatus
			for _, s := range pol.Stores {
				n, ok := byName[s]
				if ok && s != self && n.Role == string(pki.Device) && n.Removed == 0 && n.State == meta.NodeOnline && n.Addr != "" {
					cands = append(cands, n)
				}
			}
			if len(cands) == 0 {
				out = append(out, PrimaryHandoff{Policy: rec.Policy, Kept: "no other replica is awake"})
				continue
			}
			sortHeirs(cands)
			moves = append(moves, meta.PrimaryMove{From: rec, To: cands[0].Name})
			out = append(out, PrimaryHandoff{Policy: rec.Policy, To: cands[0].Name})
		}
		err = r.Meta.HandPrimaries(ctx, moves, self, "standby of "+self, time.Now().UnixNano())
		if errors.Is(err, cairn.ErrConflict) && attempt < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, h := range out {
			if h.To != "" {
				r.log.Info("standby: primary role handed to an awake replica", "node", self, "policy", h.Policy, "to", h.To)
			} else {
				r.log.Warn("standby: the primary role stays with this device", "node", self, "policy", h.Policy, "why", h.Kept)
			}
		}
		return out, nil
	}
}

// sortHeirs orders the awake replicas that could take a primary role:
// always-on ones first (they will not sleep soon), then the fastest
// measured serving rate, then by name.
func sortHeirs(cands []meta.NodeStatus) {
	slices.SortFunc(cands, func(a, b meta.NodeStatus) int {
		if a.AlwaysOn != b.AlwaysOn {
			if a.AlwaysOn {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.Rate, a.Rate); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
}
