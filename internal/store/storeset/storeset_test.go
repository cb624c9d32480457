package storeset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/memstore"
)

var bg = context.Background()

func newSet(t *testing.T, n int, o Options) *Set {
	t.Helper()
	var named []Named
	for i := range n {
		named = append(named, Named{Name: fmt.Sprintf("s%d", i), Store: memstore.New()})
	}
	s, err := New(named, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewRejects(t *testing.T) {
	m := memstore.New()
	for _, stores := range [][]Named{
		{{Name: "", Store: m}},
		{{Name: "a", Store: m}, {Name: "a", Store: m}},
		{{Name: "a"}},
		{{Name: strings.Repeat("x", 256), Store: m}},
	} {
		if _, err := New(stores, Options{}); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("New(%v): %v, want Invalid", stores, err)
		}
	}
}

// fakeClock is a settable clock for Set.now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestOrderAndHealth(t *testing.T) {
	s := newSet(t, 4, Options{ProbeInterval: time.Second})
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s.now = clk.now
	call := func(i int, d time.Duration, err error) error {
		return s.Call(bg, i, func(context.Context, cairn.Store) error {
			clk.add(d)
			return err
		})
	}
	if got := s.Order(); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("initial order %v", got)
	}
	call(0, 30*time.Millisecond, nil)
	call(1, 10*time.Millisecond, cairn.E("get", cairn.NotFound, "", nil)) // an answer
	call(2, 20*time.Millisecond, nil)
	// s3 unmeasured: first, to get measured.
	if got := s.Order(); !slices.Equal(got, []int{3, 1, 2, 0}) {
		t.Fatalf("order by latency %v", got)
	}
	down := cairn.E("get", cairn.Unavailable, "", errors.New("connection refused"))
	call(1, time.Millisecond, down)
	if got := s.Order(); !slices.Equal(got, []int{3, 2, 0, 1}) {
		t.Fatalf("order with s1 down %v", got)
	}
	if s.Up(1) || s.Skip(1) == nil {
		t.Fatal("s1 should be down and skipped")
	}
	if err := s.Skip(1); !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Skip error %v", err)
	}
	clk.add(time.Second)
	if err := s.Skip(1); err != nil {
		t.Fatalf("probe due, Skip = %v", err)
	}
	if s.Skip(1) == nil {
		t.Fatal("second Skip in the same probe interval should skip")
	}
	// The caller's own cancellation says nothing about the store.
	ctx, cancel := context.WithCancel(bg)
	s.Call(ctx, 2, func(context.Context, cairn.Store) error {
		cancel()
		return cairn.E("get", cairn.Canceled, "", context.Canceled)
	})
	if !s.Up(2) {
		t.Fatal("a canceled call marked s2 down")
	}
	call(1, 5*time.Millisecond, nil)
	if !s.Up(1) {
		t.Fatal("an answer did not bring s1 back")
	}
	h := s.Health(func(name string) int { return len(name) })
	if h[1].Requests != 3 || h[1].Failures != 1 || !h[1].Up || h[1].LastError == "" || h[1].Queued != 2 {
		t.Fatalf("health of s1 = %+v", h[1])
	}
	s.Report(Fault{Store: "s0", Kind: cairn.Corrupt})
	s.Report(Fault{Store: "s0", Kind: cairn.NotFound})
	s.Repaired(0, 3)
	if h := s.Health(nil)[0]; h.Corrupt != 1 || h.Missing != 1 || h.Repaired != 3 {
		t.Fatalf("health of s0 = %+v", h)
	}
}

