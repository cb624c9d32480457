package ecstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

// index maps object IDs to their shard maps (see the package comment).
type index struct {
	s       *Store
	mu      sync.RWMutex
	m       map[cairn.ID]*entry   // object ID → map
	byMap   map[cairn.ID]cairn.ID // map ID → object ID
	notMaps map[cairn.ID]bool     // objects of a map's size that are not maps of ours
	gen     uint64                // bumped by every add
	cache   *mapCache             // nil without Options.Dir

	scanMu   sync.Mutex
	scanning *scanCall
	lastScan time.Time // when the last scan started
}

type entry struct {
	om  *objMap
	gen uint64
}

type scanCall struct {
	done chan struct{}
	l    *listing
	err  error
}

// listing is what a scan saw: per member, whether it could be listed and
// the objects it holds with their sizes.
type listing struct {
	ok   []bool
	objs []map[cairn.ID]int64
	errs *storeset.StoreErrors
}

func (l *listing) failed() int {
	n := 0
	for _, ok := range l.ok {
		if !ok {
			n++
		}
	}
	return n
}

func (x *index) init(s *Store, dir string) error {
	x.s = s
	x.m = map[cairn.ID]*entry{}
	x.byMap = map[cairn.ID]cairn.ID{}
	x.notMaps = map[cairn.ID]bool{}
	if dir == "" {
		return nil
	}
	c, recs, err := openMapCache(dir, s.log)
	if err != nil {
		return err
	}
	x.cache = c
	for _, r := range recs {
		switch r.kind {
		case recAdd:
			om, err := decodeMap(r.data)
			if err != nil || om.k != s.k || om.m != s.m {
				continue // another policy's map, or damage: a scan finds ours again
			}
			x.addLocked(om)
		case recRemove:
			x.removeLocked(cairn.ID(r.data))
		case recNotMap:
			x.notMaps[cairn.ID(r.data)] = true
		}
	}
	return nil
}

func (x *index) get(id cairn.ID) *objMap {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if e := x.m[id]; e != nil {
		return e.om
	}
	return nil
}

func (x *index) all() []*objMap {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]*objMap, 0, len(x.m))
	for _, e := range x.m {
		out = append(out, e.om)
	}
	return out
}

// addLocked indexes om, or refreshes its generation when it is indexed
// already; it reports whether it was new.
func (x *index) addLocked(om *objMap) bool {
	x.gen++
	if e := x.m[om.id]; e != nil && e.om.mapID == om.mapID {
		e.gen = x.gen
		return false
	}
	if e := x.m[om.id]; e != nil {
		delete(x.byMap, e.om.mapID)
	}
	x.m[om.id] = &entry{om, x.gen}
	x.byMap[om.mapID] = om.id
	return true
}

func (x *index) removeLocked(id cairn.ID) bool {
	e := x.m[id]
	if e == nil {
		return false
	}
	delete(x.m, id)
	delete(x.byMap, e.om.mapID)
	return true
}

// add indexes om (whose encoding is mapBytes).
func (x *index) add(om *objMap, mapBytes []byte) {
	x.mu.Lock()
	added := x.addLocked(om)
	x.mu.Unlock()
	if added && x.cache != nil {
		x.cache.append(recAdd, mapBytes)
	}
}

func (x *index) remove(id cairn.ID) {
	x.mu.Lock()
	removed := x.removeLocked(id)
	x.mu.Unlock()
	if removed && x.cache != nil {
		x.cache.append(recRemove, id[:])
	}
}

func (x *index) close() error {
	if x.cache == nil {
		return nil
	}
	return x.cache.close()
}

// scanForMiss scans for a Get of an object the index does not know, when
// Options.MissScan allows; it returns nil, nil when it does not scan.
func (s *Store) scanForMiss(ctx context.Context) (*listing, error) {
	if s.o.MissScan < 0 {
		return nil, nil
	}
	x := &s.idx
	x.scanMu.Lock()
	recent := x.scanning == nil && !x.lastScan.IsZero() && time.Since(x.lastScan) < s.o.MissScan
	x.scanMu.Unlock()
	if recent {
		return nil, nil
	}
	return s.scan(ctx)
}

