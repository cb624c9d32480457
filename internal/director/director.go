// Package director decides where bytes go and where they come from (DESIGN.md
// decision 11, doc/director.md). For a write it picks the store or stores
// the bytes go to, by the strategy of the placement policy in force (stays
// where created, copies:N, ec:K+M); for a read of a version it picks the
// stores and nodes to ask, in what order, and what to do about each that
// is not awake. It sits below fs: fs writes and reads through the stores
// the director hands it, and knows nothing of nodes.
//
// The director knows nothing of how a realm opens stores or reaches its
// nodes: the realm supplies that through Env.
package director

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/cachestore"
)

// DefaultCacheBytes bounds the chunk cache that holds what this device read
// from other nodes.
const DefaultCacheBytes = 1 << 30

// Env is what the director needs of the realm. Its methods must be safe for
// concurrent use.
type Env interface {
	// Self returns this device's node name: "" with no error if it has no
	// credentials yet, an error if they cannot be read.
	Self(ctx context.Context) (string, error)
	// Local returns this device's own store (the realm owns it).
	Local(ctx context.Context) (cairn.Store, error)
	// Nodes returns a snapshot of the node registry, each node with its
	// state (meta.NodeOnline...).
	Nodes(ctx context.Context) ([]meta.NodeStatus, error)
	// Node returns one node's registry entry; an error of Kind NotFound if
	// there is no such node.
	Node(ctx context.Context, name string) (*meta.NodeStatus, error)
	// Store returns registered store name, opened (the realm owns it), or
	// nil with no error if no store has that name.
	Store(ctx context.Context, name string) (*Named, error)
	// Dial returns a client of node name's chunk service at addr,
	// authenticated as this device; the caller closes it.
	Dial(ctx context.Context, name, addr string) (cairn.Store, error)
	// CacheStore opens the local store the chunk cache keeps its copies
	// in; the director closes it.
	CacheStore(ctx context.Context) (cairn.Store, error)
}

// Named is a registered store (a cloud bucket, a directory) as Env.Store
// returns it.
type Named struct {
	Store cairn.Store
	// Member, if set, is Store without the consistency anchor, for a
	// copies or ec wrapper (a missing copy is an answer it handles at
	// once, not a lag to wait out).
	Member   cairn.Store
	URL      string
	Draining bool // being removed: no new data goes to it
}

// Options configure a Director.
type Options struct {
	// Target, if set, is the node or registered store every write goes
	// to, whatever the policy (put --store).
	Target string
	// NoCache reads bypass the chunk cache and this device's store except
	// for versions whose data this device holds.
	NoCache bool
	// CacheBytes bounds the chunk cache (default DefaultCacheBytes).
	CacheBytes int64
	// PolicyDir is where the copies and ec wrappers keep their repair
	// queues and shard-map caches, one subdirectory per policy.
	PolicyDir string
	// Decide, if set, replaces DefaultDecide.
	Decide Decider
	// Wake, if set, wakes a node for a read that Decide said to wake
	// (wake.go); nil: such a read fails, saying no waker exists.
	Wake WakeFunc
	// WakeTimeout bounds the wait for a woken node (default
	// DefaultWakeTimeout).
	WakeTimeout time.Duration
	// OnWake, if set, is told how a wake goes (see WakeProgress).
	OnWake WakeProgress
	// Offline, if set, says whether this device is offline (the metadata
	// service cannot be reached: doc/offline.md). While it is, a read
	// is served by this device's store and chunk cache only: a chunk
	// they lack fails at once (Kind Unavailable, "offline: ... is not on
	// this device") instead of asking other nodes and stores.
	Offline func() bool
	// OffloadTo is where a write whose target is not awake goes when
	// Decide says Offload (offload.go): a node or registered store, or
	// "" or "auto" for the first awake one that fits.
	OffloadTo string
	// StripeReserve is how many bytes a write under a stripe policy
	// reserves on donated space at a time (stripe.go); 0:
	// DefaultStripeReserve.
	StripeReserve int64
	Logger        *slog.Logger
}

// Use says what a node that is not awake was wanted for.
type Use int

const (
	// ForRead: a version being read names the node.
	ForRead Use = iota
	// ForWrite: the node is the target writes go to (Options.Target).
	ForWrite
	// ForMember: the node is a member of a copies or ec policy.
	ForMember
)

func (u Use) String() string {
	switch u {
	case ForRead:
		return "read"
	case ForWrite:
		return "write"
	case ForMember:
		return "member"
	}
	return "use"
}

// Decision is what the director does about a node that is wanted but not
// awake (its state is not meta.NodeOnline).
type Decision int

