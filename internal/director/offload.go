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

// OffloadDecide is a Decider that offloads a write target that is not
// awake (but not a removed one) and otherwise decides as next (nil:
// DefaultDecide).
func OffloadDecide(next Decider) Decider {
	if next == nil {
		next = DefaultDecide
	}
	return func(ctx context.Context, n meta.NodeStatus, use Use) Decision {
		if use == ForWrite && n.Removed == 0 && n.Role != string(pki.Surrogate) {
			return Offload
		}
		return next(ctx, n, use)
	}
}

// offloadTarget returns the store writes meant for home go to instead,
// and the name versions record for it: Options.OffloadTo if it names one,
// else (auto) this device's own store, else the first awake device or
// benefactor by name. The choice is made once per director and kept.
func (d *Director) offloadTarget(ctx context.Context, home meta.NodeStatus) (cairn.Store, string, error) {
	const op = "offload"
	self, err := d.env.Self(ctx)
	if err != nil {
		return nil, "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, "", errClosed
	}
	if d.offStore != nil {
		return d.offStore, d.offName, nil
	}
	want := d.opts.OffloadTo
	if want == "auto" {
		want = ""
	}
	if want == home.Name {
		return nil, "", cairn.E(op, cairn.Invalid, want, errors.New("the offload target is the node the write was meant for"))
	}
	if (want == "" && self != "" && self != home.Name) || (want != "" && want == self) {
		local, lerr := d.env.Local(ctx)
		if lerr != nil {
			return nil, "", lerr
		}
		d.offStore, d.offName = local, self
		return local, self, nil
	}
	if want != "" {
		if n, serr := d.env.Store(ctx, want); serr != nil {
			return nil, "", serr
		} else if n != nil {
			if n.Draining {
				return nil, "", cairn.E(op, cairn.Permission, want, errors.New("the store is being removed: no new data goes to it"))
			}
			d.offStore, d.offName = n.Store, want
			return n.Store, want, nil
		}
	}
	nodes, err := d.env.Nodes(ctx)
	if err != nil {
		return nil, "", err
	}
	slices.SortFunc(nodes, func(a, b meta.NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	var why []string
	for _, n := range nodes {
		if n.Name == home.Name || n.Name == self || (want != "" && n.Name != want) {
			continue
		}
		if n.Removed != 0 || n.Role == string(pki.Surrogate) || n.State != meta.NodeOnline || n.Addr == "" {
			if want != "" {
				why = append(why, fmt.Sprintf("%s: not awake or not a place to write (%s)", n.Name, n.State))
			}
			continue
		}
		rs, err := d.env.Dial(ctx, n.Name, n.Addr)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", n.Name, err))
			continue
		}
		d.offStore, d.offName, d.offOwns = rs, n.Name, true
		return rs, n.Name, nil
	}
	if want != "" && len(why) == 0 {
		return nil, "", cairn.E(op, cairn.NotFound, want, errors.New("no such node or store in the realm"))
	}
	why = append([]string{notAwake(home)}, why...)
	return nil, "", cairn.E(op, cairn.Unavailable, home.Name, fmt.Errorf("no awake offload target: %s", strings.Join(why, "; ")))
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
