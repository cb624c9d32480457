package cachestore_test

import (
	"fmt"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/cachestore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// BenchmarkGet reads objects of chunk size (16 KiB, the chunker's average)
// and of 1 MiB through the cache, from one goroutine, with a memstore as the
// backing store (so a miss costs the cache's own work, not a network):
//   - hit: a working set of half the bound, all cached;
//   - miss: a working set of 4x the bound read in a cycle, so every Get
//     misses (fetch, verify, insert, evict);
//   - direct: the backing store alone, for reference.
//
// The cache is a memstore or a localstore (NoSync, TrustIDs) on t.TempDir.
func BenchmarkGet(b *testing.B) {
	const max = 32 << 20
	for _, size := range []int{16 << 10, 1 << 20} {
		for _, cacheKind := range []string{"mem", "local"} {
			for _, mode := range []string{"hit", "miss", "direct"} {
				if mode == "direct" && cacheKind == "local" {
					continue
				}
				b.Run(fmt.Sprintf("size=%dK/cache=%s/%s", size>>10, cacheKind, mode), func(b *testing.B) {
					work := max / 2
					if mode == "miss" {
						work = 4 * max
					}
					n := work / size
					back := memstore.New()
					ids := make([]cairn.ID, n)
					for i := range n {
						id, data := storetest.Blob(uint64(i), size)
						if err := back.Put(bg, id, data); err != nil {
							b.Fatal(err)
						}
						ids[i] = id
					}
					var cache cairn.Store = memstore.New()
					if cacheKind == "local" {
						cache = openLocal(b, b.TempDir())
					}
					var s cairn.Store = back
					if mode != "direct" {
						cs, err := cachestore.New(bg, back, cache, cachestore.Options{MaxBytes: max})
						if err != nil {
							b.Fatal(err)
						}
						s = cs
					}
					defer s.Close()
					for _, id := range ids { // warm: fill the cache
						if _, err := s.Get(bg, id); err != nil {
							b.Fatal(err)
						}
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						if _, err := s.Get(bg, ids[i%n]); err != nil {
							b.Fatal(err)
						}
					}
					b.StopTimer()
					if cs, ok := s.(*cachestore.Store); ok {
						st := cs.Stats()
						if mode == "hit" && st.Fetches != int64(n) || mode == "miss" && st.Hits != 0 {
							b.Fatalf("%s: stats %+v", mode, st)
						}
					}
				})
			}
		}
	}
}
