package localstore

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// corpus is n distinct objects of size bytes: overlapping windows of one
// random buffer, so that a large n costs little memory.
type corpus struct {
	buf  []byte
	ids  []cairn.ID
	size int
}

const corpusStride = 64

func newCorpus(n, size int, seed uint64) *corpus {
	c := &corpus{buf: make([]byte, n*corpusStride+size), ids: make([]cairn.ID, n), size: size}
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	r.Read(c.buf)
	var wg sync.WaitGroup
	const workers = 4
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				c.ids[i] = blake3.Sum256(c.data(i))
			}
		})
	}
	wg.Wait()
	return c
}

func (c *corpus) data(i int) []byte { return c.buf[i*corpusStride : i*corpusStride+c.size] }

// BenchmarkLocalPut16K: 16 (or 64) writers put distinct 16 KiB objects. With
// sync, throughput grows with the writers: one fsync serves every request
// queued while the previous one ran. Without sync, a run longer than the
// kernel's dirty-page allowance (a few GB here) measures the disk, not the
// store: use -benchtime=60000x for ~1 GB.
func BenchmarkLocalPut16K(b *testing.B) {
	for _, tc := range []struct {
		name    string
		opts    Options
		writers int
	}{
		{"sync", Options{}, 16},
		{"sync-64writers", Options{}, 64},
		{"nosync", Options{NoSync: true}, 16},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := newCorpus(b.N, 16<<10, 1)
			s := open(b, b.TempDir(), tc.opts)
			defer s.Close()
			var next atomic.Int64
			b.SetBytes(16 << 10)
			b.SetParallelism(tc.writers / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(next.Add(1) - 1)
					if err := s.Put(bg, c.ids[i], c.data(i)); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkLocalPutSmall: 16 writers put distinct 100-byte objects with
// fsync; puts/s is the figure that matters.
func BenchmarkLocalPutSmall(b *testing.B) {
	c := newCorpus(b.N, 100, 2)
	s := open(b, b.TempDir(), Options{})
	defer s.Close()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := int(next.Add(1) - 1)
			if err := s.Put(bg, c.ids[i], c.data(i)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "puts/s")
}

// BenchmarkLocalGet16K: parallel reads of 16 KiB objects from the page cache,
// each verified (BLAKE3).
func BenchmarkLocalGet16K(b *testing.B) {
	const n = 20000
	c := newCorpus(n, 16<<10, 3)
	s := open(b, b.TempDir(), Options{NoSync: true})
	defer s.Close()
	for i := range n {
		if err := s.Put(bg, c.ids[i], c.data(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(16 << 10)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		for pb.Next() {
			if _, err := s.Get(bg, c.ids[r.IntN(n)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkLocalHas: batches of 1000 IDs, half present, against 1 M stored
// objects; ns/op is per batch, ns/id per ID.
func BenchmarkLocalHas(b *testing.B) {
	const n = 1 << 20
	const batch = 1000
	c := newCorpus(n, 64, 4)
	s := open(b, b.TempDir(), Options{NoSync: true})
	defer s.Close()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				if err := s.Put(bg, c.ids[i], c.data(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	absent := newCorpus(n, 64, 5)
	ids := make([]cairn.ID, batch)
	r := rand.New(rand.NewPCG(1, 2))
	b.ResetTimer()
	for range b.N {
		for j := range ids {
			if j%2 == 0 {
				ids[j] = c.ids[r.IntN(n)]
			} else {
				ids[j] = absent.ids[r.IntN(n)]
			}
		}
		found, err := s.Has(bg, ids)
		if err != nil || !found[0] || found[1] {
			b.Fatalf("Has = %v, %v", found[:2], err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/id")
}
