package meta_test

import (
	"context"
	"sync"
	"testing"

	"cairn.dev/cairn/internal/meta"
)

// TestUseFormat: the realm record's format is raised once, to the format
// asked, by racing callers and by a second Service alike; never lowered;
// and a format this binary does not write is refused.
func TestUseFormat(t *testing.T) {
	s, _ := newVol(t, 3)
	ctx := context.Background()
	s2, err := meta.New(s.Client(), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			svc := s
			if i%2 == 1 {
				svc = s2
			}
			errs[i] = svc.UseFormat(ctx, 2)
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != nil {
			t.Fatalf("UseFormat #%d: %v", i, e)
		}
	}
	r, err := s.Realm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Format != 2 || r.ID != "r1" {
		t.Fatalf("realm record after UseFormat(2) = %+v, want format 2, id r1", r)
	}
	if err := s2.UseFormat(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if r, _ = s.Realm(ctx); r.Format != 2 {
		t.Fatalf("UseFormat(1) lowered the realm's format to %d", r.Format)
	}
	if err := s.UseFormat(ctx, meta.RecordFormat+1); err == nil {
		t.Fatalf("UseFormat(%d) succeeded; this binary writes up to %d", meta.RecordFormat+1, meta.RecordFormat)
	}
}
