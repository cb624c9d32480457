package realm

// Stores besides the nodes' own: cloud buckets and directories registered
// with `cairn store add` (meta: store/<name>). A device opens one by its
// URL, with credentials from its own environment, on first need; writes go
// to it with `put --store NAME` (and, later, placement policies); reads of
// versions that name it fetch from it through the chunk cache.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/anchorstore"
	"cairn.dev/cairn/internal/store/azstore"
	"cairn.dev/cairn/internal/store/gcsstore"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/objstore"
	"cairn.dev/cairn/internal/store/packstore"
	"cairn.dev/cairn/internal/store/s3store"
)

// namedStore is a registered store this process opened.
type namedStore struct {
	rec meta.StoreRecord
	st  cairn.Store
	// member, if set, is st without the consistency anchor, for a
	// placement policy's wrapper (policy.go).
	member cairn.Store
	// counter is the cloud store under the wrappers, which counts the
	// requests sent (nil for other kinds).
	counter *objstore.Store
	// base is the request count already recorded (see flushRequests).
	base objstore.Requests
}

// requests returns the store's request counter, if it keeps one.
func (n *namedStore) requests() (objstore.Requests, bool) {
	if n.counter != nil {
		return n.counter.Requests(), true
	}
	return objstore.Requests{}, false
}

// OpenStoreURL opens the store raw names, without the registry:
// s3://BUCKET/PREFIX?endpoint=&region=&insecure=1, gs://BUCKET/PREFIX,
// azblob://CONTAINER/PREFIX (credentials from the environment, see
// doc/format.md "Cloud stores"), or file:///DIR (a local store in DIR, made
// if missing). It returns the URL in canonical form too. node://NAME is
// the realm's business (Realm.openStore).
func OpenStoreURL(ctx context.Context, raw string) (cairn.Store, string, error) {
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, "", cairn.E("open store", cairn.Invalid, "", errors.New("a store URL looks like s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, azblob://CONTAINER/PREFIX, file:///DIR or node://NAME"))
	}
	switch scheme {
	case s3store.Scheme:
		o, err := s3store.FromURL(raw)
		if err != nil {
			return nil, "", err
		}
		st, err := s3store.New(ctx, o)
		return st, o.URL(), err
	case gcsstore.Scheme:
		o, err := gcsstore.FromURL(raw)
		if err != nil {
			return nil, "", err
		}
		st, err := gcsstore.New(ctx, o)
		return st, o.URL(), err
	case azstore.Scheme:
		o, err := azstore.FromURL(raw)
		if err != nil {
			return nil, "", err
		}
		st, err := azstore.New(ctx, o)
		return st, o.URL(), err
	case "file":
		u, err := url.Parse(raw)
		if err != nil || u.Host != "" || u.RawQuery != "" || !filepath.IsAbs(u.Path) {
			return nil, "", cairn.E("open store", cairn.Invalid, "", errors.New("a directory store's URL is file:///ABSOLUTE/PATH"))
		}
		dir := filepath.Clean(u.Path)
		st, err := localstore.Open(ctx, dir, localstore.Options{})
		return st, "file://" + dir, err
	}
	return nil, "", cairn.E("open store", cairn.Invalid, "", fmt.Errorf("unknown store URL scheme %q (want s3, gs, azblob, file or node)", scheme))
}

