package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storetest"
)

var _ store.RangeReader = (*Store)(nil)

// statusErr is a fake service's error reply.
type statusErr int

func (e statusErr) Error() string { return fmt.Sprintf("status %d", int(e)) }

// memBucket is a Bucket in memory, with faults to inject: fail[op] holds
// errors returned by the next calls of op, one per call.
type memBucket struct {
	mu      sync.Mutex
	objs    map[string][]byte
	fail    map[string][]error
	calls   map[string]int
	n       *Counter
	closed  bool
	onHead  func(key string) // called on each Head, outside the lock
	onList  func(token string)
	pageCap int
}

func newMem() *memBucket {
	return &memBucket{objs: map[string][]byte{}, fail: map[string][]error{}, calls: map[string]int{}, n: new(Counter)}
}

func (m *memBucket) fault(op string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls[op]++
	if f := m.fail[op]; len(f) > 0 {
		m.fail[op] = f[1:]
		return f[0]
	}
	return nil
}

func (m *memBucket) Put(ctx context.Context, key string, data []byte) error {
	m.n.Add(PUT)
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.fault("put"); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objs[key] = slices.Clone(data)
	return nil
}

func (m *memBucket) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	m.n.Add(GET)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.fault("get"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	if !ok {
		return nil, statusErr(404)
	}
	if int64(len(b)) > limit {
		return nil, cairn.E("get", cairn.Invalid, key, errors.New("too large"))
	}
	return slices.Clone(b), nil
}

func (m *memBucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	m.n.Add(GET)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.fault("get"); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	switch {
	case !ok:
		return nil, statusErr(404)
	case off >= int64(len(b)):
		return nil, statusErr(416)
	}
	return slices.Clone(b[off:min(off+n, int64(len(b)))]), nil
}

func (m *memBucket) Head(ctx context.Context, key string) (int64, bool, error) {
	m.n.Add(HEAD)
	if m.onHead != nil {
		m.onHead(key)
	}
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	if err := m.fault("head"); err != nil {
		return 0, false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objs[key]
	return int64(len(b)), ok, nil
}

func (m *memBucket) Delete(ctx context.Context, key string) error {
	m.n.Add(DELETE)
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.fault("delete"); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, key)
	return nil
}

// ListPage lists in key order; the token is the last key returned.
func (m *memBucket) ListPage(ctx context.Context, prefix, token string, limit int) ([]Object, string, error) {
	m.n.Add(LIST)
	if m.onList != nil {
		m.onList(token)
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if err := m.fault("list"); err != nil {
		return nil, "", err
	}
	if m.pageCap > 0 {
		limit = min(limit, m.pageCap)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var keys []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) && k > token {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	next := ""
	if len(keys) > limit {
		keys = keys[:limit]
		next = keys[limit-1]
	}
	objs := make([]Object, len(keys))
	for i, k := range keys {
		objs[i] = Object{Key: k, Size: int64(len(m.objs[k]))}
	}
	return objs, next, nil
}

func (m *memBucket) Kind(err error) cairn.Kind {
	var s statusErr
	if errors.As(err, &s) {
		return HTTPKind(int(s))
	}
	return NetKind(err)
}

func (m *memBucket) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func TestGetRangeRequests(t *testing.T) {
	s, m := newStore("p", quick)
	id, data := storetest.Blob(1, 1000)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	before := s.Requests()
	got, err := s.GetRange(bg, id, 10, 20)
	if err != nil || string(got) != string(data[10:30]) {
		t.Fatalf("GetRange: %v", err)
	}
	if _, err := s.GetRange(bg, id, 1000, 0); err != nil {
		t.Fatalf("GetRange(1000, 0): %v", err)
	}
	if r := s.Requests().Sub(before); r != (Requests{Get: 1, Head: 1}) {
		t.Errorf("GetRange of 20 bytes, then of 0: requests %v, want one GET and one HEAD", r)
	}
	// Retried like Get.
	m.fail["get"] = []error{statusErr(503)}
	if got, err := s.GetRange(bg, id, 0, 5); err != nil || string(got) != string(data[:5]) {
		t.Fatalf("GetRange after a 503: %v", err)
	}
}

var quick = Options{Attempts: 3, Backoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

func newStore(prefix string, o Options) (*Store, *memBucket) {
	m := newMem()
	return New("mem://bucket/"+prefix, prefix, m, m.n, o), m
}

// The adapter alone passes the conformance suite.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) cairn.Store {
		s, m := newStore("pre/fix", Options{PageSize: 13})
		m.pageCap = 11 // a service that returns less than asked
		return s
	})
	storetest.Run(t, func(t *testing.T) cairn.Store {
		s, _ := newStore("", Options{})
		return s
	})
}