const (
	// UseOther skips the node and uses another copy; when none is left
	// the operation fails naming the node and its state.
	UseOther Decision = iota
	// Wake wakes the node and waits for it, for a read once no awake
	// copy answered (Options.Wake, wake.go); elsewhere, or with no
	// Options.Wake, it fails as Fail does, saying so.
	Wake
	// Offload, for a write target (ForWrite) or a member of a copies
	// policy written to (ForMember), writes to an awake offload target
	// instead and records an offload entry with each commit, for reclaim
	// to move the data home later (offload.go); elsewhere (a member
	// being read) it fails as Fail does.
	Offload
	// Fail fails the operation at once with Kind Unavailable, naming the
	// node and its state.
	Fail
)

func (d Decision) String() string {
	switch d {
	case UseOther:
		return "use another copy"
	case Wake:
		return "wake"
	case Offload:
		return "offload"
	case Fail:
		return "fail"
	}
	return "decision"
}

// A Decider decides what to do about node n, which is not awake, wanted
// for use. It must be safe for concurrent use and must not block.
type Decider func(ctx context.Context, n meta.NodeStatus, use Use) Decision

// DefaultDecide is today's behaviour: a read uses another copy; a write
// target fails; a policy member fails (its wrapper counts it as down and
// uses the other members).
func DefaultDecide(_ context.Context, _ meta.NodeStatus, use Use) Decision {
	if use == ForRead {
		return UseOther
	}
	return Fail
}

// Director makes every choice of where bytes go and come from. Its methods
// are safe for concurrent use.
type Director struct {
	env  Env
	opts Options
	log  *slog.Logger

	mu         sync.Mutex
	closed     bool
	target     cairn.Store // Options.Target opened, nil until first need
	ownsTarget bool        // target is a node client the director closes
	// The offload target (offload.go), chosen on first need.
	offStore   cairn.Store
	offName    string
	offDone    func() // releases offStore (closes a node client)
	cacheStore cairn.Store
	cache      *cachestore.Store
	router     *router
	pins       cairn.Store // the pin store (hoard.go), nil until first need

	// The policy wrappers have their own lock: a wrapper being made does
	// not hold up reads through the chunk cache.
	polMu     sync.Mutex
	polClosed bool
	pol       map[string]*PolicyStore // by canonical policy string

	// The stripe node set chosen for each stripe policy written under
	// (stripe.go): policy as set → policy with its set.
	stripeMu   sync.Mutex
	stripeSets map[string]string

	// Wakes in progress, by node name (wake.go).
	wmu      sync.Mutex
	waking   map[string]*wakeCall
	wakeCtx  context.Context // ends at Close: waits in progress end
	wakeStop context.CancelFunc
}

// New returns a director over env. It opens nothing until first need.
func New(env Env, opts Options) *Director {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Decide == nil {
		opts.Decide = DefaultDecide
	}
	d := &Director{env: env, opts: opts, log: opts.Logger}
	d.wakeCtx, d.wakeStop = context.WithCancel(context.Background())
	return d
}

// errClosed is returned by a director after Close.
var errClosed = cairn.E("fetch", cairn.Canceled, "", errors.New("the realm is closed"))

// Close closes the policy wrappers (which wait for their background
// writes and save their repair queues), the chunk cache, the node clients
// the director opened and the write target if it is a node. Stores the
// realm owns (Env.Local, Env.Store) stay open. Close the volumes writing
// through the director first.
func (d *Director) Close() error {
	d.wakeStop()
	d.polMu.Lock()
	if !d.polClosed {
		d.polClosed = true
		for _, ps := range d.pol {
			if err := ps.Store.Close(); err != nil {
				d.log.Warn("closing a policy's stores", "policy", ps.Policy.String(), "err", err)
			}
		}
	}
	d.polMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if d.cache != nil {
		d.cache.Close()
		d.router.Close()
		d.cacheStore.Close()
	} else if d.router != nil {
		d.router.Close() // NoCache reads
	}
	if d.target != nil && d.ownsTarget {
		d.target.Close()
	}
	if d.pins != nil {
		d.pins.Close()
	}
	if d.offDone != nil {
		d.offDone()
	}
	return nil
}

// IsTarget reports whether st is the store writes go to under
// Options.Target (the realm must not close it while the director writes
// to it).
func (d *Director) IsTarget(st cairn.Store) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return (d.target != nil && d.target == st) || (d.offStore != nil && d.offStore == st)
}

// self is this device's node name ("" if it has none or it cannot be read).
func (d *Director) self(ctx context.Context) string {
	n, _ := d.env.Self(ctx)
	return n
}