// AddStore checks that the store raw names works from this device (an
// object is written, read back and deleted) and records it as name.
func (r *Realm) AddStore(ctx context.Context, name, raw string) (*meta.StoreRecord, error) {
	if err := meta.CheckStoreName(name); err != nil {
		return nil, err
	}
	if _, err := r.Meta.Store(ctx, name); err == nil {
		return nil, cairn.E("add store", cairn.Exist, name, errors.New("a store of this name is already in the realm"))
	}
	st, canon, err := r.openURL(ctx, raw)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if err := probeStore(ctx, st); err != nil {
		return nil, cairn.E("add store", cairn.KindOf(err), name, fmt.Errorf("the store does not work from this device: %w", err))
	}
	if !strings.HasPrefix(canon, "node://") { // a node's store is the realm's by its certificate
		if err := r.claimStore(ctx, name, st); err != nil {
			return nil, err
		}
	}
	rec := meta.StoreRecord{Name: name, URL: canon, Added: time.Now().UnixNano(), AddedBy: r.nodeName(ctx)}
	if err := r.Meta.AddStore(ctx, rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// MarkerID is the ID of this realm's marker object, which `store add`
// writes into every bucket or directory it adds: gc keeps it, and a
// location that holds objects but not this marker is refused (another
// realm's, or another program's, whose objects this realm's gc would
// otherwise delete as garbage).
func (r *Realm) MarkerID() cairn.ID {
	id, _ := realmMarker(r.Config.RealmID)
	return id
}

func realmMarker(realmID string) (cairn.ID, []byte) {
	b := []byte("cairn realm marker v1\n" + realmID + "\n")
	return cairn.ID(blake3.Sum256(b)), b
}

// claimStore refuses a location that holds objects without this realm's
// marker, then writes the marker.
func (r *Realm) claimStore(ctx context.Context, name string, st cairn.Store) error {
	id, b := realmMarker(r.Config.RealmID)
	have, err := st.Has(ctx, []cairn.ID{id})
	if err != nil {
		return err
	}
	if have[0] {
		return nil // this realm's already (added before, then removed)
	}
	n := 0
	errFull := errors.New("not empty")
	err = st.List(ctx, func(cairn.ID, int64) error {
		n++
		return errFull
	})
	if err != nil && !errors.Is(err, errFull) {
		return err
	}
	if n > 0 {
		return cairn.E("add store", cairn.Conflict, name, errors.New("the location already holds objects that are not this realm's (another realm's or another program's, which this realm's gc would delete): give an empty bucket, prefix or directory"))
	}
	return st.Put(ctx, id, b)
}

// probeStore writes a random object, reads it back and deletes it.
func probeStore(ctx context.Context, st cairn.Store) error {
	data := make([]byte, 64)
	rand.Read(data)
	id := cairn.ID(blake3.Sum256(data))
	if err := st.Put(ctx, id, data); err != nil {
		return fmt.Errorf("writing a test object: %w", err)
	}
	got, err := st.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("reading the test object back: %w", err)
	}
	if string(got) != string(data) {
		return cairn.E("probe", cairn.Corrupt, id.String(), errors.New("the test object read back differs"))
	}
	if err := st.Delete(ctx, id); err != nil {
		return fmt.Errorf("deleting the test object: %w", err)
	}
	return nil
}

// openURL is OpenStoreURL plus node://NAME, a node of the realm.
func (r *Realm) openURL(ctx context.Context, raw string) (cairn.Store, string, error) {
	if name, ok := strings.CutPrefix(raw, "node://"); ok {
		st, err := r.nodeStore(ctx, name)
		return st, "node://" + name, err
	}
	return OpenStoreURL(ctx, raw)
}

// nodeStore opens a client of node name's chunk service; the node must be
// online (the director decides: director.OpenNode).
func (r *Realm) nodeStore(ctx context.Context, name string) (cairn.Store, error) {
	return r.dir().OpenNode(ctx, name)
}

// namedStoreLocked returns registered store name, opened on first use
// (nil, nil if no store has that name). Caller holds remoteMu.
func (r *Realm) namedStoreLocked(ctx context.Context, name string) (*namedStore, error) {
	if r.remoteClosed {
		return nil, errRealmClosed
	}
	if n := r.named[name]; n != nil {
		return n, nil
	}
	n, err := r.openNamed(ctx, name)
	if err != nil || n == nil {
		return nil, err
	}
	if r.named == nil {
		r.named = map[string]*namedStore{}
	}
	r.named[name] = n
	return n, nil
}

// namedOpen is an open of a registered store under way in namedStore.
type namedOpen struct {
	done chan struct{}
	n    *namedStore
	err  error
}

// namedStore is namedStoreLocked without holding remoteMu while the store
// opens: a cloud store's open lists its bucket, and retries with backoff
// when the server does not answer (a second or more for a stopped server),
// and every read through the router takes remoteMu. Concurrent calls for
// one name share one open and its outcome.
func (r *Realm) namedStore(ctx context.Context, name string) (*namedStore, error) {
	r.remoteMu.Lock()
	if r.remoteClosed {
		r.remoteMu.Unlock()
		return nil, errRealmClosed
	}
	if n := r.named[name]; n != nil {
		r.remoteMu.Unlock()
		return n, nil
	}
	if o := r.namedOpening[name]; o != nil {
		r.remoteMu.Unlock()
		select {
		case <-o.done:
			return o.n, o.err
		case <-ctx.Done():
			return nil, store.CtxErr(ctx, "open store", name)
		}
	}
	o := &namedOpen{done: make(chan struct{})}
	if r.namedOpening == nil {
		r.namedOpening = map[string]*namedOpen{}
	}
	r.namedOpening[name] = o
	r.remoteMu.Unlock()

	n, err := r.openNamed(ctx, name)

	r.remoteMu.Lock()
	delete(r.namedOpening, name)
	switch {
	case err != nil || n == nil:
	case r.remoteClosed:
		n.st.Close()
		n, err = nil, errRealmClosed
	case r.named[name] != nil: // opened meanwhile by namedStoreLocked
		n.st.Close()
		n = r.named[name]
	default:
		if r.named == nil {
			r.named = map[string]*namedStore{}
		}
		r.named[name] = n
	}
	r.remoteMu.Unlock()
	o.n, o.err = n, err
	close(o.done)
	return n, err
}

// openNamed opens registered store name (nil, nil if there is none).
func (r *Realm) openNamed(ctx context.Context, name string) (*namedStore, error) {
	rec, err := r.Meta.Store(ctx, name)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	st, _, err := r.openURL(ctx, rec.URL)
	if err != nil {
		return nil, cairn.E("open store", cairn.KindOf(err), name, err)
	}
	n := &namedStore{rec: *rec, st: st}
	if obj, ok := st.(*objstore.Store); ok {
		// A cloud bucket: small objects go in packs (few requests), and a
		// read of an object the metadata names but the bucket does not
		// show yet (not in a listed pack) waits for it: the consistency
		// anchor, above the pack index so each retry lists again.
		n.counter = obj
		ps, err := r.packed(ctx, name, obj)
		if err != nil {
			obj.Close()
			return nil, cairn.E("open store", cairn.KindOf(err), name, err)
		}
		n.st = anchorstore.New(ps, anchorstore.Options{Name: rec.URL, Logger: r.log})
		n.member = ps // a policy's member, where a miss is expected (policy.go)
	}
	n.base, _ = n.requests()
	return n, nil
}

// readaheadFor is fs.Options.ReadaheadFor: for a stripe set, W+1
// morsels of chunks; cloudReadahead when stores names a cloud store this
// realm has opened (a whole-file read opens it for the manifest, before
// the chunks), else 0 (the volume's readahead).
func (r *Realm) readaheadFor(stores []string) int {
	for _, name := range stores {
		// A stripe set: W+1 morsels' worth of chunks (16 KiB on average)
		// ahead, so that a read keeps a morsel requested from each of
		// the W benefactors while it consumes one (FreeLoader §4.3).
		if pol, err := meta.ParsePolicy(name); err == nil && pol.Kind == meta.PolicyStripe {
			return (len(pol.Stores) + 1) * director.MorselSize / (16 << 10)
		}
	}
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	for _, name := range stores {
		if n := r.named[name]; n != nil && n.counter != nil {
			return cloudReadahead
		}
	}
	return 0
}

// packed wraps a cloud store in a pack store whose index log lives in
// home/packs/NAME; if another process of this device holds that log, this
// one keeps its index in memory (it learns the packs from the bucket).
func (r *Realm) packed(ctx context.Context, name string, st cairn.Store) (cairn.Store, error) {
	o := packstore.Options{Dir: filepath.Join(r.Home, "packs", name), Logger: r.log,
		// A file read in order reads each pack whole, in one ranged GET
		// (a pack holds at most PackSize + Threshold bytes of objects):
		// 4 MiB spans made 4 times the requests, and the service reads
		// and checks the storage blocks at each span's ends twice.
		ReadAhead: packstore.DefaultPackSize + packstore.DefaultThreshold}
	ps, err := packstore.New(ctx, st, o)
	if errors.Is(err, cairn.ErrConflict) {
		o.Dir = ""
		ps, err = packstore.New(ctx, st, o)
	}
	if err != nil {
		return nil, err
	}
	return ps, nil
}

// GCStores opens, for gc, every store besides this device's own that
// may hold the realm's objects: every registered store and every other
// node's store (what `put --store NODE` sent there). errs names those that
// could not be opened, and those of nodes not awake, which are never
// dialled (a *SkippedStore: a node in standby is not woken; its garbage
// stays until a gc once it is awake). closeAll closes what was opened
// here.
func (r *Realm) GCStores(ctx context.Context) (out []fs.NamedStore, errs []error, closeAll func(), err error) {
	var opened []cairn.Store
	closeAll = func() {
		for _, st := range opened {
			st.Close()
		}
	}
	recs, err := r.Meta.Stores(ctx)
	if err != nil {
		return nil, nil, closeAll, err
	}
	asleep, err := r.sleepers(ctx)
	if err != nil {
		return nil, nil, closeAll, err
	}
	for _, rec := range recs {
		if n, ok := asleep[rec.Name]; ok && n.Name != rec.Name {
			// A node:// store whose node sleeps: never dialled.
			errs = append(errs, cairn.E("gc", cairn.Unavailable, rec.Name, skipped(rec.Name, n)))
			continue
		}
		st, nerr := r.NamedStore(ctx, rec.Name)
		if nerr != nil {
			errs = append(errs, nerr)
			continue
		}
		out = append(out, fs.NamedStore{Name: rec.Name, Store: st})
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return nil, nil, closeAll, err
	}
	self := r.nodeName(ctx)
	for _, n := range nodes {
		if n.Name == self || n.Removed != 0 {
			continue
		}
		if n.State != meta.NodeAwake {
			// Not awake: skipped, never dialled (nothing wakes it).
			errs = append(errs, cairn.E("gc", cairn.Unavailable, n.Name, skipped(n.Name, n)))
			continue
		}
		st, nerr := r.nodeStore(ctx, n.Name)
		if nerr != nil {
			errs = append(errs, nerr)
			continue
		}
		opened = append(opened, st)
		out = append(out, fs.NamedStore{Name: n.Name, Store: st})
	}
	out, err = r.policyGCStores(ctx, out) // ec members are swept through their wrappers (policy.go)
	if err != nil {
		return out, errs, closeAll, err
	}
	// A store registered as node://NODE that policyGCStores left out (it
	// holds ec shards) must not be swept raw under the node's own name
	// either, and this device's own store cannot be skipped: refuse.
	left := map[string]bool{}
	for _, o := range out {
		left[o.Name] = true
	}
	drop := map[string]bool{}
	for _, rec := range recs {
		node, ok := strings.CutPrefix(rec.URL, "node://")
		if !ok || left[rec.Name] {
			continue
		}
		if _, isErr := findErr(errs, rec.Name); isErr {
			continue
		}
		if node == self {
			return nil, errs, closeAll, cairn.E("gc", cairn.Conflict, rec.Name, errors.New("this store is this device's own store (node://"+node+") and an erasure-coding policy keeps shards in it: gc would delete them; it does not run"))
		}
		drop[node] = true
	}
	kept := out[:0]
	for _, o := range out {
		if !drop[o.Name] {
			kept = append(kept, o)
		}
	}
	return kept, errs, closeAll, nil
}

// findErr returns the error among errs about store name, if any.
func findErr(errs []error, name string) (error, bool) {
	for _, e := range errs {
		var ce *cairn.Error
		if errors.As(e, &ce) && ce.Path == name {
			return e, true
		}
	}
	return nil, false
}

// NamedStore returns registered store name, opened on first use, or
// NotFound.
func (r *Realm) NamedStore(ctx context.Context, name string) (cairn.Store, error) {
	r.remoteMu.Lock()
	defer r.remoteMu.Unlock()
	n, err := r.namedStoreLocked(ctx, name)
	if err != nil {
		return nil, err
	}
	if n == nil {
		return nil, cairn.E("open store", cairn.NotFound, name, errors.New("no such store in the realm (see 'cairn store ls')"))
	}
	return n.st, nil
}

// flushRequests adds the requests this process made to each store it
// opened to the realm's counts. Caller holds remoteMu.
func (r *Realm) flushRequestsLocked(ctx context.Context) {
	self := r.nodeName(ctx)
	for name, n := range r.named {
		cur, ok := n.requests()
		if !ok {
			continue
		}
		d := cur.Sub(n.base)
		if d.Total() == 0 {
			continue
		}
		if err := r.Meta.AddStoreRequests(ctx, name, self, d.Map()); err != nil {
			r.log.Warn("recording store requests", "store", name, "err", err)
			continue
		}
		n.base = cur
	}
}

// Price is a store's list price, in US dollars, for the monthly cost
// estimate of `cairn store ls` (SCFS §4.5 prices operations and storage
// the same way).
type Price = apitypes.Price

// listPrice is the price table: public list prices of each provider's
// standard class in its main US region as published in 2024 (they change;
// the figure is an estimate). A store at a custom endpoint (MinIO, any
// S3-compatible service), a directory or a node has no price.
func listPrice(rawURL string) (Price, bool) {
	scheme, rest, _ := strings.Cut(rawURL, "://")
	switch scheme {
	case s3store.Scheme:
		if strings.Contains(rest, "endpoint=") {
			return Price{}, false
		}
		return Price{GBMonth: 0.023, Write1000: 0.005, Read1000: 0.0004, Source: "Amazon S3 Standard, us-east-1, 2024 list price"}, true
	case gcsstore.Scheme:
		return Price{GBMonth: 0.020, Write1000: 0.005, Read1000: 0.0004, Source: "Google Cloud Storage Standard, us-central1, 2024 list price"}, true
	case azstore.Scheme:
		return Price{GBMonth: 0.018, Write1000: 0.0055, Read1000: 0.00044, Source: "Azure Blob Storage Hot LRS, East US, 2024 list price"}, true
	}
	return Price{}, false
}

// StoreInfo is what `cairn store ls` shows of one store.
type StoreInfo = apitypes.StoreInfo

// StoreInfos returns every registered store with its health, use,
// request counts and cost estimate, as seen from this device.
func (r *Realm) StoreInfos(ctx context.Context) ([]StoreInfo, error) {
	return r.StoreInfosSkipping(ctx, nil)
}

// StoreInfosSkipping is StoreInfos without asking the stores for which
// skip returns a reason (their Health): 'cairn web' asks no node that is
// not online, so that drawing the page never dials, or wakes, a sleeping
// device.
func (r *Realm) StoreInfosSkipping(ctx context.Context, skip func(meta.StoreRecord) string) ([]StoreInfo, error) {
	recs, err := r.Meta.Stores(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]StoreInfo, 0, len(recs))
	for _, rec := range recs {
		si := StoreInfo{StoreRecord: rec, Health: "ok"}
		if skip != nil {
			if why := skip(rec); why != "" {
				si.Health = why
				out = append(out, si)
				continue
			}
		}
		st, nerr := r.NamedStore(ctx, rec.Name)
		if nerr == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			_, nerr = st.Has(pctx, []cairn.ID{{}})
			si.Latency = time.Since(t0)
			if nerr == nil {
				if ss, ok := st.(cairn.StoreStats); ok {
					if u, uerr := ss.Stats(pctx); uerr == nil {
						si.Objects, si.Bytes = u.Objects, u.Bytes
					}
				}
			}
			cancel()
		}
		if nerr != nil {
			si.Health = nerr.Error()
			si.Latency = 0
		}
		out = append(out, si)
	}
	// This process's own requests (the listing above among them) count too.
	r.remoteMu.Lock()
	r.flushRequestsLocked(ctx)
	r.remoteMu.Unlock()
	for i := range out {
		si := &out[i]
		if si.Requests, err = r.Meta.StoreRequests(ctx, si.Name); err != nil {
			return nil, err
		}
		if p, ok := listPrice(si.URL); ok {
			si.Price = &p
			si.MonthlyCost = float64(si.Bytes) / 1e9 * p.GBMonth
			q := si.Requests
			si.RequestsCost = float64(q["PUT"]+q["LIST"])/1000*p.Write1000 + float64(q["GET"]+q["HEAD"])/1000*p.Read1000
		}
	}
	return out, nil
}

