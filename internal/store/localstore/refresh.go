package localstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Discovery: bringing the in-memory index up to date with what is on disk.
//
// It runs at Open, and later whenever a lookup misses (Get, Has), before
// Delete, List, Verify and Compact. It lists the pack directory only if the
// directory changed since the last listing (its mtime, with a margin for
// coarse timestamps), then polls the packs other live processes are appending
// to (one fstat each). So a miss costs a few system calls when nothing
// changed.

// mtimeSlack: a listing that started less than this after the directory's
// mtime may have missed a change made within the same timestamp tick, so the
// next refresh lists again.
const mtimeSlack = time.Second

// refresh brings the in-memory index up to date. since is the value of
// refreshStarted that the caller read before the lookup that missed: if a
// refresh that started after that has completed meanwhile, it saw everything
// the caller needs, and refresh returns at once.
func (s *Store) refresh(ctx context.Context, since uint64) error {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	if s.refreshDone > since {
		return nil
	}
	if err := store.CtxErr(ctx, "refresh", s.dir); err != nil {
		return err
	}
	start := s.refreshStarted.Add(1)
	if err := s.rescan(ctx); err != nil {
		return err
	}
	s.refreshDone = start
	return nil
}

func (s *Store) rescan(ctx context.Context) error {
	fi, err := os.Stat(s.packDir)
	if err != nil {
		return cairn.E("refresh", cairn.IO, s.dir, err)
	}
	mt := fi.ModTime()
	if !s.listed || !mt.Equal(s.dirMtime) || s.listedAt.Sub(mt) < mtimeSlack {
		// A listing that saw packs go, or during which the directory
		// changed, may have raced a compaction: its new packs (holding
		// the moved records and tombstones) were linked before the old
		// ones were removed, but maybe after the listing passed their
		// names. List once more, so that what the compaction moved is
		// seen by this refresh, not only the next one.
		for range 3 {
			now := time.Now()
			gone, err := s.scanDir(ctx)
			if err != nil {
				return err
			}
			s.listed, s.dirMtime, s.listedAt = true, mt, now
			fi, err := os.Stat(s.packDir)
			if err != nil {
				return cairn.E("refresh", cairn.IO, s.dir, err)
			}
			if !gone && fi.ModTime().Equal(mt) {
				break
			}
			mt = fi.ModTime()
		}
	}
	return s.pollForeign(ctx)
}

type onDisk struct{ pack, idx, packTmp, idxTmp bool }

// scanDir lists the pack directory once and installs what it finds. It
// reports whether packs were seen to go (removed since the last listing, or
// between this listing and opening them).
func (s *Store) scanDir(ctx context.Context) (gone bool, err error) {
	// Only packs known before the listing starts can be judged removed by
	// their absence: one created meanwhile (by this process too) may have
	// been linked after the listing passed its name.
	s.mu.RLock()
	known := make(map[*pack]bool, len(s.byID))
	for _, p := range s.byID {
		known[p] = true
	}
	s.mu.RUnlock()
	ents, err := os.ReadDir(s.packDir)
	if err != nil {
		return false, cairn.E("refresh", cairn.IO, s.dir, err)
	}
	disk := map[packID]*onDisk{}
	var ids []packID
	for _, e := range ents {
		name := e.Name()
		base, suffix, _ := strings.Cut(name, ".")
		id, ok := parsePackID(base)
		if !ok {
			continue
		}
		d := disk[id]
		if d == nil {
			d = &onDisk{}
			disk[id] = d
			ids = append(ids, id)
		}
		switch suffix {
		case "pack":
			d.pack = true
		case "idx":
			d.idx = true
		case "pack.tmp":
			d.packTmp = true
		case "idx.tmp":
			d.idxTmp = true
		}
	}
	slices.SortFunc(ids, func(a, b packID) int { return bytes.Compare(a[:], b[:]) })

	var added []*pack
	for _, id := range ids {
		if err := store.CtxErr(ctx, "refresh", s.dir); err != nil {
			return false, err
		}
		d := disk[id]
		if !d.pack {
			s.removeLeftovers(id, d)
			continue
		}
		s.mu.RLock()
		p := s.byID[id]
		foreign := p != nil && p.state == stateForeign
		s.mu.RUnlock()
		if p != nil {
			if foreign && d.idx {
				s.adoptIdx(p)
			}
			continue
		}
		np, err := s.loadPack(ctx, id, d.idx)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				gone = true // removed by a compaction since we listed
				continue
			}
			if ctx.Err() != nil {
				return false, store.CtxErr(ctx, "refresh", s.dir)
			}
			s.log.Error("skipping unreadable pack", "pack", id.String(), "err", err)
			continue
		}
		added = append(added, np)
	}

	s.mu.Lock()
	var removed []*pack
	for _, p := range s.packs {
		if p != nil && p.state != stateOwn && known[p] {
			if d := disk[p.id]; d == nil || !d.pack {
				removed = append(removed, p)
			}
		}
	}
	gone = gone || len(removed) > 0
	for _, p := range added {
		s.register(p)
	}
	for _, p := range added {
		for _, t := range p.tombs {
			s.kill(t.target, t.tOff)
		}
	}
	s.installMany(added)
	for _, p := range removed {
		s.uninstall(p)
		delete(s.killed, p.id)
		s.closePack(p)
	}
	s.mu.Unlock()
	return gone, nil
}

