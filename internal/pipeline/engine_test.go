package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/chunker"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/store"
)

var testGear = [32]byte{0x6e, 0xa2}

func newEngine(t testing.TB, st cairn.Store, mod func(*Config)) *Engine {
	t.Helper()
	cfg := Config{Conv: testConv, Gear: testGear}
	if mod != nil {
		mod(&cfg)
	}
	e, err := New(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func readAll(t testing.TB, e *Engine, refs []manifest.Ref) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := e.Read(context.Background(), refs, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func checkStats(t testing.TB, s WriteStats, refs []manifest.Ref, n int) {
	t.Helper()
	if s.LogicalBytes != int64(n) || s.Chunks != len(refs) || s.NewChunks+s.DupChunks != s.Chunks {
		t.Fatalf("stats %+v for %d bytes in %d refs", s, n, len(refs))
	}
	var sum int64
	for _, r := range refs {
		sum += int64(r.Size)
	}
	if sum != int64(n) {
		t.Fatalf("refs sum to %d bytes, input had %d", sum, n)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Params: chunker.Params{Avg: 3000}},
		{Workers: -1},
		{HasBatch: -5},
		{Params: chunker.Params{Min: 1 << 20, Avg: 4 << 20, Max: 128 << 20}},
	}
	for _, c := range bad {
		if _, err := New(c, newMapStore()); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want Invalid", c, err)
		}
	}
	if _, err := New(Config{}, nil); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("New(nil store) = %v, want Invalid", err)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, nil)
	max := e.Params().Max
	cases := map[string][]byte{
		"empty":        nil,
		"one byte":     {7},
		"exactly max":  randomBytes(max, 1),
		"max plus one": randomBytes(max+1, 2),
		"random 8M":    randomBytes(8<<20, 3),
		"text 8M":      textBytes(8<<20, 4),
	}
	for name, data := range cases {
		refs, stats, err := e.Write(context.Background(), bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		checkStats(t, stats, refs, len(data))
		if got := readAll(t, e, refs); !bytes.Equal(got, data) {
			t.Fatalf("%s: read back %d bytes that differ", name, len(got))
		}
		// WriteBytes cuts the same chunks.
		refs2, _, err := e.WriteBytes(context.Background(), data)
		if err != nil {
			t.Fatalf("%s: WriteBytes: %v", name, err)
		}
		if fmt.Sprint(refs2) != fmt.Sprint(refs) {
			t.Fatalf("%s: WriteBytes and Write gave different refs", name)
		}
		switch name {
		case "random 8M":
			if stats.CompressedChunks != 0 || stats.StoredBytes != stats.LogicalBytes+int64(Overhead*stats.Chunks) {
				t.Fatalf("random data: %+v", stats)
			}
		case "text 8M":
			if stats.CompressedChunks != stats.Chunks || stats.StoredBytes > stats.LogicalBytes/2 {
				t.Fatalf("text: %+v", stats)
			}
		}
	}
}

func TestWriteDedup(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, nil)
	data := randomBytes(6<<20, 5)
	refs, s1, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if s1.NewChunks != s1.Chunks || s1.NewStoredBytes != s1.StoredBytes || st.puts.Load() != int64(s1.Chunks) {
		t.Fatalf("first write: %+v, %d puts", s1, st.puts.Load())
	}
	puts, hasIDs := st.puts.Load(), st.hasIDs.Load()

	// The same data again through the same engine: nothing put, and the
	// store is not even asked (the engine remembers what it put).
	refs2, s2, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(refs2) != fmt.Sprint(refs) {
		t.Fatal("same data, different refs")
	}
	if s2.NewChunks != 0 || s2.DupChunks != s2.Chunks || s2.DupBytes != int64(len(data)) || st.puts.Load() != puts {
		t.Fatalf("second write: %+v, %d new puts", s2, st.puts.Load()-puts)
	}
	if st.hasIDs.Load() != hasIDs {
		t.Fatalf("second write asked the store about %d ids", st.hasIDs.Load()-hasIDs)
	}

	// A fresh engine (another process) asks the store, in batches, and
	// puts nothing.
	e2 := newEngine(t, st, func(c *Config) { c.HasBatch = 64 })
	calls := st.hasCall.Load()
	_, s3, err := e2.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if s3.NewChunks != 0 || st.puts.Load() != puts {
		t.Fatalf("fresh engine: %+v", s3)
	}
	if got, max := st.hasCall.Load()-calls, int64((s3.Chunks+63)/64); got > max {
		t.Fatalf("fresh engine made %d Has calls for %d chunks, want <= %d", got, s3.Chunks, max)
	}

	// An edit in the middle puts only the chunks near it.
	edited := append(append(bytes.Clone(data[:3<<20]), "an insertion"...), data[3<<20:]...)
	_, s4, err := e.Write(context.Background(), bytes.NewReader(edited))
	if err != nil {
		t.Fatal(err)
	}
	if s4.NewChunks == 0 || s4.NewChunks > 3 {
		t.Fatalf("edit: %d new chunks of %d", s4.NewChunks, s4.Chunks)
	}

	// Repeated content inside one Write is put once.
	block := randomBytes(256<<10, 6)
	var rep []byte
	for range 8 {
		rep = append(rep, block...)
	}
	st2 := newMapStore()
	e3 := newEngine(t, st2, nil)
	_, s5, err := e3.Write(context.Background(), bytes.NewReader(rep))
	if err != nil {
		t.Fatal(err)
	}
	if s5.NewChunks >= s5.Chunks/4 || int(st2.puts.Load()) != s5.NewChunks || st2.len() != s5.NewChunks {
		t.Fatalf("repeated blocks: %+v, %d puts, %d objects", s5, st2.puts.Load(), st2.len())
	}
}

