package mount_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// renameOps are the renames of TestRenameKeepsListing, relative to a
// directory holding d and src (made by renameTree): into d from src (a
// file, a directory), within d onto a new name and over an existing file
// (git's index.lock), and out of d.
func renameOps(n int) [][2]string {
	var ops [][2]string
	for i := range n {
		switch i % 5 {
		case 0:
			ops = append(ops, [2]string{fmt.Sprintf("src/a%d", i), fmt.Sprintf("d/n%d", i)})
		case 1:
			ops = append(ops, [2]string{fmt.Sprintf("d/t%d", i), fmt.Sprintf("d/f%d", i)})
		case 2:
			ops = append(ops, [2]string{fmt.Sprintf("src/sub%d", i), fmt.Sprintf("d/sub%d", i)})
		case 3:
			ops = append(ops, [2]string{fmt.Sprintf("d/f%d", i), fmt.Sprintf("d/g%d", i)})
		case 4:
			ops = append(ops, [2]string{fmt.Sprintf("d/f%d", i), fmt.Sprintf("src/out%d", i)})
		}
	}
	return ops
}

// renameTree makes, under root, directory d of files f0..f(files-1) and
// subdirectories s1 and s2, and directory src, with what renameOps(n)
// moves: each file holds its own name.
func renameTree(t *testing.T, root string, files, n int) {
	t.Helper()
	write := func(rel string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"d/s1", "d/s2", "src"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range files {
		write(fmt.Sprintf("d/f%d", i))
	}
	for i := range n {
		switch i % 5 {
		case 0:
			write(fmt.Sprintf("src/a%d", i))
		case 1:
			write(fmt.Sprintf("d/t%d", i))
		case 2:
			if err := os.Mkdir(filepath.Join(root, fmt.Sprintf("src/sub%d", i)), 0o755); err != nil {
				t.Fatal(err)
			}
			write(fmt.Sprintf("src/sub%d/x", i))
		}
	}
}

// treeState describes directories d and src under root: each name, its
// type and content (files), and each directory's link count.
func treeState(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"d", "src"} {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(root, dir), &st); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s/ nlink %d", dir, st.Nlink))
		ents, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			rel := dir + "/" + e.Name()
			if e.IsDir() {
				kids, err := os.ReadDir(filepath.Join(root, rel))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("%s/ %d entries", rel, len(kids)))
				continue
			}
			b, err := os.ReadFile(filepath.Join(root, rel))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, rel+": "+string(b))
		}
	}
	slices.Sort(out)
	return out
}

// TestRenameKeepsListing: a rename into, within or out of a directory
// whose every entry the mount holds keeps it so, its listing changed in
// place: the kernel's stat of the directory after each rename (its link
// count) is answered without listing it from etcd again, which made each
// rename into a large directory (git's index.lock, a package manager's
// temporary files) cost a listing of it. The directories then read as a
// local directory's do after the same renames, also after another
// device renamed and created names in them (the watch's path).
func TestRenameKeepsListing(t *testing.T) {
	for _, mode := range versionModes {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			const files, renames = 100, 50
			local := t.TempDir()
			renameTree(t, local, files, renames)
			renameTree(t, f.mnt, files, renames)
			f.settle()
			f.syncDir("d")
			f.syncDir("src")
			var ino [2]uint64
			for i, dir := range []string{"d", "src"} {
				if _, err := os.ReadDir(f.path(dir)); err != nil {
					t.Fatal(err)
				}
				var st syscall.Stat_t
				if err := syscall.Stat(f.path(dir), &st); err != nil {
					t.Fatal(err)
				}
				if ino[i] = st.Ino; !mount.ListingCached(f.m, st.Ino) {
					t.Fatalf("%s's listing is not cached after a readdir: nothing to check", dir)
				}
			}
			ops := renameOps(renames)
			for _, op := range ops {
				if err := os.Rename(filepath.Join(local, op[0]), filepath.Join(local, op[1])); err != nil {
					t.Fatal(err)
				}
			}
			uncached := 0
			reqs := f.measure(func() {
				for _, op := range ops {
					if err := os.Rename(f.path(op[0]), f.path(op[1])); err != nil {
						t.Fatal(err)
					}
					for i, dir := range []string{"d", "src"} {
						if !mount.ListingCached(f.m, ino[i]) {
							if uncached++; uncached == 1 {
								t.Errorf("after the rename of %s to %s: %s's listing is no longer cached", op[0], op[1], dir)
							}
						}
						var st syscall.Stat_t
						if err := syscall.Stat(f.path(dir), &st); err != nil {
							t.Fatal(err)
						}
					}
				}
			})
			t.Logf("%d renames, each followed by a stat of both directories: etcd requests %v", renames, reqs)
			if reqs["Range"] >= renames/5 {
				t.Errorf("%d reads from etcd for %d renames: a listing per rename?", reqs["Range"], renames)
			}
			if got, want := treeState(t, f.mnt), treeState(t, local); !slices.Equal(got, want) {
				t.Fatalf("after the renames, the mount has\n%s\nwant (a local directory's)\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}

			// Another device renames over, renames out and creates: the
			// watch brings each change to this mount's listings.
			g := f.device(mount.Options{}, meta.Options{})
			other := [][2]string{{"d/f99", "d/f98"}, {"d/f97", "src/f97"}, {"src/out4", "d/back4"}}
			for _, root := range []string{local, g.mnt} {
				for _, op := range other {
					if err := os.Rename(filepath.Join(root, op[0]), filepath.Join(root, op[1])); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.WriteFile(filepath.Join(root, "d/new"), []byte("d/new"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			g.settle()
			want := treeState(t, local)
			var got []string
			eventually(t, "the other device's renames on this mount", func() bool {
				got = treeState(t, f.mnt)
				return slices.Equal(got, want)
			})
		})
	}
}
