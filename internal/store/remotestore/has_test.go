package remotestore

import (
	"sync"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// Many concurrent small Has calls (writers of small files, a chunk each)
// share has requests, and each gets its own answers.
func TestHasCoalesced(t *testing.T) {
	r := newRealm(t)
	st := memstore.New()
	const n = 2000
	for i := range n / 2 { // even seeds present, odd ones not
		id, data := storetest.Blob(uint64(2*i), 64)
		if err := st.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
	}
	addr, wc := countedNode(t, r, st)
	s := newClient(t, r, addr, Options{})
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id, _ := storetest.Blob(uint64(i), 64)
			other, _ := storetest.Blob(uint64(i+1), 64)
			found, err := s.Has(bg, []cairn.ID{id, other})
			if err != nil {
				t.Errorf("Has: %v", err)
				return
			}
			if found[0] != (i%2 == 0) || found[1] != (i%2 == 1 && i+1 < n) {
				t.Errorf("Has(%d, %d) = %v", i, i+1, found)
			}
		})
	}
	wg.Wait()
	reqs := wc.has.Load()
	t.Logf("%d Has calls of 2 IDs: %d has requests", n, reqs)
	// Without coalescing it is exactly n; how far below depends on the
	// scheduling of 64 callers (~200 on an idle machine).
	if reqs > n/2 {
		t.Fatalf("%d Has calls made %d requests: not coalesced", n, reqs)
	}
}
