package pipeline

import (
	"math/bits"
	"sync"
)

// Buffers come from power-of-two size classes, from 256 B to 128 MiB, so a
// buffer for one chunk size serves any chunk up to twice as large.
const (
	minClass = 8
	maxClass = 27
)

var classes [maxClass + 1]sync.Pool

func class(n int) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len(uint(n - 1))
}

// getBuf returns a buffer of length n. Its backing array may be reused by a
// later getBuf once it is given back with putBuf.
func getBuf(n int) *[]byte {
	c := class(n)
	if c > maxClass {
		b := make([]byte, n)
		return &b
	}
	if p, ok := classes[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<c)
	return &b
}

// putBuf gives b back for reuse; the caller must not touch *b afterwards.
func putBuf(b *[]byte) {
	if b == nil {
		return
	}
	c := cap(*b)
	if c < 1<<minClass || c&(c-1) != 0 || c > 1<<maxClass {
		return // not one of ours
	}
	classes[bits.Len(uint(c))-1].Put(b)
}
