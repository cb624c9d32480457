package realm

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// dropCache empties the chunk cache (the next read is cold).
func (r *Realm) dropCache(t testing.TB) {
	r.dir().DropCache()
	if err := os.RemoveAll(filepath.Join(r.Home, cacheDir)); err != nil {
		t.Fatal(err)
	}
}

// Reading a 100 MB file another device holds, over loopback: cold (every
// chunk fetched from the writer's node into the chunk cache) and cached
// (nothing fetched). Issue 3: cold at least 300 MB/s; cached makes no
// transfer (fetched-B/op 0).
//
//	go test -run '^$' -bench RemoteRead -benchtime 5x ./internal/realm/
func BenchmarkRemoteRead(b *testing.B) {
	a, dev, _ := twoDevices(b, Options{})
	const size = 100 << 20
	data := make([]byte, size)
	rand.Read(data)
	writeFile(b, a, "big", data)
	b.Run("cold", func(b *testing.B) { benchRead(b, dev, size, true) })
	b.Run("cached", func(b *testing.B) {
		dev.dropCache(b)
		if _, _, err := readFile(dev, "big"); err != nil { // fill the cache, untimed
			b.Fatal(err)
		}
		benchRead(b, dev, size, false)
	})
}

func benchRead(b *testing.B, r *Realm, size int64, cold bool) {
	ctx := context.Background()
	v, err := r.Volume(ctx, DefaultVolume)
	if err != nil {
		b.Fatal(err)
	}
	e, err := v.Meta.Get(ctx, 1, "big")
	if err != nil {
		b.Fatal(err)
	}
	var fetched int64
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if cold {
			b.StopTimer()
			r.dropCache(b)
			b.StartTimer()
		}
		before := r.CacheStats().FetchedBytes
		if err := v.ReadFile(ctx, e, nil, io.Discard); err != nil {
			b.Fatal(err)
		}
		fetched += r.CacheStats().FetchedBytes - before
	}
	b.ReportMetric(float64(fetched)/float64(b.N), "fetched-B/op")
}
