// Package replicastore is the copies:N placement policy
// (`copies:N@storeA,storeB,...`): a cairn.Store wrapper that keeps N whole
// copies of every object, each under the object's own ID, on N of its
// member stores.
//
// Placement: with as many members as copies, every member holds every
// object. With more members than copies, an object's copies go to the
// first N members in rendezvous order (highest BLAKE3(id || name) first),
// so every reader and repairer computes the same places without a map;
// when one of those is down the next member in that order takes the copy.
//
// Put writes the copies concurrently and returns once Quorum of them are
// stored (N−f in SCFS's terms). Quorum defaults to 1 (f = N−1): a Put is
// acknowledged as soon as the object can be read back, the other copies
// are written in the background (for at most BackgroundTimeout), and a
// copy that could not be written is queued for repair. This is the same
// rule as ecstore's default (f = M: acknowledged once K shards, enough to
// read it, are stored): it keeps writes working while all but one member
// are away (a laptop offline with copies:2@local,s3) and makes a slow cloud
// cost no write latency. SCFS's stricter quorum is a setting: Quorum = N
// acknowledges only when every copy is stored (copies:2: the object
// survives the loss of either store at once), a majority is SCFS's
// n−f with f < n/2.
//
// Get reads from one member at a time, the placement members first, the
// fastest that are up first (storeset.Set.Order), verifies what it reads
// against the ID, and goes on to the next member when one has no copy,
// cannot be reached, or returns bytes that do not match. A missing or
// damaged copy is reported (log, Options.OnFault, Health) and written back
// at once in the background from the good copy (a damaged one deleted
// first); if that fails it is queued. Has is "found on any member"; Delete
// deletes from every member; List is the union of the members' listings.
//
// NotFound is answered only when it is certain: an acknowledged object has
// at least Quorum copies, so when fewer than Quorum members failed to
// answer, one that answered holds a copy. Otherwise Get and List fail with
// Kind Unavailable, naming each member and why.
package replicastore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// Named is a member store and its name.
type Named = storeset.Named

// Options tune a Store. The zero value gives the defaults.
type Options struct {
	// Quorum is how many copies must be stored before Put returns
	// (N−f). Default 1; at most N.
	Quorum int
	// Dir holds the repair queue (storeset.Queue), so queued repairs
	// survive a restart. "": the queue lives in memory only.
	Dir string
	// Concurrency bounds the requests in flight per member. Default 8.
	Concurrency int
	// ProbeInterval is how often Put tries a member that is down.
	// Default 5s; negative: always.
	ProbeInterval time.Duration
	// BackgroundTimeout bounds a copy written after Put returned, or a
	// repair started by Get. Default 10 minutes.
	BackgroundTimeout time.Duration
	// Logger receives fault reports and members going down or coming
	// back. nil discards.
	Logger *slog.Logger
	// OnFault, if set, is called for each missing or damaged copy found,
	// from the goroutine that found it. It must not block.
	OnFault func(storeset.Fault)
}

// DefaultBackgroundTimeout is BackgroundTimeout's default.
const DefaultBackgroundTimeout = 10 * time.Minute

// Store is the copies:N wrapper. It owns its members: Close closes them.
type Store struct {
	n      int
	quorum int
	set    *storeset.Set
	q      *storeset.Queue
	o      Options
	log    *slog.Logger

	flights  storeset.Flights
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
	closed   atomic.Bool
}

var (
	_ cairn.Store      = (*Store)(nil)
	_ cairn.StoreStats = (*Store)(nil)
)

// New makes a copies:n store over stores (n ≤ len(stores), names
// distinct). On success the Store owns the stores; on error the caller
// keeps them.
func New(n int, stores []Named, o Options) (*Store, error) {
	const op = "replicastore open"
	switch {
	case n < 1:
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("copies:%d: need at least 1 copy", n))
	case n > len(stores):
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("copies:%d over %d stores", n, len(stores)))
	}
	if o.Quorum == 0 {
		o.Quorum = 1
	}
	if o.Quorum < 1 || o.Quorum > n {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("quorum %d: want 1 to %d", o.Quorum, n))
	}
	if o.BackgroundTimeout <= 0 {
		o.BackgroundTimeout = DefaultBackgroundTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	set, err := storeset.New(stores, storeset.Options{
		Concurrency: o.Concurrency, ProbeInterval: o.ProbeInterval,
		Logger: o.Logger, OnFault: o.OnFault,
	})
	if err != nil {
		return nil, err
	}
	q, err := storeset.OpenQueue(o.Dir, "replica", o.Logger)
	if err != nil {
		return nil, err
	}
	s := &Store{n: n, quorum: o.Quorum, set: set, q: q, o: o, log: o.Logger}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	return s, nil
}

