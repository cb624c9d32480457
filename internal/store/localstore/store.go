// Package localstore is cairn's local-directory Store.
//
// Objects are appended to pack files (packs/<id>.pack, sealed at
// Options.PackSize) as self-describing records: a header with the object's ID
// and length, then its bytes. Each sealed pack has an index file
// (packs/<id>.idx) listing its records; the packs are the source of truth and
// an index is a cache that is rebuilt from its pack when missing or damaged.
// Deletes append tombstone records; Compact rewrites packs that are mostly
// garbage. Put group-commits: concurrent Puts share one write and one fsync.
//
// In memory the store keeps a compact hash table from ID prefix to (pack,
// entry number), about 20 bytes per object; full IDs and offsets are read
// from the index files through read-only memory maps.
//
// Several processes may open the same directory: each appends only to packs
// it created and holds an flock on them; the others find new packs and
// records on a miss. doc/format-store.md describes the formats, the crash
// recovery argument and the multi-process scheme.
package localstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/store"
)

// Store is a local-directory cairn.Store. It also implements
// cairn.StoreStats, store.Verifier and store.Compacter.
type Store struct {
	dir, packDir string
	opts         Options
	log          *slog.Logger
	sync         bool

	// layoutMu: List and Verify hold it shared, Compact exclusively, so that
	// an in-process compaction never moves objects under a List.
	layoutMu sync.RWMutex
	// compactMu: Delete holds it shared, Compact exclusively (in this
	// process); lockF carries the same lock between processes (flock).
	compactMu sync.RWMutex
	lockF     *os.File
	shMu      sync.Mutex
	shN       int

	// Discovery of other processes' packs (refresh.go), guarded by refreshMu.
	refreshMu      sync.Mutex
	refreshStarted atomic.Uint64
	refreshDone    uint64
	listed         bool
	dirMtime       time.Time
	listedAt       time.Time

	// The in-memory index, guarded by mu.
	mu      sync.RWMutex
	tab     table
	packs   []*pack // by slot; nil where free
	free    []uint32
	byID    map[packID]*pack
	dups    map[cairn.ID][]uint64         // further live copies of an ID
	killed  map[packID]map[int64]struct{} // tombstone targets: pack → record offsets
	corrupt map[cairn.ID]struct{}         // IDs whose every copy failed verification
	objects int64                         // live IDs
	bytes   int64                         // their payload bytes

	pendMu  sync.Mutex
	pending map[cairn.ID]*writeReq // Puts queued or being written

	reqs       chan *writeReq
	writerDone chan struct{}
	closed     atomic.Bool
	crashed    atomic.Bool // tests: Close without sealing, like a killed process

	// Owned by the writer goroutine.
	cur          *pack
	wbuf         []byte      // staging buffer, aligned for direct I/O (direct.go)
	direct       directState // whether packs are appended with O_DIRECT
	align        int         // direct I/O alignment, once direct is on
	directWrites int64       // direct writes that succeeded
}

var (
	_ cairn.Store       = (*Store)(nil)
	_ cairn.StoreStats  = (*Store)(nil)
	_ store.Verifier    = (*Store)(nil)
	_ store.Compacter   = (*Store)(nil)
	_ store.Quarantiner = (*Store)(nil)
	_ store.Checker     = (*Store)(nil)
)

type packState uint8

const (
	stateOwn     packState = iota // this process appends to it and holds its flock
	stateForeign                  // another live process appends to it
	stateSealed                   // indexed and immutable
)

// pack is one pack file as the store knows it.
type pack struct {
	id   packID
	slot uint32

	// Guarded by Store.mu.
	state    packState
	entries  []byte // idxEntrySize per data record, in offset order
	mapped   []byte // the mmapped index that entries aliases, if any
	tombs    []tomb
	end      int64 // end of the records known (written, scanned or indexed)
	packSize int64
	idxSize  int64
	live     int64 // record bytes of live data records

	// Own packs, writer goroutine only.
	records int      // records written
	df      *os.File // O_DIRECT write handle (direct.go), if in use
	tail    []byte   // with df: the file's bytes from its last block boundary to its end

	fmu sync.Mutex
	f   *os.File // opened lazily for reading; for own packs the write handle
}

