package ecstore_test

import (
	"fmt"
	"testing"

	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// BenchmarkECRead reads objects through ec:2+2 over four memstores, from
// one goroutine, with every store up (down=0) and with s0, the holder of
// data shard 0, down (down=1): then every read fetches shards 1 and one
// parity shard and reconstructs shard 0. Objects of 16 KiB (the chunker's
// average chunk), 1 MiB and 4 MiB (packs, large chunks).
func BenchmarkECRead(b *testing.B) {
	for _, size := range []int{16 << 10, 1 << 20, 4 << 20} {
		for _, down := range []int{0, 1} {
			b.Run(fmt.Sprintf("size=%dKiB/down=%d", size>>10, down), func(b *testing.B) {
				c := newCluster(4)
				s := openEC(b, 2, 2, c.named(), ecstore.Options{})
				defer s.Close()
				n := max(4, (32<<20)/size)
				blobs := putSome(b, s, 0, 0)
				for i := range n {
					id, data := storetest.Blob(uint64(i), size)
					if err := s.Put(bg, id, data); err != nil {
						b.Fatal(err)
					}
					blobs = append(blobs, blob{id, data})
				}
				flush(b, s)
				if down == 1 {
					c.down(true, 0)
				}
				// Warm up: every member measured, s0 known down.
				for _, x := range blobs[:4] {
					mustGet(b, s, x.id, x.data)
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					x := blobs[i%len(blobs)]
					if _, err := s.Get(bg, x.id); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if down == 1 && c.fs[0].Calls().Gets > 8 {
					b.Fatalf("reads kept asking the down store (%d Gets)", c.fs[0].Calls().Gets)
				}
			})
		}
	}
}

// BenchmarkECPut writes objects through ec:2+2 over four memstores and
// waits for every shard (Flush), from one goroutine.
func BenchmarkECPut(b *testing.B) {
	for _, size := range []int{16 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			c := newCluster(4)
			s := openEC(b, 2, 2, c.named(), ecstore.Options{})
			defer s.Close()
			blobs := make([]blob, 64)
			for i := range blobs {
				blobs[i].id, blobs[i].data = storetest.Blob(uint64(i), size)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				x := blobs[i%len(blobs)]
				if err := s.Put(bg, x.id, x.data); err != nil {
					b.Fatal(err)
				}
			}
			flush(b, s)
		})
	}
}

// BenchmarkECGetRange reads 16 KiB ranges at spread offsets of a 16 MiB
// object (a pack, as packstore reads it) through ec:2+2 over four
// memstores, with every store up and with s0 (data shard 0) down: then
// ranges in the first half are rebuilt from the same bytes of shard 1 and
// a parity shard.
func BenchmarkECGetRange(b *testing.B) {
	const size, n = 16 << 20, 16 << 10
	for _, down := range []int{0, 1} {
		b.Run(fmt.Sprintf("down=%d", down), func(b *testing.B) {
			c := newCluster(4)
			s := openEC(b, 2, 2, c.named(), ecstore.Options{})
			defer s.Close()
			id, data := storetest.Blob(1, size)
			if err := s.Put(bg, id, data); err != nil {
				b.Fatal(err)
			}
			flush(b, s)
			if down == 1 {
				c.down(true, 0)
			}
			for i := range 4 {
				if _, err := s.GetRange(bg, id, int64(i)*n, n); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(n)
			b.ResetTimer()
			for i := range b.N {
				off := int64(i) * 7919 * 4096 % (size - n)
				got, err := s.GetRange(bg, id, off, n)
				if err != nil {
					b.Fatal(err)
				}
				if i < 8 && string(got) != string(data[off:off+n]) {
					b.Fatal("wrong bytes")
				}
			}
		})
	}
}
