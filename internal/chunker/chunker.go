// Package chunker splits a byte stream into content-defined chunks with
// FastCDC (Xia et al., USENIX ATC 2016; IEEE TPDS 2020): a gear rolling hash,
// cut-point skipping below the minimum size, and normalized chunking with two
// masks (a harder one before the average size, an easier one after it).
//
// The 256-entry gear table is derived from a 32-byte secret seed (a volume's
// volkey.Master.Gear), so chunk boundaries, and therefore the chunk sizes a
// store sees, cannot be computed without the seed. Two volumes with
// different seeds cut the same data at unrelated places.
package chunker

import (
	"errors"
	"fmt"
	"io"
	"math/bits"

	"cairn.dev/cairn/internal/cairn"
	"github.com/zeebo/blake3"
)

// Size limits accepted by Params.Validate.
const (
	DefaultAvg = 16 << 10 // default average chunk size
	LimitMin   = 256      // smallest allowed Min
	LimitAvgLo = 1 << 10  // smallest allowed Avg
	LimitMax   = 64 << 20 // largest allowed Max (and thus largest chunk)
)

// gearContext separates the gear table from anything else keyed by the seed.
const gearContext = "cairn v1 fastcdc gear table expansion"

// Params are the chunk size bounds in bytes. A zero field takes its default:
// Avg 16 KiB, Min Avg/4, Max Avg*8 (the LBFS 2K/8K/64K ratio).
type Params struct {
	Min, Avg, Max int
}

// DefaultParams returns Params{4 KiB, 16 KiB, 128 KiB}.
func DefaultParams() Params { return Params{}.WithDefaults() }

// WithDefaults fills zero fields with their defaults.
func (p Params) WithDefaults() Params {
	if p.Avg == 0 {
		p.Avg = DefaultAvg
	}
	if p.Min == 0 {
		p.Min = p.Avg / 4
	}
	if p.Max == 0 {
		p.Max = p.Avg * 8
	}
	return p
}

// Validate checks that Avg is a power of two in [1 KiB, 8 MiB], that
// LimitMin <= Min < Avg < Max <= LimitMax. It does not apply defaults.
func (p Params) Validate() error {
	bad := func(format string, args ...any) error {
		return cairn.E("chunker params", cairn.Invalid, fmt.Sprintf("min=%d avg=%d max=%d", p.Min, p.Avg, p.Max),
			fmt.Errorf(format, args...))
	}
	switch {
	case p.Avg < LimitAvgLo || p.Avg > LimitMax/8:
		return bad("average size must be in [%d, %d]", LimitAvgLo, LimitMax/8)
	case p.Avg&(p.Avg-1) != 0:
		return bad("average size must be a power of two")
	case p.Min < LimitMin:
		return bad("minimum size must be at least %d", LimitMin)
	case p.Min >= p.Avg:
		return bad("minimum size must be below the average size")
	case p.Max <= p.Avg:
		return bad("maximum size must be above the average size")
	case p.Max > LimitMax:
		return bad("maximum size must be at most %d", LimitMax)
	}
	return nil
}

// normalization is the FastCDC normalization level: the small-chunk mask has
// this many more one bits than log2(Avg), the large-chunk mask this many fewer.
const normalization = 2

// Cutter finds chunk boundaries. It is immutable after NewCutter and safe for
// concurrent use; build one per volume and share it.
type Cutter struct {
	gear         [256]uint64
	maskS, maskL uint64
	p            Params
}

// NewCutter returns a Cutter for the given seed and params (zero fields take
// their defaults). It fails with a cairn.Invalid error on bad params.
func NewCutter(seed [32]byte, p Params) (*Cutter, error) {
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	c := &Cutter{p: p}
	c.gear = GearTable(seed)
	b := bits.TrailingZeros(uint(p.Avg))
	c.maskS = topMask(b + normalization)
	c.maskL = topMask(b - normalization)
	return c, nil
}

// topMask returns n one bits ending at bit 62. The gear hash shifts left once
// per byte, so bit k of the fingerprint depends on the last k+1 bytes: high
// bits give each cut decision a window of about 64 bytes, low bits would give
// it only n. Bit 63 is left out so the mask can also be tested on a
// fingerprint shifted left by one.
func topMask(n int) uint64 {
	return ((uint64(1) << n) - 1) << (63 - n)
}

// GearTable expands seed into the 256 random 64-bit gear values with
// BLAKE3's keyed extendable output.
func GearTable(seed [32]byte) [256]uint64 {
	h, err := blake3.NewKeyed(seed[:])
	if err != nil {
		panic(err) // only for a key of the wrong length
	}
	h.WriteString(gearContext)
	var raw [256 * 8]byte
	if _, err := h.Digest().Read(raw[:]); err != nil {
		panic(err)
	}
	var g [256]uint64
	for i := range g {
		g[i] = uint64(raw[8*i]) | uint64(raw[8*i+1])<<8 | uint64(raw[8*i+2])<<16 | uint64(raw[8*i+3])<<24 |
			uint64(raw[8*i+4])<<32 | uint64(raw[8*i+5])<<40 | uint64(raw[8*i+6])<<48 | uint64(raw[8*i+7])<<56
	}
	return g
}

