// Package storetest is the one conformance suite every cairn.Store passes.
//
// Call Run from a test of the implementation with a function that opens a
// fresh, empty store; persistent stores also call RunReopen, which checks that
// what was acknowledged survives Close and reopen.
//
// The suite pins down the points the cairn.Store contract leaves to each
// implementation, so that every store behaves the same:
//
//   - Cancellation: a method called with a canceled or expired context fails
//     with an error matching cairn.ErrCanceled (Kind Canceled). Implementations
//     wrap ctx.Err() as the cause (store.CtxErr does), so errors.Is with
//     context.Canceled also holds, but callers should test cairn.ErrCanceled.
//     List checks ctx before each call of fn.
//   - Wrong ID: every store verifies on Put that id == BLAKE3-256(data) and
//     rejects a mismatch with Kind Corrupt, keeping nothing.
//   - No aliasing: Put copies (or writes out) data before returning, so the
//     caller may reuse its buffer; Get returns a slice the caller owns.
//   - Has of an empty batch returns an empty (len 0) slice and no error.
//   - Delete of an object never stored, or already deleted, returns nil.
//   - A store with store.RangeReader returns exactly the bytes asked for,
//     fails a range past the end with Kind Invalid and a missing object with
//     Kind NotFound.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// Blob returns n deterministic pseudo-random bytes derived from seed, and
// their ID.
func Blob(seed uint64, n int) (cairn.ID, []byte) {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	b := make([]byte, n)
	r := rand.NewChaCha8(s)
	_, _ = r.Read(b)
	return cairn.ID(blake3.Sum256(b)), b
}

// Run runs the conformance suite. open must return a fresh, empty store each
// time it is called; the suite closes every store it opens.
func Run(t *testing.T, open func(t *testing.T) cairn.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s cairn.Store)
	}{
		{"PutGet", testPutGet},
		{"PutIdempotent", testPutIdempotent},
		{"ConcurrentSameID", testConcurrentSameID},
		{"ConcurrentDifferentIDs", testConcurrentDifferent},
		{"GetMissing", testGetMissing},
		{"Has", testHas},
		{"Delete", testDelete},
		{"List", testList},
		{"ListStops", testListStops},
		{"Canceled", testCanceled},
		{"WrongID", testWrongID},
		{"NoAliasing", testNoAliasing},
		{"Stats", testStats},
		{"Verify", testVerify},
		{"Compact", testCompact},
		{"GetRange", testGetRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			defer func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			tc.fn(t, s)
		})
	}
}

