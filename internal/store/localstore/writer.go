package localstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/store"
)

// Group commit. Put and Delete queue requests; one writer goroutine takes
// everything queued, appends it to the current pack with one write, makes it
// durable with one fdatasync, publishes it in the in-memory index and only
// then releases the waiters. While it syncs, new requests queue up and form
// the next batch.

const (
	kindClose  = 0xfe // seal the current pack and stop
	kindRotate = 0xfd // seal the current pack
)

const (
	reqQueued int32 = iota
	reqClaimed
	reqWithdrawn
)

var errWithdrawn = errors.New("withdrawn")

type writeReq struct {
	kind   byte
	id     cairn.ID
	data   []byte
	target packID // tombstones
	tOff   int64  // tombstones
	state  atomic.Int32
	done   chan struct{}
	err    error // set before done is closed
}

func (r *writeReq) recSize() int64 {
	switch r.kind {
	case kindData:
		return recHeaderSize + int64(len(r.data))
	case kindTomb:
		return recHeaderSize + tombSize
	}
	return 0
}

func (r *writeReq) appendRecord(b []byte) []byte {
	switch r.kind {
	case kindData:
		b = appendRecHeader(b, kindData, r.id, len(r.data))
		return append(b, r.data...)
	default:
		b = appendRecHeader(b, kindTomb, r.id, tombSize)
		return appendTombPayload(b, r.target, r.tOff)
	}
}

func (r *writeReq) op() string {
	if r.kind == kindTomb {
		return "delete"
	}
	return "put"
}

// wait waits for r, which the caller queued. If ctx ends before the writer
// has claimed r, r is withdrawn: the writer skips it and never touches r.data
// once wait has returned.
func (s *Store) wait(ctx context.Context, r *writeReq) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
	}
	if r.state.CompareAndSwap(reqQueued, reqWithdrawn) {
		r.err = errWithdrawn
		s.finish(r)
		return store.CtxErr(ctx, r.op(), r.id.String())
	}
	<-r.done
	return r.err
}

// finish releases r's waiters.
func (s *Store) finish(r *writeReq) {
	if r.kind == kindData {
		s.pendMu.Lock()
		if s.pending[r.id] == r {
			delete(s.pending, r.id)
		}
		s.pendMu.Unlock()
	}
	close(r.done)
}

func (s *Store) fail(reqs []*writeReq, err error) {
	for _, r := range reqs {
		r.err = cairn.E(r.op(), cairn.KindOf(err), r.id.String(), err)
		s.finish(r)
	}
}

func (s *Store) writeLoop() {
	defer close(s.writerDone)
	var batch, claimed []*writeReq
	for {
		batch = append(batch[:0], <-s.reqs)
		size := batch[0].recSize()
	drain:
		for size < int64(s.opts.BatchBytes) && len(batch) < 8192 && batch[len(batch)-1].kind < kindRotate {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
				size += r.recSize()
			default:
				break drain
			}
		}
		claimed = claimed[:0]
		var ctl *writeReq
		for _, r := range batch {
			if r.kind >= kindRotate {
				ctl = r
			} else if r.state.CompareAndSwap(reqQueued, reqClaimed) {
				claimed = append(claimed, r)
			}
		}
		s.commit(claimed)
		clear(batch)
		clear(claimed)
		if ctl != nil {
			if ctl.kind == kindClose && s.crashed.Load() {
				close(ctl.done)
				return
			}
			ctl.err = s.rotate()
			close(ctl.done)
			if ctl.kind == kindClose {
				return
			}
		}
	}
}

// commit appends reqs to the current pack (rolling over to a new one when
// it is full), syncs, publishes and releases them.
func (s *Store) commit(reqs []*writeReq) {
	for i := 0; i < len(reqs); {
		if s.cur == nil {
			p, err := s.createPack()
			if err != nil {
				s.log.Error("cannot create a pack", "err", err)
				s.fail(reqs[i:], cairn.E("create pack", cairn.IO, s.packDir, err))
				return
			}
			s.cur = p
		}
		p := s.cur
		start := p.end
		var n int64
		j := i
		for ; j < len(reqs); j++ {
			size := reqs[j].recSize()
			if (p.records > 0 || j > i) && start+n+size > s.opts.PackSize {
				break
			}
			n += size
		}
		if j == i { // p is full
			if err := s.rotate(); err != nil {
				s.log.Error("cannot seal a pack", "pack", p.id.String(), "err", err)
			}
			continue
		}
		if err := s.write(p, reqs[i:j], n); err != nil {
			s.log.Error("pack write failed; retiring the pack", "pack", p.id.String(), "err", err)
			s.fail(reqs[i:j], cairn.E("write pack", cairn.IO, p.id.String(), err))
			s.retire()
			i = j
			continue
		}
		s.publish(p, reqs[i:j], start)
		for _, r := range reqs[i:j] {
			s.finish(r)
		}
		i = j
		if p.end >= s.opts.PackSize {
			if err := s.rotate(); err != nil {
				s.log.Error("cannot seal a pack", "pack", p.id.String(), "err", err)
			}
		}
	}
	if cap(s.wbuf) > 4*s.opts.BatchBytes {
		s.wbuf = nil
	}
}