func (p *pack) n() int { return len(p.entries) / idxEntrySize }

// file returns an open handle on the pack, opening it on first use.
func (s *Store) file(p *pack) (*os.File, error) {
	p.fmu.Lock()
	defer p.fmu.Unlock()
	if p.f == nil {
		f, err := os.Open(s.packPath(p.id))
		if err != nil {
			return nil, err
		}
		p.f = f
	}
	return p.f, nil
}

func (s *Store) packPath(id packID) string {
	return filepath.Join(s.packDir, id.String()+".pack")
}

func (s *Store) idxPath(id packID) string {
	return filepath.Join(s.packDir, id.String()+".idx")
}

func loc(slot uint32, ord int) uint64 { return uint64(slot)<<32 | uint64(uint32(ord)) }

const markerName = "cairn-store"
const markerText = "cairn localstore v1\n"

// Open opens the store in dir, creating it if needed. It loads the indexes,
// recovers packs left unsealed by a crashed process (rebuilding their indexes
// from the records, ignoring a torn tail) and starts the group-commit writer.
func Open(ctx context.Context, dir string, opts Options) (*Store, error) {
	const op = "localstore open"
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, dir, err)
	}
	s := &Store{
		dir:        dir,
		packDir:    filepath.Join(dir, "packs"),
		opts:       opts,
		log:        opts.Logger.With("store", dir),
		sync:       !opts.NoSync,
		byID:       map[packID]*pack{},
		dups:       map[cairn.ID][]uint64{},
		killed:     map[packID]map[int64]struct{}{},
		corrupt:    map[cairn.ID]struct{}{},
		pending:    map[cairn.ID]*writeReq{},
		reqs:       make(chan *writeReq, 4096),
		writerDone: make(chan struct{}),
	}
	if err := s.initDir(); err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	if err := s.refresh(ctx, 0); err != nil {
		s.release()
		return nil, err
	}
	s.loadQuarantine()
	go s.writeLoop()
	return s, nil
}

// The quarantine list (doc/format.md): the IDs of objects whose every copy
// was found damaged and killed, so that a later process answers Get of one
// with Kind Corrupt ("every stored copy was damaged") rather than NotFound.
// It is a hint for messages only: an ID counts only while the store holds
// no copy of it (a Put of a good copy heals it, whatever the list says).
const (
	quarantineName   = "quarantine"
	quarantineHeader = "cairn quarantine v1\n"
)

// recordQuarantine appends id to the quarantine list, creating it (with
// its header) if needed. Lines are appended whole with O_APPEND, so
// processes may append at once.
func (s *Store) recordQuarantine(id cairn.ID) error {
	path := filepath.Join(s.dir, quarantineName)
	if f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		_, werr := f.WriteString(quarantineHeader)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return werr
		}
	} else if !errors.Is(err, os.ErrExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(id.String() + "\n")
	if err == nil && s.sync {
		err = fdatasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// loadQuarantine marks as corrupt the IDs of the quarantine list the store
// holds no copy of. A missing list is an empty one; an unreadable or
// unknown one is ignored (it only improves messages); a torn last line is
// skipped.
func (s *Store) loadQuarantine() {
	b, err := os.ReadFile(filepath.Join(s.dir, quarantineName))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil || len(b) < len(quarantineHeader) || string(b[:len(quarantineHeader)]) != quarantineHeader {
		s.log.Warn("quarantine list ignored", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range strings.Split(string(b[len(quarantineHeader):]), "\n") {
		id, perr := cairn.ParseID(line)
		if perr != nil {
			continue
		}
		if _, ok := s.lookup(&id); !ok {
			s.corrupt[id] = struct{}{}
		}
	}
}

// createMarker creates the store's marker file if it is absent. Two
// processes may create a new store at once: each writes its own temporary
// file and links it into place, which succeeds for one of them; the other
// finds the marker there and checks it like any opener.
func createMarker(marker string, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(marker), "."+markerName+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(markerText)
	if err == nil && sync {
		err = fdatasync(tmp)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), marker); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if b, err := os.ReadFile(marker); err != nil {
		return err
	} else if string(b) != markerText {
		return fmt.Errorf("%s says %q, want %q", marker, b, markerText)
	}
	if sync {
		return durable.SyncDir(filepath.Dir(marker))
	}
	return nil
}

func (s *Store) initDir() error {
	if err := os.MkdirAll(s.packDir, 0o700); err != nil {
		return cairn.E("", cairn.IO, "", err)
	}
	marker := filepath.Join(s.dir, markerName)
	b, err := os.ReadFile(marker)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err = createMarker(marker, s.sync); err != nil {
			return cairn.E("", cairn.IO, "", err)
		}
	case err != nil:
		return cairn.E("", cairn.IO, "", err)
	case string(b) != markerText:
		return cairn.E("", cairn.Invalid, "", fmt.Errorf("%s says %q, want %q", marker, b, markerText))
	}
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return cairn.E("", cairn.IO, "", err)
	}
	s.lockF = f
	return nil
}

// Close seals the pack this process was appending to, writing its index, and
// releases files, locks and maps.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	r := &writeReq{kind: kindClose, done: make(chan struct{})}
	s.reqs <- r
	<-r.done
	<-s.writerDone
	s.release()
	return r.err
}

