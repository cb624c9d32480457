package mount_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/mount"
)

// TestRenamedHereThenElsewhere: a file renamed on this mount (a -> b), then
// by another device (b -> c), is read and written through its new name, and
// nothing comes back under b (the mount's note of its own rename must not
// outlive it).
func TestRenamedHereThenElsewhere(t *testing.T) {
	for _, holdFD := range []bool{false, true} {
		f := newFixture(t, mount.Options{})
		ctx := context.Background()
		if err := os.WriteFile(f.path("a"), []byte("one\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f.path("a"), f.path("b")); err != nil {
			t.Fatal(err)
		}
		var fd *os.File
		if holdFD {
			var err error
			if fd, err = os.Open(f.path("b")); err != nil {
				t.Fatal(err)
			}
		}
		root, err := f.vol.Meta.Root(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Another device: b -> c.
		if err := f.vol.Meta.Rename(ctx, root, "b", root, "c", "v:/c"); err != nil {
			t.Fatal(err)
		}
		f.waitWatched(f.entry("c").Rev)
		time.Sleep(100 * time.Millisecond)
		if _, err := os.Stat(f.path("c")); err != nil {
			t.Errorf("holdFD=%v: stat c: %v", holdFD, err)
		}
		if _, err := os.ReadFile(f.path("c")); err != nil {
			t.Errorf("holdFD=%v: read c: %v", holdFD, err)
		}
		if w, err := os.OpenFile(f.path("c"), os.O_WRONLY|os.O_TRUNC, 0); err != nil {
			t.Errorf("holdFD=%v: open c for writing: %v", holdFD, err)
		} else {
			w.Write([]byte("two\n"))
			if err := w.Close(); err != nil {
				t.Errorf("holdFD=%v: close c: %v", holdFD, err)
			}
		}
		if fd != nil {
			fd.Close()
		}
		got := string(f.cat("c"))
		_, berr := f.vol.Meta.Get(ctx, 1, "b")
		if got != "two\n" || !errors.Is(berr, cairn.ErrNotFound) {
			t.Errorf("holdFD=%v: the write to c went elsewhere: c = %q, b err %v", holdFD, got, berr)
		}
	}
}
