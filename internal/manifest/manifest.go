// Package manifest defines a file version's manifest, the ordered list of
// its chunks with each chunk's key, and its sealed storage format
// (versions 1 and 2, described byte by byte in doc/format.md, "Manifest
// object"). Version 2 adds, per chunk, the optional base of a delta chunk;
// Seal writes version 1 unless some chunk has a base, and Open reads both.
//
// A stored manifest is an ordinary immutable object, named like a chunk by
// the BLAKE3-256 of its bytes. Its body is encrypted with a fresh random key
// Km; Km is stored wrapped (encrypted) in one or more key slots. Version 1
// writes one slot, wrapped with the volume's manifest wrap key
// (volkey.Master.ManifestWrap); readers skip slots of types they do not
// know, so slots wrapping Km for a reader's public key can be added later
// without breaking older readers.
package manifest

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"
)

// Ref names one chunk of a file: the stored object's ID, the key that
// decrypts it, and its plaintext size. A delta chunk (stored as a zstd
// frame whose dictionary is another chunk's plaintext) also names that
// base chunk; a base is always a plain chunk (Base.Base is nil), so a
// reader fetches at most two objects per chunk.
type Ref struct {
	ID   cairn.ID
	Key  [32]byte
	Size uint32
	Base *Ref // nil for an ordinary chunk
}

// Manifest is one file version: its plaintext size and its chunks in file
// order. Size is always the sum of the chunks' sizes.
type Manifest struct {
	Size   int64
	Chunks []Ref
}

// Format constants.
const (
	Magic   = "CRNM" // first bytes of every stored manifest
	Version = 1      // the version of manifests without delta chunks
	// VersionDelta is the version of manifests whose chunk list names a
	// base for delta chunks. Version 1 readers refuse it (as Corrupt,
	// naming the version), so it is written only when needed.
	VersionDelta = 2

	// MaxChunkSize bounds a Ref's Size (it equals chunker.LimitMax).
	MaxChunkSize = 64 << 20
	// MaxBodySize bounds the decoded body: about 15 million chunks, a
	// 240 GiB file at the default 16 KiB average chunk size.
	MaxBodySize = 1 << 30

	// SlotVolume is the key slot type holding Km wrapped by the volume's
	// manifest wrap key with XChaCha20-Poly1305.
	SlotVolume = 1

	keySize     = 32
	nonceSize   = chacha20poly1305.NonceSizeX // 24
	tagSize     = chacha20poly1305.Overhead   // 16
	volSlotSize = nonceSize + keySize + tagSize
	headSize    = len(Magic) + 2 // magic, version, slot count
	entryMin    = 2*keySize + 1  // ID, key, one-byte uvarint size
	// entryMin2 is a version 2 entry without a base: one more byte, the
	// base flag.
	entryMin2 = entryMin + 1
)

// Body compression flags (first byte of the encrypted body).
const (
	flagRaw  = 0
	flagZstd = 1
)

var (
	zencOnce sync.Once
	zenc     *zstd.Encoder
	zdecOnce sync.Once
	zdec     *zstd.Decoder
)

func encoder() *zstd.Encoder {
	zencOnce.Do(func() {
		var err error
		zenc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			panic(err)
		}
	})
	return zenc
}

func decoder() *zstd.Decoder {
	zdecOnce.Do(func() {
		var err error
		zdec, err = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxBodySize), zstd.WithDecoderConcurrency(0))
		if err != nil {
			panic(err)
		}
	})
	return zdec
}

// Seal encodes m, encrypts it under a fresh random key wrapped by wrap (the
// volume's manifest wrap key) and returns the stored bytes and their ID
// (BLAKE3-256 of stored). It fails with cairn.Invalid if m is inconsistent:
// Size differs from the sum of the chunk sizes, or a chunk size is zero or
// above MaxChunkSize.
func Seal(m *Manifest, wrap [32]byte) (stored []byte, id cairn.ID, err error) {
	return seal(m, wrap, nil)
}