func (s *Store) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.packs {
		if p != nil {
			s.closePack(p)
		}
	}
	s.packs, s.byID = nil, nil
	s.tab.free()
	if s.lockF != nil {
		s.lockF.Close()
	}
}

// closePack closes p's file and unmaps its index. mu held (write).
func (s *Store) closePack(p *pack) {
	p.fmu.Lock()
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	p.fmu.Unlock()
	if p.df != nil {
		p.df.Close()
		p.df, p.tail = nil, nil
	}
	unmap(p.mapped)
	p.mapped, p.entries = nil, nil
}

// ---- The in-memory index. All of these need mu (read or write as noted).

func (s *Store) entry(val uint64) []byte {
	p := s.packs[val>>32]
	o := int(uint32(val)) * idxEntrySize
	return p.entries[o : o+idxEntrySize]
}

// lookup returns the canonical location of id. mu held (read).
func (s *Store) lookup(id *cairn.ID) (uint64, bool) {
	t := &s.tab
	if len(t.slots) == 0 {
		return 0, false
	}
	k := keyOf(id)
	for i := t.home(k); ; i = t.next(i) {
		sl := t.slots[i]
		if sl.key == 0 {
			return 0, false
		}
		if sl.key == k && *entryID(s.entry(sl.val)) == *id {
			return sl.val, true
		}
	}
}

// locations returns every live location of id, canonical first. mu held (read).
func (s *Store) locations(id *cairn.ID) []uint64 {
	val, ok := s.lookup(id)
	if !ok {
		return nil
	}
	return append([]uint64{val}, s.dups[*id]...)
}

// addLoc records a live copy of id at val. mu held (write).
func (s *Store) addLoc(id *cairn.ID, val uint64) {
	e := s.entry(val)
	size := int64(entryLen(e))
	s.packs[val>>32].live += recHeaderSize + size
	t := &s.tab
	t.reserve(1, growLoad)
	k := keyOf(id)
	i := t.home(k)
	for ; t.slots[i].key != 0; i = t.next(i) {
		sl := t.slots[i]
		if sl.key == k && *entryID(s.entry(sl.val)) == *id {
			s.dups[*id] = append(s.dups[*id], val)
			return
		}
	}
	t.slots[i] = slot{k, val}
	t.n++
	s.objects++
	s.bytes += size
	if len(s.corrupt) > 0 {
		delete(s.corrupt, *id)
	}
}

// installMany installs the entries of newly found packs (at Open: all of
// them) after applying their tombstones. It inserts in batches ordered by
// home slot, so that the inserts sweep the table instead of missing the
// cache on every one: at 10 M objects this is most of Open's time. mu held
// (write).
func (s *Store) installMany(packs []*pack) {
	total := 0
	for _, p := range packs {
		total += p.n()
	}
	s.tab.reserve(total, bulkLoad)
	const chunk = 1 << 20
	batch := make([]slot, 0, min(chunk, total))
	sorted := make([]slot, min(chunk, total))
	for _, p := range packs {
		km := s.killed[p.id]
		for ord := range p.n() {
			e := p.entries[ord*idxEntrySize : (ord+1)*idxEntrySize]
			if km != nil {
				if _, dead := km[entryOff(e)]; dead {
					continue
				}
			}
			size := int64(entryLen(e))
			p.live += recHeaderSize + size
			s.bytes += size // taken back below for a duplicate
			batch = append(batch, slot{keyOf(entryID(e)), loc(p.slot, ord)})
			if len(batch) == chunk {
				s.insertBatch(batch, sorted)
				batch = batch[:0]
			}
		}
		dropPages(p.mapped) // read once, sequentially; lookups fault back what they need
	}
	s.insertBatch(batch, sorted)
}