func TestReadDetectsDamage(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, nil)
	data := textBytes(1<<20, 7)
	refs, _, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	victim := refs[len(refs)/2]
	orig, _ := st.Get(context.Background(), victim.ID)
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		bad := bytes.Clone(orig)
		bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
		st.set(victim.ID, bad)
		rerr := e.Read(context.Background(), refs, io.Discard)
		if !errors.Is(rerr, cairn.ErrCorrupt) || !strings.Contains(rerr.Error(), victim.ID.Short()) {
			t.Fatalf("damaged chunk: %v, want Corrupt naming %s", rerr, victim.ID.Short())
		}
	}
	st.set(victim.ID, orig[:len(orig)-1])
	if rerr := e.Read(context.Background(), refs, io.Discard); !errors.Is(rerr, cairn.ErrCorrupt) {
		t.Fatalf("truncated chunk: %v", rerr)
	}
	st.Delete(context.Background(), victim.ID)
	err = e.Read(context.Background(), refs, io.Discard)
	if !errors.Is(err, cairn.ErrNotFound) || !strings.Contains(err.Error(), victim.ID.Short()) {
		t.Fatalf("missing chunk: %v, want NotFound naming %s", err, victim.ID.Short())
	}
	// The ranges that do not touch the missing chunk still read.
	var off int64
	for _, r := range refs[:len(refs)/2] {
		off += int64(r.Size)
	}
	var buf bytes.Buffer
	if err := e.ReadRange(context.Background(), refs, 0, off, &buf); err != nil || !bytes.Equal(buf.Bytes(), data[:off]) {
		t.Fatalf("range before the missing chunk: %v", err)
	}
}

func TestReadRange(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, func(c *Config) { c.Params = chunker.Params{Avg: 4 << 10} })
	data := randomBytes(1<<20, 8)
	refs, _, err := e.WriteBytes(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	n := int64(len(data))
	cases := [][2]int64{{0, 0}, {0, n}, {0, 1}, {n - 1, 1}, {n, 10}, {n + 5, 10}, {n - 3, 100}, {5, 1<<63 - 1}}
	for range 100 {
		cases = append(cases, [2]int64{r.Int64N(n), r.Int64N(64 << 10)})
	}
	for _, c := range cases {
		gets := st.gets.Load()
		var buf bytes.Buffer
		if err := e.ReadRange(context.Background(), refs, c[0], c[1], &buf); err != nil {
			t.Fatalf("ReadRange(%d, %d): %v", c[0], c[1], err)
		}
		lo, hi := min(c[0], n), min(n, c[0]+min(c[1], n))
		if !bytes.Equal(buf.Bytes(), data[lo:hi]) {
			t.Fatalf("ReadRange(%d, %d): %d bytes, want data[%d:%d]", c[0], c[1], buf.Len(), lo, hi)
		}
		// Only overlapping chunks are fetched.
		want, pos := 0, int64(0)
		for _, ref := range refs {
			if pos < hi && pos+int64(ref.Size) > lo {
				want++
			}
			pos += int64(ref.Size)
		}
		if got := st.gets.Load() - gets; got != int64(want) {
			t.Fatalf("ReadRange(%d, %d) fetched %d chunks, want %d", c[0], c[1], got, want)
		}
	}
	if err := e.ReadRange(context.Background(), refs, -1, 5, io.Discard); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("negative offset: %v", err)
	}
}