// RemoveReport is what RemoveStore did.
type RemoveReport struct {
	Versions      int   `json:"versions"`       // versions that named the store
	Moved         int   `json:"moved"`          // of them, whose data was copied away
	Objects       int   `json:"objects_copied"` // objects copied (manifests, chunks, bases)
	Bytes         int64 `json:"bytes_copied"`
	StillHeldHere int   `json:"still_held"` // versions left naming the store (then it is not removed)
}

// RemoveStore drains registered store name, then removes it from the
// registry. Draining: the store is marked so nothing new goes to it; every
// version that names it and no other store gets its manifest and chunks
// copied to dest ("" = this device's own store, or another registered
// store) and then names dest instead; a version that also names another
// store just stops naming it. A version in the trash cannot be rewritten:
// if one holds data only there, nothing is removed and the error says to
// restore or purge it. The store's objects are left where they are.
func (r *Realm) RemoveStore(ctx context.Context, name, dest string, progress func(RemoveReport)) (RemoveReport, error) {
	var rep RemoveReport
	const op = "remove store"
	src, err := r.NamedStore(ctx, name)
	if err != nil {
		return rep, err
	}
	if dest == name {
		return rep, cairn.E(op, cairn.Invalid, name, errors.New("cannot drain a store into itself"))
	}
	var dst cairn.Store
	destName := dest
	if dest == "" {
		if dst, err = r.Store(ctx); err != nil {
			return rep, err
		}
		if destName = r.nodeName(ctx); destName == "" {
			destName = "local"
		}
	} else if dst, err = r.NamedStore(ctx, dest); err != nil {
		return rep, err
	}
	if dest != "" {
		if rec, serr := r.Meta.Store(ctx, dest); serr == nil && rec.Draining {
			return rep, cairn.E(op, cairn.Invalid, dest, errors.New("the destination store is itself being removed"))
		}
	}
	// A placement policy naming the store keeps shards or copies there
	// under the policy's name: draining it would cost those versions
	// their redundancy (ec: a shard per stripe). Change the policy first.
	if pols, perr := r.policiesNaming(ctx, name); perr != nil {
		return rep, perr
	} else if len(pols) > 0 {
		return rep, cairn.E(op, cairn.Conflict, name, fmt.Errorf("placement policies name the store: %s; set other policies and rewrite those files first", strings.Join(pols, "; ")))
	}
	if err = r.Meta.SetStoreDraining(ctx, name, true); err != nil {
		return rep, err
	}
	vols, err := r.AllVolumes(ctx)
	if err != nil {
		return rep, err
	}
	// Passes: drain what names the store, then walk again (trash too) to
	// see that nothing does any more. A file renamed or trashed during a
	// pass, or a writer that opened the store before it was marked
	// draining and committed since, shows up in the next walk.
	for pass := 0; ; pass++ {
		live, trashed, err := r.drainPass(ctx, vols, name, destName, src, dst, &rep, progress)
		if err != nil {
			return rep, err
		}
		if live == 0 && trashed > 0 {
			rep.StillHeldHere = trashed
			return rep, cairn.E(op, cairn.Conflict, name, fmt.Errorf("%d version(s) of files in the trash keep their data only in this store: restore them ('cairn trash restore') or purge the trash ('cairn trash purge'), then remove the store again; it stays marked as draining", trashed))
		}
		if live == 0 {
			break
		}
		if pass == 3 {
			rep.StillHeldHere = live
			return rep, cairn.E(op, cairn.Conflict, name, fmt.Errorf("versions keep being written to the store (%d after %d passes): stop the programs writing to it, then remove it again; it stays marked as draining", live, pass+1))
		}
	}
	if err := r.Meta.DeleteStore(ctx, name); err != nil {
		return rep, err
	}
	r.remoteMu.Lock()
	n := r.named[name]
	if n != nil {
		delete(r.named, name)
	}
	r.remoteMu.Unlock()
	if n != nil && !r.dir().IsTarget(n.st) {
		n.st.Close()
	}
	return rep, nil
}

