package localstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/storetest"
)

func open(t testing.TB, dir string, opts Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"sync", Options{}},
		{"sync-buffered", Options{noDirect: true}},
		{"nosync-smallpacks", Options{NoSync: true, PackSize: 64 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) cairn.Store { return open(t, t.TempDir(), tc.opts) })
		})
	}
}

func TestConformanceReopen(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"sync", Options{}},
		{"nosync-smallpacks", Options{NoSync: true, PackSize: 64 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.RunReopen(t, func(t *testing.T) func() cairn.Store {
				dir := t.TempDir()
				return func() cairn.Store { return open(t, dir, tc.opts) }
			})
		})
	}
}

// Several processes (here goroutines, each with its own Store) creating the
// same new store at once all succeed.
func TestConcurrentCreate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() {
			s, err := Open(context.Background(), dir, Options{})
			if err == nil {
				err = s.Close()
			}
			errs <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent create: %v", err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".cairn-store.tmp*")); len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// With TrustIDs, Put does not hash; a wrong ID slips in but is caught on
// read, and Verify names it.
func TestTrustIDs(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir(), Options{TrustIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id, data := storetest.Blob(1, 5000)
	if err := s.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, id); err != nil || string(got) != string(data) {
		t.Fatalf("Get = %v", err)
	}
	wrong, _ := storetest.Blob(2, 10)
	if err := s.Put(ctx, wrong, data); err != nil {
		t.Fatalf("trusted Put with a wrong ID: %v (it is not checked)", err)
	}
	bad := 0
	if err := s.Verify(ctx, func(got cairn.ID, err error) {
		if got == wrong && errors.Is(err, cairn.ErrCorrupt) {
			bad++
		}
	}); err != nil || bad != 1 {
		t.Fatalf("Verify found %d bad objects (err %v), want the wrongly named one", bad, err)
	}
	if _, err := s.Get(ctx, wrong); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of a wrongly named object = %v, want Corrupt", err)
	}
}
