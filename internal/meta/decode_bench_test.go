package meta

import (
	json "github.com/goccy/go-json"
	"testing"
)

func BenchmarkDecodeEntry(b *testing.B) {
	e := Entry{Name: "f01234", Parent: 1234567890123, Ino: 987654321098765, Type: TypeFile, Mode: 0o644, UID: 1000, GID: 1000, Size: 4096, Mtime: 1763700000000000000, Ctime: 1763700000000000000,
		Versions: []Version{{N: 1, Size: 4096, Mtime: 1763700000000000000, Committed: 1763700000000000000, Stores: []string{"local"}, Chunks: 1, Src: Source{Dev: 2049, Ino: 123456, Size: 4096, Mtime: 1763700000000000000}, Digest: "0123456789abcdef0123456789abcdef"}}}
	raw, _ := json.Marshal(e)
	b.Logf("record %d bytes", len(raw))
	b.SetBytes(int64(len(raw)))
	for i := 0; i < b.N; i++ {
		var d Entry
		if err := json.Unmarshal(raw, &d); err != nil {
			b.Fatal(err)
		}
	}
}
