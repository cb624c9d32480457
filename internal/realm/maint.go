package realm

// Background work (gc, scrub, repair) and sleeping nodes (doc/power.md,
// "Background work"): the work skips the stores of nodes that are not
// awake, never dialling them (nothing wakes a sleeper), says so, and
// records per store when it last completed (meta.MarkMaint), so that a
// later run, or the node daemon's schedule (maintLoop), catches up a
// store skipped while its node slept.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// SkippedStore is a store background work left alone because the node
// that holds it is not awake (an error, among GCStores' unreachable ones).
type SkippedStore struct {
	Store string // the store's name (the node's, for a node's own store)
	Node  string
	State string // meta.NodeStandby, meta.NodeOffline
	Since time.Time
}

func (s *SkippedStore) Error() string {
	since := "an unknown time"
	if !s.Since.IsZero() {
		since = s.Since.Local().Format(time.DateTime)
	}
	what := ""
	if s.Store != s.Node {
		what = "store " + s.Store + ": "
	}
	return fmt.Sprintf("skipped: %snode %s is %s since %s", what, s.Node, s.State, since)
}

// Standby says the node announced its sleep: nothing is wrong, the work
// catches up once it is awake.
func (s *SkippedStore) Standby() bool { return s.State == meta.NodeStandby }

func skipped(store string, n meta.NodeStatus) *SkippedStore {
	s := &SkippedStore{Store: store, Node: n.Name, State: n.State}
	if n.Since != 0 {
		s.Since = time.Unix(0, n.Since)
	}
	return s
}

// sleepers maps the store names of a policy or a gc that are on a node
// not awake (a node's own store, or a registered node://NODE store) to
// that node's status. Removed nodes are not listed.
func (r *Realm) sleepers(ctx context.Context) (map[string]meta.NodeStatus, error) {
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]meta.NodeStatus{}
	for _, n := range nodes {
		if n.Removed == 0 && n.State != meta.NodeAwake {
			out[n.Name] = n
		}
	}
	recs, err := r.Meta.Stores(ctx)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if node, ok := strings.CutPrefix(rec.URL, "node://"); ok {
			if n, asleep := out[node]; asleep {
				out[rec.Name] = n
			}
		}
	}
	return out, nil
}

// GCOptions configure GC.
type GCOptions struct {
	DryRun   bool
	Progress func(done, total int)
}