// removeLeftovers removes files of a pack whose pack file is gone: an index
// left by an interrupted compaction, stale temporary files. The listing
// may have passed the pack's name before it was created, and its index
// be written since: it checks that the pack is gone now.
func (s *Store) removeLeftovers(id packID, d *onDisk) {
	base := s.packPath(id)
	if d.idx || d.idxTmp {
		if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	if d.idx {
		s.log.Info("removing the index of a removed pack", "pack", id.String())
		_ = os.Remove(s.idxPath(id))
	}
	if d.idxTmp {
		// Written by a process sealing or recovering the pack just
		// before a compaction removed it, or left by a crash: old ones
		// only.
		if fi, err := os.Stat(s.idxPath(id) + ".tmp"); err == nil && time.Since(fi.ModTime()) >= time.Minute {
			_ = os.Remove(s.idxPath(id) + ".tmp")
		}
	}
	if d.packTmp {
		// A pack being created is locked by its creator until it is linked
		// into place; an unlocked one (and old, to leave alone the instant
		// between create and lock) was left by a crash.
		tmp := base + ".tmp"
		fi, err := os.Stat(tmp)
		if err != nil || time.Since(fi.ModTime()) < time.Minute {
			return
		}
		f, err := os.Open(tmp)
		if err != nil {
			return
		}
		if ok, _ := tryLock(f); ok {
			_ = os.Remove(tmp)
		}
		f.Close()
	}
}

// loadPack reads a pack this process does not know yet: from its index if it
// has a good one; else, if no live process holds its lock, by recovering it
// (scan, verify, write the index); else, as a pack another process is
// appending to, by scanning its records so far.
func (s *Store) loadPack(ctx context.Context, id packID, hasIdx bool) (*pack, error) {
	if hasIdx {
		p, err := s.loadSealed(id)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return p, err
		}
		s.log.Warn("pack index unusable; rebuilding it from the pack", "pack", id.String(), "err", err)
	}
	f, err := openPackFile(s.packPath(id))
	if err != nil {
		return nil, err
	}
	ok, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if !ok {
		p := &pack{id: id, state: stateForeign, f: f, end: packHeaderSize}
		if err = checkHeaderAt(f, id); err != nil {
			f.Close()
			return nil, err
		}
		entries, tombs, end, size, serr := s.scanTail(p)
		if serr != nil {
			f.Close()
			return nil, serr
		}
		p.entries, p.tombs, p.end, p.packSize = entries, tombs, end, size
		return p, nil
	}
	defer unlock(f)
	// Unlocked: its writer is gone. It may have sealed it just now.
	if !hasIdx {
		if _, serr := os.Stat(s.idxPath(id)); serr == nil {
			if p, lerr := s.loadSealed(id); lerr == nil {
				f.Close()
				return p, nil
			}
		}
	}
	p, err := s.recoverPack(ctx, id, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return p, nil
}

func openPackFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrPermission) {
		f, err = os.Open(path) // a read-only store: recover in memory only
	}
	return f, err
}

