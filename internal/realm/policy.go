package realm

// Placement policies (meta/policy.go, DESIGN.md "placement policy"): the
// realm checks and sets them, opens volumes to write under them, reports
// and repairs them. The wrappers themselves (a copies:N@... or ec:K+M@...
// policy's replicastore or ecstore over the stores it names) are the
// director's (internal/director, doc/director.md).

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/storeset"
)

// policyDir is the home's directory of the wrappers' repair queues and
// shard-map caches, one subdirectory per policy.
const policyDir = "policy"

// policyState is what the realm keeps of the policies in use: the
// volumes opened to write under each (the wrappers are the director's).
type policyState struct {
	mu     sync.Mutex
	closed bool
	vols   map[string]*fs.Volume // by volume name + "\x00" + policy
}

// PolicyStore is an open copies or ec wrapper (the director's).
type PolicyStore = director.PolicyStore

// CheckPolicy parses a policy and checks that every store it names is a
// registered store (not being removed) or a node of the realm (not
// removed). It returns the policy in canonical form.
func (r *Realm) CheckPolicy(ctx context.Context, s string) (meta.Policy, error) {
	pol, err := meta.ParsePolicy(s)
	if err != nil {
		return pol, err
	}
	for _, name := range pol.Stores {
		rec, err := r.Meta.Store(ctx, name)
		if err == nil {
			if rec.Draining {
				return pol, cairn.E("policy", cairn.Permission, name, errors.New("the store is being removed: no new data goes to it"))
			}
			continue
		}
		if !errors.Is(err, cairn.ErrNotFound) {
			return pol, err
		}
		if pol.Kind == meta.PolicyEC {
			// gc sweeps a node's store with the chunks' mark, which
			// would delete shards: until it sweeps them through the
			// wrapper, ec members are registered stores only.
			if _, nerr := r.Meta.Node(ctx, name); nerr == nil {
				return pol, cairn.E("policy", cairn.Invalid, name, errors.New("an ec policy names registered stores only (see 'cairn store add'), not nodes: use node://NAME as a store, or copies:N"))
			}
		}
		n, err := r.Meta.Node(ctx, name)
		if err != nil {
			if errors.Is(err, cairn.ErrNotFound) {
				return pol, cairn.E("policy", cairn.NotFound, name, errors.New("no such store or node in the realm (see 'cairn store ls', 'cairn devices')"))
			}
			return pol, err
		}
		if n.Removed != 0 {
			return pol, cairn.E("policy", cairn.Permission, name, errors.New("the node was removed from the realm"))
		}
		if n.Role == string(pki.Surrogate) {
			return pol, director.ErrSurrogate(name)
		}
	}
	return pol, nil
}

// SetPolicy checks policy and sets it on path ("/" or "/a/b") of volume
// vol. It returns the canonical form recorded.
func (r *Realm) SetPolicy(ctx context.Context, vol, path, policy string) (string, error) {
	return r.SetPolicyPrimary(ctx, vol, path, policy, "")
}

// SetPolicyPrimary is SetPolicy that also records the primary of a copies
// policy's replica set (doc/director.md, "Primaries"): primary if given
// (a device the policy names), else this device if the policy names it,
// else the first device it names; none if it names no device.
func (r *Realm) SetPolicyPrimary(ctx context.Context, vol, path, policy, primary string) (string, error) {
	pol, err := r.CheckPolicy(ctx, policy)
	if err != nil {
		return "", err
	}
	prim, err := r.choosePrimary(ctx, pol, primary)
	if err != nil {
		return "", err
	}
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return "", err
	}
	now, self := time.Now().UnixNano(), r.nodeName(ctx)
	rec := meta.PolicyRecord{Path: path, Policy: pol.String(), Set: now, SetBy: self}
	if err := v.Meta.SetPolicy(ctx, rec); err != nil {
		return "", err
	}
	if prim != "" {
		if err := r.Meta.SetPrimary(ctx, meta.PrimaryRecord{Policy: rec.Policy, Primary: prim, Set: now, SetBy: self, Why: "set"}); err != nil {
			return "", err
		}
	}
	return rec.Policy, nil
}

