package director

import (
	"context"
	"errors"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// A Strategy is one way of choosing where a write's bytes go: the store
// they are written to and the name versions record as where they are (any
// device rebuilds the same read path from that name). A new placement
// (striping across benefactors, staging on surrogates) is a new Strategy
// and a new entry in strategies, not new code in fs, the mount or the CLI.
type Strategy interface {
	// Target returns the store writes go to and the name versions record.
	Target(ctx context.Context) (cairn.Store, string, error)
}

// strategies makes the strategy of a policy, by the policy's kind.
var strategies = map[string]func(ctx context.Context, d *Director, pol meta.Policy) (Strategy, error){
	// Stays where created (ZZFS §3.2): this device's store, or
	// Options.Target.
	meta.PolicyLocal: func(_ context.Context, d *Director, _ meta.Policy) (Strategy, error) {
		return here{d}, nil
	},
	meta.PolicyCopies: wrapperStrategy,
	meta.PolicyEC:     wrapperStrategy,
	// Striped over benefactors (FreeLoader §4.1.2): stripe.go.
	meta.PolicyStripe: stripeStrategy,
}

func wrapperStrategy(ctx context.Context, d *Director, pol meta.Policy) (Strategy, error) {
	return d.Policy(ctx, pol.String())
}

// here is the stays-where-created strategy.
type here struct{ d *Director }

func (h here) Target(ctx context.Context) (cairn.Store, string, error) { return h.d.targetStore(ctx) }

// Write is where a volume's writes go, as the director chose it.
type Write struct {
	// Store is what the file layer writes to and reads through: writes go
	// to the strategy's store; reads go to this device's store, then the
	// chunk cache, then the nodes and stores the version names.
	Store cairn.Store
	// Name is recorded in each version as where its data is.
	Name string
	// Default: the stays-where-created strategy (what Default(policy)
	// reports).
	Default bool
	// Home, if set, is the node the writes were meant for, which is not
	// awake: they go to Name (an offload target) instead, and each commit
	// records an offload entry naming Home, for reclaim (offload.go).
	Home string
	// For a copies policy one of whose members (Home) is not awake:
	// OffloadedTo is the node or store that takes its copies instead,
	// and HomePolicy the policy (Name is the policy with OffloadedTo in
	// Home's place).
	OffloadedTo, HomePolicy string
}

// Default reports whether a write under policy goes where writes go by
// default (stays where created): no policy, "local", or a Target set
// (put --store overrides policies).
func (d *Director) Default(policy string) bool {
	return policy == "" || policy == meta.PolicyLocal || d.opts.Target != ""
}

// ForWrite returns where writes under policy go ("" for the default).
func (d *Director) ForWrite(ctx context.Context, policy string) (Write, error) {
	pol := meta.Policy{Kind: meta.PolicyLocal}
	if !d.Default(policy) {
		var err error
		if pol, err = meta.ParsePolicy(policy); err != nil {
			return Write{}, err
		}
	}
	mk := strategies[pol.Kind]
	if mk == nil {
		return Write{}, cairn.E("open policy", cairn.Invalid, policy, errors.New("no strategy for this kind of policy"))
	}
	var homePolicy, offloadedTo, memberHome string
	if pol.Kind == meta.PolicyCopies {
		// A member that is not awake: its copies go to an offload
		// target, under the policy with the target in its place.
		sub, home, to, err := d.offloadMember(ctx, pol)
		if err != nil {
			return Write{}, err
		}
		if home != "" {
			homePolicy, offloadedTo, memberHome, pol = pol.String(), to, home, sub
		}
	}
	s, err := mk(ctx, d, pol)
	if err != nil {
		return Write{}, err
	}
	target, name, err := s.Target(ctx)
	var home string
	var off errOffload
	if errors.As(err, &off) {
		// The write target is not awake: write elsewhere, and have every
		// commit record where the data was meant to go (offload.go).
		home = off.n.Name
		target, name, err = d.offloadTarget(ctx, off.n)
	}
	if err != nil {
		return Write{}, err
	}
	local, err := d.env.Local(ctx)
	if err != nil {
		return Write{}, err
	}
	if memberHome != "" {
		home = memberHome
	}
	return Write{Store: &deviceStore{local: local, target: target, d: d}, Name: name, Home: home, OffloadedTo: offloadedTo, HomePolicy: homePolicy,
		Default: pol.Kind == meta.PolicyLocal}, nil
}
