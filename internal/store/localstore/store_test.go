package localstore

import (
	"context"
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