// A member that stops answering does not collect requests without bound.
func TestCallBounded(t *testing.T) {
	s := newSet(t, 1, Options{Concurrency: 1})
	waiting := make(chan struct{}, maxWaiting+2)
	s.onWait = func() { waiting <- struct{}{} }
	block := make(chan struct{})
	started := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		s.Call(bg, 0, func(context.Context, cairn.Store) error {
			close(started)
			<-block
			return nil
		})
	})
	<-waiting // the first call waited (briefly) for its slot
	<-started
	ctx, cancel := context.WithCancel(bg)
	for range maxWaiting {
		wg.Go(func() {
			s.Call(ctx, 0, func(context.Context, cairn.Store) error { return nil })
		})
	}
	for range maxWaiting {
		<-waiting
	}
	err := s.Call(bg, 0, func(context.Context, cairn.Store) error { return nil })
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "too many requests waiting") {
		t.Fatalf("call beyond the bound: %v", err)
	}
	cancel()
	close(block)
	wg.Wait()
}

func TestWriteQuorum(t *testing.T) {
	s := newSet(t, 4, Options{ProbeInterval: -1})
	var bgwg sync.WaitGroup
	release := make(chan struct{})
	var after struct {
		sync.Mutex
		written []int
		failed  map[int]error
	}
	afterDone := make(chan struct{})
	pending, err := s.Write(bg, bg, &bgwg, "put", "x", Write{
		Targets: []int{0, 1, 2}, Spares: []int{3}, Want: 3, Quorum: 2,
		Fn: func(ctx context.Context, _ cairn.Store, i int) error {
			switch i {
			case 0:
				return cairn.E("put", cairn.Unavailable, "", errors.New("refused"))
			case 2:
				<-release
			}
			return nil
		},
		After: func(w []int, f map[int]error) {
			after.Lock()
			after.written, after.failed = w, f
			after.Unlock()
			close(afterDone)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pending)
	if !slices.Equal(pending, []int{2}) {
		t.Fatalf("pending %v, want [2] (the held one)", pending)
	}
	close(release)
	<-afterDone
	bgwg.Wait()
	slices.Sort(after.written)
	if !slices.Equal(after.written, []int{1, 2, 3}) || len(after.failed) != 1 || after.failed[0] == nil {
		t.Fatalf("after: written %v failed %v (the spare should replace s0)", after.written, after.failed)
	}

	// Quorum out of reach: fails at once, naming the members.
	_, err = s.Write(bg, bg, &bgwg, "put", "x", Write{
		Targets: []int{0, 1}, Want: 2, Quorum: 2,
		Fn: func(ctx context.Context, _ cairn.Store, i int) error {
			if i == 1 {
				return cairn.E("put", cairn.IO, "", errors.New("disk on fire"))
			}
			return nil
		},
	})
	if !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "store s1: put: I/O error: disk on fire") {
		t.Fatalf("Write without quorum: %v", err)
	}
	bgwg.Wait()

	// Canceled before the quorum.
	ctx, cancel := context.WithCancel(bg)
	hold := make(chan struct{})
	go func() { <-hold; cancel() }()
	_, err = s.Write(ctx, bg, &bgwg, "put", "x", Write{
		Targets: []int{0}, Want: 1, Quorum: 1,
		Fn: func(ctx context.Context, _ cairn.Store, i int) error {
			close(hold)
			<-ctx.Done()
			return cairn.E("put", cairn.Canceled, "", ctx.Err())
		},
	})
	if !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("canceled Write: %v", err)
	}
	bgwg.Wait()
}