// decide applies Options.Decide to node n, which is not awake. It returns
// nil for UseOther, else the error the operation fails with: Kind
// Unavailable, Path the node's name, the message its state.
func (d *Director) decide(ctx context.Context, op string, n meta.NodeStatus, use Use) error {
	switch dec := d.opts.Decide(ctx, n, use); dec {
	case UseOther:
		return nil
	case Wake, Offload:
		if dec == Offload {
			// Offloading is ForWrite's, before any member opens.
			return cairn.E(op, cairn.Unavailable, n.Name, errors.New(notAwake(n)))
		}
		return cairn.E(op, cairn.Unavailable, n.Name, fmt.Errorf("%s; cannot wake it: no waker in this build", notAwake(n)))
	default:
		return cairn.E(op, cairn.Unavailable, n.Name, errors.New(notAwake(n)))
	}
}

// notAwake says a node's state for an error: "the node is offline (last
// seen ...)".
func notAwake(n meta.NodeStatus) string {
	if n.State == meta.NodeOnline {
		return "the node has no address"
	}
	return fmt.Sprintf("the node is %s (last seen %s)", n.State, lastSeen(n.LastSeen))
}

func lastSeen(ns int64) string {
	if ns == 0 {
		return "never"
	}
	return time.Unix(0, ns).Format(time.DateTime)
}

// ErrSurrogate refuses a surrogate as a place to write.
func ErrSurrogate(name string) error {
	return cairn.E("open store", cairn.Permission, name, errors.New("the node is a surrogate: it holds staged copies only, writes go to a device, benefactor or store"))
}

// OpenNode opens a client of node name's chunk service for a policy or a
// node:// store; the node must be awake (else Options.Decide is asked,
// ForMember). The caller closes the client.
func (d *Director) OpenNode(ctx context.Context, name string) (cairn.Store, error) {
	st, err := d.env.Node(ctx, name)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, cairn.E("open store", cairn.NotFound, name, errors.New("no such node or store in the realm (see 'cairn devices', 'cairn store ls')"))
		}
		return nil, err
	}
	switch {
	case st.Removed != 0:
		return nil, cairn.E("open store", cairn.Permission, name, errors.New("the node was removed from the realm"))
	case st.State != meta.NodeOnline || st.Addr == "":
		if derr := d.decide(ctx, "open store", *st, ForMember); derr != nil {
			return nil, derr
		}
		return nil, cairn.E("open store", cairn.Unavailable, name, errors.New(notAwake(*st)))
	}
	return d.env.Dial(ctx, name, st.Addr)
}

// targetStore returns the store writes go to under the stays-where-created
// strategy and the name versions record for it: this device's store, or
// Options.Target's store or node.
func (d *Director) targetStore(ctx context.Context) (cairn.Store, string, error) {
	local, err := d.env.Local(ctx)
	if err != nil {
		return nil, "", err
	}
	self, err := d.env.Self(ctx)
	if err != nil {
		// Versions must name where their data is: never guess.
		return nil, "", err
	}
	if self == "" {
		self = "local" // a realm whose device has no credentials yet
	}
	t := d.opts.Target
	if t == "" || t == self {
		return local, self, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, "", errClosed
	}
	if d.target != nil {
		return d.target, t, nil
	}
	// A registered store (cloud bucket, directory) or else a node.
	n, err := d.env.Store(ctx, t)
	if err != nil {
		return nil, "", err
	}
	if n != nil {
		if n.Draining {
			return nil, "", cairn.E("open store", cairn.Permission, t, errors.New("the store is being removed: no new data goes to it"))
		}
		d.target = n.Store
		return n.Store, t, nil
	}
	st, err := d.env.Node(ctx, t)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, "", cairn.E("open store", cairn.NotFound, t, errors.New("no such node in the realm (see 'cairn devices')"))
		}
		return nil, "", err
	}
	switch {
	case st.Removed != 0:
		return nil, "", cairn.E("open store", cairn.Permission, t, errors.New("the node was removed from the realm"))
	case st.Role == string(pki.Surrogate):
		return nil, "", ErrSurrogate(t)
	case st.State != meta.NodeOnline || st.Addr == "":
		if d.opts.Decide(ctx, *st, ForWrite) == Offload {
			return nil, "", errOffload{*st}
		}
		if derr := d.decide(ctx, "open store", *st, ForWrite); derr != nil {
			return nil, "", derr
		}
		// UseOther: a write target has no other copy.
		return nil, "", cairn.E("open store", cairn.Unavailable, t, errors.New(notAwake(*st)))
	}
	rs, err := d.env.Dial(ctx, t, st.Addr)
	if err != nil {
		return nil, "", err
	}
	d.target, d.ownsTarget = rs, true
	return rs, t, nil
}
