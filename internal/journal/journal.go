// Package journal is cairn's one journal for work accepted locally and
// finished later (DESIGN.md decision 12): a durable, checksummed,
// append-only log of records in a directory, with one crash story. It
// knows nothing of what a record means: the mount's commit queue and the
// upload queue of put --background (one journal per put directory) keep
// their records in one. Drainer (drain.go) is the one way of applying a
// journal's records: in order, acked and fsynced as applied, retried with
// backoff, one process per directory (Lock).
//
// The format is in doc/format.md ("Journal"). In short: segment files
// <16 hex digits>.jnl, each a 24-byte header (magic, format version,
// first sequence number, CRC-32C of the header) then frames
// u32 len | u32 CRC-32C (Castagnoli) of the body | body, little-endian.
// A body is a kind byte then, for a record, its u64 sequence number and
// the caller's payload, or, for an ack, the u64 sequence numbers acked.
//
// Contract:
//
//   - Append writes one frame with one write(2) and does not fsync: a
//     record whose Append returned survives a kill of the process (it is
//     in the page cache), and a power loss once a later Sync returned.
//   - Ack appends an ack frame, also without fsync: acks may come in any
//     order. An ack lost to a power loss before the next Sync makes its
//     record come back at the next Open: consumers must take a record
//     twice (at least once, never lost).
//   - Open returns, in sequence order, every record not acked (Pending).
//     A torn tail after a crash (a frame cut short, or bytes that fail
//     their CRC with no valid frame after them) is truncated away. A bad
//     frame with valid frames after it is damage, not a crash: the
//     records before and after it are kept (each passed its CRC), the
//     segment's bytes are kept aside as <name>.corrupt for a person to
//     look at, and Damage reports it (Kind Corrupt) with the byte range
//     that could not be read: records in that range may be lost, and the
//     caller must say so.
//   - Segments are rotated at Options.SegmentSize; at a rotation the
//     records still pending in older segments are copied into the new one
//     (under their own sequence numbers) and the older segments removed,
//     unless they hold more than half a segment of pending records, in
//     which case only the fully acked segments at the front are removed.
//
// A Journal is safe for use by several goroutines.
package journal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// Version is the journal's format version (doc/format.md, "Journal").
const Version = 1

const (
	magic      = "cairnjnl"
	headerSize = 24
	frameHead  = 8
	// MaxRecord bounds a record's payload; a frame claiming more is bad.
	MaxRecord = 16 << 20

	kindRecord  = 1 // seq u64 | payload
	kindAck     = 2 // seq u64 ... (the records acked)
	kindCarried = 3 // as kindRecord: a pending record copied forward at a rotation

	ext = ".jnl"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options configure a journal.
type Options struct {
	// SegmentSize is the size at which a segment is closed and a new one
	// started (default 4 MiB).
	SegmentSize int64
}

// Record is one pending record.
type Record struct {
	Seq     uint64
	Payload []byte
}

type segment struct {
	num  uint64
	path string
	live int   // pending records in it
	size int64 // bytes
	bad  bool  // damaged: set aside as <name>.corrupt at Open
}

type entry struct {
	seg     *segment
	payload []byte
}

// Journal is an open journal directory.
type Journal struct {
	dir  string
	opts Options

	mu     sync.Mutex
	segs   []*segment // oldest first; the last is written
	f      *os.File   // the last segment, open for appending
	next   uint64     // next sequence number
	live   map[uint64]*entry
	bytes  int64 // payload bytes pending
	damage []error
	broken error // a failed write that could not be undone
}

// Open opens (creating it if needed) the journal in dir, reads it, and
// repairs what a crash left (doc comment above).
func Open(ctx context.Context, dir string, opts Options) (*Journal, error) {
	if err := ctx.Err(); err != nil {
		return nil, cairn.E("open journal", cairn.Canceled, dir, err)
	}
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = 4 << 20
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E("open journal", cairn.IO, dir, err)
	}
	j := &Journal{dir: dir, opts: opts, next: 1, live: map[uint64]*entry{}}
	names, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil {
		return nil, cairn.E("open journal", cairn.IO, dir, err)
	}
	var nums []uint64
	for _, name := range names {
		base := strings.TrimSuffix(filepath.Base(name), ext)
		n, err := strconv.ParseUint(base, 16, 64)
		if err != nil || len(base) != 16 {
			continue // not a segment of ours
		}
		nums = append(nums, n)
	}
	sort.Slice(nums, func(a, b int) bool { return nums[a] < nums[b] })
	damaged := false
	for i, n := range nums {
		s := &segment{num: n, path: j.segPath(n)}
		b, err := os.ReadFile(s.path)
		if err != nil {
			return nil, cairn.E("open journal", cairn.IO, s.path, err)
		}
		last := i == len(nums)-1
		good, bad := j.load(s, b, last)
		switch {
		case bad:
			damaged, s.bad = true, true
		case good < int64(len(b)):
			// A torn tail (a crash mid-write): cut away.
			if err := truncate(s.path, good); err != nil {
				return nil, cairn.E("open journal", cairn.IO, s.path, err)
			}
		}
		s.size = good
		j.segs = append(j.segs, s)
	}
	if damaged {
		// The damaged segments' bytes are kept aside; every pending
		// record goes into a fresh segment first (so that no ack read
		// from a segment set aside is lost with it).
		if err := j.compactAll(); err != nil {
			return nil, err
		}
	}
	if len(j.segs) == 0 || j.segs[len(j.segs)-1].size < headerSize {
		if len(j.segs) > 0 {
			// A segment whose header never reached the disk.
			s := j.segs[len(j.segs)-1]
			os.Remove(s.path)
			j.segs = j.segs[:len(j.segs)-1]
		}
		if err := j.newSegment(); err != nil {
			return nil, err
		}
	} else {
		s := j.segs[len(j.segs)-1]
		f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, cairn.E("open journal", cairn.IO, s.path, err)
		}
		j.f = f
	}
	j.dropAcked()
	return j, nil
}

