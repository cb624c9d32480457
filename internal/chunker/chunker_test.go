package chunker

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"testing/iotest"

	"cairn.dev/cairn/internal/cairn"
)

func seedOf(b byte) [32]byte {
	var s [32]byte
	for i := range s {
		s[i] = b + byte(i)
	}
	return s
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// cutAll splits data with Cut alone.
func cutAll(c *Cutter, data []byte) []int {
	var sizes []int
	for len(data) > 0 {
		n := c.Cut(data)
		sizes = append(sizes, n)
		data = data[n:]
	}
	return sizes
}

// chunkAll splits the stream r with a Chunker and returns copies of the chunks.
func chunkAll(t testing.TB, ch *Chunker) [][]byte {
	t.Helper()
	var out [][]byte
	for {
		b, err := ch.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(b))
	}
}

func mustCutter(t testing.TB, seed [32]byte, p Params) *Cutter {
	t.Helper()
	c, err := NewCutter(seed, p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParams(t *testing.T) {
	if got, want := DefaultParams(), (Params{4 << 10, 16 << 10, 128 << 10}); got != want {
		t.Fatalf("DefaultParams = %+v, want %+v", got, want)
	}
	if got, want := (Params{Avg: 8 << 10}).WithDefaults(), (Params{2 << 10, 8 << 10, 64 << 10}); got != want {
		t.Fatalf("WithDefaults = %+v, want %+v", got, want)
	}
	bad := []Params{
		{Min: 4096, Avg: 12 << 10, Max: 64 << 10}, // not a power of two
		{Min: 256, Avg: 512, Max: 4096},           // avg too small
		{Min: 100, Avg: 1024, Max: 4096},          // min too small
		{Min: 8192, Avg: 8192, Max: 65536},        // min == avg
		{Min: 2048, Avg: 8192, Max: 8192},         // max == avg
		{Min: 1 << 20, Avg: 8 << 20, Max: 128 << 20},
		{Min: -1, Avg: 8192, Max: 65536},
	}
	for _, p := range bad {
		if err := p.Validate(); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want Invalid", p, err)
		}
		if _, err := NewCutter(seedOf(1), p); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("NewCutter(%+v) = %v, want Invalid", p, err)
		}
	}
	good := []Params{DefaultParams(), {Min: 256, Avg: 1024, Max: 2048}, {Min: 1 << 20, Avg: 8 << 20, Max: 64 << 20}}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
}

func TestGearTableKeyed(t *testing.T) {
	a, b := GearTable(seedOf(1)), GearTable(seedOf(1))
	if a != b {
		t.Fatal("same seed gave different tables")
	}
	c := GearTable(seedOf(2))
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same > 0 {
		t.Fatalf("tables of different seeds share %d entries", same)
	}
}

func TestDeterministicAndStreamMatchesCut(t *testing.T) {
	data := randomBytes(8<<20, 1)
	c := mustCutter(t, seedOf(1), Params{})
	want := cutAll(c, data)
	if again := cutAll(mustCutter(t, seedOf(1), Params{}), data); !equalInts(want, again) {
		t.Fatal("same seed, same data: different boundaries")
	}
	// The streaming Chunker, fed in odd-sized reads, finds the same chunks.
	ch := c.NewChunker(iotest.HalfReader(bytes.NewReader(data)))
	chunks := chunkAll(t, ch)
	if len(chunks) != len(want) {
		t.Fatalf("stream gave %d chunks, Cut %d", len(chunks), len(want))
	}
	var joined []byte
	for i, b := range chunks {
		if len(b) != want[i] {
			t.Fatalf("chunk %d: stream %d bytes, Cut %d", i, len(b), want[i])
		}
		joined = append(joined, b...)
	}
	if !bytes.Equal(joined, data) {
		t.Fatal("chunks do not reassemble the input")
	}
	// Reset reuses the Chunker for another stream.
	ch.Reset(bytes.NewReader(data[:1000]))
	if got := chunkAll(t, ch); len(got) != 1 || !bytes.Equal(got[0], data[:1000]) {
		t.Fatalf("after Reset: %d chunks", len(got))
	}
}

func TestSeedChangesBoundaries(t *testing.T) {
	data := randomBytes(4<<20, 2)
	a := boundaries(cutAll(mustCutter(t, seedOf(1), Params{}), data))
	b := boundaries(cutAll(mustCutter(t, seedOf(2), Params{}), data))
	common := 0
	for off := range a {
		if b[off] {
			common++
		}
	}
	// Only the end of the data is a forced common boundary; chance
	// coincidences are rare (about one in Avg per boundary).
	if common > 3 {
		t.Fatalf("different seeds share %d of %d boundaries", common, len(a))
	}
}

