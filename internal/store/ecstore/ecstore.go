// Package ecstore is the ec:K+M placement policy
// (`ec:K+M@store1,...,storeN`, N = K+M): a cairn.Store wrapper that splits
// every object into K data shards and M parity shards (Reed-Solomon over
// GF(2^8), github.com/klauspost/reedsolomon) and stores shard i on member i,
// so that any K of the N members give the object back and the storage
// overhead is about N/K (DepSky, SCFS §3.2 and Figure 6; DESIGN.md "Cloud
// and cloud-of-clouds").
//
// What each member holds (doc/format.md, "Erasure-coded objects"): shard i
// as an object of its own, a header (object ID, size, K, M, i) then the
// shard's bytes, named like every object by its BLAKE3-256, so every
// member, scrubber or repairer can verify it without a key; and a copy of
// the object's shard map, the list of the N shard IDs, also named by its
// hash. A content-addressed store has no other way to find the shards of
// an object from the object's ID, so this Store keeps an index, object ID
// to shard map, in memory (and, with Options.Dir, in a cache file there):
// objects written through it are indexed at once; others (written by
// another process or device) are found by a scan, which lists the members
// and reads the maps it does not know yet (maps have a size of their own,
// 52+32·N bytes, so a scan reads little else). A Get of an unknown object
// starts a scan (at most one per Options.MissScan); List, Stats and Repair
// always scan.
//
// Put encodes the object, writes shard i and the map to member i, all
// members at once, and returns once Quorum members have both (N−f; default
// K, i.e. f = M as the issue sets it); the other members' writes go on in
// the background, and those that fail are queued for repair (in memory,
// and in Options.Dir if given). With M members down a Put is still
// acknowledged, with K shards stored: readable, but with no redundancy
// until repair; set Quorum above K (DepSky's n−f with n = 3f+1 is K+1 for
// ec:2+2) to refuse writes that would leave less. With more than N−Quorum
// members down, Put fails with Kind Unavailable naming each member and why;
// nothing is indexed, and the shards written meanwhile are left for Repair
// to complete or GC to delete (deleting them could race with a concurrent
// Put of the same object).
//
// Get asks the K fastest members that are up for their shards, one more
// member whenever one of them fails or a read has waited Options.Hedge, and
// decodes from the first K good shards. A shard that is missing, or whose
// bytes do not hash to its ID or whose header does not match the map, is
// reported (log, Options.OnFault, Health, naming the member) and rebuilt
// from the decoded object at once in the background (a damaged one deleted
// first), or queued when that fails. The object is verified against its ID
// before it is returned. With fewer than K shards readable, Get fails with
// Kind Unavailable naming each member and why (or NotFound or Corrupt when
// every member answered and the shards are gone or damaged).
package ecstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"
	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// Named is a member store and its name.
type Named = storeset.Named

// Options tune a Store. The zero value gives the defaults.
type Options struct {
	// Quorum is how many members must hold their shard (and the map)
	// before Put returns: N−f. Default K (f = M); from K to N.
	Quorum int
	// Dir holds the repair queue and the shard-map cache, so queued
	// repairs survive a restart and a new process need not read every
	// map again. "": both live in memory only.
	Dir string
	// Concurrency bounds the requests in flight per member. Default 8.
	Concurrency int
	// ProbeInterval is how often Put tries a member that is down.
	// Default 5s; negative: always.
	ProbeInterval time.Duration
	// Hedge: a Get that has waited this long for its shards asks one more
	// member (and again after each Hedge), so a member that hangs does
	// not hang reads. Default 2s; negative: never.
	Hedge time.Duration
	// MissScan is the least time between two scans started by Gets of
	// objects the index does not know. Default 1 minute; negative: a Get
	// never scans (objects written elsewhere are then found only by
	// Rescan, List, Stats or Repair).
	MissScan time.Duration
	// BackgroundTimeout bounds a shard written after Put returned, a
	// rebuild started by Get, and a scan. Default 10 minutes.
	BackgroundTimeout time.Duration
	// Logger receives fault reports and members going down or coming
	// back. nil discards.
	Logger *slog.Logger
	// OnFault, if set, is called for each missing or damaged shard found,
	// from the goroutine that found it. It must not block.
	OnFault func(storeset.Fault)
}

