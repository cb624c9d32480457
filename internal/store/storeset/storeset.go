// Package storeset is what the wrappers that spread objects over several
// stores share (replicastore for copies:N, ecstore for ec:K+M): the member
// stores with their names, each member's health (latency, failures, whether
// it answers) so that reads go to the fastest healthy members first, the
// faults found in members (an object missing or damaged there), and the
// repair queue (queue.go).
//
// A member is "down" from a request that got no answer (Kind Unavailable,
// IO, Permission, Other, or a cancellation that was not the caller's) until
// its next answered request. An answer includes NotFound and Corrupt: the
// store works, the object is the problem. While a member is down, Skip tells
// writers to leave it out, except for one probe request per ProbeInterval,
// so that a store that went away does not slow every write down and one
// that came back is noticed. Readers never skip: they try down members
// last.
package storeset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Named is a member store and the name it has in the realm (`cairn store
// add NAME URL`). Names appear in errors, fault reports, Health and the
// repair queue.
type Named struct {
	Name  string
	Store cairn.Store
}

// Options tune a Set. The zero value gives the defaults.
type Options struct {
	// Concurrency bounds the requests in flight to one member. Default 8.
	Concurrency int
	// ProbeInterval is how often a down member is tried again by writers
	// (Skip). Default 5s; negative: never skip a down member.
	ProbeInterval time.Duration
	// Logger receives a warning per fault and per member going down or
	// coming back. nil discards.
	Logger *slog.Logger
	// OnFault, if set, is called for each fault found, from the goroutine
	// that found it. It must not block.
	OnFault func(Fault)
}

// DefaultConcurrency and DefaultProbeInterval are the defaults of Options.
const (
	DefaultConcurrency   = 8
	DefaultProbeInterval = 5 * time.Second
)

// maxWaiting bounds the requests waiting for a slot of one member, per
// slot: beyond it a request fails at once (Unavailable) instead of queueing
// without end behind a member that has stopped answering.
const maxWaiting = 32

// roomWaiting is how many requests may wait for a member's slots (per
// slot) before a quorum write holds back its next write to that member
// (Set.room); half of what Call accepts, so that a member that is slower
// than the quorum but answers never has a write refused.
const roomWaiting = maxWaiting / 2

// stallAfter: a member whose oldest request in flight is older than this
// has stalled; writers no longer wait for room there (Call's bound then
// refuses the excess and counts the member down).
const stallAfter = 5 * time.Second

// Fault is a problem found in one member: an object that should be there
// is missing, or its bytes do not hash to its name.
type Fault struct {
	Store  string     // the member
	ID     cairn.ID   // the object the caller asked for
	Stored cairn.ID   // the object in Store at fault (a shard for ecstore; ID itself for replicastore)
	Kind   cairn.Kind // NotFound: missing there; Corrupt: damaged there
	Err    error
}

func (f Fault) String() string {
	what := "missing"
	if f.Kind == cairn.Corrupt {
		what = "corrupt"
	}
	s := fmt.Sprintf("store %s: object %s %s", f.Store, f.Stored.Short(), what)
	if f.Stored != f.ID {
		s += fmt.Sprintf(" (part of %s)", f.ID.Short())
	}
	return s
}

// Health is one member's state, as Set.Health reports it (for `cairn
// store ls`).
type Health struct {
	Name        string
	Up          bool          // false from a request that got no answer until the next answered one
	Latency     time.Duration // moving average of answered requests (0: none yet)
	Requests    int64         // requests made
	Failures    int64         // requests that got no answer
	Missing     int64         // objects found missing there
	Corrupt     int64         // objects found damaged there
	Repaired    int64         // objects written there by repairs
	Queued      int           // repairs waiting for this member
	LastError   string        // the last failure, "" if none
	LastErrorAt time.Time
	DownSince   time.Time // zero while up
}

// Set is a fixed list of member stores and their health. It is safe for
// concurrent use.
type Set struct {
	m      []*member
	o      Options
	log    *slog.Logger
	now    func() time.Time
	onWait func() // tests: called when a request starts waiting for a slot
}

