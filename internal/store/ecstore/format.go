package ecstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// The stored formats (doc/format.md, "Erasure-coded objects (version 1)").
//
// Shard object i of an object (one per member, member i holds shard i):
//
//	0   8  magic "cairnecs"
//	8   1  version 1
//	9   1  K, data shards (1..255)
//	10  1  M, parity shards (1..255; K+M ≤ 256)
//	11  1  i, this shard's index (0..K+M-1; 0..K-1 data, K.. parity)
//	12  8  L, the object's size, little-endian
//	20 32  the object's ID
//	52  S  the shard's bytes, S = max(1, ceil(L/K))
//
// Shard map (the same bytes on every member):
//
//	0   8  magic "cairnecm"
//	8   1  version 1
//	9   1  K
//	10  1  M
//	11  1  0
//	12  8  L, little-endian
//	20 32  the object's ID
//	52 32·(K+M)  the IDs of shard objects 0..K+M-1
//
// Both are stored under their own BLAKE3-256, like every object.
const (
	shardMagic = "cairnecs"
	mapMagic   = "cairnecm"
	version    = 1
	// Version is the version of shards and shard maps (doc/format.md,
	// "Erasure-coded objects").
	Version    = version
	headerSize = 52
	// maxObject bounds L in a header: larger is refused as damage.
	maxObject = 1 << 40
)

// objMap is a decoded shard map.
type objMap struct {
	k, m   int
	size   int64    // L
	id     cairn.ID // the object
	shards []cairn.ID
	mapID  cairn.ID // BLAKE3 of the encoded map
}

// shardSize is S for an object of size L split in k.
func shardSize(size int64, k int) int64 {
	return max(1, (size+int64(k)-1)/int64(k))
}

func mapSize(n int) int { return headerSize + cairn.IDSize*n }

func putHeader(b []byte, magic string, k, m, i int, size int64, id cairn.ID) {
	copy(b, magic)
	b[8] = version
	b[9] = byte(k)
	b[10] = byte(m)
	b[11] = byte(i)
	binary.LittleEndian.PutUint64(b[12:], uint64(size))
	copy(b[20:52], id[:])
}

// encodeShard returns shard object i of the object id (size bytes) with
// payload p.
func encodeShard(k, m, i int, size int64, id cairn.ID, p []byte) []byte {
	b := make([]byte, headerSize+len(p))
	putHeader(b, shardMagic, k, m, i, size, id)
	copy(b[headerSize:], p)
	return b
}

// encode returns the map's bytes (whose hash is om.mapID).
func (om *objMap) encode() []byte {
	b := make([]byte, mapSize(len(om.shards)))
	putHeader(b, mapMagic, om.k, om.m, 0, om.size, om.id)
	for i, s := range om.shards {
		copy(b[headerSize+cairn.IDSize*i:], s[:])
	}
	return b
}

var errFormat = errors.New("not an erasure-coded shard or map of version 1")

func checkHeader(b []byte, magic string) (k, m, i int, size int64, id cairn.ID, err error) {
	if len(b) < headerSize || string(b[:8]) != magic {
		return 0, 0, 0, 0, id, errFormat
	}
	if b[8] != version {
		return 0, 0, 0, 0, id, fmt.Errorf("erasure-coding format version %d; this cairn reads version %d", b[8], version)
	}
	k, m, i = int(b[9]), int(b[10]), int(b[11])
	size = int64(binary.LittleEndian.Uint64(b[12:]))
	copy(id[:], b[20:52])
	switch {
	case k < 1 || m < 1 || k+m > 256:
		return 0, 0, 0, 0, id, fmt.Errorf("bad shard counts K=%d M=%d", k, m)
	case i >= k+m:
		return 0, 0, 0, 0, id, fmt.Errorf("shard index %d of %d", i, k+m)
	case size < 0 || size > maxObject:
		return 0, 0, 0, 0, id, fmt.Errorf("bad object size %d", uint64(size))
	}
	return k, m, i, size, id, nil
}

// decodeMap parses a shard map. It does not check the map's own hash.
func decodeMap(b []byte) (*objMap, error) {
	k, m, i, size, id, err := checkHeader(b, mapMagic)
	if err != nil {
		return nil, cairn.E("decode shard map", cairn.Corrupt, "", err)
	}
	if i != 0 {
		return nil, cairn.E("decode shard map", cairn.Corrupt, id.String(), fmt.Errorf("reserved byte is %d", i))
	}
	if len(b) != mapSize(k+m) {
		return nil, cairn.E("decode shard map", cairn.Corrupt, id.String(), fmt.Errorf("%d bytes for %d shards, want %d", len(b), k+m, mapSize(k+m)))
	}
	om := &objMap{k: k, m: m, size: size, id: id, shards: make([]cairn.ID, k+m)}
	for j := range om.shards {
		copy(om.shards[j][:], b[headerSize+cairn.IDSize*j:])
	}
	om.mapID = blake3.Sum256(b)
	return om, nil
}

// decodeShard checks a shard object against the map it should belong to
// (index i) and returns its payload (a slice of b).
func decodeShard(b []byte, om *objMap, i int) ([]byte, error) {
	k, m, idx, size, id, err := checkHeader(b, shardMagic)
	if err != nil {
		return nil, err
	}
	switch {
	case k != om.k || m != om.m || idx != i || size != om.size || id != om.id:
		return nil, fmt.Errorf("header says shard %d of %d+%d of %s (%d bytes); want shard %d of %d+%d of %s (%d bytes)",
			idx, k, m, id.Short(), size, i, om.k, om.m, om.id.Short(), om.size)
	case int64(len(b)-headerSize) != shardSize(size, k):
		return nil, fmt.Errorf("%d shard bytes, want %d", len(b)-headerSize, shardSize(size, k))
	}
	return b[headerSize:], nil
}