// placement returns every member's position, the object's N placement
// members first (rendezvous order).
func (s *Store) placement(id cairn.ID) []int {
	all := make([]int, s.set.Len())
	for i := range all {
		all[i] = i
	}
	if s.n == len(all) {
		return all
	}
	score := make([]uint64, len(all))
	for i := range all {
		h := blake3.New()
		h.Write(id[:])
		h.Write([]byte(s.set.Name(i)))
		var sum [8]byte
		h.Digest().Read(sum[:])
		score[i] = binary.BigEndian.Uint64(sum[:])
	}
	slices.SortStableFunc(all, func(a, b int) int {
		switch {
		case score[a] > score[b]:
			return -1
		case score[a] < score[b]:
			return 1
		}
		return 0
	})
	return all
}

// readOrder is the order Get tries members in: the placement members,
// fastest that are up first, then the others likewise.
func (s *Store) readOrder(id cairn.ID) []int {
	p := s.placement(id)
	return append(s.set.OrderOf(p[:s.n]), s.set.OrderOf(p[s.n:])...)
}

// Put stores the object on N members; see the package comment. Put of an
// object already stored writes it again (each member's Put is idempotent).
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	const op = "put"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E(op, cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	data = bytes.Clone(data) // copies still being written when Put returns need it
	p := s.placement(id)
	end := s.flights.Begin(id)
	var mu sync.Mutex // orders the After callback after the queueing below
	mu.Lock()
	pending, err := s.set.Write(ctx, s.bgCtx, &s.bg, op, id.String(), storeset.Write{
		Targets: p[:s.n], Spares: p[s.n:], Want: s.n, Quorum: s.quorum,
		Timeout: s.o.BackgroundTimeout,
		Fn: func(ctx context.Context, st cairn.Store, _ int) error {
			return st.Put(ctx, id, data)
		},
		After: func(written []int, failed map[int]error) {
			defer end()
			mu.Lock()
			defer mu.Unlock()
			s.afterPut(id, p[:s.n], written)
		},
	})
	if err == nil {
		// Until the copies under way are stored, they are repairs to do:
		// a crash now leaves them in the queue file.
		for _, i := range pending {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(i)})
		}
	}
	mu.Unlock()
	return err
}

// afterPut settles the repair queue once every copy of a Put is written or
// has failed: with N copies stored, nothing is left to do; otherwise each
// placement member without a copy gets a task.
func (s *Store) afterPut(id cairn.ID, targets, written []int) {
	for _, i := range targets {
		t := storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(i)}
		switch {
		case len(written) >= s.n || slices.Contains(written, i):
			s.q.Done(t)
		case len(written) > 0:
			s.q.Add(t)
		default:
			// Nothing stored anywhere: the Put failed and said so; there
			// is no copy to repair from.
			s.q.Done(t)
		}
	}
}

// badCopy is a member found without a good copy during a read.
type badCopy struct {
	i    int
	kind cairn.Kind // NotFound or Corrupt
}

// Get returns the object from the first member in read order that has a
// good copy.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	const op = "get"
	// rebuild writes the copy to other members after Get returns: no
	// member lends it (store.LoanNote).
	ctx = store.WithoutLoans(ctx)
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return nil, err
	}
	data, bad, err := s.get(ctx, op, id, s.readOrder(id), -1)
	if err == nil && len(bad) > 0 {
		s.rebuild(id, data, bad)
	}
	return data, err
}