func boundaries(sizes []int) map[int]bool {
	m := make(map[int]bool, len(sizes))
	off := 0
	for _, n := range sizes {
		off += n
		m[off] = true
	}
	return m
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestMinMaxAndAverage(t *testing.T) {
	for _, p := range []Params{{}, {Avg: 8 << 10}, {Min: 256, Avg: 1024, Max: 4096}, {Avg: 64 << 10}} {
		c := mustCutter(t, seedOf(3), p)
		p = c.Params()
		data := randomBytes(32<<20, 3)
		sizes := cutAll(c, data)
		for i, n := range sizes {
			if n > p.Max || (n < p.Min && i != len(sizes)-1) {
				t.Fatalf("%+v: chunk %d has %d bytes", p, i, n)
			}
		}
		mean := float64(len(data)) / float64(len(sizes))
		if mean < 0.75*float64(p.Avg) || mean > 1.25*float64(p.Avg) {
			t.Errorf("%+v: mean chunk size %.0f, want within 25%% of %d", p, mean, p.Avg)
		}
		t.Logf("%+v: %d chunks, mean %.0f", p, len(sizes), mean)
	}
	// Constant data gives the same fingerprint sequence from every chunk
	// start, so it is cut periodically (at Max unless a cut happens early).
	c := mustCutter(t, seedOf(3), Params{})
	zeros := make([]byte, 1<<20)
	sizes := cutAll(c, zeros)
	for _, n := range sizes[:len(sizes)-1] {
		if n != sizes[0] {
			t.Fatalf("zeros cut unevenly: %v", sizes)
		}
	}
	// Short inputs are one chunk.
	for _, n := range []int{0, 1, c.Params().Min, c.Params().Min + 1} {
		if got := c.Cut(zeros[:n]); got != n {
			t.Errorf("Cut(%d bytes) = %d", n, got)
		}
	}
}

func TestInsertionIsLocal(t *testing.T) {
	c := mustCutter(t, seedOf(4), Params{})
	data := randomBytes(16<<20, 4)
	edited := make([]byte, 0, len(data)+100)
	mid := len(data) / 2
	edited = append(edited, data[:mid]...)
	edited = append(edited, randomBytes(100, 5)...)
	edited = append(edited, data[mid:]...)

	before := chunkSet(c, data)
	after := chunkSet(c, edited)
	changed := 0
	for k := range after {
		if !before[k] {
			changed++
		}
	}
	// The edit touches the chunk holding it and at most a couple of
	// neighbours until the boundaries resynchronise.
	if changed == 0 || changed > 3 {
		t.Fatalf("%d of %d chunks changed after a 100-byte insertion", changed, len(after))
	}
}

func chunkSet(c *Cutter, data []byte) map[string]bool {
	m := map[string]bool{}
	for len(data) > 0 {
		n := c.Cut(data)
		m[string(data[:n])] = true
		data = data[n:]
	}
	return m
}

type errReader struct{ n int }

func (r *errReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("disk on fire")
	}
	n := min(len(p), r.n)
	r.n -= n
	return n, nil
}

func TestReadError(t *testing.T) {
	c := mustCutter(t, seedOf(5), Params{})
	ch := c.NewChunker(&errReader{n: 10})
	if _, err := ch.Next(); err == nil || err.Error() != "disk on fire" {
		t.Fatalf("Next = %v, want the read error", err)
	}
	if _, err := ch.Next(); err == nil || err == io.EOF {
		t.Fatalf("second Next = %v, want the read error again", err)
	}
}

func BenchmarkCut(b *testing.B) {
	c := mustCutter(b, seedOf(6), Params{})
	data := randomBytes(64<<20, 6)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		d := data
		for len(d) > 0 {
			d = d[c.Cut(d):]
		}
	}
}

func BenchmarkChunker(b *testing.B) {
	c := mustCutter(b, seedOf(6), Params{})
	data := randomBytes(64<<20, 6)
	ch := c.NewChunker(nil)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		ch.Reset(bytes.NewReader(data))
		for {
			if _, err := ch.Next(); err != nil {
				break
			}
		}
	}
}

// refCut is FastCDC written the plain way, one byte per step, to check the
// two-bytes-per-step scan against.
func refCut(c *Cutter, data []byte) int {
	p := c.Params()
	n := len(data)
	if n <= p.Min {
		return n
	}
	n = min(n, p.Max)
	var fp uint64
	for i := p.Min; i < n; i++ {
		fp = fp<<1 + c.gear[data[i]]
		mask := c.maskL
		if i < p.Avg {
			mask = c.maskS
		}
		if fp&mask == 0 {
			return i + 1
		}
	}
	return n
}

func TestCutMatchesReference(t *testing.T) {
	for _, p := range []Params{{}, {Min: 256, Avg: 1024, Max: 4096}, {Min: 1001, Avg: 2048, Max: 3001}} {
		c := mustCutter(t, seedOf(7), p)
		data := randomBytes(4<<20, 7)
		for off := 0; off < len(data); {
			// Vary the window so odd and even lengths and starts occur.
			end := min(len(data), off+c.Params().Max+off%3)
			got, want := c.Cut(data[off:end]), refCut(c, data[off:end])
			if got != want {
				t.Fatalf("%+v at %d: Cut = %d, reference = %d", p, off, got, want)
			}
			off += got
		}
	}
}