// RunReopen runs the durability part of the suite for a persistent store.
// newStore is called once per test and names a fresh, empty location; each
// call of the returned reopen opens a store on that location. The suite
// closes every store it opens before reopening.
func RunReopen(t *testing.T, newStore func(t *testing.T) (reopen func() cairn.Store)) {
	tests := []struct {
		name string
		fn   func(t *testing.T, reopen func() cairn.Store)
	}{
		{"PutSurvives", testReopenPut},
		{"DeleteSurvives", testReopenDelete},
		{"CompactSurvives", testReopenCompact},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

var bg = context.Background()

func put(t *testing.T, s cairn.Store, id cairn.ID, data []byte) {
	t.Helper()
	if err := s.Put(bg, id, data); err != nil {
		t.Fatalf("Put %s (%d bytes): %v", id.Short(), len(data), err)
	}
}

func mustGet(t *testing.T, s cairn.Store, id cairn.ID, want []byte) {
	t.Helper()
	got, err := s.Get(bg, id)
	if err != nil {
		t.Fatalf("Get %s: %v", id.Short(), err)
	}
	if string(got) != string(want) {
		t.Fatalf("Get %s: got %d bytes, want %d (content differs)", id.Short(), len(got), len(want))
	}
}

func mustMissing(t *testing.T, s cairn.Store, id cairn.ID) {
	t.Helper()
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get %s: err = %v, want NotFound", id.Short(), err)
	}
	found, err := s.Has(bg, []cairn.ID{id})
	if err != nil || len(found) != 1 || found[0] {
		t.Fatalf("Has %s = %v, %v; want [false]", id.Short(), found, err)
	}
}

func list(t *testing.T, s cairn.Store) map[cairn.ID]int64 {
	t.Helper()
	m := map[cairn.ID]int64{}
	err := s.List(bg, func(id cairn.ID, size int64) error {
		if _, dup := m[id]; dup {
			t.Errorf("List reported %s twice", id.Short())
		}
		m[id] = size
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return m
}

func checkList(t *testing.T, s cairn.Store, want map[cairn.ID][]byte) {
	t.Helper()
	got := list(t, s)
	for id, data := range want {
		size, ok := got[id]
		if !ok {
			t.Errorf("List misses %s", id.Short())
		} else if size != int64(len(data)) {
			t.Errorf("List size of %s = %d, want %d", id.Short(), size, len(data))
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("List reports %s, which is not live", id.Short())
		}
	}
}

func testPutGet(t *testing.T, s cairn.Store) {
	for i, n := range []int{0, 1, 100, 16 << 10, 1<<20 + 7, 4 << 20} {
		id, data := Blob(uint64(i), n)
		put(t, s, id, data)
		mustGet(t, s, id, data)
	}
	id, _ := Blob(0, 0)
	if id != cairn.ID(blake3.Sum256(nil)) {
		t.Fatal("Blob of size 0 has the wrong ID")
	}
}

func testPutIdempotent(t *testing.T, s cairn.Store) {
	id, data := Blob(1, 5000)
	for range 3 {
		put(t, s, id, data)
	}
	mustGet(t, s, id, data)
	checkList(t, s, map[cairn.ID][]byte{id: data})
}

func testConcurrentSameID(t *testing.T, s cairn.Store) {
	id, data := Blob(2, 16<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			if err := s.Put(bg, id, data); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Put of one ID: %v", err)
	}
	mustGet(t, s, id, data)
	checkList(t, s, map[cairn.ID][]byte{id: data})
}

func testConcurrentDifferent(t *testing.T, s cairn.Store) {
	const writers, each = 16, 40
	want := map[cairn.ID][]byte{}
	var blobs [writers][each]struct {
		id   cairn.ID
		data []byte
	}
	for w := range writers {
		for i := range each {
			id, data := Blob(uint64(1000+w*each+i), 1+(w*each+i)*97%20000)
			blobs[w][i].id, blobs[w][i].data = id, data
			want[id] = data
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for _, b := range blobs[w] {
				if err := s.Put(bg, b.id, b.data); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Put: %v", err)
	}
	for id, data := range want {
		mustGet(t, s, id, data)
	}
	checkList(t, s, want)
}

func testGetMissing(t *testing.T, s cairn.Store) {
	id, _ := Blob(3, 10)
	mustMissing(t, s, id)
	var zero cairn.ID
	mustMissing(t, s, zero)
}

func testHas(t *testing.T, s cairn.Store) {
	a, da := Blob(4, 10)
	b, db := Blob(5, 0)
	m1, _ := Blob(6, 10)
	m2, _ := Blob(7, 10)
	put(t, s, a, da)
	put(t, s, b, db)
	ids := []cairn.ID{a, m1, b, a, m2, m1, b}
	want := []bool{true, false, true, true, false, false, true}
	found, err := s.Has(bg, ids)
	if err != nil {
		t.Fatalf("Has: %v", err)
	}
	if fmt.Sprint(found) != fmt.Sprint(want) {
		t.Fatalf("Has = %v, want %v", found, want)
	}
	for _, batch := range [][]cairn.ID{nil, {}} {
		found2, herr := s.Has(bg, batch)
		if herr != nil || len(found2) != 0 {
			t.Fatalf("Has(%#v) = %v, %v; want [], nil", batch, found2, herr)
		}
	}
	// A large batch, to catch implementations that split batches.
	big := make([]cairn.ID, 5000)
	for i := range big {
		if i%3 == 0 {
			big[i] = a
		} else {
			big[i], _ = Blob(uint64(100000+i), 1)
		}
	}
	found, err = s.Has(bg, big)
	if err != nil || len(found) != len(big) {
		t.Fatalf("Has(5000) = %d answers, %v", len(found), err)
	}
	for i, f := range found {
		if f != (i%3 == 0) {
			t.Fatalf("Has(5000)[%d] = %v", i, f)
		}
	}
}

func testDelete(t *testing.T, s cairn.Store) {
	a, da := Blob(8, 300)
	b, db := Blob(9, 300)
	put(t, s, a, da)
	put(t, s, b, db)
	if err := s.Delete(bg, a); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	mustMissing(t, s, a)
	mustGet(t, s, b, db)
	if err := s.Delete(bg, a); err != nil {
		t.Fatalf("Delete again: %v", err)
	}
	never, _ := Blob(10, 1)
	if err := s.Delete(bg, never); err != nil {
		t.Fatalf("Delete of a missing object: %v", err)
	}
	checkList(t, s, map[cairn.ID][]byte{b: db})
	put(t, s, a, da)
	mustGet(t, s, a, da)
	checkList(t, s, map[cairn.ID][]byte{a: da, b: db})
}

func testList(t *testing.T, s cairn.Store) {
	checkList(t, s, map[cairn.ID][]byte{})
	want := map[cairn.ID][]byte{}
	var ids []cairn.ID
	for i := range 300 {
		id, data := Blob(uint64(20000+i), i*37%5000)
		put(t, s, id, data)
		want[id] = data
		ids = append(ids, id)
	}
	checkList(t, s, want)
	for _, id := range ids[:100] {
		if err := s.Delete(bg, id); err != nil {
			t.Fatal(err)
		}
		delete(want, id)
	}
	checkList(t, s, want)
}

func testListStops(t *testing.T, s cairn.Store) {
	for i := range 50 {
		id, data := Blob(uint64(30000+i), 10)
		put(t, s, id, data)
	}
	stop := errors.New("stop here")
	calls := 0
	err := s.List(bg, func(cairn.ID, int64) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List with failing fn: err = %v after %d calls; want the fn's error after 1 call", err, calls)
	}
}

func testCanceled(t *testing.T, s cairn.Store) {
	id, data := Blob(11, 100)
	put(t, s, id, data)
	other, odata := Blob(12, 100)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, cairn.ErrCanceled) {
			t.Errorf("%s with canceled ctx: err = %v, want Canceled", what, err)
		}
	}
	check("Put", s.Put(ctx, other, odata))
	check("Put existing", s.Put(ctx, id, data))
	_, err := s.Get(ctx, id)
	check("Get", err)
	_, err = s.Has(ctx, []cairn.ID{id})
	check("Has", err)
	check("Delete", s.Delete(ctx, id))
	check("List", s.List(ctx, func(cairn.ID, int64) error { return nil }))
	if sv, ok := s.(store.Verifier); ok {
		check("Verify", sv.Verify(ctx, func(cairn.ID, error) {}))
	}
	if sc, ok := s.(store.Compacter); ok {
		_, err = sc.Compact(ctx)
		check("Compact", err)
	}
	// The canceled Delete must not have deleted.
	mustGet(t, s, id, data)

	// Cancel while List runs: fn is not called again.
	for i := range 20 {
		id, data := Blob(uint64(40000+i), 10)
		put(t, s, id, data)
	}
	ctx, cancel = context.WithCancel(bg)
	defer cancel()
	calls := 0
	err = s.List(ctx, func(cairn.ID, int64) error {
		calls++
		cancel()
		return nil
	})
	check("List canceled midway", err)
	if calls != 1 {
		t.Errorf("List called fn %d times after ctx was canceled in the first call", calls)
	}
}

func testWrongID(t *testing.T, s cairn.Store) {
	id, _ := Blob(13, 1000)
	_, other := Blob(14, 1000)
	err := s.Put(bg, id, other)
	if !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Put with a wrong ID: err = %v, want Corrupt", err)
	}
	mustMissing(t, s, id)
	checkList(t, s, map[cairn.ID][]byte{})
}

func testNoAliasing(t *testing.T, s cairn.Store) {
	id, data := Blob(15, 4096)
	orig := append([]byte(nil), data...)
	put(t, s, id, data)
	for i := range data {
		data[i] ^= 0xff
	}
	mustGet(t, s, id, orig)
	got, err := s.Get(bg, id)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i] = 0
	}
	mustGet(t, s, id, orig)
}

