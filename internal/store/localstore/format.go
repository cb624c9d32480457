package localstore

// On-disk formats, version 1. doc/format-store.md describes them byte by byte;
// keep the two in step.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

const (
	packMagic      = "cairnpak"
	packVersion    = 1
	packHeaderSize = 32

	recHeaderSize = 48
	kindData      = 1
	kindTomb      = 2
	tombSize      = 28 // payload of a tombstone: target pack, target offset, crc

	idxMagic      = "cairnidx"
	idxVersion    = 1
	idxHeaderSize = 64
	idxEntrySize  = 48
	idxTombSize   = 64
	idxTrailer    = 4

	// MaxObjectSize is the largest object a Store accepts.
	MaxObjectSize = 1 << 30
)

// PackVersion and IndexVersion are the versions of the pack and index
// files this package writes (doc/format.md, "Local store").
const (
	PackVersion  = packVersion
	IndexVersion = idxVersion
)

var recMagic = [4]byte{'c', 'r', 'e', 'c'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

var le = binary.LittleEndian

// packID names a pack: 8 bytes of creation time (Unix ns, big-endian, so names
// sort by age) and 8 random bytes. IDs are never reused, which lets a
// tombstone name the pack holding the record it kills.
type packID [16]byte

func newPackID() packID {
	var p packID
	binary.BigEndian.PutUint64(p[:8], uint64(time.Now().UnixNano()))
	if _, err := rand.Read(p[8:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return p
}

func (p packID) String() string { return hex.EncodeToString(p[:]) }

func parsePackID(s string) (packID, bool) {
	var p packID
	if len(s) != 32 {
		return p, false
	}
	if _, err := hex.Decode(p[:], []byte(s)); err != nil {
		return p, false
	}
	return p, true
}

func encodePackHeader(id packID) []byte {
	b := make([]byte, packHeaderSize)
	copy(b, packMagic)
	copy(b[8:24], id[:])
	le.PutUint32(b[24:], packVersion)
	le.PutUint32(b[28:], crc(b[:28]))
	return b
}

func checkPackHeader(b []byte, want packID) error {
	if len(b) < packHeaderSize {
		return errors.New("short pack header")
	}
	if string(b[:8]) != packMagic {
		return errors.New("not a cairn pack")
	}
	if le.Uint32(b[28:]) != crc(b[:28]) {
		return errors.New("pack header checksum mismatch")
	}
	if v := le.Uint32(b[24:]); v != packVersion {
		return fmt.Errorf("pack format version %d, want %d", v, packVersion)
	}
	if packID(b[8:24]) != want {
		return errors.New("pack header names another pack")
	}
	return nil
}

// record is one decoded record header (and, for a tombstone, its payload).
type record struct {
	kind   byte
	id     cairn.ID
	off    int64 // of the record header in the pack
	length uint32
	target packID // tombstones only
	tOff   int64  // tombstones only
}

func (r *record) size() int64 { return recHeaderSize + int64(r.length) }

func appendRecHeader(b []byte, kind byte, id cairn.ID, length int) []byte {
	var h [recHeaderSize]byte
	copy(h[:4], recMagic[:])
	h[4] = kind
	le.PutUint32(h[8:], uint32(length))
	copy(h[12:44], id[:])
	le.PutUint32(h[44:], crc(h[:44]))
	return append(b, h[:]...)
}

func appendTombPayload(b []byte, target packID, off int64) []byte {
	var p [tombSize]byte
	copy(p[:16], target[:])
	le.PutUint64(p[16:], uint64(off))
	le.PutUint32(p[24:], crc(p[:24]))
	return append(b, p[:]...)
}

var errBadHeader = errors.New("bad record header")

// decodeRecHeader decodes the record header at b[:recHeaderSize].
func decodeRecHeader(b []byte, off int64) (record, error) {
	var r record
	if len(b) < recHeaderSize || [4]byte(b[:4]) != recMagic || le.Uint32(b[44:]) != crc(b[:44]) {
		return r, errBadHeader
	}
	r.kind = b[4]
	if r.kind != kindData && r.kind != kindTomb || b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return r, errBadHeader
	}
	r.length = le.Uint32(b[8:])
	if r.kind == kindTomb && r.length != tombSize || r.length > MaxObjectSize {
		return r, errBadHeader
	}
	r.id = cairn.ID(b[12:44])
	r.off = off
	return r, nil
}

func decodeTombPayload(r *record, p []byte) bool {
	if len(p) != tombSize || le.Uint32(p[24:]) != crc(p[:24]) {
		return false
	}
	r.target = packID(p[:16])
	r.tOff = int64(le.Uint64(p[16:]))
	return true
}

// scanStats counts what a scan skipped.
type scanStats struct {
	bad int // records with a good header but a payload that fails verification
}

// scanPack reads the records of a pack from start up to limit and calls fn for
// each good one, in order. It stops at the first record whose header is
// damaged or that does not end before limit (a torn tail, or a record still
// being written by another process), and returns that offset: the end of the
// readable prefix. With verify, it reads every payload and skips records
// whose data does not hash to their ID (or whose tombstone checksum fails);
// without, it reads data payloads only as far as needed to find the next
// header and trusts them (Get verifies later).
func scanPack(r io.ReaderAt, start, limit int64, verify bool, fn func(rec record)) (end int64, st scanStats, err error) {
	sc := scanner{r: r, limit: limit}
	off := start
	for off+recHeaderSize <= limit {
		h, err := sc.bytes(off, recHeaderSize)
		if err != nil {
			return off, st, err
		}
		rec, herr := decodeRecHeader(h, off)
		if herr != nil || off+rec.size() > limit {
			break
		}
		ok := true
		switch {
		case rec.kind == kindTomb:
			p, err := sc.bytes(off+recHeaderSize, tombSize)
			if err != nil {
				return off, st, err
			}
			ok = decodeTombPayload(&rec, p)
		case verify:
			p, err := sc.bytes(off+recHeaderSize, int(rec.length))
			if err != nil {
				return off, st, err
			}
			ok = cairn.ID(blake3.Sum256(p)) == rec.id
		}
		if ok {
			fn(rec)
		} else {
			st.bad++
		}
		off += rec.size()
	}
	return off, st, nil
}

// scanner reads a file sequentially through a window, so that a scan of
// small records costs few system calls and large payloads that need not be
// read are skipped.
type scanner struct {
	r     io.ReaderAt
	limit int64
	buf   []byte
	base  int64 // file offset of buf[0]
	n     int   // valid bytes in buf
}

const scanWindow = 1 << 20

func (s *scanner) bytes(off int64, n int) ([]byte, error) {
	if off >= s.base && off+int64(n) <= s.base+int64(s.n) {
		i := int(off - s.base)
		return s.buf[i : i+n], nil
	}
	size := max(n, scanWindow)
	if rest := s.limit - off; int64(size) > rest {
		size = int(rest)
	}
	if cap(s.buf) < size {
		s.buf = make([]byte, size)
	}
	s.buf = s.buf[:size]
	m, err := s.r.ReadAt(s.buf, off)
	if m < n {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	s.base, s.n = off, m
	return s.buf[:n], nil
}

// entry layout in an index (and in memory): ID, record offset, payload length.
func putEntry(b []byte, id cairn.ID, off int64, length uint32) {
	copy(b[:32], id[:])
	le.PutUint64(b[32:], uint64(off))
	le.PutUint32(b[40:], length)
	le.PutUint32(b[44:], 0)
}

func entryOff(e []byte) int64    { return int64(le.Uint64(e[32:])) }
func entryLen(e []byte) uint32   { return le.Uint32(e[40:]) }
func entryID(e []byte) *cairn.ID { return (*cairn.ID)(e[:32]) }

// tomb is a tombstone as kept in memory and in an index.
type tomb struct {
	id     cairn.ID
	off    int64 // of the tombstone record
	target packID
	tOff   int64
}

// idxData is a decoded index file.
type idxData struct {
	pack    packID
	end     int64
	entries []byte // n × idxEntrySize
	tombs   []tomb
}

func encodeIdx(pack packID, end int64, entries []byte, tombs []tomb) []byte {
	n := len(entries) / idxEntrySize
	b := make([]byte, idxHeaderSize, idxHeaderSize+len(entries)+len(tombs)*idxTombSize+idxTrailer)
	copy(b, idxMagic)
	le.PutUint32(b[8:], idxVersion)
	copy(b[16:32], pack[:])
	le.PutUint64(b[32:], uint64(end))
	le.PutUint64(b[40:], uint64(n))
	le.PutUint64(b[48:], uint64(len(tombs)))
	le.PutUint32(b[60:], crc(b[:60]))
	b = append(b, entries...)
	for _, t := range tombs {
		var e [idxTombSize]byte
		copy(e[:32], t.id[:])
		copy(e[32:48], t.target[:])
		le.PutUint64(e[48:], uint64(t.tOff))
		le.PutUint64(e[56:], uint64(t.off))
		b = append(b, e[:]...)
	}
	return le.AppendUint32(b, crc(b[idxHeaderSize:]))
}

// decodeIdx checks and decodes an index file. entries aliases b.
func decodeIdx(b []byte, want packID) (idxData, error) {
	var d idxData
	if len(b) < idxHeaderSize+idxTrailer || string(b[:8]) != idxMagic {
		return d, errors.New("not a cairn pack index")
	}
	if le.Uint32(b[60:]) != crc(b[:60]) {
		return d, errors.New("index header checksum mismatch")
	}
	if v := le.Uint32(b[8:]); v != idxVersion {
		return d, fmt.Errorf("index format version %d, want %d", v, idxVersion)
	}
	d.pack = packID(b[16:32])
	if d.pack != want {
		return d, errors.New("index names another pack")
	}
	d.end = int64(le.Uint64(b[32:]))
	n, m := le.Uint64(b[40:]), le.Uint64(b[48:])
	if n > uint64(len(b))/idxEntrySize || m > uint64(len(b))/idxTombSize ||
		uint64(len(b)) != idxHeaderSize+n*idxEntrySize+m*idxTombSize+idxTrailer {
		return d, errors.New("index size does not match its counts")
	}
	body := b[idxHeaderSize : len(b)-idxTrailer]
	if le.Uint32(b[len(b)-idxTrailer:]) != crc(body) {
		return d, errors.New("index checksum mismatch")
	}
	d.entries = body[:n*idxEntrySize]
	prev := int64(packHeaderSize - 1)
	for i := 0; i < len(d.entries); i += idxEntrySize {
		e := d.entries[i : i+idxEntrySize]
		off, l := entryOff(e), entryLen(e)
		if off <= prev || l > MaxObjectSize || off+recHeaderSize+int64(l) > d.end {
			return d, errors.New("index entry out of order or out of range")
		}
		prev = off
	}
	tb := body[n*idxEntrySize:]
	d.tombs = make([]tomb, m)
	for i := range d.tombs {
		e := tb[i*idxTombSize : (i+1)*idxTombSize]
		t := &d.tombs[i]
		t.id = cairn.ID(e[:32])
		t.target = packID(e[32:48])
		t.tOff = int64(le.Uint64(e[48:]))
		t.off = int64(le.Uint64(e[56:]))
		if t.off < packHeaderSize || t.off+recHeaderSize+tombSize > d.end {
			return d, errors.New("index tombstone out of range")
		}
	}
	return d, nil
}
