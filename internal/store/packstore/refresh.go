package packstore

// Refreshing: list the backing store, learn the packs and plain objects the
// index does not know from their trailers, forget those that are gone.

import (
	"context"
	"errors"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// probeWorkers bounds the trailer reads one refresh makes at once.
const probeWorkers = 8

// Refresh lists the backing store and brings the index up to date: packs
// written by other devices are learned, packs they deleted (repacked) are
// forgotten. The file layer calls it after a garbage collection
// (store.Refresher).
func (s *Store) Refresh(ctx context.Context) error {
	if err := store.CtxErr(ctx, "refresh", ""); err != nil {
		return err
	}
	return s.refresh(ctx, s.refreshMark())
}

// refreshMark returns a mark for refresh: the number of refreshes started.
func (s *Store) refreshMark() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refStarted
}

// refresh makes sure a refresh that started after mark was taken has
// completed: it waits for the one under way and runs another if that one
// started too early (or failed). Concurrent misses so share listings.
func (s *Store) refresh(ctx context.Context, mark uint64) error {
	select {
	case s.refSem <- struct{}{}:
	case <-ctx.Done():
		return store.CtxErr(ctx, "refresh", "")
	}
	defer func() { <-s.refSem }()
	s.mu.Lock()
	if s.refStarted > mark && s.refOK {
		s.mu.Unlock()
		return nil
	}
	s.refStarted++
	s.refOK = false
	s.lastList = time.Now()
	start := s.idx.seq
	s.mu.Unlock()

	listed := map[cairn.ID]int64{}
	err := s.bList(ctx, func(id cairn.ID, size int64) error {
		listed[id] = size
		return nil
	})
	if err != nil {
		return err
	}

	type probe struct {
		id   cairn.ID
		size int64
		p    *pack // a pack, or nil
		kind int   // probePack, probePlain, probeDamaged, probeGone
	}
	var todo []probe
	s.mu.Lock()
	for id, size := range listed {
		if _, gone := s.gone[id]; !gone && !s.idx.known(id) {
			todo = append(todo, probe{id: id, size: size})
		}
	}
	// Forget what is no longer listed, except what was learned after
	// the listing began (this process's own new packs).
	for id, p := range s.idx.packs {
		if _, ok := listed[id]; !ok && p.seq <= start {
			s.forgetPackLocked(p)
		}
	}
	for id, p := range s.idx.plain {
		if _, ok := listed[id]; !ok && p.seq <= start {
			delete(s.idx.plain, id)
			s.logLocked(goneRecord(nil, id), -(logRecHeader + 40 + logRecCRC))
		}
	}
	for id := range s.idx.damaged {
		if _, ok := listed[id]; !ok {
			delete(s.idx.damaged, id)
		}
	}
	s.mu.Unlock()

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	work := make(chan int)
	for range min(probeWorkers, len(todo)) {
		wg.Go(func() {
			for i := range work {
				pr := &todo[i]
				p, kind, err := s.probe(ctx, pr.id, pr.size)
				if err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					pr.kind = probeGone
					continue
				}
				pr.p, pr.kind = p, kind
			}
		})
	}
feed:
	for i := range todo {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pr := range todo {
		if _, gone := s.gone[pr.id]; gone || s.idx.known(pr.id) {
			continue
		}
		switch pr.kind {
		case probePack:
			s.learnPackLocked(pr.p)
		case probePlain:
			s.idx.addPlain(pr.id, pr.size)
			s.logLocked(plainRecord(nil, pr.id, pr.size), logRecHeader+40+logRecCRC)
		case probeDamaged:
			s.idx.damaged[pr.id] = pr.size
		}
	}
	if err := store.CtxErr(ctx, "refresh", ""); err != nil {
		return err
	}
	if firstErr != nil {
		return firstErr
	}
	s.refOK = true
	return nil
}

const (
	probeGone = iota // vanished between listing and reading, or unreadable now
	probePack
	probePlain
	probeDamaged
)

// probe reads the end of backing object id (of the given size) to tell a
// pack from a plain object and, for a pack, learn its index.
func (s *Store) probe(ctx context.Context, id cairn.ID, size int64) (*pack, int, error) {
	if size < headerSize+trailerSize {
		return nil, probePlain, nil
	}
	n := min(size, int64(s.opts.ProbeBytes))
	tail, err := s.readRange(ctx, id, size-n, n)
	if err != nil {
		return s.probeErr(err)
	}
	_, objs, tombs, need, err := decodeTail(tail, size)
	if errors.Is(err, errNotPack) {
		// Not a pack's end. A damaged pack still has its header: never
		// take one for a plain object (a collector would delete it).
		head := tail
		if n < size {
			if head, err = s.readRange(ctx, id, 0, headerSize); err != nil {
				return s.probeErr(err)
			}
		}
		if isPack, _ := checkHeader(head); isPack {
			s.log.Warn("pack with a damaged trailer: its objects cannot be found", "pack", id.String())
			return nil, probeDamaged, nil
		}
		return nil, probePlain, nil
	}
	if err == nil && need > 0 {
		tail, err = s.readRange(ctx, id, size-need, need)
		if err != nil {
			return s.probeErr(err)
		}
		_, objs, tombs, _, err = decodeTail(tail, size)
	}
	if err != nil {
		s.log.Warn("pack with a damaged index: its objects cannot be found", "pack", id.String(), "err", err)
		return nil, probeDamaged, nil
	}
	return &pack{id: id, size: size, objs: objs, tombs: tombs}, probePack, nil
}

// probeErr: an object deleted since the listing is simply gone; anything
// else fails the refresh.
func (s *Store) probeErr(err error) (*pack, int, error) {
	if cairn.KindOf(err) == cairn.NotFound {
		return nil, probeGone, nil
	}
	return nil, probeGone, err
}