// get reads id from the members in order (skipping position skip), and
// returns the first good copy with the placement members found missing or
// damaged on the way.
func (s *Store) get(ctx context.Context, op string, id cairn.ID, order []int, skip int) ([]byte, []badCopy, error) {
	var errs storeset.StoreErrors
	var bad []badCopy
	placed := s.placement(id)[:s.n]
	unreachable, corrupt := 0, 0
	for _, i := range order {
		if i == skip {
			continue
		}
		var data []byte
		err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
			var err error
			data, err = st.Get(ctx, id)
			return err
		})
		if err == nil && cairn.ID(blake3.Sum256(data)) != id {
			err = cairn.E(op, cairn.Corrupt, id.String(), errors.New("copy does not hash to its ID"))
		}
		if err == nil {
			return data, bad, nil
		}
		if ctx.Err() != nil {
			return nil, nil, store.CtxErr(ctx, op, id.String())
		}
		errs.Add(s.set.Name(i), err)
		switch k := cairn.KindOf(err); k {
		case cairn.NotFound, cairn.Corrupt:
			if k == cairn.Corrupt {
				corrupt++
			}
			if k == cairn.Corrupt || slices.Contains(placed, i) {
				bad = append(bad, badCopy{i, k})
				s.set.Report(storeset.Fault{Store: s.set.Name(i), ID: id, Stored: id, Kind: k, Err: err})
			}
		default:
			unreachable++
		}
	}
	switch {
	case unreachable >= s.quorum:
		return nil, nil, errs.Err(op, cairn.Unavailable, id.String(),
			fmt.Sprintf("no good copy on the %d stores that answered, %d did not", s.set.Len()-unreachable-btoi(skip >= 0), unreachable))
	case corrupt > 0:
		return nil, nil, errs.Err(op, cairn.Corrupt, id.String(), "every copy found is damaged")
	}
	return nil, nil, cairn.E(op, cairn.NotFound, id.String(), nil)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rebuild writes good copies back to the members found without one, in
// the background; what fails is queued.
func (s *Store) rebuild(id cairn.ID, data []byte, bad []badCopy) {
	if s.closed.Load() {
		for _, b := range bad {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(b.i)})
		}
		return
	}
	data = bytes.Clone(data) // the caller owns what Get returned
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, s.o.BackgroundTimeout)
		defer cancel()
		for _, b := range bad {
			t := storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(b.i)}
			if err := s.writeCopy(ctx, b.i, nil, id, data, b.kind == cairn.Corrupt); err != nil {
				s.log.Warn("replicastore: rebuilding a copy failed; queued", "store", t.Store, "id", id.String(), "err", err)
				s.q.Add(t)
				continue
			}
			s.q.Done(t)
		}
	}()
}

// writeCopy writes data to member i (or to st, a replacement store, when
// st is not nil), deleting the damaged copy first when damaged.
func (s *Store) writeCopy(ctx context.Context, i int, st cairn.Store, id cairn.ID, data []byte, damaged bool) error {
	do := func(ctx context.Context, st cairn.Store) error {
		if damaged {
			if err := st.Delete(ctx, id); err != nil {
				return err
			}
		}
		return st.Put(ctx, id, data)
	}
	return s.set.RepairOn(ctx, i, st, do)
}

// Has reports which objects some member holds. Members that cannot be
// reached are left out: an object held only by them is reported absent
// (which costs the caller a Put, never data). It fails only when no member
// answers.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	const op = "has"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	answers, err := s.set.HasEach(ctx, op, func(int) []cairn.ID { return ids })
	if err != nil {
		return nil, err
	}
	for _, a := range answers {
		for j, f := range a {
			found[j] = found[j] || f
		}
	}
	return found, nil
}

// Delete deletes the object from every member, after the copies of a Put
// still being written have landed. A member that fails gets a queued
// deletion, and Delete fails with Kind Unavailable naming it (the other
// members' copies are gone).
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	const op = "delete"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	if err := s.flights.Wait(ctx, id); err != nil {
		return err
	}
	failed := s.set.DeleteEach(ctx, op, s.q, id, func(int) []cairn.ID { return []cairn.ID{id} })
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	return failed
}

// union lists every member and returns, per object, the members holding it
// and its size. It fails when Quorum or more members cannot be listed (an
// acknowledged object might then be on none of the others).
func (s *Store) union(ctx context.Context, op string) (map[cairn.ID]*held, error) {
	var mu sync.Mutex
	all := map[cairn.ID]*held{}
	var errs storeset.StoreErrors
	var wg sync.WaitGroup
	for i := range s.set.Len() {
		wg.Go(func() {
			mine, err := s.listMember(ctx, i)
			if err != nil {
				errs.Add(s.set.Name(i), err)
				return
			}
			mu.Lock()
			addHeld(all, mine, i)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return nil, err
	}
	if errs.Len() >= s.quorum {
		return nil, errs.Err(op, cairn.Unavailable, "", fmt.Sprintf("%d stores could not be listed", errs.Len()))
	}
	return all, nil
}

type listed struct {
	id   cairn.ID
	size int64
}

type held struct {
	size int64
	on   []int // members holding a copy
}

// listMember lists member i.
func (s *Store) listMember(ctx context.Context, i int) ([]listed, error) {
	var mine []listed
	err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
		mine = mine[:0]
		return st.List(ctx, func(id cairn.ID, size int64) error {
			mine = append(mine, listed{id, size})
			return nil
		})
	})
	return mine, err
}

