package meta

import (
	"fmt"

	json "github.com/goccy/go-json"
)

// Records are decoded with encoding/json, except those that are large or
// on every file's path: entries (Vol.decode, 4x faster with goccy/go-json:
// BenchmarkDecodeEntry, commit cf7f533), trash items (an entry each) and
// the local copy of a namespace (thousands of entries in one file); those
// are encoded with goccy/go-json too, as are node records (encoding/json
// writes a float below 1e-6 as 1.5e-7, goccy/go-json as 1.5e-07: the
// bytes in etcd stay what they were). goccy/go-json has
// panicked on malformed input (an index out of range on a truncated
// primary record, found by FuzzDecodePrimary), so those go through
// unmarshalFast, which turns a panic of the decoder into an error: a
// damaged or hostile record is Corrupt, never the end of the process.
// Both libraries write the same bytes for cairn's records
// (TestRecordEncodingsAgree); FuzzDecodeEntry, FuzzDecodeLocalCopy and
// FuzzDecodeRecords run every decoder on fuzzed input.
func unmarshalFast(b []byte, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("undecodable record (%d bytes): %v", len(b), r)
		}
	}()
	return json.Unmarshal(b, v)
}
