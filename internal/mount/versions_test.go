package mount_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/mount"
)

// versionModes are the mount modes the version tests run in.
var versionModes = []mount.Mode{mount.Blocking, mount.NonBlocking, mount.WriteBack}

// settle waits (up to a generous deadline) until every close of f's
// mount is committed in the metadata.
func (f *fixture) settle() {
	f.t.Helper()
	f.waitClosed(0)
	f.waitPending(60 * time.Second)
}

// contents reads every kept version of rel, oldest first.
func (f *fixture) contents(rel string) []string {
	f.t.Helper()
	e := f.entry(rel)
	var out []string
	for i := range e.Versions {
		var b bytesBuf
		if err := f.vol.ReadFile(context.Background(), e, &e.Versions[i], &b); err != nil {
			f.t.Fatalf("read version %d of %s: %v", e.Versions[i].N, rel, err)
		}
		out = append(out, string(b))
	}
	return out
}

type bytesBuf []byte

func (b *bytesBuf) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

// saveLikeSed writes content to rel as sed -i and editors do: a new
// temporary file renamed over the original.
func (f *fixture) saveLikeSed(rel, content string) {
	f.t.Helper()
	tmp := rel + ".tmp"
	if err := os.WriteFile(f.path(tmp), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(f.path(tmp), f.path(rel)); err != nil {
		f.t.Fatal(err)
	}
}

// TestTruncateAtOpenCommitsWithClose: `echo x > f` (open with O_TRUNC,
// a dup of the descriptor, the original closed before anything is
// written, the write through the dup, its close) adds exactly one
// version, and nobody sees an empty one in between; an open with O_TRUNC
// closed without a write commits the empty file, once. In every mode.
func TestTruncateAtOpenCommitsWithClose(t *testing.T) {
	for _, mode := range versionModes {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			mount.SetQuietTime(f.m, 0)
			if err := os.WriteFile(f.path("a"), []byte("one"), 0o644); err != nil {
				t.Fatal(err)
			}
			f.settle()
			// As a shell runs `echo x > a`.
			fd, err := syscall.Open(f.path("a"), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o666)
			if err != nil {
				t.Fatal(err)
			}
			dup, err := syscall.Dup(fd)
			if err != nil {
				syscall.Close(fd)
				t.Fatal(err)
			}
			if cerr := syscall.Close(fd); cerr != nil {
				syscall.Close(dup)
				t.Fatalf("close of the shell's descriptor: %v", cerr)
			}
			if got := f.contents("a"); !slices.Equal(got, []string{"one"}) {
				syscall.Close(dup)
				t.Fatalf("versions after the close of the truncating open's first descriptor: %q", got)
			}
			if _, werr := syscall.Write(dup, []byte("x\n")); werr != nil {
				syscall.Close(dup)
				t.Fatal(werr)
			}
			if cerr := syscall.Close(dup); cerr != nil {
				t.Fatalf("close after the write: %v", cerr)
			}
			f.settle()
			if got := f.contents("a"); !slices.Equal(got, []string{"one", "x\n"}) {
				t.Fatalf("versions after echo x > a: %q, want one added", got)
			}
			// The same through a real shell.
			if out, serr := exec.Command("sh", "-c", "echo y > "+f.path("a")).CombinedOutput(); serr != nil {
				t.Fatal(serr, string(out))
			}
			f.settle()
			if got := f.contents("a"); !slices.Equal(got, []string{"one", "x\n", "y\n"}) {
				t.Fatalf("versions after sh -c 'echo y > a': %q, want one added", got)
			}
			// Truncated and closed without a write: empty, once.
			w, err := os.OpenFile(f.path("a"), os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			f.settle()
			if got := f.contents("a"); !slices.Equal(got, []string{"one", "x\n", "y\n", ""}) {
				t.Fatalf("versions after an open with O_TRUNC and a close: %q, want one empty version added", got)
			}
			if got := f.readMount("a"); len(got) != 0 {
				t.Fatalf("a reads %q after the truncation", got)
			}
		})
	}
}

