package packstore

import (
	"testing"
	"time"
)

// The span pool hands a buffer given back to the next get, keeps at most
// maxFree, releases the free ones once idle and at close, and releases
// what comes back after close.
func TestSpanPool(t *testing.T) {
	p := &spanPool{size: 1 << 20, maxFree: 2, idle: 50 * time.Millisecond}
	a, b, c := p.get(), p.get(), p.get()
	for _, x := range []*spanBuf{a, b, c} {
		if len(x.b) != 1<<20 {
			t.Fatalf("buffer of %d bytes, want %d", len(x.b), 1<<20)
		}
		x.b[0], x.b[len(x.b)-1] = 1, 2 // writable, end to end
	}
	p.put(a)
	if again := p.get(); again != a {
		t.Fatal("get after put did not reuse the buffer given back")
	}
	p.put(a)
	p.put(b)
	p.put(c) // beyond maxFree: released at once
	if c.b != nil {
		t.Fatal("a buffer beyond maxFree was kept")
	}
	p.mu.Lock()
	n := len(p.free)
	p.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d free buffers, want 2", n)
	}
	// Idle: released (trim releases under mu).
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n = len(p.free)
		gone := a.b == nil && b.b == nil
		p.mu.Unlock()
		if n == 0 && gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d free buffers still held long after the pool went idle", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Close releases the free ones, and what is given back later.
	d, e := p.get(), p.get()
	p.put(d)
	p.close()
	if d.b != nil {
		t.Fatal("close kept a free buffer")
	}
	p.put(e)
	if e.b != nil {
		t.Fatal("a buffer given back after close was kept")
	}
}