var bg = context.Background()

func TestKey(t *testing.T) {
	id, _ := storetest.Blob(1, 10)
	h := id.String()
	for _, tc := range []struct{ prefix, want string }{
		{"", h[:2] + "/" + h},
		{"a", "a/" + h[:2] + "/" + h},
		{"/a/b/", "a/b/" + h[:2] + "/" + h},
	} {
		k := Key(tc.prefix, id)
		if k != tc.want {
			t.Errorf("Key(%q) = %q, want %q", tc.prefix, k, tc.want)
		}
		if got, ok := ParseKey(tc.prefix, k); !ok || got != id {
			t.Errorf("ParseKey(%q, %q) = %v, %v", tc.prefix, k, got, ok)
		}
	}
	for _, k := range []string{
		"a/" + h[:2] + "/" + h,                     // another prefix
		"b/" + h[:2] + "/" + h + "x",               // too long
		"b/" + h[2:4] + "/" + h,                    // wrong fan-out
		"b/" + strings.ToUpper(h[:2]+"/"+h),        // not canonical
		"b/" + h[:2] + "/" + h[:63] + "g",          // not hex
		"b/" + h[:2] + "x" + h,                     // no slash
		"b" + h[:2] + "/" + h,                      // prefix not followed by /
		"b/c/" + h[:2] + "/" + h,                   // deeper
		strings.Repeat("x", 3+2*cairn.IDSize+2),    // nothing alike
		"b/" + h[:2] + "/" + h[:2] + "/" + h[4:64], // right length, wrong shape
	} {
		if _, ok := ParseKey("b", k); ok {
			t.Errorf("ParseKey(b, %q) accepted", k)
		}
	}
}

func TestRetryTransient(t *testing.T) {
	s, m := newStore("p", quick)
	id, data := storetest.Blob(1, 100)
	// Two transient failures, then success: 3 attempts.
	m.fail["put"] = []error{statusErr(503), fmt.Errorf("dial: %w", syscall.ECONNRESET)}
	if err := s.Put(bg, id, data); err != nil {
		t.Fatalf("Put after two transient failures: %v", err)
	}
	if r := s.Requests(); r.Put != 3 {
		t.Errorf("PUT requests = %d, want 3", r.Put)
	}
	// Three: the store gives up with Unavailable.
	m.fail["get"] = []error{statusErr(500), statusErr(502), statusErr(429)}
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Get after 3 failures: %v, want Unavailable", err)
	}
	if m.calls["get"] != 3 {
		t.Errorf("Get tried %d times, want 3", m.calls["get"])
	}
	// A reply cut short is IO, retried too.
	m.fail["get"] = []error{io.ErrUnexpectedEOF}
	if got, err := s.Get(bg, id); err != nil || string(got) != string(data) {
		t.Fatalf("Get after a short read: %v", err)
	}
}

func TestNoRetryPermanent(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind cairn.Kind
	}{
		{statusErr(403), cairn.Permission},
		{statusErr(401), cairn.Permission},
		{statusErr(400), cairn.Invalid},
		{statusErr(412), cairn.Conflict},
		{errors.New("something odd"), cairn.Other},
	} {
		s, m := newStore("p", quick)
		id, data := storetest.Blob(1, 100)
		m.fail["put"] = []error{tc.err, tc.err, tc.err}
		err := s.Put(bg, id, data)
		if cairn.KindOf(err) != tc.kind {
			t.Errorf("Put failing with %v: kind %v (%v), want %v", tc.err, cairn.KindOf(err), err, tc.kind)
		}
		if m.calls["put"] != 1 {
			t.Errorf("Put failing with %v was tried %d times, want 1", tc.err, m.calls["put"])
		}
		if !strings.Contains(err.Error(), "mem://bucket/p "+id.String()) {
			t.Errorf("error %q does not name the store and object", err)
		}
	}
}