// insertBatch sorts items by the top 12 bits of their key (home slots grow
// with the key) into tmp and inserts them in that order. mu held (write).
func (s *Store) insertBatch(items, tmp []slot) {
	var start [4097]int
	for _, it := range items {
		start[it.key>>52+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	tmp = tmp[:len(items)]
	for _, it := range items {
		b := it.key >> 52
		tmp[start[b]] = it
		start[b]++
	}
	t := &s.tab
	for _, it := range tmp {
		i := t.home(it.key)
		dup := false
		for ; t.slots[i].key != 0; i = t.next(i) {
			sl := t.slots[i]
			if sl.key == it.key && *entryID(s.entry(sl.val)) == *entryID(s.entry(it.val)) {
				dup = true
				break
			}
		}
		if dup {
			id := entryID(s.entry(it.val))
			s.dups[*id] = append(s.dups[*id], it.val)
			s.bytes -= int64(entryLen(s.entry(it.val)))
			continue
		}
		t.slots[i] = it
		t.n++
		s.objects++
		if len(s.corrupt) > 0 {
			delete(s.corrupt, *entryID(s.entry(it.val)))
		}
	}
}

// removeLoc forgets the copy of id at val, promoting another copy if there is
// one. It reports false if val was not a live copy of id. mu held (write).
func (s *Store) removeLoc(id *cairn.ID, val uint64) bool {
	i := s.tab.find(keyOf(id), val)
	d := s.dups[*id]
	if i < 0 {
		j := indexOf(d, val)
		if j < 0 {
			return false
		}
		d[j] = d[len(d)-1]
		s.setDups(id, d[:len(d)-1])
	} else if len(d) > 0 {
		s.tab.slots[i].val = d[len(d)-1]
		s.setDups(id, d[:len(d)-1])
	} else {
		s.tab.remove(i)
		s.objects--
		s.bytes -= int64(entryLen(s.entry(val)))
	}
	s.packs[val>>32].live -= recHeaderSize + int64(entryLen(s.entry(val)))
	return true
}

func (s *Store) setDups(id *cairn.ID, d []uint64) {
	if len(d) == 0 {
		delete(s.dups, *id)
	} else {
		s.dups[*id] = d
	}
}

func indexOf(d []uint64, v uint64) int {
	for i, x := range d {
		if x == v {
			return i
		}
	}
	return -1
}

// isCanonical reports whether val is the location lookup(id) returns. mu held.
func (s *Store) isCanonical(id *cairn.ID, val uint64) bool {
	return s.tab.find(keyOf(id), val) >= 0
}

// isLive reports whether val is a live copy of id. mu held.
func (s *Store) isLive(id *cairn.ID, val uint64) bool {
	return s.isCanonical(id, val) || indexOf(s.dups[*id], val) >= 0
}

// ordAt returns the entry number of the record at off in p, or -1. mu held.
func ordAt(p *pack, off int64) int {
	n := p.n()
	i := sort.Search(n, func(i int) bool { return entryOff(p.entries[i*idxEntrySize:]) >= off })
	if i < n && entryOff(p.entries[i*idxEntrySize:]) == off {
		return i
	}
	return -1
}

// kill applies a tombstone for the record at (target, off). mu held (write).
func (s *Store) kill(target packID, off int64) {
	km := s.killed[target]
	if km == nil {
		km = map[int64]struct{}{}
		s.killed[target] = km
	}
	if _, done := km[off]; done {
		return
	}
	km[off] = struct{}{}
	p := s.byID[target]
	if p == nil {
		return
	}
	if ord := ordAt(p, off); ord >= 0 {
		s.removeLoc(entryID(p.entries[ord*idxEntrySize:]), loc(p.slot, ord))
	}
}

// register gives p a slot. mu held (write).
func (s *Store) register(p *pack) {
	if n := len(s.free); n > 0 {
		p.slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.packs[p.slot] = p
	} else {
		p.slot = uint32(len(s.packs))
		s.packs = append(s.packs, p)
	}
	s.byID[p.id] = p
}

// installFrom makes p's entries from ord on live, except killed ones, and
// applies p's tombstones from tomb number t on. mu held (write).
func (s *Store) installFrom(p *pack, ord, t int) {
	for _, tb := range p.tombs[t:] {
		s.kill(tb.target, tb.tOff)
	}
	km := s.killed[p.id]
	n := p.n()
	s.tab.reserve(n-ord, growLoad)
	for ; ord < n; ord++ {
		e := p.entries[ord*idxEntrySize : (ord+1)*idxEntrySize]
		if km != nil {
			if _, dead := km[entryOff(e)]; dead {
				continue
			}
		}
		s.addLoc(entryID(e), loc(p.slot, ord))
	}
}

// uninstall forgets every copy in p and frees its slot; it keeps p's file
// open. mu held (write).
func (s *Store) uninstall(p *pack) {
	for ord := range p.n() {
		s.removeLoc(entryID(p.entries[ord*idxEntrySize:]), loc(p.slot, ord))
	}
	s.packs[p.slot] = nil
	s.free = append(s.free, p.slot)
	delete(s.byID, p.id)
}

// ---- Reading.

var (
	errMissing = errors.New("missing")
	errGone    = errors.New("pack removed")
	errClosed  = errors.New("store is closed")
)

// readAt reads the record of the copy at val. It returns errGone if val's
// pack file has gone (another process compacted it). mu held (read).
func (s *Store) readAt(id cairn.ID, val uint64) ([]byte, error) {
	p := s.packs[val>>32]
	e := s.entry(val)
	off, n := entryOff(e), entryLen(e)
	f, err := s.file(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errGone
	}
	if err != nil {
		return nil, cairn.E("get", cairn.IO, id.String(), err)
	}
	buf := make([]byte, recHeaderSize+int(n))
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, cairn.E("get", cairn.Corrupt, id.String(), fmt.Errorf("pack %s offset %d: %w", p.id, off, err))
	}
	return buf, nil
}

// checkRecord verifies a record read for id: header, length and hash.
func checkRecord(id cairn.ID, buf []byte) error {
	rec, err := decodeRecHeader(buf, 0)
	switch {
	case err != nil:
		return err
	case rec.kind != kindData || rec.id != id || int(rec.length) != len(buf)-recHeaderSize:
		return errors.New("record header does not match the index")
	case cairn.ID(blake3.Sum256(buf[recHeaderSize:])) != id:
		return errors.New("data does not hash to its ID")
	}
	return nil
}

// get returns the object, trying every known copy; a copy that fails
// verification is dropped from the in-memory index (and the ID remembered as
// corrupt, so that a later Put writes a good copy) and, when its bytes were
// read and do not match, killed on disk too (see quarantine). It returns
// errMissing when no copy is known, errGone when the pack of the copy it
// found is gone.
func (s *Store) get(ctx context.Context, id cairn.ID) ([]byte, error) {
	for {
		s.mu.RLock()
		val, ok := s.lookup(&id)
		if !ok {
			s.mu.RUnlock()
			return nil, errMissing
		}
		p := s.packs[val>>32]
		off := entryOff(s.entry(val))
		buf, err := s.readAt(id, val)
		s.mu.RUnlock()
		mismatch := false
		if err == nil {
			if err = checkRecord(id, buf); err == nil {
				return buf[recHeaderSize:], nil
			}
			mismatch = true
			err = cairn.E("get", cairn.Corrupt, id.String(), fmt.Errorf("pack %s: %w", p.id, err))
		}
		if cairn.KindOf(err) != cairn.Corrupt {
			return nil, err
		}
		s.demote(id, val, err)
		if mismatch {
			s.quarantine(ctx, id, p.id, off)
		}
	}
}

// demote drops a damaged copy from the in-memory index.
func (s *Store) demote(id cairn.ID, val uint64, why error) {
	s.log.Warn("damaged record", "id", id.String(), "err", why)
	s.mu.Lock()
	if s.removeLoc(&id, val) {
		if _, ok := s.lookup(&id); !ok {
			s.corrupt[id] = struct{}{}
		}
	}
	s.mu.Unlock()
}

// quarantine makes a copy whose bytes were read whole and found not to
// match its ID dead on disk: it appends a tombstone for that copy, exactly
// as Delete would. Without it the damage was forgotten with the process:
// the next process (the next `cairn put`) found the copy in the index, Has
// answered "present" and the original data was never written again (issue
// 14). The index is a hint; a copy proven bad is never counted again, by
// this process or any other, and Compact reclaims it. A copy that could
// not be read (an I/O error, perhaps passing) is only demoted in memory.
// Failures are logged: the copy stays demoted here either way.
func (s *Store) quarantine(ctx context.Context, id cairn.ID, target packID, off int64) {
	if s.closed.Load() {
		return
	}
	unlockShared, err := s.lockShared(ctx)
	if err != nil {
		s.log.Warn("damaged record not quarantined", "id", id.String(), "err", err)
		return
	}
	defer unlockShared()
	if err = s.recordQuarantine(id); err != nil {
		s.log.Warn("damaged record not written to the quarantine list", "id", id.String(), "err", err)
	}
	r := &writeReq{kind: kindTomb, id: id, done: make(chan struct{}), target: target, tOff: off}
	// A read may race with Close: never wait for a writer that is gone.
	select {
	case s.reqs <- r:
	case <-s.writerDone:
		return
	}
	select {
	case <-r.done:
		err = r.err
	case <-s.writerDone:
		select {
		case <-r.done:
			err = r.err
		default:
			return
		}
	case <-ctx.Done():
		err = s.wait(ctx, r)
	}
	if err != nil {
		s.log.Warn("damaged record not quarantined", "id", id.String(), "err", err)
		return
	}
	s.log.Warn("damaged record quarantined", "id", id.String(), "pack", target.String(), "offset", off)
}

// Get returns the object's bytes, checked against id.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := store.CtxErr(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	missed := false
	for range 4 {
		since := s.refreshStarted.Load()
		data, err := s.get(ctx, id)
		switch err {
		case errGone:
			// Moved by another process's compaction: look again, with a
			// refresh that starts after we saw the pack gone.
			since = s.refreshStarted.Load()
		case errMissing:
			s.mu.RLock()
			_, bad := s.corrupt[id]
			s.mu.RUnlock()
			if bad {
				return nil, cairn.E("get", cairn.Corrupt, id.String(), errors.New("every stored copy is damaged"))
			}
			if missed {
				return nil, cairn.E("get", cairn.NotFound, id.String(), nil)
			}
			missed = true
		default:
			return data, err
		}
		if err := s.refresh(ctx, since); err != nil {
			return nil, err
		}
	}
	return nil, cairn.E("get", cairn.NotFound, id.String(), nil)
}