func TestConcurrentWrites(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, func(c *Config) { c.Params = chunker.Params{Avg: 1 << 10} })
	shared := randomBytes(64<<10, 9)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Go(func() {
			// Each file: a private part and a part every file shares.
			data := append(randomBytes(10<<10+g*997, uint64(100+g)), shared...)
			if g%2 == 0 {
				data = append(textBytes(20<<10, uint64(g)), data...)
			}
			refs, stats, err := e.Write(context.Background(), bytes.NewReader(data))
			if err != nil {
				errs <- err
				return
			}
			if stats.LogicalBytes != int64(len(data)) {
				errs <- fmt.Errorf("writer %d: %+v", g, stats)
				return
			}
			var buf bytes.Buffer
			if err := e.Read(context.Background(), refs, &buf); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(buf.Bytes(), data) {
				errs <- fmt.Errorf("writer %d: read back differs", g)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestWriteErrors(t *testing.T) {
	// A failing reader.
	e := newEngine(t, newMapStore(), nil)
	r := io.MultiReader(bytes.NewReader(randomBytes(1<<20, 10)), iotestErrReader{errors.New("disk on fire")})
	if _, _, err := e.Write(context.Background(), r); !errors.Is(err, cairn.ErrIO) || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("failing reader: %v, want IO", err)
	}

	// A failing store.
	st := newMapStore()
	st.putErr = cairn.E("put", cairn.Unavailable, "", errors.New("store down"))
	e2 := newEngine(t, st, nil)
	if _, _, err := e2.Write(context.Background(), bytes.NewReader(randomBytes(4<<20, 11))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("failing store: %v, want Unavailable", err)
	}

	// A canceled context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := e.Write(ctx, bytes.NewReader(randomBytes(4<<20, 12))); !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v, want Canceled", err)
	}
	if err := e.Read(ctx, []manifest.Ref{{}}, io.Discard); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("canceled read: %v, want Canceled", err)
	}

	// A closed engine.
	e.Close()
	if _, _, err := e.Write(context.Background(), bytes.NewReader([]byte("x"))); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("closed engine: %v, want Unavailable", err)
	}
}

type iotestErrReader struct{ err error }

func (r iotestErrReader) Read([]byte) (int, error) { return 0, r.err }

// nullStore keeps only IDs, so a large Write's memory is the pipeline's own.
type nullStore struct {
	mapStore
	mu  sync.Mutex
	ids map[cairn.ID]bool
	n   atomic.Int64
}

func (s *nullStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	time.Sleep(10 * time.Microsecond) // a store slower than the pipeline
	s.mu.Lock()
	s.ids[id] = true
	s.mu.Unlock()
	s.n.Add(int64(len(data)))
	return nil
}

func (s *nullStore) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := make([]bool, len(ids))
	for i, id := range ids {
		found[i] = s.ids[id]
	}
	return found, nil
}

// genReader yields n pseudo-random bytes without holding them.
type genReader struct {
	r *rand.ChaCha8
	n int64
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.n {
		p = p[:g.n]
	}
	g.r.Read(p)
	g.n -= int64(len(p))
	return len(p), nil
}

func TestWriteMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 256 MiB")
	}
	st := &nullStore{ids: map[cairn.ID]bool{}}
	e := newEngine(t, st, nil)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
		}
	}()
	const size = 256 << 20
	_, stats, err := e.Write(context.Background(), &genReader{r: rand.NewChaCha8([32]byte{1}), n: size})
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	if stats.LogicalBytes != size || st.n.Load() != stats.NewStoredBytes {
		t.Fatalf("stats %+v, store got %d bytes", stats, st.n.Load())
	}
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("peak heap in use grew by %d MiB while writing %d MiB", grew>>20, size>>20)
	if grew > 128<<20 {
		t.Fatalf("heap grew by %d MiB while writing %d MiB: the window does not bound memory", grew>>20, size>>20)
	}
}

// Refs names the chunks WriteBytes stores, and stores nothing.
func TestRefsWithoutStoring(t *testing.T) {
	st := newMapStore()
	e := newEngine(t, st, nil)
	for name, data := range map[string][]byte{
		"empty": nil, "small": {1, 2, 3}, "random 1M": randomBytes(1<<20, 9), "text 1M": textBytes(1<<20, 10),
	} {
		before := st.len()
		planned := e.Refs(data)
		if n := st.len() - before; n != 0 {
			t.Fatalf("%s: Refs stored %d objects", name, n)
		}
		refs, _, err := e.WriteBytes(context.Background(), data)
		if err != nil {
			t.Fatal(err)
		}
		if len(planned) != len(refs) {
			t.Fatalf("%s: Refs gave %d refs, WriteBytes %d", name, len(planned), len(refs))
		}
		for i := range refs {
			if planned[i] != refs[i] {
				t.Fatalf("%s: ref %d differs", name, i)
			}
		}
		e.Forget()
	}
}

// A small file edited in the middle: WriteDelta stores the changed chunk
// as a delta against the old chunk at its place, far smaller than its
// plain encoding, and Read (and ReadRange, and Plaintexts) decode it.
func TestWriteDelta(t *testing.T) {
	ctx := context.Background()
	st := newMapStore()
	e := newEngine(t, st, func(c *Config) { c.Params = chunker.Params{Min: 4096, Avg: 16384, Max: 131072} })
	old := textBytes(40<<10, 1)
	oldRefs, _, err := e.WriteBytes(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if len(oldRefs) < 2 {
		t.Fatalf("test setup: old file has %d chunks, want several", len(oldRefs))
	}
	edited := append(bytes.Clone(old[:20<<10]), []byte("an inserted line of new text.\n")...)
	edited = append(edited, old[20<<10:]...)
	edited[30<<10] ^= 0x20
	plain := e.Refs(edited)
	hints := make([]Hint, len(plain))
	basePlain, err := e.Plaintexts(ctx, oldRefs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range hints {
		j := min(i, len(oldRefs)-1)
		hints[i].Base, hints[i].BasePlain = &oldRefs[j], basePlain[j]
	}
	refs, ws, err := e.WriteDelta(ctx, edited, plain, hints)
	if err != nil {
		t.Fatal(err)
	}
	checkStats(t, ws, refs, len(edited))
	if ws.DeltaChunks == 0 {
		t.Fatalf("no delta chunk: %+v", ws)
	}
	var plainStored int64
	for i, r := range refs {
		if r.Key != plain[i].Key || r.Size != plain[i].Size {
			t.Fatalf("chunk %d: key or size differs from the plain ref", i)
		}
		_, enc := EncodeChunk(testConv, edited[sumSizes(plain[:i]):sumSizes(plain[:i+1])])
		plainStored += int64(len(enc))
	}
	if ws.NewStoredBytes*10 > plainStored {
		t.Fatalf("delta write stored %d bytes, the plain chunks take %d", ws.NewStoredBytes, plainStored)
	}
	if got := readAll(t, e, refs); !bytes.Equal(got, edited) {
		t.Fatal("read back differs")
	}
	var buf bytes.Buffer
	if rerr := e.ReadRange(ctx, refs, 20<<10, 100, &buf); rerr != nil || !bytes.Equal(buf.Bytes(), edited[20<<10:20<<10+100]) {
		t.Fatalf("range read: %v", rerr)
	}
	got, err := e.Plaintexts(ctx, refs)
	if err != nil || !bytes.Equal(bytes.Join(got, nil), edited) {
		t.Fatalf("plaintexts: %v", err)
	}
	// The ref names the base: without it, or with a wrong one, decoding fails.
	for _, r := range refs {
		if r.Base == nil {
			continue
		}
		stored, _ := st.Get(ctx, r.ID)
		if _, err := DecodeChunk(r, stored); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("delta decoded without its base: %v", err)
		}
		noBase := r
		noBase.Base = nil
		if _, err := DecodeChunk(noBase, stored); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("delta decoded with a ref that names no base: %v", err)
		}
		// Another stored plain chunk as the base: it decodes (or not) to
		// content that does not match the chunk key.
		wrong := oldRefs[0]
		if wrong.ID == r.Base.ID {
			wrong = oldRefs[1]
		}
		bad := []manifest.Ref{r}
		bad[0].Base = &wrong
		if err := e.Read(ctx, bad, io.Discard); err == nil {
			t.Fatal("delta read against the wrong base")
		}
		if st.Delete(ctx, r.Base.ID); e.Read(ctx, refs, io.Discard) == nil {
			t.Fatal("delta read without its base in the store")
		}
		break
	}
}