func testStats(t *testing.T, s cairn.Store) {
	st, ok := s.(cairn.StoreStats)
	if !ok {
		t.Skip("store does not implement cairn.StoreStats")
	}
	check := func(objects, bytes int64) {
		t.Helper()
		u, err := st.Stats(bg)
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		if u.Objects != objects || u.Bytes != bytes || u.Disk < u.Bytes {
			t.Fatalf("Stats = %+v, want Objects %d Bytes %d Disk >= Bytes", u, objects, bytes)
		}
	}
	check(0, 0)
	a, da := Blob(16, 1000)
	b, db := Blob(17, 2345)
	put(t, s, a, da)
	put(t, s, b, db)
	put(t, s, a, da)
	check(2, 3345)
	if err := s.Delete(bg, a); err != nil {
		t.Fatal(err)
	}
	check(1, 2345)
}

func testVerify(t *testing.T, s cairn.Store) {
	v, ok := s.(store.Verifier)
	if !ok {
		t.Skip("store does not implement store.Verifier")
	}
	for i := range 100 {
		id, data := Blob(uint64(50000+i), i*101)
		put(t, s, id, data)
	}
	err := v.Verify(bg, func(id cairn.ID, err error) {
		t.Errorf("Verify reports %s on a healthy store: %v", id.Short(), err)
	})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func testCompact(t *testing.T, s cairn.Store) {
	c, ok := s.(store.Compacter)
	if !ok {
		t.Skip("store does not implement store.Compacter")
	}
	want := map[cairn.ID][]byte{}
	var ids []cairn.ID
	for i := range 400 {
		id, data := Blob(uint64(60000+i), 1000+i)
		put(t, s, id, data)
		want[id] = data
		ids = append(ids, id)
	}
	for i, id := range ids {
		if i%4 != 0 {
			if err := s.Delete(bg, id); err != nil {
				t.Fatal(err)
			}
			delete(want, id)
		}
	}
	if _, err := c.Compact(bg); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	for id, data := range want {
		mustGet(t, s, id, data)
	}
	for i, id := range ids {
		if i%4 != 0 {
			mustMissing(t, s, id)
		}
	}
	checkList(t, s, want)
	// A second compaction with nothing to do is harmless.
	if _, err := c.Compact(bg); err != nil {
		t.Fatalf("second Compact: %v", err)
	}
	checkList(t, s, want)
}

func testGetRange(t *testing.T, s cairn.Store) {
	rr, ok := s.(store.RangeReader)
	if !ok {
		t.Skip("store does not implement store.RangeReader")
	}
	id, data := Blob(18, 100000)
	put(t, s, id, data)
	for _, r := range [][2]int64{{0, 0}, {0, 1}, {0, 100000}, {99999, 1}, {100000, 0}, {4096, 8192}, {12345, 54321}} {
		got, err := rr.GetRange(bg, id, r[0], r[1])
		if err != nil {
			t.Fatalf("GetRange(%d, %d): %v", r[0], r[1], err)
		}
		if string(got) != string(data[r[0]:r[0]+r[1]]) {
			t.Fatalf("GetRange(%d, %d): got %d bytes, want %d (content differs)", r[0], r[1], len(got), r[1])
		}
		if len(got) > 0 {
			got[0] ^= 0xff // the caller owns the slice
		}
	}
	mustGet(t, s, id, data)
	for _, r := range [][2]int64{{99999, 2}, {100001, 0}, {0, 100001}, {-1, 1}, {0, -1}} {
		if _, err := rr.GetRange(bg, id, r[0], r[1]); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("GetRange(%d, %d) of a 100000-byte object: err = %v, want Invalid", r[0], r[1], err)
		}
	}
	missing, _ := Blob(19, 10)
	if _, err := rr.GetRange(bg, missing, 0, 1); !errors.Is(err, cairn.ErrNotFound) {
		t.Errorf("GetRange of a missing object: err = %v, want NotFound", err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := rr.GetRange(ctx, id, 0, 1); !errors.Is(err, cairn.ErrCanceled) {
		t.Errorf("GetRange with canceled ctx: err = %v, want Canceled", err)
	}
}

func closeStore(t *testing.T, s cairn.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func testReopenPut(t *testing.T, reopen func() cairn.Store) {
	s := reopen()
	want := map[cairn.ID][]byte{}
	for i := range 200 {
		n := i * 131 % 30000
		if i == 199 {
			n = 4 << 20
		}
		id, data := Blob(uint64(70000+i), n)
		put(t, s, id, data)
		want[id] = data
	}
	closeStore(t, s)
	for round := range 2 {
		s = reopen()
		for id, data := range want {
			mustGet(t, s, id, data)
		}
		checkList(t, s, want)
		// Puts after reopen land next to the old ones.
		id, data := Blob(uint64(80000+round), 777)
		put(t, s, id, data)
		want[id] = data
		closeStore(t, s)
	}
	s = reopen()
	defer closeStore(t, s)
	checkList(t, s, want)
}

func testReopenDelete(t *testing.T, reopen func() cairn.Store) {
	s := reopen()
	want := map[cairn.ID][]byte{}
	var ids []cairn.ID
	for i := range 100 {
		id, data := Blob(uint64(90000+i), 500+i)
		put(t, s, id, data)
		want[id] = data
		ids = append(ids, id)
	}
	for _, id := range ids[:50] {
		if err := s.Delete(bg, id); err != nil {
			t.Fatal(err)
		}
		delete(want, id)
	}
	closeStore(t, s)

	s = reopen()
	for _, id := range ids[:50] {
		mustMissing(t, s, id)
	}
	checkList(t, s, want)
	// Put some deleted objects back; delete some survivors.
	for i, id := range ids[:10] {
		_, data := Blob(uint64(90000+i), 500+i)
		put(t, s, id, data)
		want[id] = data
	}
	for _, id := range ids[50:60] {
		if err := s.Delete(bg, id); err != nil {
			t.Fatal(err)
		}
		delete(want, id)
	}
	closeStore(t, s)

	s = reopen()
	defer closeStore(t, s)
	for id, data := range want {
		mustGet(t, s, id, data)
	}
	for _, id := range ids[10:60] {
		mustMissing(t, s, id)
	}
	checkList(t, s, want)
}

func testReopenCompact(t *testing.T, reopen func() cairn.Store) {
	s := reopen()
	if _, ok := s.(store.Compacter); !ok {
		closeStore(t, s)
		t.Skip("store does not implement store.Compacter")
	}
	want := map[cairn.ID][]byte{}
	var ids []cairn.ID
	for i := range 300 {
		id, data := Blob(uint64(95000+i), 2000+i)
		put(t, s, id, data)
		want[id] = data
		ids = append(ids, id)
	}
	closeStore(t, s)

	s = reopen()
	for i, id := range ids {
		if i%3 != 0 {
			if err := s.Delete(bg, id); err != nil {
				t.Fatal(err)
			}
			delete(want, id)
		}
	}
	if _, err := s.(store.Compacter).Compact(bg); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	checkList(t, s, want)
	closeStore(t, s)

	s = reopen()
	defer closeStore(t, s)
	for id, data := range want {
		mustGet(t, s, id, data)
	}
	for i, id := range ids {
		if i%3 != 0 {
			mustMissing(t, s, id)
		}
	}
	checkList(t, s, want)
}