// Defaults of Options.
const (
	DefaultHedge             = 2 * time.Second
	DefaultMissScan          = time.Minute
	DefaultBackgroundTimeout = 10 * time.Minute
)

// Store is the ec:K+M wrapper. It owns its members: Close closes them.
type Store struct {
	k, m, n int
	quorum  int
	enc     reedsolomon.Encoder
	set     *storeset.Set
	q       *storeset.Queue
	o       Options
	log     *slog.Logger
	idx     index

	flights  storeset.Flights
	bg       sync.WaitGroup // shards written after Put returned, rebuilds
	bgCtx    context.Context
	bgCancel context.CancelFunc
	scans    sync.WaitGroup // scans: canceled at Close
	scanCtx  context.Context
	scanStop context.CancelFunc
	closed   atomic.Bool
}

var (
	_ cairn.Store      = (*Store)(nil)
	_ cairn.StoreStats = (*Store)(nil)
)

// New makes an ec:k+m store over stores (k+m of them, names distinct):
// shard i of every object goes to stores[i], so the order matters and
// must stay the same for the life of the data (a replacement takes its
// predecessor's place; see Repair). On success the Store owns the
// stores; on error the caller keeps them.
func New(k, m int, stores []Named, o Options) (*Store, error) {
	const op = "ecstore open"
	switch {
	case k < 1 || m < 1:
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("ec:%d+%d: need at least 1 data and 1 parity shard", k, m))
	case k+m > 256:
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("ec:%d+%d: at most 256 shards", k, m))
	case len(stores) != k+m:
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("ec:%d+%d needs %d stores, have %d", k, m, k+m, len(stores)))
	}
	if o.Quorum == 0 {
		o.Quorum = k
	}
	if o.Quorum < k || o.Quorum > k+m {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("quorum %d: want %d to %d", o.Quorum, k, k+m))
	}
	if o.Hedge == 0 {
		o.Hedge = DefaultHedge
	}
	if o.MissScan == 0 {
		o.MissScan = DefaultMissScan
	}
	if o.BackgroundTimeout <= 0 {
		o.BackgroundTimeout = DefaultBackgroundTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	enc, err := reedsolomon.New(k, m)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, "", err)
	}
	set, err := storeset.New(stores, storeset.Options{
		Concurrency: o.Concurrency, ProbeInterval: o.ProbeInterval,
		Logger: o.Logger, OnFault: o.OnFault,
	})
	if err != nil {
		return nil, err
	}
	q, err := storeset.OpenQueue(o.Dir, "ec", o.Logger)
	if err != nil {
		return nil, err
	}
	s := &Store{k: k, m: m, n: k + m, quorum: o.Quorum, enc: enc, set: set, q: q, o: o, log: o.Logger}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	s.scanCtx, s.scanStop = context.WithCancel(context.Background())
	if err := s.idx.init(s, o.Dir); err != nil {
		s.bgCancel()
		s.scanStop()
		q.Close()
		return nil, err
	}
	return s, nil
}

// encode splits data into the N shard objects and the map.
func (s *Store) encode(id cairn.ID, data []byte) (objs [][]byte, om *objMap, mapBytes []byte, err error) {
	size := int64(len(data))
	S := shardSize(size, s.k)
	objs = make([][]byte, s.n)
	shards := make([][]byte, s.n)
	for i := range objs {
		objs[i] = make([]byte, headerSize+S)
		putHeader(objs[i], shardMagic, s.k, s.m, i, size, id)
		shards[i] = objs[i][headerSize:]
		if i < s.k {
			lo := min(int64(i)*S, size)
			copy(shards[i], data[lo:min(lo+S, size)])
		}
	}
	if err := s.enc.Encode(shards); err != nil {
		return nil, nil, nil, cairn.E("encode", cairn.Other, id.String(), err)
	}
	om = &objMap{k: s.k, m: s.m, size: size, id: id, shards: make([]cairn.ID, s.n)}
	for i, o := range objs {
		om.shards[i] = blake3.Sum256(o)
	}
	mapBytes = om.encode()
	om.mapID = blake3.Sum256(mapBytes)
	return objs, om, mapBytes, nil
}

