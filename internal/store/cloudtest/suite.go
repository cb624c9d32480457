package cloudtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/objstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// Backend is one cloud backend running against its test server, as
// RunStore needs it.
type Backend struct {
	// Open returns a store under prefix, with credentials the server
	// accepts.
	Open func(t *testing.T, prefix string, o objstore.Options) *objstore.Store
	// OpenAt returns a store like Open's but whose server is at addr
	// (127.0.0.1:PORT), speaking plain HTTP.
	OpenAt func(t *testing.T, addr, prefix string, o objstore.Options) *objstore.Store
	// OpenRefused returns a store whose requests are refused for their
	// credentials.
	OpenRefused func(t *testing.T, prefix string) *objstore.Store
	// RawPut writes data under key with the SDK, behind the store's back.
	RawPut func(t *testing.T, key string, data []byte)
	// Stop stops the server for good.
	Stop func()
}

// fast retries, for tests of failures.
var fast = objstore.Options{Attempts: 3, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

// RunStore runs storetest's conformance suite on the backend, then the
// tests of what only cloud stores do: request counts, paging, damage found
// on read, foreign keys and prefixes, refused credentials, a server that
// is gone (Unavailable, after the configured attempts) and one that never
// answers (bounded by ctx). It stops the server at the end.
func RunStore(t *testing.T, b Backend) {
	var mu sync.Mutex
	n := 0
	fresh := func(what string) string {
		mu.Lock()
		defer mu.Unlock()
		n++
		return fmt.Sprintf("cairn/%s-%d", what, n)
	}
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) cairn.Store { return b.Open(t, fresh("conf"), objstore.Options{}) })
	})
	t.Run("Requests", func(t *testing.T) { testRequests(t, b.Open(t, fresh("req"), objstore.Options{})) })
	t.Run("Paging", func(t *testing.T) { testPaging(t, b.Open(t, fresh("page"), objstore.Options{PageSize: 7})) })
	t.Run("Corrupt", func(t *testing.T) {
		prefix := fresh("corrupt")
		testCorrupt(t, b.Open(t, prefix, objstore.Options{}), prefix, b.RawPut)
	})
	t.Run("ForeignKeys", func(t *testing.T) {
		prefix := fresh("foreign")
		testForeign(t, b, prefix)
	})
	t.Run("Closed", func(t *testing.T) { testClosed(t, b.Open(t, fresh("closed"), objstore.Options{})) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, b.OpenRefused(t, fresh("refused"))) })
	t.Run("NoAnswer", func(t *testing.T) { testNoAnswer(t, b) })
	t.Run("ServerGone", func(t *testing.T) { testGone(t, b, b.Open(t, fresh("gone"), fast)) })
}