// policyStore returns the wrapper of policy s (copies or ec): the
// director's (director.Policy).
func (r *Realm) policyStore(ctx context.Context, s string) (*PolicyStore, error) {
	return r.dir().Policy(ctx, s)
}

// PolicyStoreOf is policyStore, for commands that show or repair a policy.
func (r *Realm) PolicyStoreOf(ctx context.Context, policy string) (*PolicyStore, error) {
	return r.policyStore(ctx, policy)
}

// PolicyVolume returns volume name opened to write under policy: its
// writes (chunks, delta bases, manifests) go to the policy's wrapper, and
// its versions record the policy string as where their data is. "" and
// "local" give Volume(name), as does any policy while Options.Target is
// set (put --store overrides policies). Reads through it work for any
// version, as through Volume. Not for use by several goroutines at once
// with Volume.
func (r *Realm) PolicyVolume(ctx context.Context, name, policy string) (*fs.Volume, error) {
	d := r.dir()
	if d.Default(policy) {
		return r.Volume(ctx, name)
	}
	if _, err := r.Volume(ctx, name); err != nil {
		return nil, err
	}
	w, err := d.ForWrite(ctx, policy)
	if err != nil {
		return nil, err
	}
	return r.writeVolume(ctx, name, w)
}

// writeVolume returns volume name opened to write where w says (one per
// volume, name and offload home, kept until the realm closes).
func (r *Realm) writeVolume(ctx context.Context, name string, w director.Write) (*fs.Volume, error) {
	def, err := r.Volume(ctx, name)
	if err != nil {
		return nil, err
	}
	key := name + "\x00" + w.Name + "\x00" + w.Home
	r.pol.mu.Lock()
	defer r.pol.mu.Unlock()
	if v := r.pol.vols[key]; v != nil {
		return v, nil
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, err
	}
	master, err := kr.Key(def.Meta.V.ID, name) // Volume made sure it is there
	if err != nil {
		return nil, err
	}
	v, err := fs.OpenFor(r.Meta, def.Meta, master, w, fs.Options{Workers: r.opts.Workers, Readahead: readahead, Logger: r.log})
	if err != nil {
		return nil, err
	}
	if r.pol.vols == nil {
		r.pol.vols = map[string]*fs.Volume{}
	}
	r.pol.vols[key] = v
	return v, nil
}

// closePolicies closes the policy volumes (the director closes the
// wrappers after them).
func (r *Realm) closePolicies() {
	r.pol.mu.Lock()
	defer r.pol.mu.Unlock()
	r.pol.closed = true
	for _, v := range r.pol.vols {
		v.Close()
	}
}