// putMember writes shard object obj (ID sid) and the map to st at once.
func putMember(ctx context.Context, st cairn.Store, sid cairn.ID, obj []byte, mapID cairn.ID, mapBytes []byte) error {
	errc := make(chan error, 1)
	go func() { errc <- st.Put(ctx, mapID, mapBytes) }()
	err := st.Put(ctx, sid, obj)
	if merr := <-errc; err == nil {
		err = merr // else both likely failed alike: the shard's error says it
	}
	return err
}

// Put stores the object as N shards; see the package comment. Put of an
// object already stored writes its shards again (the same bytes: the
// encoding is deterministic, and each member's Put is idempotent).
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	const op = "put"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E(op, cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	objs, om, mapBytes, err := s.encode(id, data)
	if err != nil {
		return err
	}
	all := make([]int, s.n)
	for i := range all {
		all[i] = i
	}
	end := s.flights.Begin(id)
	var mu sync.Mutex // orders After after the queueing below
	mu.Lock()
	pending, err := s.set.Write(ctx, s.bgCtx, &s.bg, op, id.String(), storeset.Write{
		Targets: all, Want: s.n, Quorum: s.quorum, Timeout: s.o.BackgroundTimeout,
		Fn: func(ctx context.Context, st cairn.Store, i int) error {
			return putMember(ctx, st, om.shards[i], objs[i], om.mapID, mapBytes)
		},
		After: func(written []int, _ map[int]error) {
			defer end()
			mu.Lock()
			defer mu.Unlock()
			s.afterPut(om, written)
		},
	})
	if err == nil {
		s.idx.add(om, mapBytes)
		for _, i := range pending {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: id, Store: s.set.Name(i)})
		}
	}
	mu.Unlock()
	return err
}

// afterPut settles the queue once every member's write of a Put is over:
// the members written have nothing left to do; the others get a task,
// provided K shards exist to rebuild from.
func (s *Store) afterPut(om *objMap, written []int) {
	ok := make([]bool, s.n)
	for _, i := range written {
		ok[i] = true
	}
	for i := range s.n {
		t := storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(i)}
		if ok[i] || len(written) < s.k {
			s.q.Done(t)
		} else {
			s.q.Add(t)
		}
	}
}

// badShard is a member found without a good shard of an object.
type badShard struct {
	i    int
	kind cairn.Kind // NotFound or Corrupt
	err  error
}

type fetched struct {
	i       int
	payload []byte
	err     error
}

// fetchShard reads shard i of om from member i (or from st, when not nil)
// and checks it: its hash, then its header against the map.
func (s *Store) fetchShard(ctx context.Context, om *objMap, i int, st cairn.Store) ([]byte, error) {
	var obj []byte
	get := func(ctx context.Context, st cairn.Store) error {
		var err error
		obj, err = st.Get(ctx, om.shards[i])
		return err
	}
	if err := s.set.CallOn(ctx, i, st, get); err != nil {
		return nil, err
	}
	if cairn.ID(blake3.Sum256(obj)) != om.shards[i] {
		return nil, cairn.E("get shard", cairn.Corrupt, om.shards[i].String(), errors.New("shard does not hash to its ID"))
	}
	p, err := decodeShard(obj, om, i)
	if err != nil {
		return nil, cairn.E("get shard", cairn.Corrupt, om.shards[i].String(), err)
	}
	return p, nil
}

