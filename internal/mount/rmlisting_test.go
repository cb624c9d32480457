package mount_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/mount"
)

// TestRemoveKeepsListing: removing names from a directory whose every
// entry the mount holds keeps it so: the kernel's stat of the directory
// after each unlink of an rm -rf (its link count) is answered without
// listing it from etcd again, which made an rm -rf of a directory of n
// entries cost O(n) per unlink.
func TestRemoveKeepsListing(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			const files = 100
			d := f.path("d")
			for _, sub := range []string{"s1", "s2"} {
				if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for i := range files {
				if err := os.WriteFile(filepath.Join(d, fmt.Sprint(i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f.settle()
			f.syncDir("d")
			if _, err := os.ReadDir(d); err != nil {
				t.Fatal(err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(d, &st); err != nil {
				t.Fatal(err)
			}
			if !mount.ListingCached(f.m, st.Ino) {
				t.Fatal("the directory's listing is not cached after a readdir: nothing to check")
			}
			reqs := f.measure(func() {
				for i := range files {
					if err := os.Remove(filepath.Join(d, fmt.Sprint(i))); err != nil {
						t.Fatal(err)
					}
					if !mount.ListingCached(f.m, st.Ino) {
						t.Fatalf("after the unlink of %d: the directory's listing is no longer cached", i)
					}
					var st2 syscall.Stat_t
					if err := syscall.Stat(d, &st2); err != nil {
						t.Fatal(err)
					}
					if st2.Nlink != 4 {
						t.Fatalf("after the unlink of %d: link count %d, want 4", i, st2.Nlink)
					}
				}
			})
			t.Logf("%d unlinks, each followed by a stat of the directory: etcd requests %v", files, reqs)
			if reqs["Range"] >= files/2 {
				t.Errorf("%d reads from etcd for %d unlinks: a listing per unlink?", reqs["Range"], files)
			}
			names, err := os.ReadDir(d)
			if err != nil {
				t.Fatal(err)
			}
			if len(names) != 2 {
				t.Fatalf("left %d names, want the 2 subdirectories", len(names))
			}
		})
	}
}
