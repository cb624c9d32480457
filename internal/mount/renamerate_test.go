package mount_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/mount"
)

// TestRenameRate measures renames into a directory of 5,000 entries (a
// new file renamed in from another directory, then a temporary file
// renamed over an existing one, as git's index.lock), each followed by
// a stat of the directory, in blocking and write-back mode. It asserts
// nothing: it logs renames/s. Run with CAIRN_RENAME_RATE=1.
func TestRenameRate(t *testing.T) {
	if os.Getenv("CAIRN_RENAME_RATE") == "" {
		t.Skip("a measurement: CAIRN_RENAME_RATE=1 runs it")
	}
	const files, renames = 5000, 300
	for _, mode := range []mount.Mode{mount.Blocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			for _, dir := range []string{"d", "src"} {
				if err := os.Mkdir(f.path(dir), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for i := range files {
				if err := os.WriteFile(f.path(fmt.Sprintf("d/f%d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for i := range renames {
				if err := os.WriteFile(f.path(fmt.Sprintf("src/a%d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f.path(fmt.Sprintf("d/t%d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f.settle()
			f.syncDir("d")
			f.syncDir("src")
			if _, err := os.ReadDir(f.path("d")); err != nil {
				t.Fatal(err)
			}
			d := f.path("d")
			run := func(what string, from, to func(i int) string) {
				start := time.Now()
				for i := range renames {
					if err := os.Rename(from(i), to(i)); err != nil {
						t.Fatal(err)
					}
					var st syscall.Stat_t
					if err := syscall.Stat(d, &st); err != nil {
						t.Fatal(err)
					}
				}
				el := time.Since(start)
				t.Logf("%s: %d renames (each then a stat of the directory of %d entries) in %v: %.0f renames/s",
					what, renames, files, el.Round(time.Millisecond), float64(renames)/el.Seconds())
			}
			run("into it from another directory",
				func(i int) string { return filepath.Join(f.mnt, fmt.Sprintf("src/a%d", i)) },
				func(i int) string { return filepath.Join(d, fmt.Sprintf("n%d", i)) })
			run("over an existing file in it",
				func(i int) string { return filepath.Join(d, fmt.Sprintf("t%d", i)) },
				func(i int) string { return filepath.Join(d, fmt.Sprintf("f%d", i)) })
		})
	}
}