// read fetches K good shards of om, fastest members first, never from the
// members marked in skip, and returns all N shard slots (the K data
// shards filled in, reconstructed if need be; parity slots as fetched) and
// the members found without a good shard. Skipped members are known to
// lack a good shard, except unknown of them (a member being replaced),
// which, like members that do not answer, make a shortfall Unavailable
// rather than NotFound or Corrupt.
func (s *Store) read(ctx context.Context, op string, om *objMap, skip []bool, unknown int) ([][]byte, []badShard, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the reads still under way once K are in
	var order []int
	for _, i := range s.set.Order() {
		if skip == nil || !skip[i] {
			order = append(order, i)
		}
	}
	shards := make([][]byte, s.n)
	results := make(chan fetched, s.n)
	next, running, have := 0, 0, 0
	launch := func() {
		if next == len(order) {
			return
		}
		i := order[next]
		next++
		running++
		go func() {
			p, err := s.fetchShard(ctx, om, i, nil)
			results <- fetched{i, p, err}
		}()
	}
	for range s.k {
		launch()
	}
	var hedge <-chan time.Time
	var timer *time.Timer
	if s.o.Hedge > 0 {
		timer = time.NewTimer(s.o.Hedge)
		defer timer.Stop()
		hedge = timer.C
	}
	var errs storeset.StoreErrors
	var bad []badShard
	unreachable := 0
	for have < s.k {
		if running == 0 {
			break
		}
		select {
		case r := <-results:
			running--
			if r.err == nil {
				shards[r.i] = r.payload
				have++
				continue
			}
			if ctx.Err() != nil {
				return nil, nil, store.CtxErr(ctx, op, om.id.String())
			}
			errs.Add(s.set.Name(r.i), r.err)
			switch k := cairn.KindOf(r.err); k {
			case cairn.NotFound, cairn.Corrupt:
				bad = append(bad, badShard{r.i, k, r.err})
				s.set.Report(storeset.Fault{Store: s.set.Name(r.i), ID: om.id, Stored: om.shards[r.i], Kind: k, Err: r.err})
			default:
				unreachable++
			}
			launch()
		case <-hedge:
			launch()
			timer.Reset(s.o.Hedge)
		case <-ctx.Done():
			return nil, nil, store.CtxErr(ctx, op, om.id.String())
		}
	}
	if have < s.k {
		summary := fmt.Sprintf("%d of %d shards readable, %d needed", have, s.n, s.k)
		switch {
		case unreachable > 0 || unknown > 0:
			return nil, bad, errs.Err(op, cairn.Unavailable, om.id.String(), summary)
		case len(bad) > 0 && allKind(bad, cairn.NotFound):
			return nil, bad, errs.Err(op, cairn.NotFound, om.id.String(), summary+" (the shards are gone)")
		default:
			return nil, bad, errs.Err(op, cairn.Corrupt, om.id.String(), summary)
		}
	}
	for i := range s.k {
		if shards[i] == nil {
			if err := s.enc.ReconstructData(shards); err != nil {
				return nil, bad, cairn.E(op, cairn.Corrupt, om.id.String(), fmt.Errorf("reconstruct: %w", err))
			}
			break
		}
	}
	return shards, bad, nil
}

func allKind(bad []badShard, k cairn.Kind) bool {
	for _, b := range bad {
		if b.kind != k {
			return false
		}
	}
	return true
}

// join concatenates the data shards into the object and verifies it.
func (s *Store) join(op string, om *objMap, shards [][]byte) ([]byte, error) {
	data := make([]byte, 0, om.size)
	for i := 0; i < s.k && int64(len(data)) < om.size; i++ {
		data = append(data, shards[i][:min(int64(len(shards[i])), om.size-int64(len(data)))]...)
	}
	if cairn.ID(blake3.Sum256(data)) != om.id {
		return nil, cairn.E(op, cairn.Corrupt, om.id.String(), errors.New("decoded object does not hash to its ID (a shard map or shards written wrong)"))
	}
	return data, nil
}