// drainPass walks every volume once, draining each live entry whose
// versions name store name; it returns how many live entries named it at
// the walk (each now drained) and how many trashed versions hold data only
// there.
func (r *Realm) drainPass(ctx context.Context, vols []*fs.Volume, name, destName string, src, dst cairn.Store, rep *RemoveReport, progress func(RemoveReport)) (live, trashed int, err error) {
	for _, v := range vols {
		var todo []*meta.Entry
		linked := map[uint64]bool{} // inodes with several names: drained once
		err := v.Meta.Walk(ctx, func(e *meta.Entry, inTrash bool) error {
			if e.Nlink() > 1 {
				if linked[e.Ino] {
					return nil
				}
				linked[e.Ino] = true
			}
			for _, ver := range e.Versions {
				if !slices.Contains(ver.Stores, name) {
					continue
				}
				if inTrash {
					if len(ver.Stores) == 1 {
						trashed++
					}
					continue
				}
				todo = append(todo, e)
				return nil
			}
			return nil
		})
		if err != nil {
			return 0, 0, err
		}
		live += len(todo)
		for _, e := range todo {
			if err := r.drainEntry(ctx, v, e, name, destName, src, dst, rep); err != nil {
				return 0, 0, err
			}
			if progress != nil {
				progress(*rep)
			}
		}
	}
	return live, trashed, nil
}

