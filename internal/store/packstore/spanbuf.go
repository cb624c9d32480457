package packstore

import (
	"sync"
	"syscall"
	"time"
)

// spanPool keeps the buffers of read-ahead spans (readahead.go) for reuse.
// Each is an anonymous mapping outside the Go heap, with huge pages where
// the kernel gives them: a span buffer on the heap raised the garbage
// collector's target by its size, and garbage grew to match, so a 1 GiB
// get still touched ~300 MB of fresh memory with the spans reused (as
// localstore's large index tables, allocSlots). Buffers a Get still holds
// are never unmapped: only free ones are, when the pool is trimmed (idle
// for spanIdle, or over maxFree) or closed.
type spanPool struct {
	size    int
	maxFree int
	idle    time.Duration // spanIdle (tests shorten it)

	mu       sync.Mutex
	free     []*spanBuf
	lastUse  time.Time
	trimming bool
	closed   bool
}

// spanBuf is one buffer of the pool.
type spanBuf struct {
	b      []byte
	mapped bool // an anonymous mapping (else on the Go heap)
}

// spanIdle is how long free span buffers are kept after the last span
// read: a mount that read one large file does not hold them for good.
const spanIdle = 10 * time.Second

// get returns a buffer of p.size bytes.
func (p *spanPool) get() *spanBuf {
	p.mu.Lock()
	p.lastUse = time.Now()
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	b, err := syscall.Mmap(-1, 0, p.size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return &spanBuf{b: make([]byte, p.size)}
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
	return &spanBuf{b: b, mapped: true}
}

// put gives b back: nothing may touch its bytes afterwards.
func (p *spanPool) put(b *spanBuf) {
	p.mu.Lock()
	if p.closed || len(p.free) >= p.maxFree {
		p.mu.Unlock()
		b.release()
		return
	}
	p.free = append(p.free, b)
	if !p.trimming {
		p.trimming = true
		time.AfterFunc(p.idle, p.trim)
	}
	p.mu.Unlock()
}

// trim releases the free buffers once no span was read for p.idle.
func (p *spanPool) trim() {
	p.mu.Lock()
	if wait := p.idle - time.Since(p.lastUse); wait > 0 && !p.closed {
		time.AfterFunc(wait, p.trim)
		p.mu.Unlock()
		return
	}
	for _, b := range p.free {
		b.release() // under mu: rare, and the pool's state stays whole
	}
	p.free, p.trimming = nil, false
	p.mu.Unlock()
}

// close releases the free buffers; those given back later are released
// as they come.
func (p *spanPool) close() {
	p.mu.Lock()
	p.closed = true
	for _, b := range p.free {
		b.release()
	}
	p.free = nil
	p.mu.Unlock()
}

func (b *spanBuf) release() {
	if b.mapped {
		_ = syscall.Munmap(b.b)
	}
	b.b = nil
}