// Has reports, in order, which of ids are present, from the in-memory index
// and the index files; it reads no pack data except to discover records
// another process appended since the last look (refresh.go).
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := store.CtxErr(ctx, "has", ""); err != nil {
		return nil, err
	}
	since := s.refreshStarted.Load()
	found := make([]bool, len(ids))
	missing := s.has(ids, found)
	if missing > 0 {
		if err := s.refresh(ctx, since); err != nil {
			return nil, err
		}
		s.has(ids, found)
	}
	return found, nil
}

func (s *Store) has(ids []cairn.ID, found []bool) (missing int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := range ids {
		if !found[i] {
			_, found[i] = s.lookup(&ids[i])
			if !found[i] {
				missing++
			}
		}
	}
	return missing
}

// Check reads and verifies every one of ids the store holds
// (store.Checker): found[i] is true when a good copy of ids[i] is stored.
// Damaged copies are quarantined, as by Get.
func (s *Store) Check(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	good := make([]bool, len(ids))
	for i, id := range ids {
		_, err := s.Get(ctx, id)
		switch {
		case err == nil:
			good[i] = true
		case errors.Is(err, cairn.ErrCorrupt), errors.Is(err, cairn.ErrNotFound):
		default:
			return nil, err
		}
	}
	return good, nil
}