func sumSizes(refs []manifest.Ref) int {
	n := 0
	for _, r := range refs {
		n += int(r.Size)
	}
	return n
}

// gatedStore holds each Put until the test lets it go.
type gatedStore struct {
	*mapStore
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	g.entered <- struct{}{}
	<-g.release
	return g.mapStore.Put(ctx, id, data)
}

// A Put that returns after a Forget (a garbage collection ran meanwhile
// and may have deleted what it stored before) leaves no trace in the set
// of IDs the engine trusts: the next Write asks the store again and
// stores the object again if it is gone (TestPutWhileGC lost chunks so).
func TestForgetDuringPut(t *testing.T) {
	ctx := context.Background()
	inner := newMapStore()
	g := &gatedStore{mapStore: inner, entered: make(chan struct{}, 16), release: make(chan struct{})}
	e := newEngine(t, g, nil)
	data := randomBytes(4<<10, 3) // one chunk
	done := make(chan error, 1)
	go func() {
		_, _, err := e.WriteBytes(ctx, data)
		done <- err
	}()
	<-g.entered
	e.Forget()
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The collection deleted the object; the next write must put it back.
	refs := e.Refs(data)
	if err := inner.Delete(ctx, refs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, ws, err := e.WriteBytes(ctx, data); err != nil || ws.NewChunks != 1 {
		t.Fatalf("write after the object was collected: %d new chunks, %v; want 1", ws.NewChunks, err)
	}
	if ok, _ := inner.Has(ctx, []cairn.ID{refs[0].ID}); !ok[0] {
		t.Fatal("the object is not back in the store")
	}
}

// A delta decoded against the wrong base (a manifest naming another base
// of the same size) gives other bytes without any decoding error; the
// engine's DecodeDelta (fsck's) catches it by the chunk key.
func TestDecodeDeltaWrongBase(t *testing.T) {
	e := newEngine(t, newMapStore(), nil)
	base := textBytes(8<<10, 4)
	plain := append([]byte(nil), base...)
	copy(plain[4000:], "an edit")
	bref, _, _ := encodeChunk(e.hp, base, 0, nil)
	ref, stored, ok := encodeDelta(e.hp, plain, bref, base)
	if !ok {
		t.Fatal("no delta")
	}
	if got, err := e.DecodeDelta(ref, stored, base); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("right base: %v", err)
	}
	other := append([]byte(nil), base...)
	other[100] ^= 0xff
	if _, err := DecodeDelta(ref, stored, other); err != nil {
		t.Fatalf("test setup: the package decoder already notices: %v", err)
	}
	if _, err := e.DecodeDelta(ref, stored, other); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("wrong base = %v, want Corrupt", err)
	}
}

// slowGets delays every Get and counts the most in flight at once.
type slowGets struct {
	*mapStore
	inFlight, most atomic.Int64
}

func (s *slowGets) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	cur := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.most.Load(); cur > m && !s.most.CompareAndSwap(m, cur); m = s.most.Load() {
	}
	time.Sleep(2 * time.Millisecond)
	return s.mapStore.Get(ctx, id)
}