// TestSaveByRenameKeepsHistory: a file saved as sed -i and editors save
// it (a temporary file written, then renamed over the original) keeps
// its history: each save is the next version of the name, in order, and
// nothing goes to the trash. In every mode, with the temporary file's
// commit done before the rename (committed), still queued (queued: the
// store unreachable until the end; non-blocking and write-back), and
// still to come at its close (open: renamed before it is closed).
func TestSaveByRenameKeepsHistory(t *testing.T) {
	for _, mode := range versionModes {
		for _, how := range []string{"committed", "queued", "open"} {
			if how == "queued" && mode == mount.Blocking {
				continue // its close commits
			}
			t.Run(mode.String()+"/"+how, func(t *testing.T) {
				f := newFixture(t, mount.Options{Mode: mode})
				mount.SetQuietTime(f.m, 0)
				if err := os.WriteFile(f.path("a"), []byte("one"), 0o644); err != nil {
					t.Fatal(err)
				}
				f.settle()
				if how == "queued" {
					f.st.fail.Store(true)
				}
				for _, content := range []string{"two", "three", "four"} {
					tmp := f.path("a.tmp")
					if how == "open" {
						w, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
						if err != nil {
							t.Fatal(err)
						}
						_, err = w.WriteString(content)
						if err == nil {
							err = os.Rename(tmp, f.path("a"))
						}
						if cerr := w.Close(); err == nil {
							err = cerr
						}
						if err != nil {
							t.Fatal(err)
						}
					} else {
						if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
							t.Fatal(err)
						}
						if how == "committed" {
							f.settle()
						}
						if err := os.Rename(tmp, f.path("a")); err != nil {
							t.Fatal(err)
						}
					}
					if got := f.readMount("a"); string(got) != content {
						t.Fatalf("a reads %q after the save of %q", got, content)
					}
				}
				if how == "queued" {
					if e := f.entry("a"); len(e.Versions) != 1 {
						t.Fatalf("a has %d versions with the store unreachable, want the first only", len(e.Versions))
					}
					f.st.fail.Store(false)
				}
				f.settle()
				if got := f.contents("a"); !slices.Equal(got, []string{"one", "two", "three", "four"}) {
					t.Fatalf("versions of a: %q, want every save in order", got)
				}
				e := f.entry("a")
				for i, v := range e.Versions {
					if v.N != uint64(i+1) {
						t.Fatalf("version numbers: %+v", e.Versions)
					}
				}
				// The name has the saved file's attributes, as on a local disk.
				if e.Mode != 0o600 || e.Size != 4 {
					t.Fatalf("a after the saves: mode %o, size %d", e.Mode, e.Size)
				}
				if tr, err := f.vol.Meta.Trash(context.Background()); err != nil || len(tr) != 0 {
					t.Fatalf("trash after the saves: %d items, %v", len(tr), err)
				}
			})
		}
	}
}

// TestRenameOverQueuedCommit: a file renamed over one whose commit is
// still queued on this mount, while its own content is not to come (it is
// what the metadata has: an empty new file, or one with a version made
// elsewhere), leaves the name with its own content, also after a
// remount: the replaced file's queued writes are dropped, as a local disk
// drops a replaced file's unsaved writes, and do not land after it as
// the name's newest version. Its committed versions go as the versions
// design says: to the trash under an empty file that never had a version
// (none here if it had none), before the moved file's own otherwise.
// (The merge of write-back's deferred creates with versions following
// the path made the replaced file, created only at the rename, empty and
// versionless, so the empty file took its history and its queued commit
// landed on it: TestFSX seed 1796161450245364827.)
func TestRenameOverQueuedCommit(t *testing.T) {
	for _, mode := range []mount.Mode{mount.NonBlocking, mount.WriteBack} {
		for _, tc := range []struct {
			name      string
			committed bool   // a has a committed version "one" before its queued "two"
			b         string // b's content: "" an empty file made on the mount, else a version made elsewhere
			versions  []string
			trash     int // trash items, each a's committed version
		}{
			{name: "new-empty", b: ""},
			{name: "empty-over-committed", committed: true, b: "", trash: 1},
			{name: "versioned", b: "bee", versions: []string{"bee"}},
			{name: "versioned-over-committed", committed: true, b: "bee", versions: []string{"one", "bee"}},
		} {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				f := newFixture(t, mount.Options{Mode: mode})
				mount.SetQuietTime(f.m, 0)
				if tc.committed {
					if err := os.WriteFile(f.path("a"), []byte("one"), 0o644); err != nil {
						t.Fatal(err)
					}
					f.settle()
				}
				if tc.b != "" {
					f.put("b", []byte(tc.b))
				}
				f.st.fail.Store(true) // a's commit stays queued
				if err := os.WriteFile(f.path("a"), []byte("two"), 0o644); err != nil {
					t.Fatal(err)
				}
				if tc.b == "" {
					if err := os.WriteFile(f.path("b"), nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				f.waitClosed(0)
				if err := os.Rename(f.path("b"), f.path("a")); err != nil {
					t.Fatal(err)
				}
				check := func(when string) {
					t.Helper()
					if got := f.readMount("a"); string(got) != tc.b {
						t.Fatalf("a reads %q %s, want %q (b's)", got, when, tc.b)
					}
				}
				check("after the rename")
				f.st.fail.Store(false)
				f.settle()
				check("once the queue is done")
				f.mountAgain(mount.Options{Mode: mode})
				check("after a remount")
				if got := f.contents("a"); !slices.Equal(got, tc.versions) {
					t.Fatalf("versions of a: %q, want %q", got, tc.versions)
				}
				tr, err := f.vol.Meta.Trash(context.Background())
				if err != nil || len(tr) != tc.trash {
					t.Fatalf("trash: %d items, %v; want %d", len(tr), err, tc.trash)
				}
				for _, it := range tr {
					if len(it.Entry.Versions) != 1 {
						t.Fatalf("a in the trash: %+v, want its committed version", it.Entry)
					}
				}
			})
		}
	}
}