// Quarantined reports which of ids this store knows to have no good copy
// of: every copy it had was found damaged (by this process or, through
// the quarantine list, an earlier one) and none was stored since
// (store.Quarantiner).
func (s *Store) Quarantined(ids []cairn.ID) []bool {
	out := make([]bool, len(ids))
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.corrupt) == 0 {
		return out
	}
	for i := range ids {
		if _, bad := s.corrupt[ids[i]]; bad {
			_, present := s.lookup(&ids[i])
			out[i] = !present
		}
	}
	return out
}

// Put stores data under id, after checking that id is its BLAKE3-256 hash
// (Kind Corrupt otherwise). It returns when the record is fsync'd.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if err := store.CtxErr(ctx, "put", id.String()); err != nil {
		return err
	}
	if s.closed.Load() {
		return cairn.E("put", cairn.Invalid, id.String(), errClosed)
	}
	if len(data) > MaxObjectSize {
		return cairn.E("put", cairn.Invalid, id.String(), fmt.Errorf("object of %d bytes exceeds %d", len(data), MaxObjectSize))
	}
	if !s.opts.TrustIDs && cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E("put", cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	for {
		s.mu.RLock()
		_, ok := s.lookup(&id)
		s.mu.RUnlock()
		if ok {
			return nil
		}
		s.pendMu.Lock()
		if r := s.pending[id]; r != nil {
			// Another Put of the same object is in flight: wait for it.
			s.pendMu.Unlock()
			select {
			case <-r.done:
				if r.err == nil || r.err == errWithdrawn {
					// Look it up again: its record may have been born
					// dead (deleted by another process before it was
					// published here), and then this Put writes anew.
					continue
				}
				return r.err
			case <-ctx.Done():
				return store.CtxErr(ctx, "put", id.String())
			}
		}
		// Look again: the writer publishes before it clears pending.
		s.mu.RLock()
		_, ok = s.lookup(&id)
		s.mu.RUnlock()
		if ok {
			s.pendMu.Unlock()
			return nil
		}
		r := &writeReq{kind: kindData, id: id, data: data, done: make(chan struct{})}
		s.pending[id] = r
		s.pendMu.Unlock()
		s.reqs <- r
		return s.wait(ctx, r)
	}
}