// addHeld records in all that member i holds the objects in mine.
func addHeld(all map[cairn.ID]*held, mine []listed, i int) {
	for _, l := range mine {
		h := all[l.id]
		if h == nil {
			h = &held{size: l.size}
			all[l.id] = h
		}
		h.on = append(h.on, i)
	}
}

// List calls fn once per object held by any member.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	const op = "list"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return err
	}
	all, err := s.union(ctx, op)
	if err != nil {
		return err
	}
	for id, h := range all {
		if err := store.CtxErr(ctx, op, ""); err != nil {
			return err
		}
		if err := fn(id, h.size); err != nil {
			return err
		}
	}
	return store.CtxErr(ctx, op, "")
}

// Stats reports the distinct objects and their bytes (Objects, Bytes) and
// the bytes of every copy held (Disk), from the members' listings.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	const op = "stats"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	all, err := s.union(ctx, op)
	if err != nil {
		return cairn.StoreUsage{}, err
	}
	var u cairn.StoreUsage
	for _, h := range all {
		u.Objects++
		u.Bytes += h.size
		u.Disk += h.size * int64(len(h.on))
	}
	return u, nil
}

// Health returns each member's state, in the order the members were given.
func (s *Store) Health() []storeset.Health { return s.set.Health(s.q.Len) }

// Queued returns the repairs waiting.
func (s *Store) Queued() []storeset.Task { return s.q.Tasks() }

// Flush waits until the copies still being written by earlier Puts, and
// the repairs Get started, are over (or ctx ends).
func (s *Store) Flush(ctx context.Context) error { return storeset.Flush(ctx, &s.bg) }

// Close waits for the background writes (each bounded by
// BackgroundTimeout), saves the repair queue and closes the members.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.bg.Wait()
	s.bgCancel()
	return errors.Join(s.q.Close(), s.set.Close())
}

// GetFrom reads id from member name alone, verified against its ID, for a
// caller that prefers one member (the director's primary). If within > 0
// and the member does not answer within it, GetFrom gives up with Kind
// Unavailable and counts the member as down, so that a Get that follows
// asks it last. Kind NotFound if the member has no copy (or there is no
// member of that name); the member's health is kept as for Get.
func (s *Store) GetFrom(ctx context.Context, name string, id cairn.ID, within time.Duration) ([]byte, error) {
	const op = "get"
	ctx = store.WithoutLoans(ctx)
	i := s.set.Index(name)
	if i < 0 {
		return nil, cairn.E(op, cairn.NotFound, id.String(), fmt.Errorf("no member %s", name))
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if within > 0 {
		cctx, cancel = context.WithTimeout(ctx, within)
	}
	defer cancel()
	var data []byte
	err := s.set.Call(cctx, i, func(ctx context.Context, st cairn.Store) error {
		var err error
		data, err = st.Get(ctx, id)
		return err
	})
	if err == nil && cairn.ID(blake3.Sum256(data)) != id {
		err = cairn.E(op, cairn.Corrupt, id.String(), errors.New("copy does not hash to its ID"))
		s.set.Report(storeset.Fault{Store: name, ID: id, Stored: id, Kind: cairn.Corrupt, Err: err})
	}
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		err = cairn.E(op, cairn.Unavailable, id.String(), fmt.Errorf("%s did not answer within %v", name, within))
		s.set.Failed(i, err)
	}
	if err != nil && ctx.Err() != nil {
		return nil, store.CtxErr(ctx, op, id.String())
	}
	return data, err
}

// Down counts member name, if up, as down (err says why) until it
// answers again: Get asks it last. The director calls it for a member it knows asleep.
func (s *Store) Down(name string, err error) {
	if i := s.set.Index(name); i >= 0 && s.set.Up(i) {
		s.set.Failed(i, err)
	}
}