func checkHeaderAt(f *os.File, id packID) error {
	h := make([]byte, packHeaderSize)
	if _, err := f.ReadAt(h, 0); err != nil {
		return fmt.Errorf("pack header: %w", err)
	}
	return checkPackHeader(h, id)
}

// loadIdx maps and checks the index of pack id against the pack's size.
func (s *Store) loadIdx(id packID) (mapped []byte, d idxData, packSize int64, err error) {
	mapped, err = mapFile(s.idxPath(id))
	if err != nil {
		return nil, d, 0, err
	}
	d, err = decodeIdx(mapped, id)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(s.packPath(id)); err == nil {
			packSize = fi.Size()
			if packSize < d.end {
				err = fmt.Errorf("pack has %d bytes, its index covers %d", packSize, d.end)
			}
		}
	}
	if err != nil {
		unmap(mapped)
		return nil, d, 0, err
	}
	return mapped, d, packSize, nil
}

func (s *Store) loadSealed(id packID) (*pack, error) {
	mapped, d, size, err := s.loadIdx(id)
	if err != nil {
		return nil, err
	}
	dropPages(mapped) // checked; installing reads it once more, sequentially
	return &pack{
		id: id, state: stateSealed, entries: d.entries, mapped: mapped, tombs: d.tombs,
		end: d.end, packSize: size, idxSize: int64(len(mapped)),
	}, nil
}

// scanTail reads the records another process appended to p since p.end. It
// syncs the file first (after noting its size), so that every record it
// returns is durable even though its writer may not have synced it yet.
func (s *Store) scanTail(p *pack) (entries []byte, tombs []tomb, end, size int64, err error) {
	fi, err := p.f.Stat()
	if err != nil {
		return nil, nil, 0, 0, err
	}
	size = fi.Size()
	if size <= p.end {
		return nil, nil, p.end, size, nil
	}
	if s.sync {
		if err = fdatasync(p.f); err != nil {
			return nil, nil, 0, 0, err
		}
	}
	end, _, err = scanPack(p.f, p.end, size, false, func(r record) {
		if r.kind == kindData {
			var e [idxEntrySize]byte
			putEntry(e[:], r.id, r.off, r.length)
			entries = append(entries, e[:]...)
		} else {
			tombs = append(tombs, tomb{id: r.id, off: r.off, target: r.target, tOff: r.tOff})
		}
	})
	return entries, tombs, end, size, err
}

// recoverPack rebuilds the index of a pack whose writer died before sealing
// it. The caller holds the pack's lock. Every record is verified; the first
// damaged header ends the pack (a torn tail), and the file is truncated
// there once the index is durable.
func (s *Store) recoverPack(ctx context.Context, id packID, f *os.File) (*pack, error) {
	if err := store.CtxErr(ctx, "recover", id.String()); err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if err = checkHeaderAt(f, id); err != nil {
		return nil, err
	}
	var entries []byte
	var tombs []tomb
	end, st, err := scanPack(f, packHeaderSize, size, true, func(r record) {
		if r.kind == kindData {
			var e [idxEntrySize]byte
			putEntry(e[:], r.id, r.off, r.length)
			entries = append(entries, e[:]...)
		} else {
			tombs = append(tombs, tomb{id: r.id, off: r.off, target: r.target, tOff: r.tOff})
		}
	})
	if err != nil {
		return nil, err
	}
	s.log.Info("recovered an unsealed pack", "pack", id.String(),
		"objects", len(entries)/idxEntrySize, "tombstones", len(tombs),
		"damaged", st.bad, "torn_bytes", size-end)
	p := &pack{id: id, state: stateSealed, f: f, entries: entries, tombs: tombs, end: end, packSize: size}
	idx := encodeIdx(id, end, entries, tombs)
	if err := writeFileAtomic(s.idxPath(id), idx, s.sync); err != nil {
		s.log.Warn("cannot write the index of a recovered pack; serving it from memory", "pack", id.String(), "err", err)
		return p, nil
	}
	p.idxSize = int64(len(idx))
	// Drop the torn tail (and any blocks the dead writer had preallocated:
	// versions before O_DIRECT appends did).
	if err := f.Truncate(end); err == nil {
		p.packSize = end
		if s.sync {
			_ = fdatasync(f)
		}
	}
	if mapped, d, _, err := s.loadIdx(id); err == nil {
		p.entries, p.mapped, p.tombs = d.entries, mapped, d.tombs
	}
	return p, nil
}