func (j *Journal) segPath(n uint64) string {
	return filepath.Join(j.dir, fmt.Sprintf("%016x%s", n, ext))
}

func truncate(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Sync()
}

// header returns a segment header for first sequence number base.
func header(base uint64) []byte {
	h := make([]byte, headerSize)
	copy(h, magic)
	binary.LittleEndian.PutUint32(h[8:], Version)
	binary.LittleEndian.PutUint64(h[12:], base)
	binary.LittleEndian.PutUint32(h[20:], crc32.Checksum(h[:20], castagnoli))
	return h
}

// Frame is one frame read from a segment by Decode.
type Frame struct {
	Off  int64 // where it starts
	Kind byte
	Seq  uint64   // kindRecord, kindCarried
	Acks []uint64 // kindAck
	Data []byte   // the payload of a record
}

// Decode reads a segment's bytes: its header's first sequence number,
// the frames before the first bad one, where the good bytes end, and,
// if a bad stretch is followed by valid frames (damage, not a torn
// tail), where those resume and the frames from there (scanning on past
// further bad stretches). err is a header that cannot be read.
func Decode(b []byte) (base uint64, frames []Frame, good int64, resumed []int64, err error) {
	if len(b) < headerSize {
		if len(b) == 0 || bytes.HasPrefix([]byte(magic), b[:min(len(b), len(magic))]) {
			return 0, nil, 0, nil, nil // a header cut short: a torn creation
		}
		return 0, nil, 0, nil, errors.New("not a journal segment")
	}
	if string(b[:8]) != magic {
		return 0, nil, 0, nil, errors.New("not a journal segment (bad magic)")
	}
	if crc32.Checksum(b[:20], castagnoli) != binary.LittleEndian.Uint32(b[20:]) {
		return 0, nil, 0, nil, errors.New("segment header fails its CRC")
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != Version {
		return 0, nil, 0, nil, fmt.Errorf("segment format version %d (this cairn reads %d)", v, Version)
	}
	base = binary.LittleEndian.Uint64(b[12:])
	off := int64(headerSize)
	for {
		for {
			fr, n, ok := frameAt(b, off)
			if !ok {
				break
			}
			frames = append(frames, fr)
			off += n
		}
		if len(resumed) == 0 {
			good = off
		}
		if off == int64(len(b)) {
			return base, frames, good, resumed, nil
		}
		// A bad frame at off: look for a valid one after it.
		found := false
		for p := off + 1; p+frameHead <= int64(len(b)); p++ {
			if _, _, ok := frameAt(b, p); ok {
				resumed = append(resumed, p)
				off, found = p, true
				break
			}
		}
		if !found {
			return base, frames, good, resumed, nil
		}
	}
}

// frameAt decodes the frame at off, if valid.
func frameAt(b []byte, off int64) (Frame, int64, bool) {
	if off+frameHead > int64(len(b)) {
		return Frame{}, 0, false
	}
	n := int64(binary.LittleEndian.Uint32(b[off:]))
	sum := binary.LittleEndian.Uint32(b[off+4:])
	if n < 1 || n > MaxRecord+9 || off+frameHead+n > int64(len(b)) {
		return Frame{}, 0, false
	}
	body := b[off+frameHead : off+frameHead+n]
	if crc32.Checksum(body, castagnoli) != sum {
		return Frame{}, 0, false
	}
	fr := Frame{Off: off, Kind: body[0]}
	switch fr.Kind {
	case kindRecord, kindCarried:
		if len(body) < 9 {
			return Frame{}, 0, false
		}
		fr.Seq = binary.LittleEndian.Uint64(body[1:])
		fr.Data = body[9:]
	case kindAck:
		if (len(body)-1)%8 != 0 || len(body) == 1 {
			return Frame{}, 0, false
		}
		for p := 1; p < len(body); p += 8 {
			fr.Acks = append(fr.Acks, binary.LittleEndian.Uint64(body[p:]))
		}
	default:
		return Frame{}, 0, false
	}
	return fr, frameHead + n, true
}

// load applies segment s's bytes b. It returns how many leading bytes
// are good, and whether the segment is damaged (it is then set aside by
// Open).
func (j *Journal) load(s *segment, b []byte, last bool) (int64, bool) {
	base, frames, good, resumed, err := Decode(b)
	if err != nil {
		j.damage = append(j.damage, cairn.E("open journal", cairn.Corrupt, s.path, fmt.Errorf("%v: none of its %d bytes could be read; kept as %s.corrupt", err, len(b), filepath.Base(s.path))))
		return 0, true
	}
	j.next = max(j.next, base)
	for _, fr := range frames {
		j.apply(s, fr)
	}
	bad := len(resumed) > 0 || (!last && good < int64(len(b)) && good >= headerSize)
	if bad {
		what := fmt.Sprintf("bytes %d to %d of %d cannot be read (a bad frame with valid frames after it)", good, firstOr(resumed, int64(len(b))), len(b))
		if len(resumed) == 0 {
			what = fmt.Sprintf("bytes %d to %d cannot be read (a segment closed by a rotation was fsynced whole: not a torn write)", good, len(b))
		}
		j.damage = append(j.damage, cairn.E("open journal", cairn.Corrupt, s.path, fmt.Errorf("%s; records there are lost, those before and after are kept; the segment is kept as %s.corrupt", what, filepath.Base(s.path))))
	}
	return good, bad
}

func firstOr(v []int64, d int64) int64 {
	if len(v) > 0 {
		return v[0]
	}
	return d
}

func (j *Journal) apply(s *segment, fr Frame) {
	switch fr.Kind {
	case kindRecord, kindCarried:
		j.next = max(j.next, fr.Seq+1)
		if old, ok := j.live[fr.Seq]; ok {
			old.seg.live--
			j.bytes -= int64(len(old.payload))
		}
		j.live[fr.Seq] = &entry{seg: s, payload: bytes.Clone(fr.Data)}
		s.live++
		j.bytes += int64(len(fr.Data))
	case kindAck:
		for _, seq := range fr.Acks {
			j.next = max(j.next, seq+1)
			if e, ok := j.live[seq]; ok {
				e.seg.live--
				j.bytes -= int64(len(e.payload))
				delete(j.live, seq)
			}
		}
	}
}

// newSegment starts a segment (header fsynced, directory fsynced) and
// makes it the one written; the one written before is fsynced first.
func (j *Journal) newSegment() error {
	var num uint64
	if len(j.segs) > 0 {
		num = j.segs[len(j.segs)-1].num + 1
	}
	if j.f != nil {
		if err := j.f.Sync(); err != nil {
			return cairn.E("journal", cairn.IO, j.f.Name(), err)
		}
	}
	s := &segment{num: num, path: j.segPath(num)}
	// A leftover (a previous attempt's) is replaced.
	if err := durable.WriteFile(s.path, header(j.next), 0o600); err != nil {
		return cairn.E("journal", cairn.IO, s.path, err)
	}
	if err := durable.SyncDir(j.dir); err != nil {
		return cairn.E("journal", cairn.IO, j.dir, err)
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return cairn.E("journal", cairn.IO, s.path, err)
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f = f
	s.size = headerSize
	j.segs = append(j.segs, s)
	return nil
}

func frame(kind byte, seq uint64, data []byte) []byte {
	n := 1 + len(data)
	if kind != kindAck {
		n += 8
	}
	b := make([]byte, frameHead+n)
	b[frameHead] = kind
	p := frameHead + 1
	if kind != kindAck {
		binary.LittleEndian.PutUint64(b[p:], seq)
		p += 8
	}
	copy(b[p:], data)
	binary.LittleEndian.PutUint32(b[0:], uint32(n))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(b[frameHead:], castagnoli))
	return b
}

// write appends one frame to the current segment with one write(2); a
// short write is cut away again so that the next frame starts clean.
func (j *Journal) write(b []byte) error {
	if j.broken != nil {
		return j.broken
	}
	s := j.segs[len(j.segs)-1]
	n, err := j.f.Write(b)
	if err != nil {
		if n > 0 {
			if terr := j.f.Truncate(s.size); terr != nil {
				j.broken = cairn.E("journal", cairn.IO, s.path, fmt.Errorf("a short write could not be cut away (%v): the journal takes no more records until reopened", terr))
			}
		}
		return cairn.E("journal append", cairn.IO, s.path, err)
	}
	s.size += int64(n)
	return nil
}

// Append adds a record and returns its sequence number (one write, no
// fsync: see Sync).
func (j *Journal) Append(ctx context.Context, payload []byte) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, cairn.E("journal append", cairn.Canceled, j.dir, err)
	}
	if len(payload) > MaxRecord {
		return 0, cairn.E("journal append", cairn.Invalid, j.dir, fmt.Errorf("a record of %d bytes (at most %d)", len(payload), MaxRecord))
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.rotateIfFull(int64(frameHead + 9 + len(payload))); err != nil {
		return 0, err
	}
	seq := j.next
	if err := j.write(frame(kindRecord, seq, payload)); err != nil {
		return 0, err
	}
	j.next++
	s := j.segs[len(j.segs)-1]
	j.live[seq] = &entry{seg: s, payload: bytes.Clone(payload)}
	s.live++
	j.bytes += int64(len(payload))
	return seq, nil
}