// Delete appends a tombstone for every known copy of id and returns when they
// are fsync'd. It first looks for copies other processes wrote.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	if err := store.CtxErr(ctx, "delete", id.String()); err != nil {
		return err
	}
	if s.closed.Load() {
		return cairn.E("delete", cairn.Invalid, id.String(), errClosed)
	}
	unlockShared, err := s.lockShared(ctx)
	if err != nil {
		return cairn.E("delete", cairn.KindOf(err), id.String(), err)
	}
	defer unlockShared()
	if err = s.refresh(ctx, s.refreshStarted.Load()); err != nil {
		return err
	}
	s.mu.RLock()
	var reqs []*writeReq
	for _, val := range s.locations(&id) {
		reqs = append(reqs, &writeReq{
			kind: kindTomb, id: id, done: make(chan struct{}),
			target: s.packs[val>>32].id, tOff: entryOff(s.entry(val)),
		})
	}
	s.mu.RUnlock()
	for _, r := range reqs {
		s.reqs <- r
	}
	for _, r := range reqs {
		if werr := s.wait(ctx, r); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// lockShared takes the compaction lock shared: in this process (compactMu)
// and between processes (flock on dir/lock, counted so that the first
// holder takes it and the last releases it).
func (s *Store) lockShared(ctx context.Context) (func(), error) {
	s.compactMu.RLock()
	s.shMu.Lock()
	if s.shN == 0 {
		if err := lockWait(ctx, s.lockF, lockSH); err != nil {
			s.shMu.Unlock()
			s.compactMu.RUnlock()
			if ctx.Err() != nil {
				return nil, store.CtxErr(ctx, "lock", s.dir)
			}
			return nil, cairn.E("lock", cairn.IO, s.dir, err)
		}
	}
	s.shN++
	s.shMu.Unlock()
	return func() {
		s.shMu.Lock()
		s.shN--
		if s.shN == 0 {
			_ = unlock(s.lockF)
		}
		s.shMu.Unlock()
		s.compactMu.RUnlock()
	}, nil
}

// liveEntry is a copy of an index entry, taken under mu and used after.
type liveEntry struct {
	id   cairn.ID
	val  uint64
	off  int64
	size uint32
}

// walk calls fn for the live copies in every pack, in batches copied under mu,
// without holding mu during fn. With all, dups are included; otherwise only
// each ID's canonical copy.
func (s *Store) walk(ctx context.Context, op string, all bool, fn func(e liveEntry) error) error {
	s.mu.RLock()
	packs := make([]*pack, 0, len(s.packs))
	for _, p := range s.packs {
		if p != nil {
			packs = append(packs, p)
		}
	}
	s.mu.RUnlock()
	batch := make([]liveEntry, 0, 1024)
	for _, p := range packs {
		for ord := 0; ; {
			batch = batch[:0]
			s.mu.RLock()
			if s.packs[p.slot] != p {
				s.mu.RUnlock()
				break
			}
			n := p.n()
			for ; ord < n && len(batch) < cap(batch); ord++ {
				e := p.entries[ord*idxEntrySize : (ord+1)*idxEntrySize]
				id, val := entryID(e), loc(p.slot, ord)
				if s.isCanonical(id, val) || all && indexOf(s.dups[*id], val) >= 0 {
					batch = append(batch, liveEntry{*id, val, entryOff(e), entryLen(e)})
				}
			}
			s.mu.RUnlock()
			for _, e := range batch {
				if err := store.CtxErr(ctx, op, ""); err != nil {
					return err
				}
				if err := fn(e); err != nil {
					return err
				}
			}
			if ord >= n {
				break
			}
		}
	}
	return store.CtxErr(ctx, op, "")
}

// List calls fn once per live object. A compaction by another process that
// this process notices while List runs (on a miss inside fn) may make List
// report a moved object twice or not at all; one in this process waits for
// List to finish.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	if err := store.CtxErr(ctx, "list", ""); err != nil {
		return err
	}
	s.layoutMu.RLock()
	defer s.layoutMu.RUnlock()
	if err := s.refresh(ctx, s.refreshStarted.Load()); err != nil {
		return err
	}
	return s.walk(ctx, "list", false, func(e liveEntry) error { return fn(e.id, int64(e.size)) })
}

