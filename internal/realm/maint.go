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
