package replicastore_test

import (
	"fmt"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/replicastore"
	"cairn.dev/cairn/internal/store/storetest"
)

// BenchmarkReplicaRead reads objects through copies:2 over two memstores,
// from one goroutine, with both stores up (down=0) and one down (down=1),
// for comparison with ecstore's BenchmarkECRead.
func BenchmarkReplicaRead(b *testing.B) {
	for _, size := range []int{16 << 10, 1 << 20, 4 << 20} {
		for _, down := range []int{0, 1} {
			b.Run(fmt.Sprintf("size=%dKiB/down=%d", size>>10, down), func(b *testing.B) {
				named, fs := members(2)
				s := open(b, 2, named, replicastore.Options{})
				defer s.Close()
				n := max(4, (32<<20)/size)
				var ids []cairn.ID
				for i := range n {
					id, data := storetest.Blob(uint64(i), size)
					if err := s.Put(bg, id, data); err != nil {
						b.Fatal(err)
					}
					ids = append(ids, id)
				}
				if err := s.Flush(bg); err != nil {
					b.Fatal(err)
				}
				if down == 1 {
					fs[0].SetDown(true)
				}
				for _, id := range ids[:4] {
					if _, err := s.Get(bg, id); err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					if _, err := s.Get(bg, ids[i%len(ids)]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