// adoptIdx switches a pack another process was appending to, and has now
// sealed, to its index.
func (s *Store) adoptIdx(p *pack) {
	mapped, d, size, err := s.loadIdx(p.id)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("cannot read the index of a sealed pack; still scanning it", "pack", p.id.String(), "err", err)
		}
		return
	}
	dropPages(mapped) // before another goroutine can unmap it
	s.replace(p, d.entries, mapped, d.tombs, d.end, size, int64(len(mapped)))
}

// replace gives an installed pack a new, complete list of records.
func (s *Store) replace(p *pack, entries, mapped []byte, tombs []tomb, end, packSize, idxSize int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	oldN, oldT := p.n(), len(p.tombs)
	if len(entries) >= len(p.entries) && bytes.Equal(entries[:len(p.entries)], p.entries) &&
		len(tombs) >= oldT && slices.Equal(tombs[:oldT], p.tombs) {
		// What we had is a prefix of the index: keep it installed.
	} else {
		for ord := range oldN {
			s.removeLoc(entryID(p.entries[ord*idxEntrySize:]), loc(p.slot, ord))
		}
		oldN, oldT = 0, 0
	}
	unmap(p.mapped)
	p.entries, p.mapped, p.tombs = entries, mapped, tombs
	p.end, p.packSize, p.idxSize, p.state = end, packSize, idxSize, stateSealed
	s.installFrom(p, oldN, oldT)
}

// pollForeign catches up with the packs other processes are appending to,
// and recovers those whose writer has died.
func (s *Store) pollForeign(ctx context.Context) error {
	s.mu.RLock()
	var foreign []*pack
	for _, p := range s.packs {
		if p != nil && p.state == stateForeign {
			foreign = append(foreign, p)
		}
	}
	s.mu.RUnlock()
	for _, p := range foreign {
		if err := store.CtxErr(ctx, "refresh", s.dir); err != nil {
			return err
		}
		ok, err := tryLock(p.f)
		if err != nil {
			return cairn.E("refresh", cairn.IO, p.id.String(), err)
		}
		if ok {
			s.takeOver(ctx, p)
			continue
		}
		entries, tombs, end, size, err := s.scanTail(p)
		if err != nil {
			return cairn.E("refresh", cairn.IO, p.id.String(), err)
		}
		if len(entries) == 0 && len(tombs) == 0 {
			continue
		}
		s.mu.Lock()
		oldN, oldT := p.n(), len(p.tombs)
		p.entries = append(p.entries, entries...)
		p.tombs = append(p.tombs, tombs...)
		p.end, p.packSize = end, size
		s.installFrom(p, oldN, oldT)
		s.mu.Unlock()
	}
	return nil
}

// takeOver handles a foreign pack whose writer has let go of it (we hold its
// lock): sealed meanwhile, or left unsealed by a crash.
func (s *Store) takeOver(ctx context.Context, p *pack) {
	defer unlock(p.f)
	if _, err := os.Stat(s.idxPath(p.id)); err == nil {
		s.adoptIdx(p)
		s.mu.RLock()
		sealed := p.state == stateSealed
		s.mu.RUnlock()
		if sealed {
			return
		}
	}
	np, err := s.recoverPack(ctx, p.id, p.f)
	if err != nil {
		s.log.Error("cannot recover a pack whose writer died", "pack", p.id.String(), "err", err)
		return
	}
	s.replace(p, np.entries, np.mapped, np.tombs, np.end, np.packSize, np.idxSize)
}

// Refresh implements store.Refresher: it brings the in-memory index up to
// date with packs, records and tombstones other processes wrote.
func (s *Store) Refresh(ctx context.Context) error {
	return s.refresh(ctx, s.refreshStarted.Load())
}