// A long run of quorum writes over a member slower than the quorum: the
// writes left running behind it pile up until Call refuses them (the
// member counted down, its copies missing until a repair) unless Write
// waits for room there. A member that has stalled is not waited for.
func TestWriteSlowMember(t *testing.T) {
	s := newSet(t, 2, Options{Concurrency: 1, ProbeInterval: -1})
	var bgwg sync.WaitGroup
	var mu sync.Mutex
	failed := map[int]int{}
	w := Write{
		Targets: []int{0, 1}, Want: 2, Quorum: 1,
		Fn: func(ctx context.Context, _ cairn.Store, i int) error {
			if i == 1 {
				time.Sleep(200 * time.Microsecond)
			}
			return nil
		},
		After: func(_ []int, f map[int]error) {
			mu.Lock()
			defer mu.Unlock()
			for i := range f {
				failed[i]++
			}
		},
	}
	for range 4 * maxWaiting {
		if _, err := s.Write(bg, bg, &bgwg, "put", "x", w); err != nil {
			t.Fatal(err)
		}
	}
	bgwg.Wait()
	if len(failed) != 0 || !s.Up(1) {
		t.Fatalf("writes failed per member: %v; s1 up: %v (last error %v)", failed, s.Up(1), s.LastError(1))
	}

	// s1 stops answering: writers wait for room until its oldest request
	// is stallAfter old, then no longer.
	var clock struct {
		sync.Mutex
		t time.Time
	}
	clock.t = time.Now()
	s.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return clock.t }
	hang := make(chan struct{})
	w.Fn = func(ctx context.Context, _ cairn.Store, i int) error {
		if i == 1 {
			<-hang
		}
		return nil
	}
	for range roomWaiting + 1 { // one in flight, roomWaiting waiting
		if _, err := s.Write(bg, bg, &bgwg, "put", "x", w); err != nil {
			t.Fatal(err)
		}
	}
	for {
		s.m[1].mu.Lock()
		n := s.m[1].waiting
		s.m[1].mu.Unlock()
		if n == roomWaiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	clock.Lock()
	clock.t = clock.t.Add(stallAfter + time.Second)
	clock.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := s.Write(bg, bg, &bgwg, "put", "x", w)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Write waits for room at a member that stalled")
	}
	close(hang)
	bgwg.Wait()
}

func TestFlights(t *testing.T) {
	var f Flights
	id := cairn.ID{1}
	if err := f.Wait(bg, id); err != nil {
		t.Fatal(err)
	}
	end1 := f.Begin(id)
	end2 := f.Begin(id)
	done := make(chan error)
	go func() { done <- f.Wait(bg, id) }()
	end1()
	end1() // idempotent
	select {
	case <-done:
		t.Fatal("Wait returned with a write still under way")
	case <-time.After(10 * time.Millisecond):
	}
	end2()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.Begin(id)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := f.Wait(ctx, id); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("Wait with canceled ctx: %v", err)
	}
}

func task(op Op, b byte, store string) Task { return Task{Op: op, ID: cairn.ID{b}, Store: store} }