var bg = context.Background()

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func closeStore(t *testing.T, s cairn.Store) {
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// testRequests checks that each call costs the requests it should.
func testRequests(t *testing.T, s *objstore.Store) {
	closeStore(t, s)
	a, da := storetest.Blob(1, 1000)
	b, db := storetest.Blob(2, 2000)
	missing, _ := storetest.Blob(3, 10)
	step := func(what string, want objstore.Requests, fn func()) {
		t.Helper()
		before := s.Requests()
		fn()
		if got := s.Requests().Sub(before); got != want {
			t.Errorf("%s: requests %v, want %v", what, got, want)
		}
	}
	step("Put", objstore.Requests{Put: 1}, func() { must(t, s.Put(bg, a, da)) })
	step("second Put", objstore.Requests{Put: 1}, func() { must(t, s.Put(bg, b, db)) })
	step("Get", objstore.Requests{Get: 1}, func() {
		got, err := s.Get(bg, a)
		must(t, err)
		if string(got) != string(da) {
			t.Fatal("Get returned other bytes")
		}
	})
	step("Get missing", objstore.Requests{Get: 1}, func() {
		if _, err := s.Get(bg, missing); !errors.Is(err, cairn.ErrNotFound) {
			t.Fatalf("Get missing: %v, want NotFound", err)
		}
	})
	step("GetRange", objstore.Requests{Get: 1}, func() {
		got, err := s.GetRange(bg, b, 100, 900)
		must(t, err)
		if string(got) != string(db[100:1000]) {
			t.Fatal("GetRange returned other bytes")
		}
	})
	step("GetRange past the end", objstore.Requests{Get: 1}, func() {
		if _, err := s.GetRange(bg, b, 1999, 2); !errors.Is(err, cairn.ErrInvalid) {
			t.Fatalf("GetRange past the end: %v, want Invalid", err)
		}
	})
	step("GetRangeInto", objstore.Requests{Get: 1}, func() {
		dst := make([]byte, 900)
		must(t, s.GetRangeInto(bg, b, 100, dst))
		if string(dst) != string(db[100:1000]) {
			t.Fatal("GetRangeInto read other bytes")
		}
	})
	step("GetRangeInto past the end", objstore.Requests{Get: 1}, func() {
		if err := s.GetRangeInto(bg, b, 1999, make([]byte, 2)); !errors.Is(err, cairn.ErrInvalid) {
			t.Fatalf("GetRangeInto past the end: %v, want Invalid", err)
		}
	})
	step("GetRangeInto missing", objstore.Requests{Get: 1}, func() {
		if err := s.GetRangeInto(bg, missing, 0, make([]byte, 2)); !errors.Is(err, cairn.ErrNotFound) {
			t.Fatalf("GetRangeInto of a missing object: %v, want NotFound", err)
		}
	})
	step("GetRange of nothing", objstore.Requests{Head: 1}, func() {
		if _, err := s.GetRange(bg, missing, 0, 0); !errors.Is(err, cairn.ErrNotFound) {
			t.Fatalf("GetRange of 0 bytes of a missing object: %v, want NotFound", err)
		}
	})
	// One HEAD per distinct ID.
	step("Has", objstore.Requests{Head: 3}, func() {
		found, err := s.Has(bg, []cairn.ID{a, missing, a, b, missing, a})
		must(t, err)
		if fmt.Sprint(found) != "[true false true true false true]" {
			t.Fatalf("Has = %v", found)
		}
	})
	step("List", objstore.Requests{List: 1}, func() {
		seen := 0
		must(t, s.List(bg, func(cairn.ID, int64) error { seen++; return nil }))
		if seen != 2 {
			t.Fatalf("List saw %d objects, want 2", seen)
		}
	})
	step("Stats", objstore.Requests{List: 1}, func() {
		u, err := s.Stats(bg)
		must(t, err)
		if u.Objects != 2 || u.Bytes != 3000 {
			t.Fatalf("Stats = %+v, want 2 objects of 3000 bytes", u)
		}
	})
	step("Delete", objstore.Requests{Delete: 1}, func() { must(t, s.Delete(bg, a)) })
	if m := s.Requests().Map(); m["PUT"] != 2 || m["GET"] != 7 || m["HEAD"] != 4 || m["LIST"] != 2 || m["DELETE"] != 1 {
		t.Errorf("Requests().Map() = %v", m)
	}
}

// testPaging lists more objects than a page holds.
func testPaging(t *testing.T, s *objstore.Store) {
	closeStore(t, s)
	want := map[cairn.ID]int64{}
	for i := range 25 {
		id, data := storetest.Blob(uint64(100+i), 10+i)
		must(t, s.Put(bg, id, data))
		want[id] = int64(len(data))
	}
	before := s.Requests()
	got := map[cairn.ID]int64{}
	must(t, s.List(bg, func(id cairn.ID, size int64) error {
		if _, dup := got[id]; dup {
			t.Errorf("List reported %s twice", id.Short())
		}
		got[id] = size
		return nil
	}))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("List over pages of 7 = %v, want %v", got, want)
	}
	// 25 objects in pages of 7: 7, 7, 7, 4.
	if n := s.Requests().Sub(before).List; n != 4 {
		t.Errorf("List of 25 objects in pages of 7 sent %d LIST requests, want 4", n)
	}
}

// testCorrupt damages an object behind the store's back.
func testCorrupt(t *testing.T, s *objstore.Store, prefix string, rawPut func(*testing.T, string, []byte)) {
	closeStore(t, s)
	id, data := storetest.Blob(7, 5000)
	must(t, s.Put(bg, id, data))
	bad := append([]byte(nil), data...)
	bad[1234] ^= 0x01
	rawPut(t, objstore.Key(prefix, id), bad)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of a damaged object: err = %v, want Corrupt", err)
	}
	rawPut(t, objstore.Key(prefix, id), data[:100])
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of a truncated object: err = %v, want Corrupt", err)
	}
	// Put writes again, and so repairs.
	must(t, s.Put(bg, id, data))
	got, err := s.Get(bg, id)
	if err != nil || string(got) != string(data) {
		t.Fatalf("Get after Put repaired the object: %v", err)
	}
}

