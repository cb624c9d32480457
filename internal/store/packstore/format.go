package packstore

// The pack object format, version 1. doc/format.md ("Pack objects
// (version 1)") describes it byte by byte; keep the two in step.

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

const (
	packMagic   = "cairnpck"
	packVersion = 1
	headerSize  = 32
	trailerSize = 32
	entrySize   = 48 // data entry: ID, offset, length
	tombSize    = 64 // tombstone entry: ID, target pack ID

	// maxEntries bounds n and m of a trailer, so that a damaged or hostile
	// trailer cannot make a reader allocate without bound.
	maxEntries = 1 << 24
)

// PackVersion is the version of the pack objects this package writes, and
// LogVersion that of its local pack index log (doc/format.md, "Pack
// objects").
const (
	PackVersion = packVersion
	LogVersion  = logVersion
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var le = binary.LittleEndian

// obj is a data entry of a pack: an object's ID and where its bytes are.
type obj struct {
	id     cairn.ID
	off, n int64
}

// tomb is a tombstone entry: the copy of id held by pack target is deleted.
type tomb struct {
	id, target cairn.ID
}

// trailer is the fixed-size end of a pack.
type trailer struct {
	indexOff int64 // where the entries begin (the end of the objects' bytes)
	n, m     int   // data and tombstone entries
}

func (t trailer) indexLen() int64 { return int64(t.n)*entrySize + int64(t.m)*tombSize }

// size is the pack's total size according to the trailer.
func (t trailer) size() int64 { return t.indexOff + t.indexLen() + trailerSize }

// newHeader returns a pack header: magic, version, and 16 bytes (creation
// time and random) that make every pack's bytes, and so its ID, unique, so
// that a tombstone naming a pack can never kill a later pack's copy.
func newHeader() []byte {
	b := make([]byte, headerSize)
	copy(b, packMagic)
	le.PutUint32(b[8:], packVersion)
	le.PutUint64(b[16:], uint64(time.Now().UnixNano()))
	if _, err := rand.Read(b[24:32]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return b
}

// checkHeader reports whether b (at least headerSize bytes) begins like a
// pack, and an error if it does but of a version this code cannot read.
func checkHeader(b []byte) (isPack bool, err error) {
	if len(b) < headerSize || string(b[:8]) != packMagic {
		return false, nil
	}
	if v := le.Uint32(b[8:]); v != packVersion {
		return true, fmt.Errorf("pack format version %d (this cairn reads version %d)", v, packVersion)
	}
	return true, nil
}

// appendIndex appends the entries and the trailer of a pack whose objects'
// bytes end at indexOff.
func appendIndex(b []byte, indexOff int64, objs []obj, tombs []tomb) []byte {
	start := len(b)
	for _, o := range objs {
		b = append(b, o.id[:]...)
		b = le.AppendUint64(b, uint64(o.off))
		b = le.AppendUint64(b, uint64(o.n))
	}
	for _, t := range tombs {
		b = append(b, t.id[:]...)
		b = append(b, t.target[:]...)
	}
	b = le.AppendUint64(b, uint64(indexOff))
	b = le.AppendUint32(b, uint32(len(objs)))
	b = le.AppendUint32(b, uint32(len(tombs)))
	b = le.AppendUint32(b, packVersion)
	b = le.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
	b = append(b, packMagic...)
	return b
}

var errNotPack = errors.New("not a pack (no pack trailer)")

// parseTrailer reads the last trailerSize bytes of an object of the given
// size. It returns errNotPack when they do not end with the pack magic, and
// another error when they do but are not a valid version 1 trailer for an
// object of that size.
func parseTrailer(b []byte, size int64) (trailer, error) {
	var t trailer
	if len(b) != trailerSize {
		return t, fmt.Errorf("trailer of %d bytes, want %d", len(b), trailerSize)
	}
	if string(b[24:32]) != packMagic {
		return t, errNotPack
	}
	if v := le.Uint32(b[16:]); v != packVersion {
		return t, fmt.Errorf("pack format version %d (this cairn reads version %d)", v, packVersion)
	}
	off, n, m := le.Uint64(b[0:]), le.Uint32(b[8:]), le.Uint32(b[12:])
	if n > maxEntries || m > maxEntries {
		return t, fmt.Errorf("trailer claims %d objects and %d tombstones", n, m)
	}
	if off < headerSize || off > uint64(size) {
		return t, fmt.Errorf("index offset %d out of range for a %d-byte pack", off, size)
	}
	t = trailer{indexOff: int64(off), n: int(n), m: int(m)}
	if t.size() != size {
		return t, fmt.Errorf("trailer describes a %d-byte pack, the object has %d bytes", t.size(), size)
	}
	return t, nil
}

// parseIndex decodes the entries and trailer of a pack: b is the pack's last
// t.indexLen()+trailerSize bytes. It checks the checksum, then the entries
// (parseEntries).
func parseIndex(b []byte, t trailer) ([]obj, []tomb, error) {
	if int64(len(b)) != t.indexLen()+trailerSize {
		return nil, nil, fmt.Errorf("index of %d bytes, want %d", len(b), t.indexLen()+trailerSize)
	}
	sumAt := len(b) - trailerSize + 20
	if crc32.Checksum(b[:sumAt], castagnoli) != le.Uint32(b[sumAt:]) {
		return nil, nil, errors.New("pack index checksum mismatch")
	}
	return parseEntries(b[:t.indexLen()], t)
}

// parseEntries decodes t.n data entries and t.m tombstones from b and checks
// that the data entries tile the objects' region [headerSize, t.indexOff) in
// order, with no gap, overlap or repeated ID, and that no tombstone repeats.
func parseEntries(b []byte, t trailer) ([]obj, []tomb, error) {
	if int64(len(b)) != t.indexLen() {
		return nil, nil, fmt.Errorf("entries of %d bytes, want %d", len(b), t.indexLen())
	}
	objs := make([]obj, t.n)
	seen := make(map[cairn.ID]struct{}, t.n)
	next := int64(headerSize)
	for i := range objs {
		e := b[i*entrySize:]
		o := &objs[i]
		copy(o.id[:], e[:32])
		off, n := le.Uint64(e[32:]), le.Uint64(e[40:])
		if off != uint64(next) || n > uint64(t.indexOff-next) {
			return nil, nil, fmt.Errorf("entry %d at [%d, +%d) does not follow the previous one (%d) within the objects' region (ends at %d)", i, off, n, next, t.indexOff)
		}
		if _, dup := seen[o.id]; dup {
			return nil, nil, fmt.Errorf("object %s appears twice", o.id.Short())
		}
		seen[o.id] = struct{}{}
		o.off, o.n = int64(off), int64(n)
		next += o.n
	}
	if next != t.indexOff {
		return nil, nil, fmt.Errorf("entries cover the objects' region up to %d, it ends at %d", next, t.indexOff)
	}
	tombs := make([]tomb, t.m)
	killed := make(map[tomb]struct{}, t.m)
	base := t.n * entrySize
	for i := range tombs {
		e := b[base+i*tombSize:]
		copy(tombs[i].id[:], e[:32])
		copy(tombs[i].target[:], e[32:64])
		if _, dup := killed[tombs[i]]; dup {
			return nil, nil, fmt.Errorf("tombstone %d repeats one before it", i)
		}
		killed[tombs[i]] = struct{}{}
	}
	return objs, tombs, nil
}

// decodeTail decodes a pack's index from the last bytes of the object (tail
// holds the object's last len(tail) bytes; size is the object's size). It
// returns the trailer and, when tail holds the whole index, the entries;
// need > 0 says how many bytes from the end are needed when it does not.
func decodeTail(tail []byte, size int64) (t trailer, objs []obj, tombs []tomb, need int64, err error) {
	if int64(len(tail)) > size || len(tail) < trailerSize {
		return t, nil, nil, 0, fmt.Errorf("tail of %d bytes of a %d-byte object", len(tail), size)
	}
	t, err = parseTrailer(tail[len(tail)-trailerSize:], size)
	if err != nil {
		return t, nil, nil, 0, err
	}
	want := t.indexLen() + trailerSize
	if int64(len(tail)) < want {
		return t, nil, nil, want, nil
	}
	objs, tombs, err = parseIndex(tail[int64(len(tail))-want:], t)
	return t, objs, tombs, 0, err
}
