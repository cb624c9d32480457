package pipeline

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// cpuMeter reports, besides wall-clock MB/s, the MB processed per second
// of CPU time over all threads ("MB/cpu-s"): a figure that does not depend
// on other load on the machine. Throughput on k idle cores is at most k
// times it.
type cpuMeter struct {
	cpu   time.Duration
	bytes int64
	start time.Duration
}

func (m *cpuMeter) begin()      { m.start = cpuTime() }
func (m *cpuMeter) end(n int64) { m.cpu += cpuTime() - m.start; m.bytes += n }
func (m *cpuMeter) report(b *testing.B) {
	if m.cpu > 0 {
		b.ReportMetric(float64(m.bytes)/1e6/m.cpu.Seconds(), "MB/cpu-s")
	}
}

const benchSize = 64 << 20

// benchWrite writes data into a fresh store each iteration, so every chunk
// is new (the full write path: chunk, hash, compress, encrypt, hash, Has,
// Put).
func benchWrite(b *testing.B, data []byte) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var stats WriteStats
	var m cpuMeter
	for b.Loop() {
		b.StopTimer()
		st := newMapStore()
		st.verify = false
		e := newEngine(b, st, nil)
		b.StartTimer()
		m.begin()
		var err error
		_, stats, err = e.Write(context.Background(), bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		m.end(int64(len(data)))
		b.StopTimer()
		e.Close()
		b.StartTimer()
	}
	m.report(b)
	b.ReportMetric(float64(stats.StoredBytes)/float64(stats.LogicalBytes), "stored/logical")
}

func BenchmarkWritePipeline(b *testing.B) { benchWrite(b, randomBytes(benchSize, 1)) }

func BenchmarkWriteCompressible(b *testing.B) { benchWrite(b, textBytes(benchSize, 1)) }

// BenchmarkWriteDuplicate writes data the engine has already put: the cost
// of recognising it (all the encoding, no Put, no Has).
func BenchmarkWriteDuplicate(b *testing.B) {
	data := randomBytes(benchSize, 1)
	st := newMapStore()
	e := newEngine(b, st, nil)
	if _, _, err := e.Write(context.Background(), bytes.NewReader(data)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var m cpuMeter
	for b.Loop() {
		m.begin()
		if _, _, err := e.Write(context.Background(), bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
		m.end(int64(len(data)))
	}
	m.report(b)
}

func benchRead(b *testing.B, data []byte) {
	st := newMapStore()
	e := newEngine(b, st, nil)
	refs, _, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var m cpuMeter
	for b.Loop() {
		m.begin()
		if err := e.Read(context.Background(), refs, io.Discard); err != nil {
			b.Fatal(err)
		}
		m.end(int64(len(data)))
	}
	m.report(b)
}

func BenchmarkReadPipeline(b *testing.B) { benchRead(b, randomBytes(benchSize, 1)) }

func BenchmarkReadCompressible(b *testing.B) { benchRead(b, textBytes(benchSize, 1)) }

func BenchmarkEncodeChunk(b *testing.B) {
	hp := newHasherPool(testConv)
	data := randomBytes(16<<10, 1)
	buf := make([]byte, 0, len(data)+Overhead)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		encodeChunk(hp, data, 0, buf)
	}
}

// BenchmarkWriteSmallFiles has 16 goroutines writing 48 KiB files
// concurrently through one engine (the shared worker pool).
func BenchmarkWriteSmallFiles(b *testing.B) {
	const writers, fileSize, files = 16, 48 << 10, 1024
	data := randomBytes(files*fileSize, 2)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var m cpuMeter
	for b.Loop() {
		b.StopTimer()
		st := newMapStore()
		st.verify = false
		e := newEngine(b, st, nil)
		b.StartTimer()
		m.begin()
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				for f := w; f < files; f += writers {
					if _, _, err := e.WriteBytes(context.Background(), data[f*fileSize:(f+1)*fileSize]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		m.end(int64(len(data)))
		b.StopTimer()
		e.Close()
		b.StartTimer()
	}
	m.report(b)
}

// BenchmarkEncodeDelta encodes a 32 KiB text chunk with a few bytes
// changed as a delta against its previous version, and decodes it.
func BenchmarkEncodeDelta(b *testing.B) {
	hp := newHasherPool(testConv)
	base := textBytes(32<<10, 1)
	plain := append([]byte(nil), base...)
	copy(plain[16<<10:], "a few changed bytes in the middle")
	bref, _, _ := encodeChunk(hp, base, 0, nil)
	b.SetBytes(int64(len(plain)))
	b.ReportAllocs()
	var size int
	for b.Loop() {
		ref, stored, ok := encodeDelta(hp, plain, bref, base)
		if !ok {
			b.Fatal("no delta")
		}
		size = len(stored)
		if _, err := DecodeDelta(ref, stored, base); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size), "stored-bytes")
}