// Params returns the (defaulted, validated) params.
func (c *Cutter) Params() Params { return c.p }

// Cut returns the length of the first chunk of data, taking data as the rest
// of the stream: it returns len(data) when data is no longer than Min, or
// when no boundary is found before its end and it is shorter than Max. The
// result is at most Max and, unless data is shorter, at least Min.
func (c *Cutter) Cut(data []byte) int {
	n := len(data)
	if n <= c.p.Min {
		return n
	}
	if n > c.p.Max {
		n = c.p.Max
	}
	normal := c.p.Avg
	if n < normal {
		normal = n
	}
	i := c.p.Min
	fp, i, ok := c.scan(data[:normal], i, 0, c.maskS)
	if ok {
		return i
	}
	if _, i, ok = c.scan(data[:n], i, fp, c.maskL); ok {
		return i
	}
	return n
}

// scan rolls the gear hash over b[i:], starting from fingerprint fp, and
// returns the position just after the first byte at which fp&mask == 0.
// Otherwise it returns the fingerprint after the last byte, len(b), false.
//
// It takes two bytes per step (the "rolling two bytes" of FastCDC 2020)
// with the two table lookups added off the fingerprint's dependency chain:
//
//	fp1 = fp0<<1 + g[x]             (tested as fp1<<1 = fp0<<2 + g[x]<<1)
//	fp2 = fp1<<1 + g[y] = fp0<<2 + (g[x]<<1 + g[y])
//
// Testing fp1<<1 against mask<<1 is the same test because mask leaves bit 63
// clear.
func (c *Cutter) scan(b []byte, i int, fp, mask uint64) (uint64, int, bool) {
	if i >= len(b) {
		return fp, len(b), false
	}
	g := &c.gear
	mask2 := mask << 1
	s := b[i:]
	for len(s) >= 2 {
		gx, gy := g[s[0]]<<1, g[s[1]]
		s = s[2:]
		x := fp << 2
		if (x+gx)&mask2 == 0 {
			return 0, len(b) - len(s) - 1, true
		}
		fp = x + (gx + gy)
		if fp&mask == 0 {
			return 0, len(b) - len(s), true
		}
	}
	if len(s) == 1 {
		fp = fp<<1 + g[s[0]]
		if fp&mask == 0 {
			return 0, len(b), true
		}
	}
	return fp, len(b), false
}

// Chunker cuts the stream from an io.Reader into chunks.
type Chunker struct {
	c          *Cutter
	r          io.Reader
	buf        []byte
	start, end int
	eof        bool
	err        error
}

// New returns a Chunker reading r, with a new Cutter for seed and p.
func New(r io.Reader, seed [32]byte, p Params) (*Chunker, error) {
	c, err := NewCutter(seed, p)
	if err != nil {
		return nil, err
	}
	return c.NewChunker(r), nil
}

// bufSize is the read buffer size: at least two maximal chunks, so a refill
// moves at most half the buffer, and at least 1 MiB, so reads are large.
func (c *Cutter) bufSize() int { return max(2*c.p.Max, 1<<20) }

// NewChunker returns a Chunker reading r with c's boundaries.
func (c *Cutter) NewChunker(r io.Reader) *Chunker {
	return &Chunker{c: c, r: r}
}

// Reset makes ch read from r, keeping its buffer, so a pooled Chunker costs
// no allocation per stream.
func (ch *Chunker) Reset(r io.Reader) {
	ch.r, ch.start, ch.end, ch.eof, ch.err = r, 0, 0, false, nil
}

// Next returns the next chunk, or io.EOF after the last one. The returned
// slice aliases the Chunker's buffer: it is valid only until the next call
// to Next or Reset. A read error other than io.EOF is returned as is, and
// returned again by every later call.
func (ch *Chunker) Next() ([]byte, error) {
	if ch.err != nil {
		return nil, ch.err
	}
	if ch.end-ch.start < ch.c.p.Max && !ch.eof {
		if err := ch.fill(); err != nil {
			ch.err = err
			return nil, err
		}
	}
	if ch.start == ch.end {
		return nil, io.EOF
	}
	n := ch.c.Cut(ch.buf[ch.start:ch.end])
	chunk := ch.buf[ch.start : ch.start+n : ch.start+n]
	ch.start += n
	return chunk, nil
}

// fill moves the unread bytes to the front of the buffer and reads until
// the buffer is full or the reader reports EOF.
func (ch *Chunker) fill() error {
	if ch.buf == nil {
		ch.buf = make([]byte, ch.c.bufSize())
	}
	if ch.start > 0 {
		ch.end = copy(ch.buf, ch.buf[ch.start:ch.end])
		ch.start = 0
	}
	empty := 0
	for ch.end < len(ch.buf) {
		n, err := ch.r.Read(ch.buf[ch.end:])
		ch.end += n
		if errors.Is(err, io.EOF) {
			ch.eof = true
			return nil
		}
		if err != nil {
			return err
		}
		if n == 0 {
			if empty++; empty > 100 {
				return io.ErrNoProgress
			}
		}
	}
	return nil
}