// GC collects garbage in this device's store and in every other store
// that can be reached (fs.GC), skipping the stores of nodes that are not
// awake (never dialled). It returns the report, the stores skipped or
// unreachable (each a *SkippedStore or the error that made it so), and
// records, unless DryRun, the collection in every store it swept to the
// end (meta.MarkMaint).
func (r *Realm) GC(ctx context.Context, o GCOptions) (*fs.GCReport, []error, error) {
	vols, err := r.AllVolumes(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := r.Store(ctx)
	if err != nil {
		return nil, nil, err
	}
	others, unreachable, closeOthers, err := r.GCStores(ctx)
	defer closeOthers()
	if err != nil {
		return nil, unreachable, err
	}
	started := time.Now()
	rep, err := fs.GC(ctx, r.Meta, vols, st, fs.GCOptions{DryRun: o.DryRun, Progress: o.Progress, Others: others, Keep: []cairn.ID{r.MarkerID()}})
	if err != nil || o.DryRun {
		return rep, unreachable, err
	}
	done := []string{}
	if self := r.nodeName(ctx); self != "" {
		done = append(done, self)
	}
	for _, s := range rep.Stores {
		if s.Error == "" {
			done = append(done, s.Name)
		}
	}
	done = r.maintNames(ctx, done)
	if merr := r.Meta.MarkMaint(ctx, meta.MaintGC, started, done...); merr != nil {
		r.log.Warn("gc: record the stores collected", "err", merr)
	}
	return rep, unreachable, nil
}

// AsSkipped reports whether err is a store skipped because its node is
// not awake.
func AsSkipped(err error) (*SkippedStore, bool) {
	var s *SkippedStore
	ok := errors.As(err, &s)
	return s, ok
}

// Defaults of the node daemon's background-work schedule.
const (
	DefaultMaintEvery = 24 * time.Hour
	// scrubFactor: a scrub reads every copy, so it is due this many
	// times less often than gc and repair.
	scrubFactor = 7
)

// MaintOptions configure the node daemon's background-work schedule.
type MaintOptions struct {
	// Every is how old a store's last gc and repair may grow before they
	// are due again (its scrub: scrubFactor times that). 0: no schedule.
	Every time.Duration
	// Check is how often the daemon looks for due work (default: Every/24,
	// at most an hour), plus a random jitter of up to Check, so that the
	// devices of a realm do not all look at once.
	Check time.Duration
}

// maintDue says which work is due at now: gc if a store gc can reach
// (gcStores: this device's, registered stores and nodes that are awake)
// was last collected more than every ago (or never); repair and scrub
// likewise for the awake members of the policies in use (members).
func maintDue(now time.Time, every time.Duration, recs map[string]meta.MaintRecord, gcStores, members []string) (gc, repair, scrub bool) {
	old := func(name, kind string, age time.Duration) bool {
		last := recs[name].Last(kind)
		return last.IsZero() || now.Sub(last) > age
	}
	for _, s := range gcStores {
		gc = gc || old(s, meta.MaintGC, every)
	}
	for _, s := range members {
		scrub = scrub || old(s, meta.MaintScrub, scrubFactor*every)
		repair = repair || old(s, meta.MaintRepair, every)
	}
	return gc, repair && !scrub, scrub
}

// dueWork reads the records and the registry and says which work is due.
func (r *Realm) dueWork(ctx context.Context, every time.Duration) (gc, repair, scrub bool, err error) {
	recs, err := r.Meta.Maint(ctx)
	if err != nil {
		return false, false, false, err
	}
	asleep, err := r.sleepers(ctx)
	if err != nil {
		return false, false, false, err
	}
	var gcStores []string
	if self := r.nodeName(ctx); self != "" {
		gcStores = append(gcStores, self)
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return false, false, false, err
	}
	for _, n := range nodes {
		if n.Removed == 0 && n.State == meta.NodeAwake {
			gcStores = append(gcStores, n.Name)
		}
	}
	stores, err := r.Meta.Stores(ctx)
	if err != nil {
		return false, false, false, err
	}
	for _, s := range stores {
		if _, ok := asleep[s.Name]; !ok {
			gcStores = append(gcStores, s.Name)
		}
	}
	pols, err := r.PoliciesInUse(ctx)
	if err != nil {
		return false, false, false, err
	}
	var members []string
	for _, p := range pols {
		pol, perr := meta.ParsePolicy(p)
		if perr != nil {
			continue
		}
		for _, m := range pol.Stores {
			if _, ok := asleep[m]; !ok {
				members = append(members, m)
			}
		}
	}
	gc, repair, scrub = maintDue(time.Now(), every, recs, gcStores, members)
	return gc, repair, scrub, nil
}

// maintLoop runs the background work that is due, whenever this node is
// awake and idle (ready says so), until ctx ends: gc, then repair (or
// scrub), each over the stores that are awake; what is skipped is logged
// and caught up by a later round once its node is awake. A gc another
// device runs meanwhile (the fence is taken) is left to it.
func (r *Realm) maintLoop(ctx context.Context, o MaintOptions, ready func() bool) {
	if o.Every <= 0 {
		return
	}
	if o.Check <= 0 {
		o.Check = min(o.Every/24, time.Hour)
	}
	for {
		wait := o.Check + rand.N(o.Check)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if !ready() {
			continue
		}
		r.maintRound(ctx, o.Every)
	}
}

// maintRound runs one round of the schedule (maintLoop).
func (r *Realm) maintRound(ctx context.Context, every time.Duration) {
	gc, repair, scrub, err := r.dueWork(ctx, every)
	if err != nil {
		r.log.Warn("background work: what is due", "err", err)
		return
	}
	if gc {
		r.log.Info("background work: gc")
		rep, skippedStores, gerr := r.GC(ctx, GCOptions{})
		for _, s := range skippedStores {
			r.log.Info("background work: gc", "store", s.Error())
		}
		switch {
		case errors.Is(gerr, cairn.ErrConflict):
			r.log.Info("background work: another gc runs: left to it", "err", gerr)
		case gerr != nil:
			r.log.Warn("background work: gc", "err", gerr)
		default:
			r.log.Info("background work: gc done", "freed", rep.FreedBytes, "objects", rep.DeletedObjects)
		}
	}
	if repair || scrub {
		r.log.Info("background work: repair", "scrub", scrub)
		res, rerr := r.Repair(ctx, "", scrub, nil, nil)
		if rerr != nil {
			r.log.Warn("background work: repair", "err", rerr)
		}
		for _, rr := range res {
			for _, s := range rr.Skipped {
				r.log.Info("background work: repair", "policy", rr.Policy, "store", s)
			}
			r.log.Info("background work: repair done", "policy", rr.Policy, "report", rr.Report.String())
		}
	}
}

// maintNames adds to names what each of them stands for: the member
// stores of a policy swept through its wrapper (an ec policy's members
// are swept that way only), and the node behind a registered node://NODE
// store, so that each store's own record says when it was collected.
func (r *Realm) maintNames(ctx context.Context, names []string) []string {
	recs, err := r.Meta.Stores(ctx)
	if err != nil {
		r.log.Warn("record background work: list the stores", "err", err)
	}
	alias := map[string]string{}
	for _, rec := range recs {
		if node, ok := strings.CutPrefix(rec.URL, "node://"); ok {
			alias[rec.Name] = node
		}
	}
	out := append([]string(nil), names...)
	for _, n := range names {
		if meta.IsPolicyName(n) {
			if pol, perr := meta.ParsePolicy(n); perr == nil {
				out = append(out, pol.Stores...)
			}
		}
	}
	for _, n := range slices.Clone(out) {
		if node, ok := alias[n]; ok {
			out = append(out, node)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