func TestQueueMemory(t *testing.T) {
	q, err := OpenQueue("", "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := task(OpPut, 1, "s0"), task(OpDelete, 2, "s1")
	q.Add(a)
	q.Add(a)
	q.Add(b)
	if q.Len("") != 2 || q.Len("s0") != 1 || !q.Has(a) {
		t.Fatalf("queue %v", q.Tasks())
	}
	q.Done(a)
	q.Done(a)
	if got := q.Tasks(); len(got) != 1 || got[0] != b {
		t.Fatalf("queue %v", got)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
}

func queueFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestQueueFiles(t *testing.T) {
	dir := t.TempDir()
	q1, err := OpenQueue(dir, "ec", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := task(OpPut, 1, "s0"), task(OpDelete, 2, "s1"), task(OpPut, 3, "other store")
	q1.Add(a)
	q1.Add(b)
	q1.Done(a)
	// A second Queue while the first is open does not take its tasks.
	q2, err := OpenQueue(dir, "ec", nil)
	if err != nil {
		t.Fatal(err)
	}
	if q2.Len("") != 0 {
		t.Fatalf("second queue adopted an open queue's tasks: %v", q2.Tasks())
	}
	q2.Add(c)
	// Another prefix does not see them either.
	q3, err := OpenQueue(dir, "replica", nil)
	if err != nil {
		t.Fatal(err)
	}
	if q3.Len("") != 0 {
		t.Fatal("prefixes mixed")
	}
	if cerr := q3.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	// A crash of q1 (no Close): its file's lock is released when the file
	// is closed; simulate by closing the file only.
	q1.mu.Lock()
	q1.closeFile()
	q1.mu.Unlock()
	if cerr := q2.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	q4, err := OpenQueue(dir, "ec", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Task{b, c}
	slices.SortFunc(want, func(x, y Task) int { return strings.Compare(x.Store, y.Store) })
	if got := q4.Tasks(); !slices.Equal(got, q4.sorted()) || len(got) != 2 || !q4.Has(b) || !q4.Has(c) {
		t.Fatalf("adopted %v, want %v", got, want)
	}
	if files := queueFiles(t, dir); len(files) != 1 {
		t.Fatalf("after adoption: files %v, want q4's only", files)
	}
	q4.Done(b)
	q4.Done(c)
	if err := q4.Close(); err != nil {
		t.Fatal(err)
	}
	if files := queueFiles(t, dir); len(files) != 0 {
		t.Fatalf("an empty queue left files: %v", files)
	}
}

func TestQueueDamagedTail(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQueue(dir, "ec", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := task(OpPut, 1, "s0"), task(OpPut, 2, "s0")
	q.Add(a)
	q.Add(b)
	path := q.path
	q.mu.Lock()
	q.closeFile() // crash
	q.mu.Unlock()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if werr := os.WriteFile(path, data[:len(data)-3], 0o600); werr != nil { // torn last record
		t.Fatal(werr)
	}
	q2, err := OpenQueue(dir, "ec", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if got := q2.Tasks(); len(got) != 1 || got[0] != a {
		t.Fatalf("after a torn record: %v, want [a]", got)
	}
}

func TestDecodeQueue(t *testing.T) {
	a, b := task(OpPut, 1, "s0"), task(OpDelete, 2, "s1")
	f := []byte(queueMagic)
	f = appendRecord(f, a, false)
	f = appendRecord(f, b, false)
	f = appendRecord(f, a, true)
	got, err := DecodeQueue(f)
	if err != nil || len(got) != 1 || got[0] != b {
		t.Fatalf("DecodeQueue = %v, %v", got, err)
	}
	for name, bad := range map[string][]byte{
		"magic":   []byte("cairnrq2"),
		"short":   f[:len(f)-1],
		"crc":     append(append([]byte{}, f[:len(f)-1]...), f[len(f)-1]^1),
		"len":     append([]byte(queueMagic), 0, 0, 0, 1, 0, 0, 0, 0),
		"unknown": appendRecord([]byte(queueMagic), Task{Op: 3, Store: "x"}, false),
	} {
		if _, err := DecodeQueue(bad); !errors.Is(err, cairn.ErrCorrupt) {
			t.Errorf("%s: %v, want Corrupt", name, err)
		}
	}
}

func FuzzDecodeQueue(f *testing.F) {
	seed := []byte(queueMagic)
	seed = appendRecord(seed, task(OpPut, 1, "s0"), false)
	seed = appendRecord(seed, task(OpDelete, 9, "a longer store name"), false)
	seed = appendRecord(seed, task(OpPut, 1, "s0"), true)
	f.Add(seed)
	f.Add([]byte(queueMagic))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tasks, err := DecodeQueue(data)
		if err != nil && !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("error of the wrong kind: %v", err)
		}
		// What decodes re-encodes to a file that decodes the same.
		out := []byte(queueMagic)
		for _, tk := range tasks {
			if tk.Op != OpPut && tk.Op != OpDelete || tk.Store == "" || len(tk.Store) > 255 {
				t.Fatalf("decoded an impossible task %+v", tk)
			}
			out = appendRecord(out, tk, false)
		}
		again, err := DecodeQueue(out)
		if err != nil || !slices.Equal(again, tasks) {
			t.Fatalf("re-encoded queue decodes to %v, %v; want %v", again, err, tasks)
		}
	})
}
