package localstore

import (
	"fmt"
	"log/slog"
	"os"
)

// Options configure a Store. The zero value gives the defaults.
type Options struct {
	// PackSize is the size at which a pack file is sealed and the next one
	// started. Default 256 MiB; at least 64 KiB, at most 4 GiB. An object
	// larger than PackSize gets a pack of its own.
	PackSize int64

	// NoSync turns off every fsync: Put and Delete are then not durable
	// against a machine crash (a killed process loses nothing). For tests and
	// benchmarks only.
	NoSync bool

	// BatchBytes caps the bytes one group commit writes before its fsync.
	// Default 16 MiB; at least 64 KiB.
	BatchBytes int

	// CompactBelow is the fraction of a sealed pack that must still be live
	// for Compact to leave it alone: a pack whose live records take less than
	// CompactBelow × its size is rewritten. Default 0.5; in (0, 1].
	CompactBelow float64

	// TrustIDs skips hashing data on Put: the caller guarantees that id is
	// BLAKE3-256(data), as cairn's own pipeline does (it has just computed
	// it). Get, Verify and Compact still check every object they read, so a
	// wrong ID is still caught, on read instead of on write. Saves one
	// BLAKE3 pass over everything written (~0.3 ns per byte).
	TrustIDs bool

	// Logger receives recovery reports, damaged records and other notes.
	// nil discards them.
	Logger *slog.Logger

	// Tests: append through the page cache even with sync on; replace the
	// O_DIRECT write.
	noDirect        bool
	testDirectWrite func(f *os.File, b []byte, off int64) (int, error)
}

const (
	defaultPackSize   = 256 << 20
	minPackSize       = 64 << 10
	maxPackSize       = 4 << 30
	defaultBatchBytes = 16 << 20
	minBatchBytes     = 64 << 10
)

// withDefaults validates o and fills in defaults.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.PackSize == 0:
		o.PackSize = defaultPackSize
	case o.PackSize < minPackSize || o.PackSize > maxPackSize:
		return o, fmt.Errorf("PackSize %d outside [%d, %d]", o.PackSize, minPackSize, int64(maxPackSize))
	}
	switch {
	case o.BatchBytes == 0:
		o.BatchBytes = defaultBatchBytes
	case o.BatchBytes < minBatchBytes:
		return o, fmt.Errorf("BatchBytes %d below %d", o.BatchBytes, minBatchBytes)
	}
	switch {
	case o.CompactBelow == 0:
		o.CompactBelow = 0.5
	case !(o.CompactBelow > 0 && o.CompactBelow <= 1):
		return o, fmt.Errorf("CompactBelow %v outside (0, 1]", o.CompactBelow)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}