// scan lists the members and indexes the maps it does not know yet,
// joining a scan already under way. The scan itself runs in the
// background (bounded by BackgroundTimeout): a caller that gives up does
// not fail it for the others waiting.
func (s *Store) scan(ctx context.Context) (*listing, error) {
	if err := store.CtxErr(ctx, "scan", ""); err != nil {
		return nil, err
	}
	x := &s.idx
	x.scanMu.Lock()
	c := x.scanning
	if c == nil {
		c = &scanCall{done: make(chan struct{})}
		x.scanning = c
		x.lastScan = time.Now()
		s.scans.Add(1)
		go func() {
			defer s.scans.Done()
			sctx, cancel := context.WithTimeout(s.scanCtx, s.o.BackgroundTimeout)
			c.l, c.err = s.doScan(sctx)
			cancel()
			x.scanMu.Lock()
			x.scanning = nil
			x.scanMu.Unlock()
			close(c.done)
		}()
	}
	x.scanMu.Unlock()
	select {
	case <-c.done:
		return c.l, c.err
	case <-ctx.Done():
		return nil, store.CtxErr(ctx, "scan", "")
	}
}

func (s *Store) doScan(ctx context.Context) (*listing, error) {
	x := &s.idx
	x.mu.RLock()
	startGen := x.gen
	x.mu.RUnlock()
	l := &listing{ok: make([]bool, s.n), objs: make([]map[cairn.ID]int64, s.n), errs: &storeset.StoreErrors{}}
	var wg sync.WaitGroup
	for i := range s.n {
		wg.Go(func() {
			objs := map[cairn.ID]int64{}
			err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
				clear(objs)
				return st.List(ctx, func(id cairn.ID, size int64) error {
					objs[id] = size
					return nil
				})
			})
			if err != nil {
				l.errs.Add(s.set.Name(i), err)
				return
			}
			l.ok[i], l.objs[i] = true, objs
		})
	}
	wg.Wait()
	if err := store.CtxErr(ctx, "scan", ""); err != nil {
		return nil, err
	}
	if l.failed() == s.n {
		return l, l.errs.Err("scan", cairn.Unavailable, "", "no store could be listed")
	}

	// Maps not indexed yet, and the members that list each.
	want := int64(mapSize(s.n))
	cand := map[cairn.ID][]int{}
	x.mu.RLock()
	for i, objs := range l.objs {
		for id, size := range objs {
			if size != want || x.notMaps[id] {
				continue
			}
			if _, ok := x.byMap[id]; ok {
				continue
			}
			cand[id] = append(cand[id], i)
		}
	}
	x.mu.RUnlock()
	ids := make([]cairn.ID, 0, len(cand))
	for id := range cand {
		ids = append(ids, id)
	}
	work := make(chan cairn.ID)
	var fw sync.WaitGroup
	for range min(16, len(ids)) {
		fw.Go(func() {
			for id := range work {
				s.fetchMap(ctx, id, s.set.OrderOf(cand[id]))
			}
		})
	}
	for _, id := range ids {
		select {
		case work <- id:
		case <-ctx.Done():
		}
	}
	close(work)
	fw.Wait()
	if err := store.CtxErr(ctx, "scan", ""); err != nil {
		return nil, err
	}

	// With every member listed, an indexed object whose map is on none of
	// them was deleted (by another process): forget it. Only entries
	// indexed before the scan began: a Put acknowledged since may have
	// stored its maps after the listings.
	if l.failed() == 0 {
		var gone []cairn.ID
		x.mu.RLock()
		for id, e := range x.m {
			if e.gen > startGen {
				continue
			}
			if !slices.ContainsFunc(l.objs, func(objs map[cairn.ID]int64) bool {
				_, ok := objs[e.om.mapID]
				return ok
			}) {
				gone = append(gone, id)
			}
		}
		x.mu.RUnlock()
		for _, id := range gone {
			x.mu.Lock()
			removed := false
			if e := x.m[id]; e != nil && e.gen <= startGen {
				removed = x.removeLocked(id)
			}
			x.mu.Unlock()
			if removed && x.cache != nil {
				x.cache.append(recRemove, id[:])
			}
		}
	}
	return l, nil
}

// fetchMap reads candidate map id from the members in order (the first
// that gives good bytes) and indexes it, or remembers it is not a map of
// ours.
func (s *Store) fetchMap(ctx context.Context, id cairn.ID, order []int) {
	x := &s.idx
	for _, i := range order {
		var b []byte
		err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
			var err error
			b, err = st.Get(ctx, id)
			return err
		})
		if err != nil || cairn.ID(blake3.Sum256(b)) != id {
			continue // another member may have a good copy
		}
		om, err := decodeMap(b)
		if err != nil || om.k != s.k || om.m != s.m {
			if err == nil {
				err = fmt.Errorf("a map of ec:%d+%d, this store is ec:%d+%d", om.k, om.m, s.k, s.m)
			}
			s.log.Debug("ecstore: scan: object of a map's size is not a map of this store", "id", id.String(), "err", err)
			x.mu.Lock()
			x.notMaps[id] = true
			x.mu.Unlock()
			if x.cache != nil {
				x.cache.append(recNotMap, id[:])
			}
			return
		}
		x.add(om, b)
		return
	}
}