func TestRetryHonoursContext(t *testing.T) {
	s, m := newStore("p", Options{Attempts: 50, Backoff: time.Hour})
	id, _ := storetest.Blob(1, 100)
	m.fail["get"] = []error{statusErr(503)}
	ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := s.Get(ctx, id)
	if !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get with a backoff longer than ctx: %v, want Canceled (deadline)", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Get waited %v", d)
	}
}

func TestCorruptOnGet(t *testing.T) {
	s, m := newStore("p", quick)
	id, data := storetest.Blob(1, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	m.objs[Key("p", id)][5] ^= 1
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of damaged object: %v, want Corrupt", err)
	}
	if m.calls["get"] != 1 {
		t.Errorf("a damaged object was read %d times, want 1", m.calls["get"])
	}
}

func TestListRetriesOnePage(t *testing.T) {
	s, m := newStore("p", Options{PageSize: 10, Attempts: 3, Backoff: time.Millisecond})
	for i := range 35 {
		id, data := storetest.Blob(uint64(i), 10)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
	}
	var tokens []string
	m.onList = func(token string) { tokens = append(tokens, token) }
	// The third page fails once.
	failed := false
	m.onList = func(token string) {
		tokens = append(tokens, token)
		if len(tokens) == 3 && !failed {
			failed = true
			m.mu.Lock()
			m.fail["list"] = []error{statusErr(503)}
			m.mu.Unlock()
		}
	}
	seen := map[cairn.ID]bool{}
	err := s.List(bg, func(id cairn.ID, _ int64) error {
		if seen[id] {
			t.Errorf("List reported %s twice", id.Short())
		}
		seen[id] = true
		return nil
	})
	if err != nil || len(seen) != 35 {
		t.Fatalf("List: %d objects, %v", len(seen), err)
	}
	// Pages: "", t1, t2 (fails), t2 again, t3.
	if len(tokens) != 5 || tokens[0] != "" || tokens[2] != tokens[3] || tokens[1] == tokens[2] {
		t.Errorf("page tokens %q: want the failed page retried alone", tokens)
	}
}

func TestListStuckToken(t *testing.T) {
	s, m := newStore("p", Options{})
	id, data := storetest.Blob(1, 10)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	stuck := &stuckBucket{memBucket: m}
	s.b = stuck
	err := s.List(bg, func(cairn.ID, int64) error { return nil })
	if err == nil || stuck.calls > 3 {
		t.Fatalf("List over a service repeating its page token: %v after %d pages", err, stuck.calls)
	}
}

type stuckBucket struct {
	*memBucket
	calls int
}

func (b *stuckBucket) ListPage(ctx context.Context, prefix, token string, limit int) ([]Object, string, error) {
	b.calls++
	objs, _, err := b.memBucket.ListPage(ctx, prefix, "", limit)
	return objs, "same", err
}

func TestHasBounded(t *testing.T) {
	s, m := newStore("p", Options{HasWorkers: 4})
	var mu sync.Mutex
	inFlight, most := 0, 0
	m.onHead = func(string) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
	}
	ids := make([]cairn.ID, 100)
	for i := range ids {
		ids[i], _ = storetest.Blob(uint64(i%50), 10)
	}
	found, err := s.Has(bg, ids)
	if err != nil || len(found) != 100 {
		t.Fatalf("Has: %v", err)
	}
	if most > 4 {
		t.Errorf("%d HEADs in flight, want at most 4", most)
	}
	if most < 2 {
		t.Errorf("at most %d HEAD in flight: Has does not run them concurrently", most)
	}
	if r := s.Requests(); r.Head != 50 {
		t.Errorf("Has of 50 distinct IDs sent %d HEADs", r.Head)
	}
}

