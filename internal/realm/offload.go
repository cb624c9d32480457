package realm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
)

// Offloads lists what waits for reclaim (doc/director.md, "Offload and
// reclaim"), oldest first.
func (r *Realm) Offloads(ctx context.Context) ([]*meta.Offload, error) {
	return r.Meta.Offloads(ctx)
}

// ReclaimOptions select what Reclaim does.
type ReclaimOptions struct {
	// Home, if set: only entries whose home is this node or store.
	Home string
	// Match, if set: only entries it accepts (a move's, 'cairn move
	// --wait').
	Match func(o *meta.Offload) bool
	// Progress, if set, is told each entry's outcome.
	Progress func(o *meta.Offload, outcome string)
}

// ReclaimReport is what a reclaim did.
type ReclaimReport struct {
	Reclaimed int   `json:"reclaimed"` // entries whose version now lives at home
	Dropped   int   `json:"dropped"`   // entries whose version no longer exists
	Waiting   int   `json:"waiting"`   // entries whose home is not awake
	Copied    int   `json:"copied"`    // objects copied home
	Sent      int64 `json:"sent"`      // their bytes
	Deleted   int   `json:"deleted"`   // offloaded copies deleted
	// Errors, by entry ("VOLUME:name vN"), of entries left for later.
	Errors []string `json:"errors,omitempty"`
}

// reclaimMu makes one reclaim at a time per process (the node daemon's
// and a by-hand one in the same process would only repeat each other's
// work; across processes each step is idempotent).
var reclaimMu sync.Mutex

// Reclaim moves offloaded versions home (doc/director.md, "Offload and
// reclaim"): for each offload entry whose home is awake it copies the
// objects of the version the home lacks (asking it which it has), makes
// them durable there, rewrites the version's stores from the offload
// target to the home and deletes the entry in one compare-guarded
// transaction, then deletes from the offload target the objects no
// version that may be held there references. Every step is idempotent and
// a kill at any point leaves the entry (copied again, only what is
// missing) or, after the transaction, at worst unreferenced objects on the
// offload target that gc collects. An entry whose version no longer exists
// is deleted. Errors of one entry are reported and the others go on.
func (r *Realm) Reclaim(ctx context.Context, o ReclaimOptions) (*ReclaimReport, error) {
	reclaimMu.Lock()
	defer reclaimMu.Unlock()
	list, err := r.Meta.Offloads(ctx)
	if err != nil {
		return nil, err
	}
	rep := &ReclaimReport{}
	awake := map[string]bool{}
	isAwake := func(name string) bool {
		if a, ok := awake[name]; ok {
			return a
		}
		a := false
		if n, err := r.Meta.Node(ctx, name); err == nil {
			a = n.State == meta.NodeOnline && n.Addr != "" && n.Removed == 0
		} else if self, _ := r.selfName(ctx); self == name {
			a = true
		} else if ns, err := r.namedStore(ctx, name); err == nil && ns != nil {
			a = true // a registered store never sleeps
		}
		awake[name] = a
		return a
	}
	tell := func(e *meta.Offload, outcome string) {
		if o.Progress != nil {
			o.Progress(e, outcome)
		}
	}
	// What to delete from each offload target once the versions are
	// home: one pass under the GC fence per target, not per entry (the
	// fence holds up writers' commits while it is held).
	drop := map[string][]cairn.ID{}
	defer func() {
		for _, now := range slices.Sorted(maps.Keys(drop)) {
			n, err := r.dropOffloaded(ctx, now, drop[now])
			rep.Deleted += n
			if err != nil {
				r.log.Warn("reclaim: offloaded copies stay until gc", "store", now, "err", err)
				rep.Errors = append(rep.Errors, fmt.Sprintf("deleting the offloaded copies on %s (they stay until gc): %v", now, err))
			}
		}
	}()
	for _, e := range list {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		if (o.Home != "" && e.Home != o.Home) || (o.Match != nil && !o.Match(e)) {
			continue
		}
		if !isAwake(e.Home) {
			rep.Waiting++
			tell(e, "waits: "+e.Home+" is not awake")
			continue
		}
		outcome, err := r.reclaimOne(ctx, e, rep, drop)
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s:%s v%d: %v", e.Vol, e.Name, e.N, err))
			tell(e, "error: "+err.Error())
			continue
		}
		tell(e, outcome)
	}
	return rep, nil
}

