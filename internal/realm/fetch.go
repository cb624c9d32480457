package realm

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/cachestore"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/remotestore"
)

// DefaultCacheBytes bounds the chunk cache (home/cache) that holds what this
// device read from other nodes.
const DefaultCacheBytes = director.DefaultCacheBytes

// cacheDir is the chunk cache's directory in the home.
const cacheDir = "cache"

var errRealmClosed = cairn.E("fetch", cairn.Canceled, "", errors.New("the realm is closed"))

// dir returns the realm's director (internal/director), made on first
// need: every choice of where bytes go and come from is its; the realm
// only supplies, through env, what the director needs of it.
func (r *Realm) dir() *director.Director {
	r.dirMu.Lock()
	defer r.dirMu.Unlock()
	if r.director == nil {
		r.director = r.newDirector()
	}
	return r.director
}

// newDirector makes a director over this realm with the realm's options.
func (r *Realm) newDirector() *director.Director {
	o := director.Options{Target: r.opts.Target, NoCache: r.opts.NoCache, CacheBytes: r.opts.CacheBytes,
		PolicyDir: filepath.Join(r.Home, policyDir), Logger: r.log,
		Offline: func() bool { _, off := r.Meta.Offline(); return off }}
	if r.opts.WakeTimeout >= 0 {
		// Reads wake what holds their data alone (doc/power.md, "Wake").
		o.Decide, o.Wake, o.WakeTimeout, o.OnWake = director.WakeDecide, r.wakeNode, r.opts.WakeTimeout, r.opts.OnWake
	}
	if r.opts.OffloadTo != "off" {
		// A write never waits for a wake: what is meant for a node that
		// is not awake goes to an offload target, reclaimed later
		// (offload.go).
		o.Decide, o.OffloadTo = director.OffloadDecide(o.Decide), r.opts.OffloadTo
	}
	return director.New(env{r}, o)
}

// env is what the director needs of the realm (director.Env).
type env struct{ r *Realm }

func (e env) Self(ctx context.Context) (string, error)             { return e.r.selfName(ctx) }
func (e env) Local(ctx context.Context) (cairn.Store, error)       { return e.r.Store(ctx) }
func (e env) Nodes(ctx context.Context) ([]meta.NodeStatus, error) { return e.r.Meta.Nodes(ctx) }
func (e env) Node(ctx context.Context, name string) (*meta.NodeStatus, error) {
	return e.r.Meta.Node(ctx, name)
}

func (e env) Store(ctx context.Context, name string) (*director.Named, error) {
	n, err := e.r.namedStore(ctx, name)
	if err != nil || n == nil {
		return nil, err
	}
	return &director.Named{Store: n.st, Member: n.member, URL: n.rec.URL, Draining: n.rec.Draining}, nil
}

func (e env) Dial(ctx context.Context, name, addr string) (cairn.Store, error) {
	return e.r.remoteStore(ctx, name, addr)
}

// CacheStore opens the chunk cache's store: a localstore in home/cache.
func (e env) CacheStore(ctx context.Context) (cairn.Store, error) {
	return localstore.Open(ctx, filepath.Join(e.r.Home, cacheDir), localstore.Options{
		// A cache needs no durability, and smaller packs let eviction
		// give space back sooner.
		NoSync: true, TrustIDs: true, PackSize: 16 << 20, Logger: e.r.log})
}

// pinDir is the pin store's directory in the home (pin.go).
const pinDir = "pinned"

// PinStore opens the store pinned data is kept in (director.PinStorer): a
// localstore in home/pinned, never evicted; Unhoard empties it of what is
// no longer pinned. Unlike the chunk cache it syncs what it writes: it
// is what a device away from the network has, and a crash there could
// not be made good by fetching again.
func (e env) PinStore(ctx context.Context, create bool) (cairn.Store, error) {
	dir := filepath.Join(e.r.Home, pinDir)
	if !create {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
	}
	return localstore.Open(ctx, dir, localstore.Options{
		TrustIDs: true, PackSize: 16 << 20, Logger: e.r.log})
}

// CacheStats reports what the chunk cache did in this process (zero if it
// was never opened).
func (r *Realm) CacheStats() cachestore.Stats {
	return r.dir().CacheStats()
}

// remoteStore returns a client of node name's chunk service at addr,
// authenticated with this device's credentials; it accepts only that
// node's certificate, and none the realm revoked.
func (r *Realm) remoteStore(ctx context.Context, name, addr string) (*remotestore.Store, error) {
	creds, err := r.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	rev, err := r.revocations(ctx)
	if err != nil {
		return nil, err
	}
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: rev, Peer: pki.RequireNode(name)})
	if err != nil {
		return nil, err
	}
	return remotestore.New(remotestore.Options{Addr: addr, TLS: tlsConf, Logger: r.log})
}

// revocations starts the realm's revocation watch on first need; it lives
// until Close.
func (r *Realm) revocations(ctx context.Context) (*meta.Revocations, error) {
	r.revMu.Lock()
	defer r.revMu.Unlock()
	if r.rev == nil {
		rev, err := r.Meta.WatchRevocations(ctx)
		if err != nil {
			return nil, err
		}
		r.rev = rev
	}
	return r.rev, nil
}

// nodeName is this device's node name ("" if it has no credentials).
func (r *Realm) nodeName(ctx context.Context) string {
	n, _ := r.selfName(ctx)
	return n
}

// selfName is this device's node name: "" with no error if it has no
// credentials yet, an error if they cannot be read.
func (r *Realm) selfName(ctx context.Context) (string, error) {
	r.revMu.Lock()
	defer r.revMu.Unlock()
	if r.name == "" {
		c, err := r.Credentials(ctx)
		switch {
		case err == nil:
			r.name = c.Identity.Name
		case errors.Is(err, cairn.ErrNotFound):
		default:
			return "", err
		}
	}
	return r.name, nil
}

// Reserve reserves donated space (director.Donations, for stripe
// policies).
func (e env) Reserve(ctx context.Context, req meta.ReserveRequest) (*meta.Reservation, error) {
	return e.r.Meta.Reserve(ctx, req)
}

// WithDatasetSize tells writes made with ctx under a stripe policy the
// size of the dataset about to be written: it is reserved whole on
// donated space before anything is written (director.WithDatasetSize).
func WithDatasetSize(ctx context.Context, n int64) context.Context {
	return director.WithDatasetSize(ctx, n)
}
