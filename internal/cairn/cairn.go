// Package cairn is cairn's vocabulary: the identifiers, the error type and the
// central interfaces every other package speaks. It has no dependencies beyond
// the standard library and no implementations; read it first.
package cairn

import (
	"context"
	"encoding/hex"
	"fmt"
)

// IDSize is the length of a chunk or manifest identifier in bytes.
const IDSize = 32

// ID names an object in a store: the BLAKE3-256 hash of the object's stored
// (encrypted) bytes. Anyone can verify that an object matches its ID without
// holding a key.
type ID [IDSize]byte

// String returns the ID as 64 lowercase hexadecimal digits.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// Short returns the first 12 hex digits, for messages.
func (id ID) Short() string { return hex.EncodeToString(id[:6]) }

// IsZero reports whether id is the zero ID (no object).
func (id ID) IsZero() bool { return id == ID{} }

// ParseID parses the 64-hex-digit form produced by String.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*IDSize {
		return id, E("parse id", Invalid, s, fmt.Errorf("want %d hex digits, have %d", 2*IDSize, len(s)))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, E("parse id", Invalid, s, err)
	}
	return id, nil
}

// Store keeps immutable, content-addressed objects (chunks and manifests).
//
// Contract, for every implementation:
//   - Objects are immutable. Put of an ID already present succeeds and changes
//     nothing (idempotent); callers may Put the same object concurrently.
//   - Put must not retain data (or any slice of it) after it returns: the
//     caller reuses the buffer. A store that keeps objects in memory copies.
//   - The caller computes id = BLAKE3-256(data). A store may verify it (and
//     then fails with Kind Corrupt); it must never keep data under a wrong ID
//     once it has noticed.
//   - Put returns only when the object is durable to the level the store
//     promises (a local store: fsync'd), so a crash after Put returns never
//     loses it. A crash during Put leaves the object either absent or whole.
//   - Get of a missing object fails with an error matching NotFound
//     (errors.Is(err, cairn.ErrNotFound)). Get never returns bytes that do not
//     hash to id: a store that finds damage returns Kind Corrupt.
//   - Has answers for a batch, in order: found[i] reports whether ids[i] is
//     present. It is cheap (no data read) and may be answered from an index.
//   - Delete of a missing object is not an error. Delete is not undone by a
//     crash once it returns.
//   - List calls fn once per stored object, in no particular order, from the
//     caller's goroutine; if fn returns an error List stops and returns it.
//     Objects Put or Deleted while List runs may or may not be seen.
//   - All methods are safe for concurrent use and honour ctx cancellation.
//   - Close releases resources; no method may be called after Close.
type Store interface {
	Put(ctx context.Context, id ID, data []byte) error
	Get(ctx context.Context, id ID) ([]byte, error)
	Has(ctx context.Context, ids []ID) (found []bool, err error)
	Delete(ctx context.Context, id ID) error
	List(ctx context.Context, fn func(id ID, size int64) error) error
	Close() error
}

// StoreStats is an optional ability of a Store (found by type assertion):
// how many objects it holds and how many bytes they take on disk.
type StoreStats interface {
	Stats(ctx context.Context) (StoreUsage, error)
}

// StoreUsage is what StoreStats reports.
type StoreUsage struct {
	Objects int64 // live objects
	Bytes   int64 // bytes of live objects
	Disk    int64 // bytes used on the medium, including garbage not yet compacted
}

// MarshalText encodes the ID as hex (so JSON records carry readable IDs).
func (id ID) MarshalText() ([]byte, error) { return []byte(id.String()), nil }

// UnmarshalText parses the hex form.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := ParseID(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}
