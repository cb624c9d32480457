package localstore

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/storetest"
)

// directSizes returns object sizes that make batches end everywhere
// relative to block boundaries: exactly on one, just before and after, and
// at random places, small and large.
func directSizes(seed uint64, n int) []int {
	// The first record ends exactly at 4096: header 32 + record header 48.
	sizes := []int{4096 - packHeaderSize - recHeaderSize, 0, 1, 4096 - recHeaderSize - 1, 4096 - recHeaderSize + 1, 3 * 4096}
	r := rand.New(rand.NewPCG(seed, 7))
	for len(sizes) < n {
		switch r.IntN(4) {
		case 0:
			sizes = append(sizes, r.IntN(200))
		case 1:
			sizes = append(sizes, 70<<10+r.IntN(70<<10))
		default:
			sizes = append(sizes, r.IntN(20<<10))
		}
	}
	return sizes
}

// packFileChecks checks that the pack file holds exactly the records written
// so far: its size is the end of the last record and a scan from the header
// finds every record, intact, up to there.
func packFileChecks(t *testing.T, s *Store, wantRecords int) {
	t.Helper()
	s.mu.RLock()
	var p *pack
	for _, q := range s.packs {
		if q != nil && q.state == stateOwn {
			p = q
		}
	}
	var end int64
	if p != nil {
		end = p.end
	}
	s.mu.RUnlock()
	if p == nil {
		t.Fatal("no pack being written")
	}
	f, err := os.Open(s.packPath(p.id))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != end {
		t.Fatalf("pack file has %d bytes, records end at %d", fi.Size(), end)
	}
	if cerr := checkHeaderAt(f, p.id); cerr != nil {
		t.Fatal(cerr)
	}
	n := 0
	scanEnd, st, err := scanPack(f, packHeaderSize, fi.Size(), true, func(record) { n++ })
	if err != nil || st.bad != 0 || scanEnd != end || n != wantRecords {
		t.Fatalf("scan: end %d (want %d), %d records (want %d), %d bad, err %v", scanEnd, end, n, wantRecords, st.bad, err)
	}
}

// TestDirectAppend: with sync on, batches are appended with O_DIRECT, the
// partial last block rewritten by the next batch; the file never holds
// anything but the records, and everything reads back, before and after a
// reopen.
func TestDirectAppend(t *testing.T) {
	dir := t.TempDir()
	if !directWorks(t, dir) {
		t.Skip("no O_DIRECT here")
	}
	s := open(t, dir, Options{})
	var objs []obj
	for i, size := range directSizes(1, 60) {
		id, data := storetest.Blob(uint64(1000+i), size)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj{id, data})
		packFileChecks(t, s, len(objs))
		if i%7 == 0 {
			for _, o := range objs {
				mustGet(t, s, o)
			}
		}
	}
	if s.direct != directOn || s.directWrites == 0 { // the writer is done with these fields: Put returned
		t.Fatalf("direct state %d after %d direct writes", s.direct, s.directWrites)
	}
	// Concurrent Puts: batches of several records.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i, size := range directSizes(uint64(w+2), 40) {
				id, data := storetest.Blob(uint64(w+1)<<20|uint64(i), size)
				if err := s.Put(bg, id, data); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				objs = append(objs, obj{id, data})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Duplicated sizes make duplicate objects only by accident; count IDs.
	distinct := map[cairn.ID]bool{}
	for _, o := range objs {
		distinct[o.id] = true
	}
	packFileChecks(t, s, len(distinct))
	if err := s.Delete(bg, objs[3].id); err != nil { // a tombstone: 76 bytes
		t.Fatal(err)
	}
	packFileChecks(t, s, len(distinct)+1)
	direct := s.directWrites
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if direct == 0 {
		t.Fatal("no direct write")
	}
	s = open(t, dir, Options{})
	defer s.Close()
	for i, o := range objs {
		if o.id == objs[3].id {
			mustMissing(t, s, o.id)
		} else if i != 3 {
			mustGet(t, s, o)
		}
	}
	verifyClean(t, s)
}