// Get returns the object; see the package comment.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	const op = "get"
	// Shards are joined into new bytes, and a repair may keep them
	// after Get returns: no member lends (store.LoanNote).
	ctx = store.WithoutLoans(ctx)
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return nil, err
	}
	om, err := s.lookup(ctx, op, id)
	if err != nil {
		return nil, err
	}
	shards, bad, err := s.read(ctx, op, om, nil, 0)
	if err != nil {
		return nil, err
	}
	data, err := s.join(op, om, shards)
	if err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		s.rebuildLater(om, shards, bad)
	}
	return data, nil
}

// lookup finds the shard map of id, scanning the members when the index
// does not know it and a scan is allowed.
func (s *Store) lookup(ctx context.Context, op string, id cairn.ID) (*objMap, error) {
	if om := s.idx.get(id); om != nil {
		return om, nil
	}
	l, err := s.scanForMiss(ctx)
	if err != nil {
		return nil, err
	}
	if om := s.idx.get(id); om != nil {
		return om, nil
	}
	if l != nil && l.failed() >= s.quorum {
		return nil, l.errs.Err(op, cairn.Unavailable, id.String(),
			fmt.Sprintf("not found on the %d stores listed; %d could not be listed", s.n-l.failed(), l.failed()))
	}
	return nil, cairn.E(op, cairn.NotFound, id.String(), nil)
}

// rebuildLater writes back, in the background, the shards of the members
// found without a good one during a read; what fails is queued.
func (s *Store) rebuildLater(om *objMap, shards [][]byte, bad []badShard) {
	if s.closed.Load() {
		for _, b := range bad {
			s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)})
		}
		return
	}
	shards = append([][]byte(nil), shards...) // Reconstruct fills the slots
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, s.o.BackgroundTimeout)
		defer cancel()
		if err := s.enc.Reconstruct(shards); err != nil {
			s.log.Error("ecstore: re-encoding for a rebuild failed", "id", om.id.String(), "err", err)
			return
		}
		for _, b := range bad {
			t := storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(b.i)}
			if err := s.writeShard(ctx, om, b.i, nil, shards[b.i], b.kind == cairn.Corrupt); err != nil {
				s.log.Warn("ecstore: rebuilding a shard failed; queued", "store", t.Store, "id", om.id.String(), "err", err)
				s.q.Add(t)
				continue
			}
			s.q.Done(t)
		}
	}()
}

// writeShard writes shard i of om (payload p) and the map to member i, or
// to st when not nil (a replacement), deleting the damaged shard first when
// damaged. The rebuilt shard must hash to the map's shard ID: the encoding
// is deterministic, so anything else is a bug, and nothing is written.
func (s *Store) writeShard(ctx context.Context, om *objMap, i int, st cairn.Store, p []byte, damaged bool) error {
	obj := encodeShard(s.k, s.m, i, om.size, om.id, p)
	if cairn.ID(blake3.Sum256(obj)) != om.shards[i] {
		return cairn.E("rebuild shard", cairn.Corrupt, om.id.String(),
			fmt.Errorf("rebuilt shard %d does not hash to the map's shard ID", i))
	}
	mapBytes := om.encode()
	do := func(ctx context.Context, st cairn.Store) error {
		if damaged {
			if err := st.Delete(ctx, om.shards[i]); err != nil {
				return err
			}
		}
		return putMember(ctx, st, om.shards[i], obj, om.mapID, mapBytes)
	}
	return s.set.RepairOn(ctx, i, st, do)
}

// Has reports which objects are stored with at least K shards present on
// the members that answer (asked by Has: no data is read). Objects the
// index does not know are reported absent without a scan (a false
// "absent" costs the caller a Put, never data); so are objects whose
// shards are on members that cannot be reached. Members found without
// their shard of an object that is present get a queued repair. Has fails
// only when no member answers.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	const op = "has"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	maps := make([]*objMap, len(ids))
	known := 0
	for j, id := range ids {
		if maps[j] = s.idx.get(id); maps[j] != nil {
			known++
		}
	}
	if known == 0 {
		return found, nil
	}
	answers, err := s.set.HasEach(ctx, op, func(i int) []cairn.ID {
		var ask []cairn.ID
		for _, om := range maps {
			if om != nil {
				ask = append(ask, om.shards[i])
			}
		}
		return ask
	})
	if err != nil {
		return nil, err
	}
	a := 0
	for j, om := range maps {
		if om == nil {
			continue
		}
		count := 0
		for i := range s.n {
			if answers[i] != nil && answers[i][a] {
				count++
			}
		}
		found[j] = count >= s.k
		if found[j] && count < s.n {
			for i := range s.n {
				if answers[i] != nil && !answers[i][a] {
					s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(i)})
				}
			}
		}
		a++
	}
	return found, nil
}

