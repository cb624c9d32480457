package remotestore

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// The issue-3 figure: 100 MB of 16 KiB chunks over loopback (real TLS 1.3,
// HTTP/2), node backed by memory so the network path is what is measured.
const (
	benchChunk  = 16 << 10
	benchChunks = 100_000_000 / benchChunk // 6103 chunks, 100 MB
	benchWidth  = 64                       // calls in flight, as the file layer keeps them
)

type chunk struct {
	id   cairn.ID
	data []byte
}

func benchData() []chunk {
	cs := make([]chunk, benchChunks)
	for i := range cs {
		cs[i].id, cs[i].data = storetest.Blob(uint64(i), benchChunk)
	}
	return cs
}

// parallel runs fn on every chunk with benchWidth goroutines.
func parallel(b *testing.B, cs []chunk, fn func(c chunk) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range benchWidth {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(cs) {
					return
				}
				if err := fn(cs[i]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkPut100MB puts the 100 MB with a fresh client each round: new
// data (an empty node) and data the node already has, asked about first
// (the default), sent regardless (SendAlways), or after the caller's own
// Has (the write pipeline's way: Put then does not ask again). wire-MB/op
// is what the node received, TLS records included.
func BenchmarkPut100MB(b *testing.B) {
	cs := benchData()
	ids := make([]cairn.ID, len(cs))
	for i := range cs {
		ids[i] = cs[i].id
	}
	ctx := context.Background()
	full := memstore.New()
	for _, c := range cs {
		if err := full.Put(ctx, c.id, c.data); err != nil {
			b.Fatal(err)
		}
	}
	for _, bc := range []struct {
		name            string
		present, always bool
		hasFirst        bool
	}{
		{name: "new"},
		{name: "new/SendAlways", always: true},
		{name: "new/Has-first", hasFirst: true},
		{name: "present", present: true},
		{name: "present/SendAlways", present: true, always: true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRealm(b)
			var (
				addr string
				ln   *countingListener
			)
			if bc.present {
				addr, ln = r.serveWith(b, "node", nopClose{full}, nil)
			}
			b.SetBytes(int64(len(cs) * benchChunk))
			var (
				cpu       time.Duration
				wireBytes int64
			)
			for b.Loop() {
				b.StopTimer()
				if !bc.present {
					addr, ln = r.serveWith(b, "node", memstore.New(), nil)
				}
				cfg, err := pki.ClientTLS(r.creds(b, "laptop", pki.Device), pki.TLSOptions{Revocations: r.rev, Peer: pki.RequireNode("node")})
				if err != nil {
					b.Fatal(err)
				}
				s, err := New(Options{Addr: addr, TLS: cfg, SendAlways: bc.always})
				if err != nil {
					b.Fatal(err)
				}
				ln.received.Store(0)
				b.StartTimer()
				c0 := cpuTime()
				if bc.hasFirst {
					if _, err := s.Has(ctx, ids); err != nil {
						b.Fatal(err)
					}
				}
				parallel(b, cs, func(c chunk) error { return s.Put(ctx, c.id, c.data) })
				cpu += cpuTime() - c0
				b.StopTimer()
				wireBytes += ln.received.Load()
				s.Close()
				b.StartTimer()
			}
			reportCPU(b, cpuTime()-cpu, int64(len(cs)*benchChunk))
			b.ReportMetric(float64(wireBytes)/1e6/float64(b.N), "wire-MB/op")
		})
	}
}

// nopClose keeps a store open when the node serving it closes.
type nopClose struct{ cairn.Store }

func (nopClose) Close() error { return nil }

func BenchmarkGet100MB(b *testing.B) {
	cs := benchData()
	ctx := context.Background()
	for _, backend := range []string{"memstore", "localstore"} {
		b.Run(backend, func(b *testing.B) {
			var st cairn.Store = memstore.New()
			if backend == "localstore" {
				ls, err := localstore.Open(ctx, b.TempDir(), localstore.Options{NoSync: true})
				if err != nil {
					b.Fatal(err)
				}
				st = ls
			}
			for _, c := range cs {
				if err := st.Put(ctx, c.id, c.data); err != nil {
					b.Fatal(err)
				}
			}
			r := newRealm(b)
			addr := r.serve(b, "node", st)
			b.SetBytes(int64(len(cs) * benchChunk))
			cpu0 := cpuTime()
			for b.Loop() {
				// A fresh client each round: new connection, nothing cached.
				s := r.client(b, addr, "laptop", "node")
				parallel(b, cs, func(c chunk) error {
					_, err := s.Get(ctx, c.id)
					return err
				})
				s.Close()
			}
			reportCPU(b, cpu0, int64(len(cs)*benchChunk))
		})
	}
}

func BenchmarkHas100MB(b *testing.B) {
	cs := benchData()
	ids := make([]cairn.ID, len(cs))
	for i := range cs {
		ids[i] = cs[i].id
	}
	r := newRealm(b)
	addr := r.serve(b, "node", memstore.New())
	s := r.client(b, addr, "laptop", "node")
	defer s.Close()
	for b.Loop() {
		if _, err := s.Has(context.Background(), ids); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds MB per CPU-second (client and node together, as they share
// this process): the figure that machine load does not distort. With 2
// idle cores, wall-clock MB/s approaches twice it when both are busy.
func reportCPU(b *testing.B, cpu0 time.Duration, bytes int64) {
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(bytes)*float64(b.N)/1e6/cpu.Seconds(), "MB/cpu-s")
}