// TestReadAheadChunks: ReadAhead keeps its own number of chunks in
// flight, not Config.Readahead (a cloud store's packs need more).
func TestReadAheadChunks(t *testing.T) {
	st := &slowGets{mapStore: newMapStore()}
	e := newEngine(t, st, func(c *Config) { c.Readahead = 4 })
	data := randomBytes(4<<20, 9)
	refs, _, err := e.WriteBytes(context.Background(), data)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) < 100 {
		t.Fatalf("%d chunks, want at least 100", len(refs))
	}
	for _, tc := range []struct{ ahead, want int }{{0, 4}, {64, 64}} {
		st.most.Store(0)
		var buf bytes.Buffer
		if err := e.ReadAhead(context.Background(), refs, tc.ahead, &buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("ahead %d: read back differs", tc.ahead)
		}
		// Fetches start as slots free, so the most at once may fall a
		// little short of the limit on a busy machine, never above it.
		if m := st.most.Load(); m > int64(tc.want) || m < int64(tc.want)/2 {
			t.Errorf("ahead %d: at most %d Gets at once, want %d", tc.ahead, m, tc.want)
		}
	}
}

// An object Put deferred (buffered by the store until a Flush) is not
// remembered as stored: a later write of the same data asks the store,
// which may have lost the buffer.
func TestDeferredPutNotKnown(t *testing.T) {
	ctx := context.Background()
	st := newMapStore()
	e := newEngine(t, st, nil)
	data := randomBytes(4<<10, 11)
	if _, _, err := e.WriteBytes(store.WithDeferred(ctx), data); err != nil {
		t.Fatal(err)
	}
	before := st.hasCall.Load()
	if _, _, err := e.WriteBytes(ctx, data); err != nil {
		t.Fatal(err)
	}
	if st.hasCall.Load() == before {
		t.Fatal("the second write trusted a deferred Put: it did not ask the store")
	}
}

// notingStore notes every object it returns as verified (store.VerifyNote),
// whether or not it hashes to its ID: a store that lies, or bytes damaged
// after a lower store checked them.
type notingStore struct {
	*mapStore
	notes atomic.Int64
}

func (s *notingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	data, err := s.mapStore.Get(ctx, id)
	if err == nil {
		store.NoteVerified(ctx, id, data)
		s.notes.Add(1)
	}
	return data, err
}

// A chunk a store noted as verified is not hashed again, but its AEAD tag
// is still checked: damage after (or despite) the store's check is still
// reported as Corrupt, naming the chunk.
func TestReadNotedChunkStillAuthenticated(t *testing.T) {
	st := &notingStore{mapStore: newMapStore()}
	e := newEngine(t, st, nil)
	data := textBytes(1<<20, 9)
	refs, _, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := e.Read(context.Background(), refs, &buf); err != nil || !bytes.Equal(buf.Bytes(), data) {
		t.Fatalf("read back: %v", err)
	}
	if st.notes.Load() == 0 {
		t.Fatal("the store was never asked to note a verification")
	}
	victim := refs[len(refs)/2]
	orig, _ := st.mapStore.Get(context.Background(), victim.ID)
	r := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		bad := bytes.Clone(orig)
		bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
		st.set(victim.ID, bad)
		err := e.Read(context.Background(), refs, io.Discard)
		if !errors.Is(err, cairn.ErrCorrupt) || !strings.Contains(err.Error(), victim.ID.Short()) {
			t.Fatalf("damaged chunk noted as verified: %v, want Corrupt naming %s", err, victim.ID.Short())
		}
	}
}

// seqStore records whether Gets carried store.WithSequential.
type seqStore struct {
	*mapStore
	seq, plain atomic.Int64
}

func (s *seqStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if store.Sequential(ctx) {
		s.seq.Add(1)
	} else {
		s.plain.Add(1)
	}
	return s.mapStore.Get(ctx, id)
}