// Verify reads every live copy of every object and checks it against its ID;
// fn receives each damaged one (Kind Corrupt). Damaged copies are dropped from
// the in-memory index and quarantined on disk (a tombstone, see quarantine),
// so Has reports an object with no good copy as missing, in this process and
// every later one, and a later Put of it writes a good one.
func (s *Store) Verify(ctx context.Context, fn func(id cairn.ID, err error)) error {
	if err := store.CtxErr(ctx, "verify", ""); err != nil {
		return err
	}
	s.layoutMu.RLock()
	defer s.layoutMu.RUnlock()
	if err := s.refresh(ctx, s.refreshStarted.Load()); err != nil {
		return err
	}
	return s.walk(ctx, "verify", true, func(e liveEntry) error {
		s.mu.RLock()
		if !s.isLive(&e.id, e.val) {
			s.mu.RUnlock()
			return nil
		}
		p := s.packs[e.val>>32]
		buf, err := s.readAt(e.id, e.val)
		s.mu.RUnlock()
		if err == errGone {
			return nil // moved by another process, whose compaction checked every record it copied
		}
		mismatch := false
		if err == nil {
			if err = checkRecord(e.id, buf); err != nil {
				mismatch = true
				err = cairn.E("verify", cairn.Corrupt, e.id.String(), fmt.Errorf("pack %s offset %d: %w", p.id, e.off, err))
			}
		}
		if err != nil {
			if cairn.KindOf(err) == cairn.Corrupt {
				s.demote(e.id, e.val, err)
			}
			if mismatch {
				s.quarantine(ctx, e.id, p.id, e.off)
			}
			fn(e.id, err)
		}
		return nil
	})
}

// Stats reports live objects and bytes, and the bytes of all pack and index
// files (including garbage not yet compacted).
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if err := store.CtxErr(ctx, "stats", ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	u := cairn.StoreUsage{Objects: s.objects, Bytes: s.bytes}
	for _, p := range s.packs {
		if p != nil {
			u.Disk += p.packSize + p.idxSize
		}
	}
	return u, nil
}