// reclaimOne reclaims one offload entry (see Reclaim).
func (r *Realm) reclaimOne(ctx context.Context, e *meta.Offload, rep *ReclaimReport, drop map[string][]cairn.ID) (string, error) {
	v, err := r.Volume(ctx, e.Vol)
	if errors.Is(err, cairn.ErrNotFound) || (err == nil && v.Meta.V.ID != e.VolID) {
		// The volume is gone (or its name was reused): so is the version.
		if derr := r.Meta.DropOffload(ctx, e); derr != nil {
			return "", derr
		}
		rep.Dropped++
		return "dropped: the volume is gone", nil
	}
	if err != nil {
		return "", err
	}
	// The objects to copy, once: the version is its manifest, wherever
	// the file's record moved, and a write of the file between the copy
	// and the settle only makes the settle read the record again (a file
	// written every few seconds would otherwise never settle a large
	// version: each try copied, or asked the home about, every object).
	var ids []cairn.ID
	for attempt := 0; ; attempt++ {
		f, i, err := findOffloaded(ctx, v, e)
		if err != nil {
			return "", err
		}
		if f == nil {
			// The version was dropped (keep-versions), purged, or
			// reclaimed by another process between our list and now.
			if derr := r.Meta.DropOffload(ctx, e); derr != nil && !errors.Is(derr, cairn.ErrConflict) {
				return "", derr
			}
			rep.Dropped++
			// Its copy on the offload target goes too, as far as no
			// version held there references it (a version dropped by
			// keep-versions while it waited: gc would find it, but
			// only a gc of that store).
			if idsIn, verr := versionObjects(ctx, v, &meta.Version{N: e.N, Manifest: e.Manifest, Size: e.Bytes, Stores: []string{e.Now}}); verr == nil {
				drop[e.Now] = append(drop[e.Now], idsIn...)
			}
			return "dropped: the version no longer exists there", nil
		}
		if ids == nil {
			ver := f.Versions[i]
			if ids, err = versionObjects(ctx, v, &ver); err != nil {
				return "", err
			}
			if err := r.copyHome(ctx, e, ids, rep); err != nil {
				return "", err
			}
		}
		if _, err := v.Meta.SettleOffload(ctx, f, i, e); err != nil {
			if errors.Is(err, cairn.ErrConflict) && attempt < 20 {
				continue // the file changed: find the version again
			}
			return "", err
		}
		rep.Reclaimed++
		// The version lives at home now: the offloaded copy of what no
		// version that may be held there references goes (Reclaim, at
		// the end).
		drop[e.Now] = append(drop[e.Now], ids...)
		return fmt.Sprintf("reclaimed to %s (%d objects)", e.Home, len(ids)), nil
	}
}

// versionObjects lists the objects of version ver: its manifest, its
// chunks and their delta bases, each once.
func versionObjects(ctx context.Context, v *fs.Volume, ver *meta.Version) ([]cairn.ID, error) {
	m, err := v.Manifest(ctx, ver)
	if err != nil {
		return nil, err
	}
	ids := []cairn.ID{ver.Manifest}
	for _, ref := range m.Chunks {
		ids = append(ids, ref.ID)
		if ref.Base != nil {
			ids = append(ids, ref.Base.ID)
		}
	}
	slices.SortFunc(ids, func(a, b cairn.ID) int { return bytesCompare(a[:], b[:]) })
	return slices.Compact(ids), nil
}

func bytesCompare(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return int(a[i]) - int(b[i])
		}
	}
	return len(a) - len(b)
}