// testForeign puts keys that are not cairn objects under the prefix, and
// objects under neighbouring prefixes and the bucket's root: List sees
// only its own.
func testForeign(t *testing.T, b Backend, prefix string) {
	s := b.Open(t, prefix, objstore.Options{})
	closeStore(t, s)
	id, data := storetest.Blob(8, 100)
	must(t, s.Put(bg, id, data))
	other, odata := storetest.Blob(9, 100)
	h := other.String()
	for _, k := range []string{
		prefix + "/README",
		prefix + "/" + h[:2] + "/" + h + ".tmp",
		prefix + "/" + h[2:4] + "/" + h, // wrong fan-out directory
		prefix + "/xx/" + h,
		prefix + "/" + h[:2] + "/" + h[:63] + "G",
		prefix + "-neighbour/" + h[:2] + "/" + h, // another prefix that begins alike
		prefix + "/sub/" + h[:2] + "/" + h,       // a deeper prefix
	} {
		b.RawPut(t, k, odata)
	}
	neighbour := b.Open(t, prefix+"x", objstore.Options{})
	closeStore(t, neighbour)
	must(t, neighbour.Put(bg, other, odata))
	root := b.Open(t, "", objstore.Options{})
	closeStore(t, root)
	rid, rdata := storetest.Blob(10, 100)
	must(t, root.Put(bg, rid, rdata))

	list := func(s *objstore.Store) map[cairn.ID]int64 {
		m := map[cairn.ID]int64{}
		must(t, s.List(bg, func(id cairn.ID, size int64) error { m[id] = size; return nil }))
		return m
	}
	if got := list(s); len(got) != 1 || got[id] != 100 {
		t.Errorf("List under %q = %v, want only %s", prefix, got, id.Short())
	}
	if got := list(root); len(got) != 1 || got[rid] != 100 {
		t.Errorf("List of the bucket's root = %v, want only %s", got, rid.Short())
	}
	if found, err := s.Has(bg, []cairn.ID{id, other}); err != nil || !found[0] || found[1] {
		t.Errorf("Has = %v, %v; want [true false]", found, err)
	}
}

func testClosed(t *testing.T, s *objstore.Store) {
	id, data := storetest.Blob(11, 10)
	must(t, s.Put(bg, id, data))
	must(t, s.Close())
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("Get after Close: %v, want Invalid", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// calls runs every method that makes requests and returns their errors.
func calls(s *objstore.Store) map[string]error {
	id, data := storetest.Blob(12, 100)
	errs := map[string]error{}
	errs["Put"] = s.Put(bg, id, data)
	_, errs["Get"] = s.Get(bg, id)
	_, errs["Has"] = s.Has(bg, []cairn.ID{id})
	errs["Delete"] = s.Delete(bg, id)
	errs["List"] = s.List(bg, func(cairn.ID, int64) error { return nil })
	_, errs["Stats"] = s.Stats(bg)
	return errs
}

// testRefused: credentials the server refuses give Permission, at once
// (one request each: refusals are not retried).
func testRefused(t *testing.T, s *objstore.Store) {
	closeStore(t, s)
	for what, err := range calls(s) {
		if !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s with refused credentials: err = %v, want Permission", what, err)
		}
	}
	if r := s.Requests(); r.Put != 1 || r.Get != 1 || r.Head != 1 || r.Delete != 1 || r.List != 2 {
		t.Errorf("requests %v: want one per call (refusals are not retried)", r)
	}
}

// testNoAnswer points a store at a server that accepts connections and
// never answers: every call ends with Canceled when its ctx expires.
func testNoAnswer(t *testing.T, b Backend) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	s := b.OpenAt(t, l.Addr().String(), "cairn/silent", fast)
	closeStore(t, s)
	id, data := storetest.Blob(13, 100)
	for what, call := range map[string]func(ctx context.Context) error{
		"Put": func(ctx context.Context) error { return s.Put(ctx, id, data) },
		"Get": func(ctx context.Context) error { _, err := s.Get(ctx, id); return err },
		"Has": func(ctx context.Context) error { _, err := s.Has(ctx, []cairn.ID{id}); return err },
		"List": func(ctx context.Context) error {
			return s.List(ctx, func(cairn.ID, int64) error { return nil })
		},
	} {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		t0 := time.Now()
		err := call(ctx)
		cancel()
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("%s to a silent server returned after %v; want about its ctx's 300ms", what, d)
		}
		if !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s to a silent server: err = %v, want Canceled (deadline exceeded)", what, err)
		}
	}
}

// testGone stops the server: every call fails with Unavailable after the
// store's 3 attempts, quickly.
func testGone(t *testing.T, b Backend, s *objstore.Store) {
	closeStore(t, s)
	id, data := storetest.Blob(14, 100)
	must(t, s.Put(bg, id, data))
	b.Stop()
	before := s.Requests()
	t0 := time.Now()
	for what, err := range calls(s) {
		if !errors.Is(err, cairn.ErrUnavailable) {
			t.Errorf("%s with the server gone: err = %v, want Unavailable", what, err)
		}
	}
	if d := time.Since(t0); d > 20*time.Second {
		t.Errorf("calls with the server gone took %v", d)
	}
	if r := s.Requests().Sub(before); r.Put != 3 || r.Get != 3 || r.Head != 3 || r.Delete != 3 || r.List != 6 {
		t.Errorf("requests with the server gone: %v; want 3 attempts per call", r)
	}
	// A canceled context still wins over retrying.
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	slow := b.Open(t, "cairn/gone-slow", objstore.Options{Attempts: 100, Backoff: time.Second})
	closeStore(t, slow)
	t0 = time.Now()
	if _, err := slow.Get(ctx, id); !errors.Is(err, cairn.ErrCanceled) {
		t.Errorf("Get with 100 attempts and a 50ms ctx: %v, want Canceled", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Get with a 50ms ctx took %v", d)
	}
}