// PoliciesInUse returns the distinct copies and ec policies named by the
// versions of every volume (trash included) and set on paths, and the
// stripe sets versions name, sorted.
func (r *Realm) PoliciesInUse(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	list, err := r.Meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	for _, mv := range list {
		v, err := r.Volume(ctx, mv.Name)
		if err != nil {
			return nil, err
		}
		err = v.Meta.Walk(ctx, func(e *meta.Entry, _ bool) error {
			for _, ver := range e.Versions {
				for _, s := range ver.Stores {
					if meta.IsPolicyName(s) {
						seen[s] = true
					}
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		recs, err := v.Meta.Policies(ctx)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			// A stripe policy as set names no benefactors yet: it is no
			// wrapper until written under (stripe:W,greedy@set).
			if meta.IsPolicyName(rec.Policy) && !strings.HasPrefix(rec.Policy, meta.PolicyStripe+":") {
				seen[rec.Policy] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

// RepairResult is what Repair did for one policy.
type RepairResult struct {
	Policy string                `json:"policy"`
	Report storeset.RepairReport `json:"report"`
	Error  string                `json:"error,omitempty"`
	Health []storeset.Health     `json:"health"`
	Queued int                   `json:"queued"` // repairs still waiting after the run
	// Skipped names the members left alone because their node is not
	// awake ("skipped: node NAME is standby since ..."): never dialled,
	// their queued repairs kept for a later run.
	Skipped []string `json:"skipped,omitempty"`
	// Offline counts the skipped members whose node is offline rather
	// than in standby (a run to do again; a standby is no failure).
	Offline int `json:"offline,omitempty"`
}

// Repair repairs every copies and ec policy in use (PoliciesInUse): the
// queued repairs, then a walk of every object, rebuilding missing (with
// scrub, also damaged) copies and shards onto their stores. store, if not
// "", restricts it to the policies naming that store and to that store's
// copies and shards. An error is for what stopped it; each policy's
// failures are in its result. progress, if not nil, is called with each
// policy's result; walk, if not nil, as each policy's walk goes (objects
// checked of those listed).
func (r *Realm) Repair(ctx context.Context, storeName string, scrub bool, progress func(RepairResult), walk func(policy string, done, total int)) ([]RepairResult, error) {
	pols, err := r.PoliciesInUse(ctx)
	if err != nil {
		return nil, err
	}
	asleep, err := r.sleepers(ctx)
	if err != nil {
		return nil, err
	}
	kind := meta.MaintRepair
	if scrub {
		kind = meta.MaintScrub
	}
	var out []RepairResult
	for _, s := range pols {
		pol, err := meta.ParsePolicy(s)
		if err != nil {
			return out, err
		}
		if storeName != "" && !slices.Contains(pol.Stores, storeName) {
			continue
		}
		if pol.Kind == meta.PolicyStripe {
			continue // no redundancy to repair (a lost morsel is re-imported: issue 20, item 6)
		}
		ps, err := r.policyStore(ctx, s)
		if err != nil {
			return out, err
		}
		res := RepairResult{Policy: s}
		// The members on nodes not awake are left alone (never
		// dialled: nothing wakes a sleeper); the others are repaired
		// one by one then. All awake: one repair of the whole policy.
		var awake []string
		for _, m := range pol.Stores {
			if storeName != "" && m != storeName {
				continue
			}
			if n, ok := asleep[m]; ok {
				sk := skipped(m, n)
				res.Skipped = append(res.Skipped, sk.Error())
				if !sk.Standby() {
					res.Offline++
				}
				continue
			}
			awake = append(awake, m)
		}
		started := time.Now()
		var walked func(done, total int)
		if walk != nil {
			walked = func(done, total int) { walk(s, done, total) }
		}
		var done []string
		if len(res.Skipped) == 0 {
			res.Report, err = ps.Repair(ctx, storeName, scrub, walked)
			if err == nil && res.Report.Failed == 0 && res.Report.Unrecoverable == 0 {
				done = awake
			}
		} else {
			for _, m := range awake {
				rep, merr := ps.Repair(ctx, m, scrub, walked)
				addReport(&res.Report, rep)
				if merr != nil {
					err = merr
					break
				}
				if rep.Failed == 0 && rep.Unrecoverable == 0 {
					done = append(done, m)
				}
			}
		}
		if len(done) > 0 {
			if merr := r.Meta.MarkMaint(ctx, kind, started, done...); merr != nil {
				r.log.Warn("repair: record the stores repaired", "err", merr)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, err
			}
			res.Error = err.Error()
		}
		res.Health = ps.Health()
		for _, h := range res.Health {
			res.Queued += h.Queued
		}
		out = append(out, res)
		if progress != nil {
			progress(res)
		}
	}
	if storeName != "" && len(out) == 0 {
		return nil, cairn.E("repair", cairn.NotFound, storeName, errors.New("no policy in use names this store"))
	}
	return out, nil
}

// FilePlacement is where one file's current version is.
type FilePlacement struct {
	Path    string   `json:"path"`
	Size    int64    `json:"size"`
	Version uint64   `json:"version"`
	Stores  []string `json:"stores"`
	// Policy is the policy in force for the path now (new versions go
	// there); Stores say where the current version went.
	Policy string `json:"policy"`
	// Readable: for a version under a copies or ec policy, whether the
	// wrapper finds its manifest stored with enough copies or shards
	// ("" when not checked).
	Readable string `json:"readable,omitempty"`
}

// PolicyReport is what `cairn policy get` shows.
type PolicyReport struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
	// InForce is the policy for Path, and From the path it is set on
	// ("" for the default, local).
	InForce string `json:"policy"`
	From    string `json:"from,omitempty"`
	// Primary is the primary device of InForce, a copies policy ("" if
	// none; doc/director.md, "Primaries").
	Primary string `json:"primary,omitempty"`
	// Set lists the policies set on Path and below it.
	Set   []meta.PolicyRecord `json:"set"`
	Files []FilePlacement     `json:"files"`
	// Health of the stores of each copies or ec policy the files use.
	Health map[string][]storeset.Health `json:"health"`
}

// placementTTL is how long Placement trusts the policies it read: a
// policy set while a volume is mounted or served applies to the files
// written from then on, within this delay.
const placementTTL = 2 * time.Second

// Placement is the fs.Placement of volume name, for writers that know each
// file's path (the mount, the WebDAV gateway): a file is written under the
// policy set on its nearest ancestor, as put does (put --store has no
// counterpart there). The policies are read again at most every
// placementTTL, and the director asked again then where each policy's
// writes go.
func (r *Realm) Placement(name string) fs.Placement {
	var (
		mu   sync.Mutex
		recs []meta.PolicyRecord
		read time.Time
		vols = map[string]*fs.Volume{}
	)
	var moves []MoveStatus
	return func(ctx context.Context, path string) (*fs.Volume, error) {
		mu.Lock()
		defer mu.Unlock()
		if read.IsZero() || time.Since(read) > placementTTL {
			rs, err := r.Policies(ctx, name)
			if err != nil {
				return nil, err
			}
			// Offline, the moves last read stand, as the policies do
			// (doc/offline.md): a write is never refused for want of
			// the offload entries.
			ms := moves
			if _, off := r.Meta.Offline(); !off {
				var err error
				if ms, err = r.volumeMoves(ctx, name); err != nil {
					if cairn.KindOf(err) != cairn.Unavailable {
						return nil, err
					}
					ms = moves
				}
			}
			recs, moves, read = rs, ms, time.Now()
			// Ask the director again too: a member that went to
			// sleep or woke since changes where a policy's writes go
			// (offload, director.md); PolicyVolume keeps the volumes.
			clear(vols)
		}
		key := MovingTo(moves, path)
		if key != "" {
			key = "move\x00" + key
		} else if rec := meta.PolicyFor(recs, path); rec != nil {
			key = rec.Policy
		}
		if v, ok := vols[key]; ok {
			return v, nil
		}
		v, err := r.WriteVolumeFor(ctx, name, recs, moves, path)
		if err != nil {
			return nil, err
		}
		vols[key] = v
		return v, nil
	}
}

// Policies returns the policies set on volume vol.
func (r *Realm) Policies(ctx context.Context, vol string) ([]meta.PolicyRecord, error) {
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return nil, err
	}
	return v.Meta.Policies(ctx)
}

// PolicyReport reports the policy in force at path of volume vol and, for
// every file at or under it, where its current version is; each copies or
// ec policy those versions name is asked whether it holds their manifests
// (Has: no data read), which also gives its stores' health.
func (r *Realm) PolicyReport(ctx context.Context, vol string, parts []string) (*PolicyReport, error) {
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return nil, err
	}
	recs, err := v.Meta.Policies(ctx)
	if err != nil {
		return nil, err
	}
	path := "/" + strings.Join(parts, "/")
	rep := &PolicyReport{Volume: vol, Path: path, InForce: meta.PolicyLocal, Set: []meta.PolicyRecord{}, Health: map[string][]storeset.Health{}}
	if rec := meta.PolicyFor(recs, path); rec != nil {
		rep.InForce, rep.From = rec.Policy, rec.Path
		if rep.Primary, err = (env{r}).Primary(ctx, rec.Policy); err != nil {
			return nil, err
		}
	}
	for _, rec := range recs {
		if path == "/" || rec.Path == path || strings.HasPrefix(rec.Path, path+"/") {
			rep.Set = append(rep.Set, rec)
		}
	}
	e, err := v.Meta.Lookup(ctx, parts)
	if err != nil {
		return nil, err
	}
	rescanned := map[string]bool{}
	var walk func(e *meta.Entry, p string) error
	walk = func(e *meta.Entry, p string) error {
		if !e.IsDir() {
			if e.Type != meta.TypeFile {
				return nil
			}
			fp := FilePlacement{Path: p, Size: e.Size, Policy: meta.PolicyLocal}
			if rec := meta.PolicyFor(recs, p); rec != nil {
				fp.Policy = rec.Policy
			}
			if cur := e.Current(); cur != nil {
				fp.Version, fp.Stores = cur.N, cur.Stores
				for _, s := range cur.Stores {
					if !meta.IsPolicyName(s) {
						continue
					}
					fp.Readable = "no"
					ps, err := r.policyStore(ctx, s)
					if err != nil {
						fp.Readable = err.Error()
						continue
					}
					if ec, ok := ps.Store.(*ecstore.Store); ok && !rescanned[s] {
						// Learn the shard maps other devices wrote.
						rescanned[s] = true
						if err := ec.Rescan(ctx); err != nil {
							r.log.Warn("listing a policy's stores", "policy", s, "err", err)
						}
					}
					if has, err := ps.Store.Has(ctx, []cairn.ID{cur.Manifest}); err != nil {
						fp.Readable = err.Error()
					} else if has[0] {
						fp.Readable = "yes"
					}
				}
			}
			rep.Files = append(rep.Files, fp)
			return nil
		}
		kids, err := v.Meta.ReadDir(ctx, e.Ino)
		if err != nil {
			return err
		}
		for i := range kids {
			if err := walk(&kids[i], strings.TrimSuffix(p, "/")+"/"+kids[i].Name); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(e, path); err != nil {
		return nil, err
	}
	for _, f := range rep.Files {
		for _, s := range f.Stores {
			if _, ok := rep.Health[s]; ok || !meta.IsPolicyName(s) {
				continue
			}
			if ps, err := r.policyStore(ctx, s); err == nil {
				rep.Health[s] = ps.Health()
			}
		}
	}
	if rep.Files == nil {
		rep.Files = []FilePlacement{}
	}
	return rep, nil
}

// policyGCStores adjusts the stores gc sweeps (GCStores): a store that is
// a member of an ec policy holds shards and shard maps, whose IDs are no
// chunk's, so sweeping it with the chunks' mark would delete them all; it
// is left out, and each ec policy in use is swept through its wrapper
// instead (its List names the objects it holds, Delete removes their
// shards and maps). Members of copies policies hold objects under their own
// IDs and are swept as they are.
func (r *Realm) policyGCStores(ctx context.Context, out []fs.NamedStore) ([]fs.NamedStore, error) {
	pols, err := r.PoliciesInUse(ctx)
	if err != nil {
		return out, err
	}
	ecMember := map[string]bool{}
	var wrappers []fs.NamedStore
	for _, s := range pols {
		pol, err := meta.ParsePolicy(s)
		// ec shards, and stripe morsels (packs of chunks), are swept
		// through their wrappers, never raw from their members.
		if err != nil || (pol.Kind != meta.PolicyEC && (pol.Kind != meta.PolicyStripe || len(pol.Stores) == 0)) {
			continue
		}
		for _, m := range pol.Stores {
			ecMember[m] = true
		}
		ps, err := r.policyStore(ctx, s)
		if err != nil {
			return out, err
		}
		wrappers = append(wrappers, fs.NamedStore{Name: s, Store: ps.Store})
	}
	kept := out[:0]
	for _, o := range out {
		if !ecMember[o.Name] {
			kept = append(kept, o)
		}
	}
	return append(kept, wrappers...), nil
}

// addReport adds b's counts to a.
func addReport(a *storeset.RepairReport, b storeset.RepairReport) {
	a.Objects = max(a.Objects, b.Objects) // each member's walk examines every object
	a.Missing += b.Missing
	a.Corrupt += b.Corrupt
	a.Rebuilt += b.Rebuilt
	a.Deleted += b.Deleted
	a.Failed += b.Failed
	a.Unrecoverable += b.Unrecoverable
}
