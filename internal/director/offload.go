package director

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// Offload (doc/director.md, "Offload and reclaim"): a write whose target
// node is not awake goes to an awake offload target instead; the version
// names the offload target as where its data is (so any reader reads it
// from there without waking the home), and its commit records an offload
// entry (meta.Offload) naming the home, in the commit's own transaction.
// Reclaim (the realm's, internal/realm/offload.go) later copies the data
// home and rewrites the version's stores.

// errOffload is targetStore's answer when Decide said Offload for the
// write target n: ForWrite then picks an offload target.
type errOffload struct{ n meta.NodeStatus }

func (e errOffload) Error() string { return "offload writes for " + e.n.Name }

// OffloadDecide is a Decider that offloads a write target or a copies
// policy's member that is not awake (but not a removed one) and
// otherwise decides as next (nil: DefaultDecide). A member being read is
// skipped as by Fail (its wrapper reads the other members).
func OffloadDecide(next Decider) Decider {
	if next == nil {
		next = DefaultDecide
	}
	return func(ctx context.Context, n meta.NodeStatus, use Use) Decision {
		if (use == ForWrite || use == ForMember) && n.Removed == 0 && n.Role != string(pki.Surrogate) {
			return Offload
		}
		return next(ctx, n, use)
	}
}

// offloadTarget returns the store writes meant for home (the write
// target) go to instead, and the name versions record for it
// (offloadName). The choice is made once per director and kept.
func (d *Director) offloadTarget(ctx context.Context, home meta.NodeStatus) (cairn.Store, string, error) {
	name, err := d.offloadName(ctx, home, nil)
	if err != nil {
		return nil, "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, "", errClosed
	}
	if d.offStore != nil && d.offName == name {
		return d.offStore, d.offName, nil
	}
	st, done, err := d.OpenStore(ctx, name)
	if err != nil {
		return nil, "", err
	}
	if d.offDone != nil {
		d.offDone()
	}
	d.offStore, d.offName, d.offDone = st, name, done
	return st, name, nil
}