func TestHasError(t *testing.T) {
	s, m := newStore("p", quick)
	ids := make([]cairn.ID, 200)
	for i := range ids {
		ids[i], _ = storetest.Blob(uint64(i), 10)
	}
	m.fail["head"] = []error{statusErr(403)}
	// Every HEAD but the refused first takes 5 ms, as over a network:
	// in memory the 16 workers could ask all 200 before the refusal's
	// worker (descheduled on a loaded machine) cancels the rest.
	var heads atomic.Int64
	m.onHead = func(string) {
		if heads.Add(1) > 1 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if _, err := s.Has(bg, ids); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("Has with one refused HEAD: %v, want Permission", err)
	}
	if n := s.Requests().Head; n > 100 {
		t.Errorf("Has went on after a refusal: %d HEADs", n)
	}
	// Cancel while it runs.
	ctx, cancel := context.WithCancel(bg)
	var once sync.Once
	m.onHead = func(string) { once.Do(cancel) }
	if _, err := s.Has(ctx, ids); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("Has canceled midway: %v, want Canceled", err)
	}
}

func TestCloseClosesBucket(t *testing.T) {
	s, m := newStore("p", quick)
	if err := s.Close(); err != nil || !m.closed {
		t.Fatalf("Close: %v, bucket closed %v", err, m.closed)
	}
	id, data := storetest.Blob(1, 10)
	if err := s.Put(bg, id, data); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Put after Close: %v", err)
	}
}

func TestTooLarge(t *testing.T) {
	s, _ := newStore("p", quick)
	if err := s.Put(bg, cairn.ID{}, make([]byte, MaxObject+1)); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Put of %d bytes: %v, want Invalid", MaxObject+1, err)
	}
}

func TestNetKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want cairn.Kind
	}{
		{context.Canceled, cairn.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), cairn.Canceled},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, cairn.Unavailable},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), cairn.Unavailable},
		{&net.DNSError{Err: "no such host", Name: "x"}, cairn.Unavailable},
		{io.ErrUnexpectedEOF, cairn.IO},
		{errors.New("what"), cairn.Other},
		{nil, cairn.Other},
	} {
		if got := NetKind(tc.err); got != tc.want {
			t.Errorf("NetKind(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	for status, want := range map[int]cairn.Kind{
		200: cairn.Other, 304: cairn.Other, 400: cairn.Invalid, 401: cairn.Permission, 403: cairn.Permission,
		404: cairn.NotFound, 408: cairn.Unavailable, 409: cairn.Conflict, 412: cairn.Conflict,
		416: cairn.Invalid, 429: cairn.Unavailable, 500: cairn.Unavailable, 503: cairn.Unavailable,
	} {
		if got := HTTPKind(status); got != want {
			t.Errorf("HTTPKind(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestRequests(t *testing.T) {
	var n Counter
	n.Add(PUT)
	n.Add(PUT)
	n.Add(LIST)
	n.Add(Class(99)) // ignored
	r := n.Snapshot()
	if r != (Requests{Put: 2, List: 1}) || r.Total() != 3 {
		t.Fatalf("Snapshot = %+v", r)
	}
	if s := r.String(); s != "PUT 2 GET 0 HEAD 0 LIST 1 DELETE 0" {
		t.Errorf("String = %q", s)
	}
	if m := r.Map(); len(m) != 5 || m["PUT"] != 2 || m["LIST"] != 1 {
		t.Errorf("Map = %v", m)
	}
	if d := r.Sub(Requests{Put: 1}); d != (Requests{Put: 1, List: 1}) {
		t.Errorf("Sub = %+v", d)
	}
}

func TestReadBody(t *testing.T) {
	body := []byte("0123456789")
	for _, tc := range []struct {
		name        string
		body        []byte
		size, limit int64
		wantEOF     bool // fails with io.ErrUnexpectedEOF
		wantInvalid bool
	}{
		{"announced", body, 10, 100, false, false},
		{"unannounced", body, -1, 100, false, false},
		{"empty", nil, 0, 100, false, false},
		{"short", body[:7], 10, 100, true, false},
		{"long", body, 7, 100, true, false},
		{"over the limit, announced", body, 10, 5, false, true},
		{"over the limit, unannounced", body, -1, 5, false, true},
	} {
		got, err := ReadBody(iotest.OneByteReader(strings.NewReader(string(tc.body))), tc.size, tc.limit, "k")
		checkBody(t, tc.name, got, tc.body, err, tc.wantEOF, tc.wantInvalid)
	}
}

// checkBody checks what a body read returned: got and no error, or the
// error it was to fail with.
func checkBody(t *testing.T, name string, got, want []byte, err error, wantEOF, wantInvalid bool) {
	t.Helper()
	switch {
	case wantEOF:
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v, want io.ErrUnexpectedEOF", name, err)
		}
	case wantInvalid:
		if !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("%s: %v, want Invalid", name, err)
		}
	case err != nil || string(got) != string(want):
		t.Errorf("%s: %q, %v", name, got, err)
	}
}

func TestReadBodyInto(t *testing.T) {
	body := []byte("0123456789")
	for _, tc := range []struct {
		name        string
		body        []byte
		size        int64
		dst         int
		wantEOF     bool // fails with io.ErrUnexpectedEOF
		wantInvalid bool
	}{
		{"announced", body, 10, 10, false, false},
		{"unannounced", body, -1, 10, false, false},
		{"short", body[:7], 10, 10, true, false},
		{"short, unannounced", body[:7], -1, 10, true, false},
		{"long", body, 7, 7, true, false},
		{"long, unannounced", body, -1, 7, true, false},
		{"announces less than asked", body[:7], 7, 10, false, true},
		{"announces more than asked", body, 10, 7, false, true},
	} {
		dst := make([]byte, tc.dst)
		err := ReadBodyInto(iotest.OneByteReader(strings.NewReader(string(tc.body))), tc.size, dst, "k")
		checkBody(t, tc.name, dst, tc.body, err, tc.wantEOF, tc.wantInvalid)
	}
}

// fillBucket is a memBucket that reads ranges into the caller's buffer
// (RangeFillBucket), through ReadBodyInto as a backend does.
type fillBucket struct{ *memBucket }

func (f fillBucket) GetRangeInto(ctx context.Context, key string, off int64, dst []byte) error {
	b, err := f.GetRange(ctx, key, off, int64(len(dst)))
	if err != nil {
		return err
	}
	return ReadBodyInto(bytes.NewReader(b), int64(len(b)), dst, key)
}

// GetRangeInto reads into the caller's buffer, with one GET, retried as
// GetRange; without RangeFillBucket the bucket's GetRange is copied.
func TestGetRangeInto(t *testing.T) {
	for _, fill := range []bool{false, true} {
		m := newMem()
		var b Bucket = m
		if fill {
			b = fillBucket{m}
		}
		s := New("mem://bucket/p", "p", b, m.n, quick)
		id, data := storetest.Blob(1, 1000)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		before := s.Requests()
		dst := make([]byte, 20)
		if err := s.GetRangeInto(bg, id, 10, dst); err != nil || string(dst) != string(data[10:30]) {
			t.Fatalf("fill %t: GetRangeInto: %v", fill, err)
		}
		if r := s.Requests().Sub(before); r != (Requests{Get: 1}) {
			t.Errorf("fill %t: GetRangeInto of 20 bytes: requests %v, want one GET", fill, r)
		}
		m.fail["get"] = []error{statusErr(503)}
		if err := s.GetRangeInto(bg, id, 0, dst[:5]); err != nil || string(dst[:5]) != string(data[:5]) {
			t.Fatalf("fill %t: GetRangeInto after a 503: %v", fill, err)
		}
		if err := s.GetRangeInto(bg, id, 990, dst); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("fill %t: GetRangeInto past the end: %v, want Invalid", fill, err)
		}
		missing, _ := storetest.Blob(2, 10)
		if err := s.GetRangeInto(bg, missing, 0, dst); !errors.Is(err, cairn.ErrNotFound) {
			t.Errorf("fill %t: GetRangeInto of a missing object: %v, want NotFound", fill, err)
		}
	}
}

// PutHashed stores like Put (for a caller that computed the ID itself);
// Get checks the bytes as always.
func TestPutHashed(t *testing.T) {
	s, _ := newStore("p", quick)
	var _ store.HashedPutter = s
	data := []byte("a pack named by its writer")
	id := cairn.ID(blake3.Sum256(data))
	if err := s.PutHashed(context.Background(), id, data); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(context.Background(), id)
	if err != nil || string(got) != string(data) {
		t.Fatalf("Get after PutHashed: %q, %v", got, err)
	}
	wrong := cairn.ID{1}
	if err := s.PutHashed(context.Background(), wrong, data); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), wrong); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of an object stored under a wrong ID: %v, want Corrupt", err)
	}
}