// seal is Seal with extra opaque key slots written before the volume slot
// (each a type byte, a big-endian uint16 length and the body), which lets
// tests build manifests as a later version might.
func seal(m *Manifest, wrap [32]byte, extra [][]byte) (stored []byte, id cairn.ID, err error) {
	const op = "seal manifest"
	if m == nil {
		return nil, id, cairn.E(op, cairn.Invalid, "", errors.New("nil manifest"))
	}
	var sum int64
	for i, r := range m.Chunks {
		if r.Size == 0 || r.Size > MaxChunkSize {
			return nil, id, cairn.E(op, cairn.Invalid, "", fmt.Errorf("chunk %d (%s) has size %d", i, r.ID.Short(), r.Size))
		}
		if b := r.Base; b != nil {
			if b.Size == 0 || b.Size > MaxChunkSize {
				return nil, id, cairn.E(op, cairn.Invalid, "", fmt.Errorf("chunk %d (%s) has a base of size %d", i, r.ID.Short(), b.Size))
			}
			if b.Base != nil {
				return nil, id, cairn.E(op, cairn.Invalid, "", fmt.Errorf("chunk %d (%s): its base is itself a delta", i, r.ID.Short()))
			}
		}
		sum += int64(r.Size)
	}
	if sum != m.Size {
		return nil, id, cairn.E(op, cairn.Invalid, "", fmt.Errorf("size %d but chunks sum to %d", m.Size, sum))
	}
	version := versionOf(m)
	body := encodeBody(m, version)
	if len(body)+1 > MaxBodySize {
		return nil, id, cairn.E(op, cairn.Invalid, "", fmt.Errorf("%d chunks: body of %d bytes exceeds %d", len(m.Chunks), len(body), MaxBodySize))
	}
	inner := make([]byte, 1, 1+len(body))
	inner[0] = flagRaw
	if z := encoder().EncodeAll(body, []byte{flagZstd}); len(z) < len(inner)+len(body) {
		inner = z
	} else {
		inner = append(inner, body...)
	}

	var km [keySize]byte
	rand.Read(km[:])
	wrapAEAD, err := chacha20poly1305.NewX(wrap[:])
	if err != nil {
		return nil, id, cairn.E(op, cairn.Other, "", err)
	}
	bodyAEAD, err := chacha20poly1305.NewX(km[:])
	if err != nil {
		return nil, id, cairn.E(op, cairn.Other, "", err)
	}

	extraSize := 0
	for _, e := range extra {
		extraSize += len(e)
	}
	stored = make([]byte, 0, headSize+extraSize+3+volSlotSize+nonceSize+len(inner)+tagSize)
	stored = append(stored, Magic...)
	stored = append(stored, version, byte(1+len(extra))) // version, key slot count
	for _, e := range extra {
		stored = append(stored, e...)
	}
	stored = append(stored, SlotVolume)
	stored = binary.BigEndian.AppendUint16(stored, volSlotSize)
	stored = appendRandom(stored, nonceSize)
	stored = wrapAEAD.Seal(stored, stored[len(stored)-nonceSize:], km[:], slotAAD(version, SlotVolume))
	stored = appendRandom(stored, nonceSize)
	// The body's associated data is everything before the ciphertext:
	// magic, version, every key slot and the body nonce.
	stored = bodyAEAD.Seal(stored, stored[len(stored)-nonceSize:], inner, stored)
	return stored, blake3.Sum256(stored), nil
}

func appendRandom(b []byte, n int) []byte {
	b = append(b, make([]byte, n)...)
	rand.Read(b[len(b)-n:])
	return b
}

// versionOf is the format version m is written in: VersionDelta if some
// chunk has a base, else Version, so files without delta chunks stay
// readable by version 1 readers.
func versionOf(m *Manifest) byte {
	for i := range m.Chunks {
		if m.Chunks[i].Base != nil {
			return VersionDelta
		}
	}
	return Version
}

// encodeBody is the plaintext body: uvarint file size, uvarint chunk count,
// then per chunk its 32-byte ID, 32-byte key and uvarint size; in version
// 2 each entry then has a base flag (0 or 1), and after a 1 the base's ID,
// key and uvarint size.
func encodeBody(m *Manifest, version byte) []byte {
	body := make([]byte, 0, 2*binary.MaxVarintLen64+len(m.Chunks)*(2*keySize+binary.MaxVarintLen32+1))
	body = binary.AppendUvarint(body, uint64(m.Size))
	body = binary.AppendUvarint(body, uint64(len(m.Chunks)))
	entry := func(r *Ref) {
		body = append(body, r.ID[:]...)
		body = append(body, r.Key[:]...)
		body = binary.AppendUvarint(body, uint64(r.Size))
	}
	for i := range m.Chunks {
		r := &m.Chunks[i]
		entry(r)
		if version < VersionDelta {
			continue
		}
		if r.Base == nil {
			body = append(body, 0)
			continue
		}
		body = append(body, 1)
		entry(r.Base)
	}
	return body
}

// slotAAD is the associated data of a key slot's AEAD: the magic, the
// version and the slot type, so a wrapped key cannot be moved into another
// format version or slot type.
func slotAAD(version, typ byte) []byte {
	return append([]byte(Magic), version, typ)
}