// policiesNaming lists the placement policies (set on a path, or named by
// a version) that have store name among their members.
func (r *Realm) policiesNaming(ctx context.Context, name string) ([]string, error) {
	seen := map[string]bool{}
	inUse, err := r.PoliciesInUse(ctx)
	if err != nil {
		return nil, err
	}
	cands := inUse
	vols, err := r.Meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	for _, mv := range vols {
		recs, err := r.Policies(ctx, mv.Name)
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			cands = append(cands, rec.Policy)
		}
	}
	var out []string
	for _, c := range cands {
		pol, err := meta.ParsePolicy(c)
		if err != nil || seen[pol.String()] || !slices.Contains(pol.Stores, name) {
			continue
		}
		seen[pol.String()] = true
		out = append(out, pol.String())
	}
	return out, nil
}

// drainEntry rewrites the versions of e that name store name: their data
// is copied from src to dst where no other store holds it, then the entry
// is updated (compare-and-swap; on a concurrent change it is read again).
func (r *Realm) drainEntry(ctx context.Context, v *fs.Volume, e *meta.Entry, name, destName string, src, dst cairn.Store, rep *RemoveReport) error {
	copied := map[uint64]bool{} // version numbers whose data is on dst
	for attempt := 0; ; attempt++ {
		n := *e
		n.Versions = slices.Clone(e.Versions)
		changed := false
		for i := range n.Versions {
			ver := &n.Versions[i]
			if !slices.Contains(ver.Stores, name) {
				continue
			}
			others := slices.DeleteFunc(slices.Clone(ver.Stores), func(s string) bool { return s == name })
			if len(others) == 0 {
				if !copied[ver.N] {
					if err := r.copyVersion(ctx, v, ver, src, dst, rep); err != nil {
						return err
					}
					copied[ver.N] = true
					rep.Moved++
				}
				others = []string{destName}
			}
			ver.Stores = others
			changed = true
			if attempt == 0 {
				rep.Versions++
			}
		}
		if !changed {
			return nil
		}
		_, err := v.Meta.Update(ctx, &n)
		if err == nil {
			return nil
		}
		if !errors.Is(err, cairn.ErrConflict) || attempt > 20 {
			return err
		}
		if e, err = v.Meta.Get(ctx, e.Parent, e.Name); err != nil {
			if errors.Is(err, cairn.ErrNotFound) {
				return nil // gone (to the trash: counted by the next run)
			}
			return err
		}
	}
}

