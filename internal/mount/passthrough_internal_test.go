package mount

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// TestHarvestWhileClosing: harvest (from a utime by path, which holds no
// reference to the copy: git clone's copy of each file, cp -p) runs while
// the copy's last reference goes (the kernel's release after the close),
// which closes its file. It neither fails (it failed with ENOENT: the
// descriptor's number was gone when the copy's mtime was armed through
// /proc/self/fd) nor arms another file that got the descriptor's number.
func TestHarvestWhileClosing(t *testing.T) {
	cache, m := testCache(t)
	c, err := cache.newWork(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.f.WriteString("committed"); err != nil {
		t.Fatal(err)
	}
	// A clean copy: its last reference closes its file and keeps it, a
	// new one opens it again.
	k := cacheKey{1, cairn.ID{1}}
	c.size, c.version, c.manifest, c.ptw = 9, true, k.manifest, true
	cache.adopt(c, k)
	if !c.cached {
		t.Fatal("the copy was not adopted")
	}
	// Opened right after each close, it gets the number the copy had.
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("another file"), 0o600); err != nil {
		t.Fatal(err)
	}
	was := time.Unix(1_500_000_000, 0)
	if err := os.Chtimes(other, was, was); err != nil {
		t.Fatal(err)
	}

	const rounds = 20000
	done := make(chan error, 1)
	go func() {
		for range rounds {
			cache.unref(c) // the release: closes the file
			if f, err := os.Open(other); err == nil {
				f.Close()
			}
			if err := cache.ref(c); err != nil { // the next open
				done <- err
				return
			}
		}
		done <- nil
	}()
	// Every harvest until the closes are done; another file armed is
	// seen by its mtime, and set back.
	var fails, armed, harvests int
	var first error
	for finished := false; !finished; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			finished = true
		default:
		}
		c.wmu.Lock()
		err := m.harvest(c)
		c.wmu.Unlock()
		harvests++
		if err != nil {
			fails++
			first = cmp.Or(first, err)
		}
		if fi, err := os.Stat(other); err != nil {
			t.Fatal(err)
		} else if !fi.ModTime().Equal(was) {
			armed++
			os.Chtimes(other, was, was)
		}
	}
	if fails > 0 || armed > 0 {
		t.Fatalf("%d harvests while the copy was closed and opened %d times: %d failed (first: %v), %d armed another file", harvests, rounds, fails, first, armed)
	}
	t.Logf("%d harvests while the copy was closed and opened %d times", harvests, rounds)
}

// TestOpenPTWhileReleasing: an open that shares the kernel's backing copy
// of a file while the copy's last handle is released (an empty file
// just created and closed: its work copy, holding nothing, is removed
// at its last reference) gets it open, or, once it is let go, a copy of
// its own; it never fails.
func TestOpenPTWhileReleasing(t *testing.T) {
	cache, m := testCache(t)
	ctx := context.Background()
	e := &meta.Entry{Ino: 1, Type: meta.TypeFile}
	const rounds = 20000
	var fails int
	var first error
	for range rounds {
		n := &node{m: m, ino: 1, typ: meta.TypeFile, nodeState: &nodeState{}}
		c, err := cache.newWork(1)
		if err != nil {
			t.Fatal(err)
		}
		// The handle that created it, registered as the inode's backing
		// file, is being released.
		n.pt, n.ptHandles, n.ptID, n.content = c, 1, 7, c
		released := &handle{n: n, c: c, pt: true}
		start, done := make(chan struct{}), make(chan struct{})
		go func() {
			<-start
			released.drop(ctx)
			// go-fuse then lets the registration go (backing.
			// UnregisterBackingFd).
			n.mu.Lock()
			if n.ptID = 0; n.ptHandles == 0 {
				n.pt = nil
			}
			n.mu.Unlock()
			close(done)
		}()
		close(start)
		h, err := n.openPT(ctx, e, syscall.O_RDONLY)
		<-done
		if err != nil {
			fails++
			first = cmp.Or(first, err)
			continue
		}
		if h.c.file() == nil {
			t.Fatal("the open got a closed copy")
		}
		h.drop(ctx)
	}
	if fails > 0 {
		t.Fatalf("%d of %d opens failed (first: %v)", fails, rounds, first)
	}
}

// testCache opens a whole-file cache in a temporary directory (closed at
// cleanup) and a Mount that has only it.
func testCache(t *testing.T) (*diskCache, *Mount) {
	t.Helper()
	cache, err := openCache(t.TempDir(), 1<<30, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.close)
	return cache, &Mount{cache: cache}
}
