package mount_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// TestWriteBackTimesStay: in write-back mode, the mtime and ctime a stat
// shows after a write and close, and after a chmod, chown, link or
// second write made 0 to 30 ms later (while the close's commit is
// queued), never go back and never move by themselves: not when the
// commit lands, not when the change is written. The commit records the
// times the mount showed. Each round makes the change at another delay
// after the close, on a new file (whose creation waits for its first
// commit) and on a file rewritten.
func TestWriteBackTimesStay(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	type timesCase struct {
		name   string
		change func(p string, r int) error
		writes bool // the change writes: mtime must advance
	}
	cases := []timesCase{
		{name: "chmod", change: func(p string, r int) error { return os.Chmod(p, 0o600+os.FileMode(r/2%2)*0o40) }},
		{name: "chown", change: func(p string, r int) error { return os.Chown(p, 0, 1+r/2%2) }},
		{name: "link", change: func(p string, r int) error { return os.Link(p, fmt.Sprintf("%s.link%d", p, r)) }},
		{name: "write", writes: true, change: func(p string, r int) error {
			w, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = w.WriteAt([]byte("again"), 2)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			return err
		}},
	}
	rounds := 40
	if testing.Short() {
		rounds = 12
	}
	settled := func() bool {
		return f.m.Pending() == 0 && f.m.WriteHandles() == 0 && mount.PendingChanges(f.m) == 0
	}
	stat := func(p string) (mt, ct time.Time) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return time.Unix(st.Mtim.Sec, st.Mtim.Nsec), time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
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
				if err := os.WriteFile(p, fmt.Appendf(nil, "round %d\n", r), 0o644); err != nil {
					t.Fatal(err)
				}
				mt0, ct0 := stat(p)
				// From 0 to 30 ms after the close, in 0.75 ms steps.
				time.Sleep(time.Duration(r%40) * 750 * time.Microsecond)
				// Each time a clock tick or more after the last (a write's
				// mtime is the kernel's coarse clock's).
				tick := time.Millisecond
				if c.writes {
					tick = 15 * time.Millisecond
				}
				for time.Now().Before(mt0.Add(tick)) {
					time.Sleep(time.Millisecond)
				}
				if err := c.change(p, r); err != nil {
					t.Fatal(err)
				}
				mt1, ct1 := stat(p)
				if c.writes && !mt1.After(mt0) {
					t.Fatalf("round %d: the write left mtime at %v (shown before it: %v)", r, mt1, mt0)
				}
				if !c.writes && !mt1.Equal(mt0) {
					t.Fatalf("round %d: the %s moved mtime from %v (shown after the close) to %v", r, c.name, mt0, mt1)
				}
				if !ct1.After(ct0) {
					t.Fatalf("round %d: the %s left ctime at %v (shown before it: %v)", r, c.name, ct1, ct0)
				}
				check := func(when string) {
					t.Helper()
					mt, ct := stat(p)
					if !mt.Equal(mt1) || !ct.Equal(ct1) {
						t.Fatalf("round %d: %s: mtime %v ctime %v, shown after the %s: mtime %v ctime %v (after the close: %v %v)",
							r, when, mt, ct, c.name, mt1, ct1, mt0, ct0)
					}
				}
				busy := time.Now().Add(40 * time.Millisecond)
				for time.Now().Before(busy) {
					check("just after")
				}
				deadline := time.Now().Add(60 * time.Second)
				for !settled() {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: not written after 60 s: %d queued commits, %d write handles, %d pending changes", r, f.m.Pending(), f.m.WriteHandles(), mount.PendingChanges(f.m))
					}
					check("while written")
					time.Sleep(5 * time.Millisecond)
				}
				check("once written")
				if r%4 == 3 {
					// Past the kernel's attribute cache: the mount's own answer.
					time.Sleep(mount.DefaultAttrTimeout + 100*time.Millisecond)
					check("once written, asked again")
				}
				if e := f.entry(name); e.Mtime != mt1.UnixNano() || e.Ctime != ct1.UnixNano() {
					t.Fatalf("round %d: the metadata has mtime %v ctime %v, the mount showed %v %v", r, time.Unix(0, e.Mtime), time.Unix(0, e.Ctime), mt1, ct1)
				}
			}
		})
	}
}

// TestWriteBackUtimesBeforeWriteElsewhere: in write-back mode, a utimes
// and chmod here whose write to the metadata meets a newer record (new
// content committed on another device after them) are made again on it
// without the utimes's mtime: the later write's mtime stands (as on one
// machine, where a write after a utimes moves the mtime), the mode is
// the chmod's.
func TestWriteBackUtimesBeforeWriteElsewhere(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	g := f.device(mount.Options{Mode: mount.Blocking}, meta.Options{})
	if err := os.WriteFile(f.path("a"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.settle()
	if _, err := os.Stat(f.path("a")); err != nil { // known to the entry cache
		t.Fatal(err)
	}
	release := mount.HoldWriteBack(f.m)
	defer release()
	stamp := time.Unix(1_000_000_000, 0)
	if err := os.Chtimes(f.path("a"), stamp, stamp); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.path("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n := mount.PendingChanges(f.m); n != 1 {
		t.Fatalf("%d pending changes after the utimes and chmod, want 1 (written at once?)", n)
	}
	if err := os.WriteFile(g.path("a"), []byte("v2, written on another device after"), 0o644); err != nil {
		t.Fatal(err)
	}
	written := f.entry("a")
	if written.Mtime == stamp.UnixNano() {
		t.Fatal("the other device's write kept the utimes's mtime: nothing to check")
	}
	release()
	deadline := time.Now().Add(60 * time.Second)
	for mount.PendingChanges(f.m) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pending change is not written after 60 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e := f.entry("a")
	if e.Mode != 0o600 {
		t.Errorf("mode %o in the metadata, want the chmod's 600", e.Mode)
	}
	if e.Mtime != written.Mtime {
		t.Errorf("mtime %v in the metadata, want %v, the write's made after the utimes (%v)", time.Unix(0, e.Mtime), time.Unix(0, written.Mtime), stamp)
	}

	// A newer record without new content (a chmod elsewhere) keeps the
	// utimes's mtime.
	if _, err := os.Stat(f.path("a")); err != nil {
		t.Fatal(err)
	}
	release = mount.HoldWriteBack(f.m)
	defer release()
	if err := os.Chtimes(f.path("a"), stamp, stamp); err != nil {
		t.Fatal(err)
	}
	if n := mount.PendingChanges(f.m); n != 1 {
		t.Fatalf("%d pending changes after the utimes, want 1 (written at once?)", n)
	}
	if err := os.Chmod(g.path("a"), 0o640); err != nil {
		t.Fatal(err)
	}
	if e := f.entry("a"); e.Mode != 0o640 {
		t.Fatalf("mode %o after the other device's chmod", e.Mode)
	}
	release()
	for mount.PendingChanges(f.m) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pending change is not written after 60 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := f.entry("a"); e.Mtime != stamp.UnixNano() || e.Mode != 0o640 {
		t.Errorf("after a chmod elsewhere: mode %o mtime %v in the metadata, want 640 and the utimes's %v", e.Mode, time.Unix(0, e.Mtime), stamp)
	}
}