// A whole-file read tells the store its Gets are in order; a ranged read
// does not.
func TestReadSaysSequential(t *testing.T) {
	st := &seqStore{mapStore: newMapStore()}
	e := newEngine(t, st, nil)
	refs, _, err := e.Write(context.Background(), bytes.NewReader(textBytes(1<<20, 11)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Read(context.Background(), refs, io.Discard); err != nil {
		t.Fatal(err)
	}
	if st.seq.Load() != int64(len(refs)) || st.plain.Load() != 0 {
		t.Fatalf("whole-file read: %d sequential Gets, %d others; want %d, 0", st.seq.Load(), st.plain.Load(), len(refs))
	}
	if err := e.ReadRange(context.Background(), refs, 100, 1000, io.Discard); err != nil {
		t.Fatal(err)
	}
	if st.plain.Load() == 0 {
		t.Fatal("a ranged read said it was sequential")
	}
}

// atBuffer is an io.WriterAt in memory.
type atBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (a *atBuffer) WriteAt(p []byte, off int64) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if end := int(off) + len(p); end > len(a.b) {
		a.b = append(a.b, make([]byte, end-len(a.b))...)
	}
	copy(a.b[off:], p)
	return len(p), nil
}

// oneAtATime is an atBuffer that fails the test if WriteAt is called
// while another call is in progress.
type oneAtATime struct {
	atBuffer
	t    *testing.T
	busy atomic.Bool
}

func (o *oneAtATime) WriteAt(p []byte, off int64) (int, error) {
	if !o.busy.CompareAndSwap(false, true) {
		o.t.Error("WriteAt called while another WriteAt runs")
		return o.atBuffer.WriteAt(p, off)
	}
	defer o.busy.Store(false)
	time.Sleep(10 * time.Microsecond) // widen the window for an overlap
	return o.atBuffer.WriteAt(p, off)
}

// ReadAheadAt writes every chunk at its offset: the same bytes as Read,
// whatever the order the chunks arrive in; a damaged or missing chunk
// fails the read, naming it.
func TestReadAheadAt(t *testing.T) {
	st := &slowGets{mapStore: newMapStore()}
	e := newEngine(t, st, nil)
	data := textBytes(3<<20, 13)
	refs, _, err := e.Write(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, ahead := range []int{1, 7, 0, 1 << 20} {
		var out atBuffer
		if err := e.ReadAheadAt(context.Background(), refs, ahead, &out); err != nil || !bytes.Equal(out.b, data) {
			t.Fatalf("ahead %d: %v (%d bytes of %d, equal %v)", ahead, err, len(out.b), len(data), bytes.Equal(out.b, data))
		}
	}
	if err := e.ReadAheadAt(context.Background(), nil, 0, &atBuffer{}); err != nil {
		t.Fatalf("no chunks: %v", err)
	}
	// One WriteAt at a time (many at once spin on the file's lock in
	// the kernel).
	one := &oneAtATime{t: t}
	if err := e.ReadAheadAt(context.Background(), refs, 64, one); err != nil || !bytes.Equal(one.b, data) {
		t.Fatalf("one at a time: %v (equal %v)", err, bytes.Equal(one.b, data))
	}
	victim := refs[len(refs)/3]
	orig, _ := st.mapStore.Get(context.Background(), victim.ID)
	bad := bytes.Clone(orig)
	bad[len(bad)/2] ^= 1
	st.set(victim.ID, bad)
	if err := e.ReadAheadAt(context.Background(), refs, 16, &atBuffer{}); !errors.Is(err, cairn.ErrCorrupt) || !strings.Contains(err.Error(), victim.ID.Short()) {
		t.Fatalf("damaged chunk: %v, want Corrupt naming %s", err, victim.ID.Short())
	}
	st.Delete(context.Background(), victim.ID)
	if err := e.ReadAheadAt(context.Background(), refs, 16, &atBuffer{}); !errors.Is(err, cairn.ErrNotFound) || !strings.Contains(err.Error(), victim.ID.Short()) {
		t.Fatalf("missing chunk: %v, want NotFound naming %s", err, victim.ID.Short())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st.set(victim.ID, orig)
	if err := e.ReadAheadAt(ctx, refs, 16, &atBuffer{}); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("canceled: %v, want Canceled", err)
	}
}

// failingAt is an atBuffer whose writes fail once more than limit bytes
// were written.
type failingAt struct {
	atBuffer
	limit, n int
}

var errDiskFull = errors.New("disk full (test)")

func (f *failingAt) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	over := f.n+len(p) > f.limit
	if !over {
		f.n += len(p)
	}
	f.mu.Unlock()
	if over {
		return 0, errDiskFull
	}
	return f.atBuffer.WriteAt(p, off)
}

// ReadAheadAt of files of every size (empty, under a page, one chunk,
// many) with each number of workers gives the file; a write that fails
// fails the read with an I/O error wrapping its cause, and every byte
// written before it is the file's own at its offset.
func TestReadAheadAtSizesAndWriteError(t *testing.T) {
	st := &slowGets{mapStore: newMapStore()}
	e := newEngine(t, st, nil)
	ctx := context.Background()
	for _, n := range []int{0, 1, 4095, 4097, 64 << 10, 1<<20 + 3} {
		data := randomBytes(n, uint64(n)+1)
		refs, _, err := e.WriteBytes(ctx, data)
		if err != nil {
			t.Fatal(err)
		}
		for _, ahead := range []int{1, 3, 0, 1 << 20} {
			var out atBuffer
			if err := e.ReadAheadAt(ctx, refs, ahead, &out); err != nil || !bytes.Equal(out.b, data) {
				t.Fatalf("%d bytes, %d chunks, ahead %d: %v (%d bytes back, equal %v)", n, len(refs), ahead, err, len(out.b), bytes.Equal(out.b, data))
			}
		}
		if n < 64<<10 {
			continue
		}
		for _, ahead := range []int{1, 16} {
			w := &failingAt{limit: n / 2}
			err := e.ReadAheadAt(ctx, refs, ahead, w)
			if !errors.Is(err, cairn.ErrIO) || !errors.Is(err, errDiskFull) {
				t.Fatalf("%d bytes, ahead %d: %v, want an I/O error wrapping %v", n, ahead, err, errDiskFull)
			}
			for i, b := range w.b {
				if b != 0 && b != data[i] {
					t.Fatalf("%d bytes, ahead %d: byte %d written wrong", n, ahead, i)
				}
			}
		}
	}
}

// lendingStore lends every object it returns (store.LoanNote), as a cloud
// pack store's read-ahead does: a fresh copy, which it scribbles over as
// soon as it is given back (as reuse would), counting loans and returns.
type lendingStore struct {
	*mapStore
	t              *testing.T
	lent, returned atomic.Int64
}

func (s *lendingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	data, err := s.mapStore.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	data = bytes.Clone(data)
	store.NoteVerified(ctx, id, data)
	if !store.CanLend(ctx) {
		return data, nil
	}
	var once atomic.Bool
	store.Lend(ctx, data, func() {
		if !once.CompareAndSwap(false, true) {
			s.t.Error("a loan was given back twice")
		}
		for i := range data {
			data[i] = 0xa5
		}
		s.returned.Add(1)
	})
	s.lent.Add(1)
	return data, nil
}

// A reader given lent chunks decrypts them in place and gives each back
// once it has written its plaintext, never before: the output is intact
// though the store scribbles over every chunk it gets back.
func TestReadGivesLoansBack(t *testing.T) {
	st := &lendingStore{mapStore: newMapStore(), t: t}
	e := newEngine(t, st, nil)
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"compressible", textBytes(2<<20, 17)},
		{"incompressible", randomBytes(2<<20, 18)},
	} {
		refs, _, err := e.Write(context.Background(), bytes.NewReader(tc.data))
		if err != nil {
			t.Fatal(err)
		}
		st.lent.Store(0)
		st.returned.Store(0)
		var buf bytes.Buffer
		if err := e.Read(context.Background(), refs, &buf); err != nil || !bytes.Equal(buf.Bytes(), tc.data) {
			t.Fatalf("%s: Read: %v (equal %v)", tc.name, err, bytes.Equal(buf.Bytes(), tc.data))
		}
		var out atBuffer
		if err := e.ReadAheadAt(context.Background(), refs, 64, &out); err != nil || !bytes.Equal(out.b, tc.data) {
			t.Fatalf("%s: ReadAheadAt: %v (equal %v)", tc.name, err, bytes.Equal(out.b, tc.data))
		}
		if _, err := e.Plaintexts(context.Background(), refs[:3]); err != nil {
			t.Fatalf("%s: Plaintexts: %v", tc.name, err)
		}
		if n := int64(2*len(refs) + 3); st.lent.Load() != n || st.returned.Load() != n {
			t.Errorf("%s: %d chunks lent, %d given back, want %d each", tc.name, st.lent.Load(), st.returned.Load(), n)
		}
	}
}
