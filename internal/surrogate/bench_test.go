package surrogate

import (
	"crypto/rand"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// BenchmarkStageGet stages batches of 256 chunks of 16 KiB (cairn's
// average chunk) over loopback and reads each back, verified: the
// service's own cost, with no link delay.
func BenchmarkStageGet(b *testing.B) {
	f := start(b, func(c *Config) { c.Offer, c.Quota = 64<<20, 64<<20 })
	s, err := f.client("laptop").Register(b.Context(), 0)
	if err != nil {
		b.Fatal(err)
	}
	const n, size = 256, 16 << 10
	objs := make([]Object, n)
	for i := range objs {
		d := make([]byte, size)
		rand.Read(d)
		objs[i] = Object{ID: cairn.ID(blake3.Sum256(d)), Data: d}
	}
	b.SetBytes(2 * n * size)
	b.ResetTimer()
	for range b.N {
		if _, err := s.Stage(b.Context(), objs); err != nil {
			b.Fatal(err)
		}
		for _, o := range objs {
			if _, err := s.Get(b.Context(), o.ID); err != nil {
				b.Fatal(err)
			}
		}
		ids := make([]cairn.ID, n)
		for i, o := range objs {
			ids[i] = o.ID
		}
		if _, err := s.Unstage(b.Context(), ids); err != nil {
			b.Fatal(err)
		}
	}
}