// Ack marks records done, in any order (one write, no fsync: an ack lost
// to a power loss before the next Sync gives its record again at the
// next Open). Unknown or already acked sequence numbers are ignored.
func (j *Journal) Ack(ctx context.Context, seqs ...uint64) error {
	if err := ctx.Err(); err != nil {
		return cairn.E("journal ack", cairn.Canceled, j.dir, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var body []byte
	for _, seq := range seqs {
		if _, ok := j.live[seq]; ok {
			body = binary.LittleEndian.AppendUint64(body, seq)
		}
	}
	if len(body) == 0 {
		return nil
	}
	if err := j.rotateIfFull(int64(frameHead + 1 + len(body))); err != nil {
		return err
	}
	if err := j.write(frame(kindAck, 0, body)); err != nil {
		return err
	}
	for _, seq := range seqs {
		if e, ok := j.live[seq]; ok {
			e.seg.live--
			j.bytes -= int64(len(e.payload))
			delete(j.live, seq)
		}
	}
	j.dropAcked()
	return nil
}

// Sync makes every record and ack written so far durable (fsync of the
// segment written; older segments were fsynced when it was started).
func (j *Journal) Sync(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return cairn.E("journal sync", cairn.Canceled, j.dir, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.broken != nil {
		return j.broken
	}
	if err := j.f.Sync(); err != nil {
		return cairn.E("journal sync", cairn.IO, j.f.Name(), err)
	}
	return nil
}

// Pending returns the records not acked, in sequence order.
func (j *Journal) Pending() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	recs := make([]Record, 0, len(j.live))
	for seq, e := range j.live {
		recs = append(recs, Record{Seq: seq, Payload: bytes.Clone(e.payload)})
	}
	sort.Slice(recs, func(a, b int) bool { return recs[a].Seq < recs[b].Seq })
	return recs
}

// Len returns how many records are pending.
func (j *Journal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.live)
}

// Damage returns what Open found damaged (each of Kind Corrupt), for the
// caller to report.
func (j *Journal) Damage() []error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]error(nil), j.damage...)
}