// Delete deletes the object's shards, then its map, from every member,
// after the shards of a Put still being written have landed. A member that
// fails gets queued deletions, and Delete fails with Kind Unavailable
// naming it (the other members' shards are gone). An object the index
// does not know is not looked for: Delete of it does nothing.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	const op = "delete"
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	if err := s.flights.Wait(ctx, id); err != nil {
		return err
	}
	om := s.idx.get(id)
	if om == nil {
		return nil
	}
	failed := s.set.DeleteEach(ctx, op, s.q, id, func(i int) []cairn.ID { return []cairn.ID{om.shards[i], om.mapID} })
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return err
	}
	s.idx.remove(id)
	return failed
}

// List scans the members and calls fn once per object with a shard map on
// some member. It fails with Kind Unavailable when Quorum or more members
// cannot be listed (an acknowledged object might then be on none of the
// others).
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	const op = "list"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return err
	}
	l, err := s.scan(ctx)
	if err != nil {
		return err
	}
	if l.failed() >= s.quorum {
		return l.errs.Err(op, cairn.Unavailable, "", fmt.Sprintf("%d stores could not be listed", l.failed()))
	}
	for _, om := range s.idx.all() {
		if err := store.CtxErr(ctx, op, ""); err != nil {
			return err
		}
		if err := fn(om.id, om.size); err != nil {
			return err
		}
	}
	return store.CtxErr(ctx, op, "")
}

// Stats scans the members and reports the objects and their bytes
// (Objects, Bytes) and the bytes of the shards and maps that hold them on
// the members listed (Disk).
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	const op = "stats"
	if err := store.CtxErr(ctx, op, ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	l, err := s.scan(ctx)
	if err != nil {
		return cairn.StoreUsage{}, err
	}
	if l.failed() >= s.quorum {
		return cairn.StoreUsage{}, l.errs.Err(op, cairn.Unavailable, "", fmt.Sprintf("%d stores could not be listed", l.failed()))
	}
	var u cairn.StoreUsage
	for _, om := range s.idx.all() {
		u.Objects++
		u.Bytes += om.size
		for i := range s.n {
			if !l.ok[i] {
				continue
			}
			u.Disk += l.objs[i][om.shards[i]] + l.objs[i][om.mapID]
		}
	}
	return u, nil
}

// Rescan lists the members and reads the shard maps the index does not
// know yet (objects written by other processes or devices).
func (s *Store) Rescan(ctx context.Context) error {
	l, err := s.scan(ctx)
	if err != nil {
		return err
	}
	return l.errs.Err("rescan", cairn.Unavailable, "", "")
}

// Health returns each member's state, in the order the members were given.
func (s *Store) Health() []storeset.Health { return s.set.Health(s.q.Len) }

// Queued returns the repairs waiting.
func (s *Store) Queued() []storeset.Task { return s.q.Tasks() }

// Flush waits until the shards still being written by earlier Puts, and
// the rebuilds Get started, are over (or ctx ends).
func (s *Store) Flush(ctx context.Context) error { return storeset.Flush(ctx, &s.bg) }

// Close stops scans under way, waits for the background writes (each
// bounded by BackgroundTimeout), saves the repair queue and the map cache,
// and closes the members.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.scanStop()
	s.scans.Wait()
	s.bg.Wait()
	s.bgCancel()
	return errors.Join(s.q.Close(), s.idx.close(), s.set.Close())
}
