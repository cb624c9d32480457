package localstore

import (
	"context"
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
