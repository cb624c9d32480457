package mount_test

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// asOther runs op on a thread of its own whose file system user and
// group are otherUID and otherGID (what the kernel checks permissions
// against), and returns its error.
func asOther(op func() error) error {
	ch := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with the goroutine.
		runtime.LockOSThread()
		if err := unix.Setfsgid(otherGID); err != nil {
			ch <- err
			return
		}
		if err := unix.Setfsuid(otherUID); err != nil {
			ch <- err
			return
		}
		ch <- op()
	}()
	return <-ch
}

// TestWriteBackAttrsStay: in write-back mode, a chmod, chown, utimes or
// truncate made just after the last writer's close (while its queued commit is on
// its way) never reads back as the old value, at any moment: not when
// the commit lands, not when the change is written; an open for writing
// by another user that the new mode or owner forbids fails throughout;
// and the metadata ends with the change. Each round makes the change at
// another delay after the close (the commit starts once the mount has
// been quiet for 20 ms), on a file rewritten and on a new file (whose
// creation waits for its first commit).
func TestWriteBackAttrsStay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: checks an open as another user")
	}
	f := newFixture(t, mount.Options{Mode: mount.WriteBack, AllowOther: true, AttrTimeout: mount.NoAttrCache})
	root, err := os.Open(f.mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// Opened relative to the mount's root: the other user cannot search
	// the test's temporary directories above it.
	openOther := func(name string) error {
		return asOther(func() error {
			fd, err := unix.Openat(int(root.Fd()), name, unix.O_WRONLY, 0)
			if err == nil {
				unix.Close(fd)
			}
			return err
		})
	}
	stamp := time.Unix(1_000_000_000, 123_000_000)
	type attrCase struct {
		name      string
		before    func(w *os.File) error // on the descriptor written: the old attributes
		change    func(p string) error
		shows     func(st *unix.Stat_t) string // "" when st shows the change, else what it shows
		recorded  func(e *meta.Entry) bool
		forbidden bool // the change forbids otherUID to open for writing
	}
	cases := []attrCase{
		{
			name:   "chmod",
			before: func(w *os.File) error { return w.Chmod(0o666) },
			change: func(p string) error { return os.Chmod(p, 0o640) },
			shows: func(st *unix.Stat_t) string {
				if st.Mode&07777 == 0o640 {
					return ""
				}
				return fmt.Sprintf("mode %o", st.Mode&07777)
			},
			recorded:  func(e *meta.Entry) bool { return e.Mode == 0o640 },
			forbidden: true,
		},
		{
			name: "chmod-000",
			before: func(w *os.File) error {
				if err := w.Chown(otherUID, otherGID); err != nil {
					return err
				}
				return w.Chmod(0o600)
			},
			change: func(p string) error { return os.Chmod(p, 0) },
			shows: func(st *unix.Stat_t) string {
				if st.Mode&07777 == 0 {
					return ""
				}
				return fmt.Sprintf("mode %o", st.Mode&07777)
			},
			recorded:  func(e *meta.Entry) bool { return e.Mode == 0 },
			forbidden: true,
		},
		{
			name: "chown",
			before: func(w *os.File) error {
				if err := w.Chown(otherUID, otherGID); err != nil {
					return err
				}
				return w.Chmod(0o600)
			},
			change: func(p string) error { return os.Chown(p, 0, 0) },
			shows: func(st *unix.Stat_t) string {
				if st.Uid == 0 && st.Gid == 0 {
					return ""
				}
				return fmt.Sprintf("owner %d:%d", st.Uid, st.Gid)
			},
			recorded:  func(e *meta.Entry) bool { return e.UID == 0 && e.GID == 0 },
			forbidden: true,
		},
		{
			name:   "utimes",
			before: func(w *os.File) error { return w.Chmod(0o644) },
			change: func(p string) error { return os.Chtimes(p, stamp, stamp) },
			shows: func(st *unix.Stat_t) string {
				if st.Mtim.Sec == stamp.Unix() && st.Mtim.Nsec == int64(stamp.Nanosecond()) {
					return ""
				}
				return fmt.Sprintf("mtime %v", time.Unix(st.Mtim.Sec, st.Mtim.Nsec))
			},
			recorded: func(e *meta.Entry) bool { return e.Mtime == stamp.UnixNano() },
		},
		{
			name:   "truncate",
			before: func(w *os.File) error { return w.Chmod(0o644) },
			change: func(p string) error { return os.Truncate(p, 3) },
			shows: func(st *unix.Stat_t) string {
				if st.Size == 3 {
					return ""
				}
				return fmt.Sprintf("size %d", st.Size)
			},
			recorded: func(e *meta.Entry) bool { return e.Size == 3 },
		},
	}
	rounds := 40
	if testing.Short() {
		rounds = 12
	}
	settled := func() bool {
		return f.m.Pending() == 0 && f.m.WriteHandles() == 0 && mount.PendingChanges(f.m) == 0
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for r := range rounds {
				// Even rounds rewrite one file; odd rounds make a new one.
				name := c.name
				if r%2 == 1 {
					name = fmt.Sprintf("%s-%d", c.name, r)
				}
				p := f.path(name)
				w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.before(w); err != nil {
					w.Close()
					t.Fatal(err)
				}
				if _, err := fmt.Fprintf(w, "round %d\n", r); err != nil {
					w.Close()
					t.Fatal(err)
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				if r < 2 {
					// The old attributes do let the other user write: the
					// checks below are not empty.
					if err := openOther(name); c.forbidden && err != nil {
						t.Fatalf("round %d: before the change, an open for writing as uid %d: %v", r, otherUID, err)
					}
				}
				// From 10 to 40 ms after the close, in 0.75 ms steps.
				time.Sleep(10*time.Millisecond + time.Duration(r%40)*750*time.Microsecond)
				if err := c.change(p); err != nil {
					t.Fatal(err)
				}
				check := func(when string) {
					t.Helper()
					var st unix.Stat_t
					if err := unix.Stat(p, &st); err != nil {
						t.Fatalf("round %d: stat %s: %v", r, when, err)
					}
					if got := c.shows(&st); got != "" {
						t.Fatalf("round %d: %s, the change reads back undone: %s", r, when, got)
					}
					if c.forbidden {
						if err := openOther(name); err != unix.EACCES {
							t.Fatalf("round %d: %s, an open for writing as uid %d that the change forbids: %v, want EACCES", r, when, otherUID, err)
						}
					}
				}
				// Asked without a pause for a while (which keeps the mount
				// busy: the change stays pending, whether or not the commit
				// lands meanwhile), then until everything is written.
				busy := time.Now().Add(60 * time.Millisecond)
				for time.Now().Before(busy) {
					check("just after")
				}
				deadline := time.Now().Add(60 * time.Second)
				for !settled() {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: not written after 60 s: %d queued commits, %d write handles, %d pending changes", r, f.m.Pending(), f.m.WriteHandles(), mount.PendingChanges(f.m))
					}
					check("while written")
					// Longer than the quiet time the mount waits for.
					time.Sleep(30 * time.Millisecond)
				}
				check("once written")
				if e := f.entry(name); !c.recorded(e) {
					t.Fatalf("round %d: the metadata has mode %o owner %d:%d mtime %v size %d: the change is lost", r, e.Mode, e.UID, e.GID, time.Unix(0, e.Mtime), e.Size)
				}
			}
		})
	}
}