// Close closes the journal; it does not Sync.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	if j.broken == nil {
		j.broken = cairn.E("journal", cairn.Invalid, j.dir, errors.New("closed"))
	}
	return err
}

// rotateIfFull starts a new segment if a frame of n bytes would take the
// current one past the segment size.
func (j *Journal) rotateIfFull(n int64) error {
	s := j.segs[len(j.segs)-1]
	if s.size+n <= j.opts.SegmentSize || s.size <= headerSize {
		return nil
	}
	if j.bytes <= j.opts.SegmentSize/2 {
		return j.compactAll()
	}
	if err := j.newSegment(); err != nil {
		return err
	}
	j.dropAcked()
	return nil
}

// compactAll starts a new segment holding every pending record (carried,
// under its own sequence number), fsyncs it, and removes every older
// segment, or, for a damaged one, renames it to <name>.corrupt.
func (j *Journal) compactAll() error {
	old := j.segs
	if err := j.newSegment(); err != nil {
		return err
	}
	s := j.segs[len(j.segs)-1]
	seqs := make([]uint64, 0, len(j.live))
	for seq := range j.live {
		seqs = append(seqs, seq)
	}
	sort.Slice(seqs, func(a, b int) bool { return seqs[a] < seqs[b] })
	for _, seq := range seqs {
		e := j.live[seq]
		if err := j.write(frame(kindCarried, seq, e.payload)); err != nil {
			return err
		}
		e.seg.live--
		e.seg = s
		s.live++
	}
	if err := j.f.Sync(); err != nil {
		return cairn.E("journal", cairn.IO, s.path, err)
	}
	for _, o := range old {
		var err error
		if o.bad {
			err = os.Rename(o.path, o.path+".corrupt")
		} else {
			err = os.Remove(o.path)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return cairn.E("journal", cairn.IO, o.path, err)
		}
	}
	j.segs = []*segment{s}
	if err := durable.SyncDir(j.dir); err != nil {
		return cairn.E("journal", cairn.IO, j.dir, err)
	}
	return nil
}