// write appends reqs (n bytes of records) to p at p.end and, with sync on,
// makes them durable: with O_DIRECT where the file system allows it
// (direct.go), else with pwrite and fdatasync. Writer goroutine.
func (s *Store) write(p *pack, reqs []*writeReq, n int64) error {
	if s.openDirect(p) {
		if err := s.writeDirect(p, reqs, n); err != errDirectRefused {
			return err
		}
	}
	buf := s.staging(int(n))[:0]
	for _, r := range reqs {
		buf = r.appendRecord(buf)
	}
	_, err := p.f.WriteAt(buf, p.end)
	if err == nil && s.sync {
		err = fdatasync(p.f)
	}
	return err
}

// publish makes written records visible. Writer goroutine.
func (s *Store) publish(p *pack, reqs []*writeReq, off int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range reqs {
		switch r.kind {
		case kindData:
			ord := p.n()
			var e [idxEntrySize]byte
			putEntry(e[:], r.id, off, uint32(len(r.data)))
			p.entries = append(p.entries, e[:]...)
			// Another process may have read the record from the file
			// before we got here, deleted it, and this process applied
			// that tombstone already (kill found no entry yet): the
			// record is born dead. Its Put still succeeds, ordered
			// before the Delete.
			if _, dead := s.killed[p.id][off]; !dead {
				s.addLoc(&r.id, loc(p.slot, ord))
			}
		case kindTomb:
			p.tombs = append(p.tombs, tomb{id: r.id, off: off, target: r.target, tOff: r.tOff})
			s.kill(r.target, r.tOff)
		}
		off += r.recSize()
		p.records++
	}
	p.end, p.packSize = off, off
}

// createPack creates a pack this process will append to: a temporary file,
// locked and given its header (durably), registered in memory, then linked
// into place, so that no other process ever sees the pack unlocked while its
// writer lives.
func (s *Store) createPack() (*pack, error) {
	for attempt := 0; ; attempt++ {
		id := newPackID()
		final := s.packPath(id)
		tmp := final + ".tmp"
		f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) && attempt < 3 {
				continue
			}
			return nil, err
		}
		ok, err := tryLock(f)
		if err == nil && !ok {
			err = errors.New("new pack file is locked by someone else")
		}
		if err == nil {
			_, err = f.WriteAt(encodePackHeader(id), 0)
		}
		if err == nil && s.sync {
			err = fdatasync(f)
		}
		if err != nil {
			f.Close()
			os.Remove(tmp)
			return nil, err
		}
		p := &pack{id: id, state: stateOwn, f: f, end: packHeaderSize, packSize: packHeaderSize}
		s.mu.Lock()
		s.register(p)
		s.mu.Unlock()
		err = os.Link(tmp, final)
		os.Remove(tmp)
		if err == nil && s.sync {
			err = durable.SyncDir(s.packDir)
		}
		if err != nil {
			s.mu.Lock()
			s.uninstall(p)
			s.closePack(p)
			s.mu.Unlock()
			os.Remove(final)
			if errors.Is(err, os.ErrExist) && attempt < 3 {
				continue
			}
			return nil, err
		}
		return p, nil
	}
}

// rotate seals the current pack (or removes it if it holds no record).
// Writer goroutine.
func (s *Store) rotate() error {
	p := s.cur
	if p == nil {
		return nil
	}
	s.cur = nil
	if p.records == 0 {
		s.mu.Lock()
		s.uninstall(p)
		s.closePack(p)
		s.mu.Unlock()
		if err := os.Remove(s.packPath(p.id)); err != nil {
			return err
		}
		if s.sync {
			return durable.SyncDir(s.packDir)
		}
		return nil
	}
	return s.seal(p)
}

// retire stops appending to the current pack after a failed write or sync:
// it is sealed at the end of its last good batch if possible; otherwise it
// stays locked until Close, and the next process to open the store recovers
// it from its records.
func (s *Store) retire() {
	p := s.cur
	s.cur = nil
	if err := s.seal(p); err != nil {
		s.log.Error("cannot seal a retired pack; it will be recovered at the next open", "pack", p.id.String(), "err", err)
	}
}

// seal writes the index of a pack this process wrote, then serves its entries
// from the mapped index and lets go of the pack's lock.
func (s *Store) seal(p *pack) error {
	if p.df != nil {
		p.df.Close()
		p.df, p.tail = nil, nil
	}
	s.mu.RLock()
	entries, tombs, end := p.entries, p.tombs, p.end
	s.mu.RUnlock()
	// After a failed write, drop any partial record past the last good one.
	if err := p.f.Truncate(end); err != nil {
		return fmt.Errorf("truncate pack %s: %w", p.id, err)
	}
	if s.sync {
		if err := fdatasync(p.f); err != nil {
			return fmt.Errorf("sync pack %s: %w", p.id, err)
		}
	}
	idx := encodeIdx(p.id, end, entries, tombs)
	if err := writeFileAtomic(s.idxPath(p.id), idx, s.sync); err != nil {
		return fmt.Errorf("write index of pack %s: %w", p.id, err)
	}
	mapped, err := mapFile(s.idxPath(p.id))
	var d idxData
	if err == nil {
		if d, err = decodeIdx(mapped, p.id); err != nil || len(d.entries) != len(entries) {
			unmap(mapped)
			mapped = nil
		}
	}
	dropPages(mapped)
	// Let go of the file while the pack is still ours in memory: once it
	// is sealed here, a refresh may find that another process compacted
	// it away (its index is complete) and close its file.
	uerr := unlock(p.f)
	s.mu.Lock()
	if mapped != nil {
		p.entries, p.mapped = d.entries, mapped
	}
	p.state = stateSealed
	p.idxSize = int64(len(idx))
	s.mu.Unlock()
	return uerr
}