// copyVersion copies a version's manifest and every object its chunks
// need (chunks, bases) from src to dst, skipping what dst has.
func (r *Realm) copyVersion(ctx context.Context, v *fs.Volume, ver *meta.Version, src, dst cairn.Store, rep *RemoveReport) error {
	m, err := v.Manifest(store.WithSources(ctx, ver.Stores), ver)
	if err != nil {
		return err
	}
	ids := []cairn.ID{ver.Manifest}
	for _, c := range m.Chunks {
		ids = append(ids, c.ID)
		if c.Base != nil {
			ids = append(ids, c.Base.ID)
		}
	}
	slices.SortFunc(ids, func(a, b cairn.ID) int { return strings.Compare(string(a[:]), string(b[:])) })
	ids = slices.Compact(ids)
	have, err := dst.Has(ctx, ids)
	if err != nil {
		return err
	}
	for i, id := range ids {
		if have[i] {
			continue
		}
		data, err := src.Get(ctx, id)
		if err != nil {
			return cairn.E("remove store", cairn.KindOf(err), id.String(), fmt.Errorf("copying a version's data away: %w", err))
		}
		if err := dst.Put(ctx, id, data); err != nil {
			return err
		}
		rep.Objects++
		rep.Bytes += int64(len(data))
	}
	return nil
}