// offloadName picks where writes meant for home go instead:
// Options.OffloadTo if it names one, else (auto) this device, else the
// first awake device or benefactor by name; never the home, a surrogate,
// or one of exclude (the other members of a copies policy).
func (d *Director) offloadName(ctx context.Context, home meta.NodeStatus, exclude []string) (string, error) {
	const op = "offload"
	self, err := d.env.Self(ctx)
	if err != nil {
		return "", err
	}
	want := d.opts.OffloadTo
	if want == "auto" {
		want = ""
	}
	if want == home.Name || (want != "" && slices.Contains(exclude, want)) {
		return "", cairn.E(op, cairn.Invalid, want, errors.New("the offload target is the node the write was meant for, or already holds a copy"))
	}
	if (want == "" && self != "" && self != home.Name && !slices.Contains(exclude, self)) || (want != "" && want == self) {
		return self, nil
	}
	if want != "" {
		if n, serr := d.env.Store(ctx, want); serr != nil {
			return "", serr
		} else if n != nil {
			if n.Draining {
				return "", cairn.E(op, cairn.Permission, want, errors.New("the store is being removed: no new data goes to it"))
			}
			return want, nil
		}
	}
	nodes, err := d.env.Nodes(ctx)
	if err != nil {
		return "", err
	}
	slices.SortFunc(nodes, func(a, b meta.NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	var why []string
	for _, n := range nodes {
		if n.Name == home.Name || n.Name == self || slices.Contains(exclude, n.Name) || (want != "" && n.Name != want) {
			continue
		}
		if n.Removed != 0 || n.Role == string(pki.Surrogate) || n.State != meta.NodeOnline || n.Addr == "" {
			if want != "" {
				why = append(why, fmt.Sprintf("%s: not awake or not a place to write (%s)", n.Name, n.State))
			}
			continue
		}
		return n.Name, nil
	}
	if want != "" && len(why) == 0 {
		return "", cairn.E(op, cairn.NotFound, want, errors.New("no such node or store in the realm"))
	}
	why = append([]string{notAwake(home)}, why...)
	return "", cairn.E(op, cairn.Unavailable, home.Name, fmt.Errorf("no awake offload target: %s", strings.Join(why, "; ")))
}

// offloadMember returns, for a copies policy exactly one of whose members
// is a node that is not awake and that Decide says to offload, and that
// has fewer awake members than copies without it, the policy
// with an offload target in that member's place, the member and the
// target. Otherwise (all awake, several asleep, no target) it returns
// home "": the policy's own wrapper writes to its awake members and
// queues the sleeper's copies for repair, as before.
func (d *Director) offloadMember(ctx context.Context, pol meta.Policy) (meta.Policy, string, string, error) {
	var asleep []meta.NodeStatus
	at, notAwake := -1, 0
	for i, name := range pol.Stores {
		if n, err := d.env.Store(ctx, name); err != nil || n != nil {
			continue // a registered store does not sleep (or the wrapper reports it)
		}
		st, err := d.env.Node(ctx, name)
		if err != nil || st.Removed != 0 || (st.State == meta.NodeOnline && st.Addr != "") {
			continue
		}
		notAwake++
		if d.opts.Decide(ctx, *st, ForMember) != Offload {
			continue
		}
		asleep, at = append(asleep, *st), i
	}
	if len(asleep) != 1 || len(pol.Stores)-notAwake >= pol.N {
		// (With as many awake members as copies, the wrapper keeps the
		// N copies on them: rendezvous order passes over a member that
		// is down. Nothing to offload.)
		return pol, "", "", nil
	}
	to, err := d.offloadName(ctx, asleep[0], pol.Stores)
	if err != nil {
		d.log.Warn("a policy member is not awake and no offload target is: its copies wait for repair", "policy", pol.String(), "member", asleep[0].Name, "err", err)
		return pol, "", "", nil
	}
	sub := pol
	sub.Stores = slices.Clone(pol.Stores)
	sub.Stores[at] = to
	return sub, asleep[0].Name, to, nil
}

// OpenStore opens the store called name as versions name it: this
// device's store, a registered store or an awake node's chunk service
// (reclaim's source and destination). done releases it.
func (d *Director) OpenStore(ctx context.Context, name string) (st cairn.Store, done func(), err error) {
	self, err := d.env.Self(ctx)
	if err != nil {
		return nil, nil, err
	}
	if name == self {
		local, lerr := d.env.Local(ctx)
		return local, func() {}, lerr
	}
	n, err := d.env.Store(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	if n != nil {
		return n.Store, func() {}, nil
	}
	rs, err := d.OpenNode(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return rs, func() { rs.Close() }, nil
}

// ForMove returns where writes go for a file being moved to home (a node
// or registered store; doc/director.md, "Moves") while the move's copy
// runs: home lacks most of the file's chunks until then, so a version
// written there would send the whole file and wait for the move. Instead
// the write is offloaded, as to a home that is not awake: to the offload
// target (this device unless Options.OffloadTo names another), which
// stores only the chunks it lacks, and each commit records an offload
// entry naming home, reclaimed there once the copy is done. On home
// itself, writes stay on this device's store, which is home.
func (d *Director) ForMove(ctx context.Context, home string) (Write, error) {
	local, err := d.env.Local(ctx)
	if err != nil {
		return Write{}, err
	}
	if self, errIn := d.env.Self(ctx); errIn != nil {
		return Write{}, errIn
	} else if self == home {
		return Write{Store: &deviceStore{local: local, target: local, d: d}, Name: self, Default: true}, nil
	}
	target, name, err := d.offloadTarget(ctx, meta.NodeStatus{NodeRecord: meta.NodeRecord{Name: home}})
	if err != nil {
		return Write{}, err
	}
	return Write{Store: &deviceStore{local: local, target: target, d: d}, Name: name, Home: home}, nil
}
