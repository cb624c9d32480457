package ecstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// mapCache is the shard-map cache file, <Options.Dir>/ec-maps: the maps
// this Store has learnt (by Put or by a scan) and forgotten (by Delete or a
// scan), so that a new process starts with the index of the last and need
// not read every map again. It is only a cache: losing it, or any record
// of it, costs a scan, never data. Several processes may append to it at
// once (each record is one write on a file opened O_APPEND, and records
// check themselves); opening compacts it when most of it is dead, and a
// process still appending to the replaced file loses those records from
// the cache.
//
// Format (version 1): the 8 bytes "cairnem1", then records of
//
//	len     4 bytes, little-endian: length of payload
//	crc     4 bytes, little-endian: CRC-32C (Castagnoli) of payload
//	payload type (1 byte) and data:
//	        1 add: a shard map's bytes (format.go)
//	        2 remove: an object ID (32 bytes)
//	        3 not a map: the ID of an object of a map's size that is not
//	          a map of this Store (so a scan does not read it again)
//
// A record cut short or failing its CRC ends the file; what follows is
// ignored.
type mapCache struct {
	mu   sync.Mutex
	f    *os.File
	path string
	log  *slog.Logger
}

const (
	cacheMagic = "cairnem1"
	cacheName  = "ec-maps"

	recAdd    = 1
	recRemove = 2
	recNotMap = 3

	maxRecord = 1 + headerSize + 256*cairn.IDSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type cacheRecord struct {
	kind byte
	data []byte
}

// openMapCache opens (creating) the cache file in dir and returns its
// records, compacting the file first when most of it is dead.
func openMapCache(dir string, log *slog.Logger) (*mapCache, []cacheRecord, error) {
	const op = "open shard-map cache"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, cairn.E(op, cairn.IO, dir, err)
	}
	path := filepath.Join(dir, cacheName)
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, cairn.E(op, cairn.IO, path, err)
	}
	var recs []cacheRecord
	if len(data) > 0 {
		recs, err = decodeMapCache(data)
		if err != nil {
			log.Warn("ecstore: shard-map cache damaged; keeping the records before the damage", "file", path, "err", err)
		}
	}
	live := liveRecords(recs)
	if len(data) == 0 || err != nil || len(recs) > 2*len(live)+1024 {
		// Rewrite with the live records only.
		buf := []byte(cacheMagic)
		for _, r := range live {
			buf = appendCacheRecord(buf, r.kind, r.data)
		}
		tmp, cerr := os.CreateTemp(dir, cacheName+".*.tmp")
		if cerr != nil {
			return nil, nil, cairn.E(op, cairn.IO, dir, cerr)
		}
		_, cerr = tmp.Write(buf)
		if cerr == nil {
			cerr = tmp.Close()
		} else {
			tmp.Close()
		}
		if cerr == nil {
			cerr = os.Rename(tmp.Name(), path)
		}
		if cerr != nil {
			os.Remove(tmp.Name())
			return nil, nil, cairn.E(op, cairn.IO, path, cerr)
		}
		recs = live
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, cairn.E(op, cairn.IO, path, err)
	}
	return &mapCache{f: f, path: path, log: log}, recs, nil
}

// liveRecords replays recs and returns the adds and not-maps still in
// force, in their order.
func liveRecords(recs []cacheRecord) []cacheRecord {
	type key struct {
		kind byte
		id   cairn.ID
	}
	objOf := func(r cacheRecord) cairn.ID {
		var id cairn.ID
		if r.kind == recAdd {
			copy(id[:], r.data[20:52])
		} else {
			copy(id[:], r.data)
		}
		return id
	}
	last := map[key]int{}
	for i, r := range recs {
		switch r.kind {
		case recAdd, recNotMap:
			last[key{r.kind, objOf(r)}] = i
		case recRemove:
			delete(last, key{recAdd, objOf(r)})
		}
	}
	var out []cacheRecord
	for i, r := range recs {
		if r.kind != recRemove && last[key{r.kind, objOf(r)}] == i {
			out = append(out, r)
		}
	}
	return out
}

func (c *mapCache) append(kind byte, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return
	}
	if _, err := c.f.Write(appendCacheRecord(nil, kind, data)); err != nil {
		c.log.Warn("ecstore: shard-map cache write failed; not using it any more", "file", c.path, "err", err)
		c.f.Close()
		c.f = nil
	}
}

func (c *mapCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}

func appendCacheRecord(b []byte, kind byte, data []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(1+len(data)))
	crc := crc32.Update(crc32.Checksum([]byte{kind}, castagnoli), castagnoli, data)
	b = binary.LittleEndian.AppendUint32(b, crc)
	b = append(b, kind)
	return append(b, data...)
}

// decodeMapCache parses a cache file. Records of a known type with data of
// the right length are returned (an add's map is not decoded here); on
// damage it returns the records before it and an error of Kind Corrupt.
func decodeMapCache(data []byte) ([]cacheRecord, error) {
	bad := func(off int, why string) error {
		return cairn.E("decode shard-map cache", cairn.Corrupt, "", fmt.Errorf("offset %d: %s", off, why))
	}
	if len(data) < len(cacheMagic) || string(data[:len(cacheMagic)]) != cacheMagic {
		return nil, bad(0, "bad magic")
	}
	var recs []cacheRecord
	off := len(cacheMagic)
	for off < len(data) {
		if len(data)-off < 8 {
			return recs, bad(off, "record cut short")
		}
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n < 1 || n > maxRecord {
			return recs, bad(off, fmt.Sprintf("bad record length %d", n))
		}
		if len(data)-off-8 < n {
			return recs, bad(off, "record cut short")
		}
		p := data[off+8 : off+8+n]
		if crc32.Checksum(p, castagnoli) != sum {
			return recs, bad(off, "CRC mismatch")
		}
		r := cacheRecord{kind: p[0], data: p[1:]}
		switch {
		case r.kind == recAdd && len(r.data) >= headerSize:
		case (r.kind == recRemove || r.kind == recNotMap) && len(r.data) == cairn.IDSize:
		default:
			return recs, bad(off, fmt.Sprintf("bad record type %d or length %d", r.kind, n))
		}
		recs = append(recs, r)
		off += 8 + n
	}
	return recs, nil
}