// dropAcked removes the fully acked segments at the front (not the one
// written). Only a prefix: an ack in a later segment may be of a record
// in an earlier one, and must outlive it.
func (j *Journal) dropAcked() {
	dropped := false
	for len(j.segs) > 1 && j.segs[0].live == 0 {
		if err := os.Remove(j.segs[0].path); err != nil && !errors.Is(err, os.ErrNotExist) {
			break // tried again at the next ack
		}
		j.segs, dropped = j.segs[1:], true
	}
	if dropped {
		// In order: a later segment's removal must not reach the disk
		// before an earlier one's (its acks would be lost).
		durable.SyncDir(j.dir)
	}
}

// Read returns the records the journal in dir holds pending, in
// sequence order, reading it without changing anything (another process
// may have it open; a torn tail is left for Open). A missing directory
// holds none.
func Read(dir string) ([]Record, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*"+ext))
	if err != nil {
		return nil, err
	}
	sort.Strings(names) // fixed-width hex: file order is segment order
	j := &Journal{live: map[uint64]*entry{}}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		} else if err != nil {
			return nil, cairn.E("read journal", cairn.IO, name, err)
		}
		s := &segment{path: name}
		_, frames, _, _, derr := Decode(b)
		if derr != nil {
			continue
		}
		for _, fr := range frames {
			j.apply(s, fr)
		}
	}
	return j.Pending(), nil
}