// findOffloaded finds the version entry e describes: in the file where
// it was committed, else (renamed) in the file of its inode anywhere in
// the volume. It returns nil if there is no such version still naming the
// offload target.
func findOffloaded(ctx context.Context, v *fs.Volume, e *meta.Offload) (*meta.Entry, int, error) {
	now, _ := e.Names()
	match := func(f *meta.Entry) int {
		if f == nil || f.Ino != e.Ino {
			return -1
		}
		for i, ver := range f.Versions {
			if ver.Manifest == e.Manifest && slices.Contains(ver.Stores, now) {
				return i
			}
		}
		return -1
	}
	f, err := v.Meta.Get(ctx, e.Parent, e.Name)
	if err != nil && !errors.Is(err, cairn.ErrNotFound) {
		return nil, 0, err
	}
	if i := match(f); i >= 0 {
		return f, i, nil
	}
	var found *meta.Entry
	errFound := errors.New("found")
	err = v.Walk(ctx, func(_ string, f *meta.Entry, trashed bool) error {
		if !trashed && match(f) >= 0 {
			found = f
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return nil, 0, err
	}
	if found == nil {
		return nil, 0, nil
	}
	return found, match(found), nil
}

// copyInFlight bounds the objects reclaim copies at once.
const copyInFlight = 8

// copyHome copies to e.Home the objects of ids it lacks, from e.Now, and
// makes them durable there.
func (r *Realm) copyHome(ctx context.Context, e *meta.Offload, ids []cairn.ID, rep *ReclaimReport) error {
	d := r.dir()
	dst, doneDst, err := d.OpenStore(ctx, e.Home)
	if err != nil {
		return err
	}
	defer doneDst()
	has, err := dst.Has(ctx, ids)
	if err != nil {
		return err
	}
	var missing []cairn.ID
	for i, id := range ids {
		if !has[i] {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	src, doneSrc, err := d.OpenStore(ctx, e.Now)
	if err != nil {
		return err
	}
	defer doneSrc()
	// copyInFlight objects at once: one by one, each costs two round
	// trips, and a large file (a move) has thousands.
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(copyInFlight)
	for _, id := range missing {
		g.Go(func() error {
			b, err := src.Get(gctx, id)
			if err != nil {
				return err
			}
			if err := dst.Put(gctx, id, b); err != nil {
				return err
			}
			mu.Lock()
			rep.Copied++
			rep.Sent += int64(len(b))
			mu.Unlock()
			metrics.Default().ReclaimBytes.Add(float64(len(b))) // cairn_reclaim_bytes_total
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if f, ok := dst.(interface{ Flush(context.Context) error }); ok {
		return f.Flush(ctx)
	}
	return nil
}

// dropOffloaded deletes from the store called name the objects of ids no
// version that may be held there references (fs.DropUnreferenced).
func (r *Realm) dropOffloaded(ctx context.Context, name string, ids []cairn.ID) (int, error) {
	st, done, err := r.dir().OpenStore(ctx, name)
	if err != nil {
		return 0, err
	}
	defer done()
	vols, err := r.AllVolumes(ctx)
	if err != nil {
		return 0, err
	}
	return fs.DropUnreferenced(ctx, r.Meta, vols, name, st, ids)
}

// DefaultReclaimEvery is how often a node daemon reclaims while awake.
const DefaultReclaimEvery = time.Minute

// reclaimLoop reclaims the versions offloaded while node self slept, and
// those moves take to or from it (doc/director.md, "Moves"): on
// each kick and every every, while not sleeping, until ctx ends.
func (r *Realm) reclaimLoop(ctx context.Context, self string, every time.Duration, kick <-chan struct{}, sleeping *atomic.Bool) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-t.C:
		}
		if sleeping.Load() {
			continue
		}
		// What waits for this node, and the moves of what it holds
		// (a move to a registered store has no node of its own).
		rep, err := r.Reclaim(ctx, ReclaimOptions{Match: func(o *meta.Offload) bool { return o.Home == self || (o.Move != "" && o.Now == self) }})
		switch {
		case err != nil:
			if ctx.Err() == nil {
				r.log.Warn("reclaim", "node", self, "err", err)
			}
		case rep.Reclaimed+rep.Dropped > 0 || len(rep.Errors) > 0:
			r.log.Info("reclaim", "node", self, "reclaimed", rep.Reclaimed, "dropped", rep.Dropped, "copied", rep.Copied, "bytes", rep.Sent, "deleted", rep.Deleted, "errors", rep.Errors)
		}
	}
}