type member struct {
	name string
	st   cairn.Store
	slot chan struct{}

	mu        sync.Mutex
	waiting   int
	started   chan struct{} // closed when a request stops waiting (room); nil if nobody watches
	seq       uint64
	inflight  map[uint64]time.Time // start of each request in flight
	ewma      time.Duration
	requests  int64
	failures  int64
	missing   int64
	corrupt   int64
	repaired  int64
	down      bool
	downSince time.Time
	nextProbe time.Time
	lastErr   error
	lastErrAt time.Time
	stale     bool // a Refresh of it failed: refreshed before it is asked Has (refresh.go)
}

// New makes a Set of stores, which must have distinct, non-empty names.
// The Set owns the stores from then on: Close closes them.
func New(stores []Named, o Options) (*Set, error) {
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Concurrency < 0 {
		return nil, cairn.E("storeset", cairn.Invalid, "", errors.New("Concurrency is negative"))
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Set{o: o, log: o.Logger, now: time.Now}
	seen := map[string]bool{}
	for _, n := range stores {
		switch {
		case n.Name == "":
			return nil, cairn.E("storeset", cairn.Invalid, "", errors.New("a store has no name"))
		case len(n.Name) > 255:
			return nil, cairn.E("storeset", cairn.Invalid, n.Name, errors.New("store name longer than 255 bytes"))
		case seen[n.Name]:
			return nil, cairn.E("storeset", cairn.Invalid, n.Name, errors.New("store named twice"))
		case n.Store == nil:
			return nil, cairn.E("storeset", cairn.Invalid, n.Name, errors.New("nil store"))
		}
		seen[n.Name] = true
		s.m = append(s.m, &member{name: n.Name, st: n.Store, slot: make(chan struct{}, o.Concurrency), inflight: map[uint64]time.Time{}})
	}
	return s, nil
}

// Len returns the number of members.
func (s *Set) Len() int { return len(s.m) }

// Name returns member i's name.
func (s *Set) Name(i int) string { return s.m[i].name }

// Store returns member i's store.
func (s *Set) Store(i int) cairn.Store { return s.m[i].st }

// Index returns the position of the member called name, or -1.
func (s *Set) Index(name string) int {
	for i, m := range s.m {
		if m.name == name {
			return i
		}
	}
	return -1
}

// Order returns the members' positions, best first: members that are up
// by increasing latency, then down members, most recently up first. Ties
// keep the members' order. A member's latency is its moving average, or
// the age of its oldest request in flight when that is more (a member that
// has stopped answering drops back before it fails anything); members not
// measured yet and idle count 0, so that every member gets measured.
func (s *Set) Order() []int { return s.OrderOf(nil) }

// OrderOf is Order restricted to the positions in among (all when nil).
func (s *Set) OrderOf(among []int) []int {
	type key struct {
		i    int
		down bool
		lat  time.Duration
		ds   time.Time
	}
	if among == nil {
		among = make([]int, len(s.m))
		for i := range among {
			among[i] = i
		}
	}
	keys := make([]key, len(among))
	now := s.now()
	for j, i := range among {
		m := s.m[i]
		m.mu.Lock()
		lat := m.ewma
		for _, start := range m.inflight {
			lat = max(lat, now.Sub(start))
		}
		keys[j] = key{i, m.down, lat, m.downSince}
		m.mu.Unlock()
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		switch {
		case a.down != b.down:
			if a.down {
				return 1
			}
			return -1
		case a.down:
			return b.ds.Compare(a.ds)
		default:
			return cmpDur(a.lat, b.lat)
		}
	})
	out := make([]int, len(keys))
	for j, k := range keys {
		out[j] = k.i
	}
	return out
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Up reports whether member i is up.
func (s *Set) Up(i int) bool {
	m := s.m[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.down
}

// Skip returns nil when a writer should send member i a request, and an
// error of Kind Unavailable giving the member's last failure when it is
// down and no probe is due. Each call that returns nil for a down member
// uses up the probe until the next ProbeInterval.
func (s *Set) Skip(i int) error {
	m := s.m[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.down || s.o.ProbeInterval < 0 {
		return nil
	}
	now := s.now()
	if !now.Before(m.nextProbe) {
		m.nextProbe = now.Add(s.o.ProbeInterval)
		return nil
	}
	return cairn.E("not asked", cairn.Unavailable, "",
		fmt.Errorf("down since %s (%w)", m.downSince.Format(time.TimeOnly), m.lastErr))
}

// room returns once member i has fewer than roomWaiting requests waiting
// per slot, or at once when it is down or has stalled (stallAfter). A
// write that returns at a quorum leaves its writes to the slower members
// running; without this a long run of writes (a put of a large file) piles
// them up behind a member that is merely slower until Call refuses them,
// and those copies or shards are missing until a repair. With it, writers
// go at the pace of the slowest member that answers. It fails only when ctx
// ends (Kind Canceled).
func (s *Set) room(ctx context.Context, i int) error {
	m := s.m[i]
	for {
		m.mu.Lock()
		if m.waiting < roomWaiting*cap(m.slot) || m.down {
			m.mu.Unlock()
			return nil
		}
		now := s.now()
		for _, start := range m.inflight {
			if now.Sub(start) > stallAfter {
				m.mu.Unlock()
				return nil
			}
		}
		if m.started == nil {
			m.started = make(chan struct{})
		}
		started := m.started
		m.mu.Unlock()
		t := time.NewTimer(stallAfter)
		select {
		case <-started:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return cairn.E("wait for room", cairn.Canceled, m.name, ctx.Err())
		}
		t.Stop()
	}
}

// Call runs fn, a request to member i, within the member's concurrency
// bound, and updates its health from the outcome (see the package comment
// for what counts as an answer). It returns fn's error as it is, or an
// error of Kind Canceled if ctx ended while waiting for a slot, or of Kind
// Unavailable if too many requests already wait for this member.
func (s *Set) Call(ctx context.Context, i int, fn func(ctx context.Context, st cairn.Store) error) error {
	m := s.m[i]
	m.mu.Lock()
	if m.waiting >= maxWaiting*cap(m.slot) {
		m.mu.Unlock()
		err := cairn.E("not asked", cairn.Unavailable, "", errors.New("too many requests waiting"))
		s.failed(m, err)
		return err
	}
	m.waiting++
	m.mu.Unlock()
	if s.onWait != nil {
		s.onWait()
	}
	select {
	case m.slot <- struct{}{}:
	case <-ctx.Done():
		m.mu.Lock()
		m.waiting--
		if m.started != nil {
			close(m.started)
			m.started = nil
		}
		m.mu.Unlock()
		return cairn.E("wait for a request slot", cairn.Canceled, "", ctx.Err())
	}
	start := s.now()
	m.mu.Lock()
	m.waiting--
	if m.started != nil {
		close(m.started)
		m.started = nil
	}
	m.requests++
	m.seq++
	seq := m.seq
	m.inflight[seq] = start
	m.mu.Unlock()
	err := fn(ctx, m.st)
	elapsed := s.now().Sub(start)
	m.mu.Lock()
	delete(m.inflight, seq)
	m.mu.Unlock()
	<-m.slot
	switch k := cairn.KindOf(err); {
	case err == nil || k == cairn.NotFound || k == cairn.Corrupt || k == cairn.Invalid:
		s.answered(m, elapsed)
	case ctx.Err() != nil:
		// The caller gave up: says nothing about the store.
	default:
		s.failed(m, err)
	}
	return err
}

// ewmaWeight is the weight of a new sample in the latency average (1/4).
const ewmaShift = 2

func (s *Set) answered(m *member, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ewma == 0 {
		m.ewma = max(d, 1)
	} else {
		m.ewma += (d - m.ewma) >> ewmaShift
		m.ewma = max(m.ewma, 1)
	}
	if m.down {
		m.down = false
		s.log.Info("storeset: store is back", "store", m.name, "down_for", s.now().Sub(m.downSince).Round(time.Millisecond))
		m.downSince = time.Time{}
	}
}

func (s *Set) failed(m *member, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failures++
	m.lastErr = err
	m.lastErrAt = s.now()
	if !m.down {
		m.down = true
		m.downSince = m.lastErrAt
		m.nextProbe = m.lastErrAt.Add(s.o.ProbeInterval)
		s.log.Warn("storeset: store is down", "store", m.name, "err", err)
	}
}

// Report records a fault found in a member: counts it, logs it and calls
// Options.OnFault.
func (s *Set) Report(f Fault) {
	if i := s.Index(f.Store); i >= 0 {
		m := s.m[i]
		m.mu.Lock()
		if f.Kind == cairn.Corrupt {
			m.corrupt++
		} else {
			m.missing++
		}
		m.mu.Unlock()
	}
	s.log.Warn("storeset: "+f.String(), "store", f.Store, "id", f.ID.String(), "stored", f.Stored.String(), "err", f.Err)
	if s.o.OnFault != nil {
		s.o.OnFault(f)
	}
}

// Repaired counts n objects written to member i by a repair.
func (s *Set) Repaired(i, n int) {
	m := s.m[i]
	m.mu.Lock()
	m.repaired += int64(n)
	m.mu.Unlock()
}

// Health returns every member's state, in the members' order. queued, if
// not nil, gives the number of repairs waiting for a member.
func (s *Set) Health(queued func(name string) int) []Health {
	out := make([]Health, len(s.m))
	for i, m := range s.m {
		m.mu.Lock()
		h := Health{
			Name: m.name, Up: !m.down, Latency: m.ewma,
			Requests: m.requests, Failures: m.failures,
			Missing: m.missing, Corrupt: m.corrupt, Repaired: m.repaired,
			LastErrorAt: m.lastErrAt, DownSince: m.downSince,
		}
		if m.lastErr != nil {
			h.LastError = m.lastErr.Error()
		}
		m.mu.Unlock()
		if queued != nil {
			h.Queued = queued(m.name)
		}
		out[i] = h
	}
	return out
}

// LastError returns member i's last failure, or nil.
func (s *Set) LastError(i int) error {
	m := s.m[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

// Close closes every member store and returns their errors joined.
func (s *Set) Close() error {
	var errs []error
	for _, m := range s.m {
		if err := m.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store %s: %w", m.name, err))
		}
	}
	return errors.Join(errs...)
}

// StoreErrors collects per-member failures of one operation and turns them
// into one error that names each member and why it failed.
type StoreErrors struct {
	mu   sync.Mutex
	errs []storeErr
}

type storeErr struct {
	name string
	err  error
}

// Add records that member name failed with err.
func (e *StoreErrors) Add(name string, err error) {
	e.mu.Lock()
	e.errs = append(e.errs, storeErr{name, err})
	e.mu.Unlock()
}

// Len returns how many failures were added.
func (e *StoreErrors) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.errs)
}

// Err returns nil when nothing was added, or an error of Kind kind (op and
// path as in cairn.E) whose message lists each member and its failure, in
// the order they were added. It does not wrap the members' errors: their
// Kinds differ (one member NotFound, another Unavailable), and errors.Is
// must match only kind.
func (e *StoreErrors) Err(op string, kind cairn.Kind, path, summary string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.errs) == 0 && summary == "" {
		return nil
	}
	return cairn.E(op, kind, path, &joined{summary: summary, errs: slices.Clone(e.errs)})
}

type joined struct {
	summary string
	errs    []storeErr
}

func (j *joined) Error() string {
	var b []byte
	b = append(b, j.summary...)
	for i, e := range j.errs {
		switch {
		case i == 0 && len(b) > 0:
			b = append(b, ": "...)
		case i > 0:
			b = append(b, "; "...)
		}
		b = append(b, "store "...)
		b = append(b, e.name...)
		b = append(b, ": "...)
		b = append(b, e.err.Error()...)
	}
	return string(b)
}

// RepairReport counts what a repair did (replicastore and ecstore Repair).
type RepairReport struct {
	Objects       int64 // objects the walk examined
	Missing       int64 // copies (shards) found missing
	Corrupt       int64 // copies (shards) found damaged
	Rebuilt       int64 // copies (shards) written back
	Deleted       int64 // queued deletions carried out
	Failed        int64 // repairs that could not be made now (left queued)
	Unrecoverable int64 // objects with no good copy (ec: fewer than K good shards) on the stores that answered
}

func (r RepairReport) String() string {
	return fmt.Sprintf("%d objects checked, %d missing and %d damaged found, %d rebuilt, %d deletions done, %d failed, %d unrecoverable",
		r.Objects, r.Missing, r.Corrupt, r.Rebuilt, r.Deleted, r.Failed, r.Unrecoverable)
}

// Failed counts err, a request to member i that got no answer in the time
// its caller allowed, as a failure: the member is down until it answers
// again (Call does not count a request whose context ended).
func (s *Set) Failed(i int, err error) { s.failed(s.m[i], err) }
