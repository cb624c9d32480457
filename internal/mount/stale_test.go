package mount_test

// Decisions made on the entry cache, while it has not heard yet of a
// change made on another device (its watch stalled: stallWatch). The
// cache may answer a lookup or a stat so, within its trust window
// (entries.go); it must not make a change this device asks for act on a
// name as it was before the other device's change.

import (
	"context"
	"os"
	"testing"

	"cairn.dev/cairn/internal/mount"
)

// TestSetattrOnStaleEntry: a chmod that changes nothing as far as the
// entry cache knows still makes the mode what it asks for, when another
// device changed it just before. It was skipped as a no-op on the
// cache's word, and the other device's mode stayed.
func TestSetattrOnStaleEntry(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, mount.Options{})
	if err := os.WriteFile(f.path("a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(f.path("a")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("stat a: %v, %v", fi, err)
	}
	resume := f.stallWatch()
	defer resume()
	e := f.entry("a")
	e.Mode = 0o600 // another device's chmod
	if _, err := f.vol.Meta.Update(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	resume()
	if got := f.entry("a").Mode; got != 0o644 {
		t.Fatalf("mode %o after this device's chmod 644 that followed another device's chmod 600, want 644", got)
	}
}