// Open verifies stored against id, unwraps the manifest key with wrap,
// decrypts and decodes the body. Damage or truncation fails with
// cairn.Corrupt; a wrap key that opens no key slot fails with
// cairn.Permission ("wrong volume key"). Errors name the manifest by
// id.Short().
func Open(stored []byte, id cairn.ID, wrap [32]byte) (*Manifest, error) {
	const op = "open manifest"
	path := id.Short()
	corrupt := func(format string, args ...any) error {
		return cairn.E(op, cairn.Corrupt, path, fmt.Errorf(format, args...))
	}
	if blake3.Sum256(stored) != id {
		return nil, corrupt("content does not match its id")
	}
	if len(stored) < headSize || string(stored[:len(Magic)]) != Magic {
		return nil, corrupt("not a cairn manifest")
	}
	version := stored[len(Magic)]
	if version != Version && version != VersionDelta {
		return nil, corrupt("unsupported manifest version %d (this cairn reads versions %d and %d)", version, Version, VersionDelta)
	}
	nslots := int(stored[len(Magic)+1])
	if nslots == 0 {
		return nil, corrupt("no key slots")
	}
	rest := stored[headSize:]
	var volSlot []byte
	for i := range nslots {
		if len(rest) < 3 {
			return nil, corrupt("truncated in key slot %d", i)
		}
		typ, n := rest[0], int(binary.BigEndian.Uint16(rest[1:3]))
		if len(rest)-3 < n {
			return nil, corrupt("truncated in key slot %d", i)
		}
		if typ == SlotVolume {
			if n != volSlotSize {
				return nil, corrupt("volume key slot of %d bytes, want %d", n, volSlotSize)
			}
			if volSlot == nil {
				volSlot = rest[3 : 3+n]
			}
		}
		rest = rest[3+n:]
	}
	if len(rest) < nonceSize+tagSize {
		return nil, corrupt("truncated body")
	}
	header := stored[:len(stored)-len(rest)+nonceSize]
	bodyNonce, ciphertext := rest[:nonceSize], rest[nonceSize:]
	if volSlot == nil {
		return nil, cairn.E(op, cairn.Permission, path, errors.New("no key slot for a volume key"))
	}

	wrapAEAD, err := chacha20poly1305.NewX(wrap[:])
	if err != nil {
		return nil, cairn.E(op, cairn.Other, path, err)
	}
	km, err := wrapAEAD.Open(make([]byte, 0, keySize), volSlot[:nonceSize], volSlot[nonceSize:], slotAAD(version, SlotVolume))
	if err != nil {
		return nil, cairn.E(op, cairn.Permission, path, errors.New("wrong volume key"))
	}
	bodyAEAD, err := chacha20poly1305.NewX(km)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, path, err)
	}
	inner, err := bodyAEAD.Open(nil, bodyNonce, ciphertext, header)
	if err != nil {
		return nil, corrupt("body fails authentication")
	}
	if len(inner) == 0 {
		return nil, corrupt("empty body")
	}
	body := inner[1:]
	switch inner[0] {
	case flagRaw:
	case flagZstd:
		body, err = decoder().DecodeAll(body, nil)
		if err != nil {
			return nil, corrupt("body decompression: %v", err)
		}
	default:
		return nil, corrupt("unknown body flag %d", inner[0])
	}
	m, err := decodeBody(body, version)
	if err != nil {
		return nil, cairn.E(op, cairn.Corrupt, path, err)
	}
	return m, nil
}

// decodeBody parses the plaintext body of the given format version,
// checking every length against the bytes that remain before allocating
// for it. A version 2 body must name at least one base (writers use
// version 1 otherwise), so each chunk list has one encoding.
func decodeBody(b []byte, version byte) (*Manifest, error) {
	size, b, err := uvarint(b)
	if err != nil {
		return nil, fmt.Errorf("file size: %w", err)
	}
	count, b, err := uvarint(b)
	if err != nil {
		return nil, fmt.Errorf("chunk count: %w", err)
	}
	min := entryMin
	if version >= VersionDelta {
		min = entryMin2
	}
	if count > uint64(len(b)/min) {
		return nil, fmt.Errorf("%d chunks declared in %d bytes", count, len(b))
	}
	m := &Manifest{Chunks: make([]Ref, count)}
	entry := func(c *Ref, i int, what string) error {
		if len(b) < 2*keySize {
			return fmt.Errorf("chunk %d%s truncated", i, what)
		}
		copy(c.ID[:], b)
		copy(c.Key[:], b[keySize:])
		n, rest, err := uvarint(b[2*keySize:])
		if err != nil {
			return fmt.Errorf("chunk %d%s size: %w", i, what, err)
		}
		if n == 0 || n > MaxChunkSize {
			return fmt.Errorf("chunk %d%s has size %d", i, what, n)
		}
		b = rest
		c.Size = uint32(n)
		return nil
	}
	var sum uint64
	bases := 0
	for i := range m.Chunks {
		c := &m.Chunks[i]
		if err := entry(c, i, ""); err != nil {
			return nil, err
		}
		sum += uint64(c.Size)
		if version < VersionDelta {
			continue
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("chunk %d base flag truncated", i)
		}
		flag := b[0]
		b = b[1:]
		switch flag {
		case 0:
		case 1:
			c.Base = new(Ref)
			if err := entry(c.Base, i, " base"); err != nil {
				return nil, err
			}
			bases++
		default:
			return nil, fmt.Errorf("chunk %d has base flag %d", i, flag)
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(b))
	}
	if version >= VersionDelta && bases == 0 {
		return nil, errors.New("version 2 body without a delta chunk")
	}
	if sum != size {
		return nil, fmt.Errorf("file size %d but chunks sum to %d", size, sum)
	}
	m.Size = int64(size)
	return m, nil
}

// uvarint reads one minimally encoded uvarint from the front of b.
func uvarint(b []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, nil, errors.New("truncated varint")
	case n < 0:
		return 0, nil, errors.New("varint overflows 64 bits")
	case n > 1 && b[n-1] == 0:
		return 0, nil, errors.New("non-minimal varint")
	}
	return v, b[n:], nil
}