// TestDirectRefused: a file system that takes O_DIRECT at open but refuses
// the writes (EINVAL) makes the store fall back to buffered writes, at the
// first direct write or later in a pack, without losing a record.
func TestDirectRefused(t *testing.T) {
	for _, after := range []int64{0, 3} {
		dir := t.TempDir()
		if !directWorks(t, dir) {
			t.Skip("no O_DIRECT here")
		}
		var writes atomic.Int64
		var logged bytes.Buffer // written by the writer goroutine; read after Close
		logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s := open(t, dir, Options{Logger: logger, testDirectWrite: func(f *os.File, b []byte, off int64) (int, error) {
			if writes.Add(1) > after {
				return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.EINVAL}
			}
			return f.WriteAt(b, off)
		}})
		var objs []obj
		for i, size := range directSizes(3, 40) {
			id, data := storetest.Blob(uint64(i), size)
			if err := s.Put(bg, id, data); err != nil {
				t.Fatalf("refused after %d: %v", after, err)
			}
			objs = append(objs, obj{id, data})
			packFileChecks(t, s, len(objs))
		}
		for _, o := range objs {
			mustGet(t, s, o)
		}
		if s.direct != directOff || s.directWrites != after {
			t.Fatalf("refused after %d: direct state %d, %d direct writes", after, s.direct, s.directWrites)
		}
		s.Close()
		if !strings.Contains(logged.String(), "level=DEBUG msg=\"O_DIRECT unavailable") {
			t.Errorf("refused after %d: no debug log of the fallback in\n%s", after, logged.String())
		}
		s = open(t, dir, Options{})
		for _, o := range objs {
			mustGet(t, s, o)
		}
		verifyClean(t, s)
		s.Close()
	}
}

// TestDirectWriteError: a direct write that fails (EIO) fails its batch and
// retires the pack, sealed at its last good record; later Puts go to a new
// pack.
func TestDirectWriteError(t *testing.T) {
	dir := t.TempDir()
	if !directWorks(t, dir) {
		t.Skip("no O_DIRECT here")
	}
	var fail atomic.Bool
	s := open(t, dir, Options{testDirectWrite: func(f *os.File, b []byte, off int64) (int, error) {
		if fail.Load() {
			// Half written, then the error, leaving garbage after it.
			half := len(b) / 2 &^ 4095
			f.WriteAt(b[:half], off)
			f.WriteAt(bytes.Repeat([]byte{0xee}, len(b)-half), off+int64(half))
			return half, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.EIO}
		}
		return f.WriteAt(b, off)
	}})
	before := putN(t, s, 1, 20, 5000)
	if s.direct != directOn {
		t.Fatalf("direct state %d", s.direct)
	}
	fail.Store(true)
	id, data := storetest.Blob(999, 50000)
	if err := s.Put(bg, id, data); cairn.KindOf(err) != cairn.IO {
		t.Fatalf("Put during a failing write: %v, want Kind IO", err)
	}
	fail.Store(false)
	after := putN(t, s, 100, 20, 5000)
	if n := len(files(t, dir, ".idx")); n != 1 {
		t.Fatalf("%d indexes, want the retired pack's", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, Options{})
	defer s.Close()
	for _, o := range append(before, after...) {
		mustGet(t, s, o)
	}
	mustMissing(t, s, id)
	verifyClean(t, s)
}

func TestAlignedBytes(t *testing.T) {
	for _, align := range []int{1, 512, 4096, 1 << 16} {
		for _, n := range []int{1, 100, 4096, 70000} {
			b := alignedBytes(n, align)
			if len(b) < n || len(b)%align != 0 || cap(b) != len(b) {
				t.Fatalf("alignedBytes(%d, %d): len %d cap %d", n, align, len(b), cap(b))
			}
			if addr := uintptrOf(b); addr%uintptr(align) != 0 {
				t.Fatalf("alignedBytes(%d, %d) at %#x", n, align, addr)
			}
		}
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// directWorks reports whether the file system under dir takes O_DIRECT
// writes; the tests of the direct path skip where it does not.
func directWorks(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	if err != nil {
		t.Logf("O_DIRECT refused at open: %v", err)
		return false
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.WriteAt(alignedBytes(64<<10, 64<<10), 0); err != nil {
		t.Logf("O_DIRECT write refused: %v", err)
		return false
	}
	return true
}

// TestDirectAppendSeenByOtherOpener: another process reading through the
// page cache sees each record as soon as the Put that wrote it with
// O_DIRECT returns, although it had cached the partial block that the
// direct write replaced.
func TestDirectAppendSeenByOtherOpener(t *testing.T) {
	dir := t.TempDir()
	if !directWorks(t, dir) {
		t.Skip("no O_DIRECT here")
	}
	a := open(t, dir, Options{})
	defer a.Close()
	b := open(t, dir, Options{})
	defer b.Close()
	r := rand.New(rand.NewPCG(5, 6))
	var objs []obj
	for i, size := range directSizes(9, 120) {
		id, data := storetest.Blob(uint64(5000+i), size)
		if err := a.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		o := obj{id, data}
		objs = append(objs, o)
		mustGet(t, b, o)
		mustGet(t, b, objs[r.IntN(len(objs))])
	}
	if a.directWrites == 0 {
		t.Fatal("A made no direct write")
	}
	verifyClean(t, b)
}
