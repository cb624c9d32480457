package mount_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/mount"
)

// statTimes returns the mtime and ctime of path.
func statTimes(t *testing.T, path string) (mtime, ctime time.Time) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return time.Unix(st.Mtim.Unix()), time.Unix(st.Ctim.Unix())
}

// clockPast waits until a file changed in dir now gets a ctime after
// since: the local disk's clock (coarse, as the kernel keeps it) has
// moved past it, so that a change from now on shows a later time.
func clockPast(t *testing.T, dir string, since time.Time) {
	t.Helper()
	probe := filepath.Join(dir, ".clock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := os.WriteFile(probe, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, c := statTimes(t, probe); c.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the clock did not move past %v", since)
		}
		time.Sleep(time.Millisecond) // polling the clock itself
	}
}

// TestTruncateAtOpenTimes: an open with O_TRUNC of a non-empty file
// changes its mtime and ctime at once, as on a local disk, in every
// mode, whether or not another descriptor (a reader, a writer) has it
// open; the commit at its close (one version, truncOnly) and a remount
// keep them.
func TestTruncateAtOpenTimes(t *testing.T) {
	for _, mode := range versionModes {
		for _, holder := range []string{"alone", "reader", "writer"} {
			t.Run(mode.String()+"/"+holder, func(t *testing.T) {
				testTruncateAtOpenTimes(t, mode, holder)
			})
		}
	}
}

func testTruncateAtOpenTimes(t *testing.T, mode mount.Mode, holder string) {
	f := newFixture(t, mount.Options{Mode: mode})
	mount.SetQuietTime(f.m, 0)
	local := t.TempDir()
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	paths := map[string]string{"local": filepath.Join(local, "a"), "mount": f.path("a")}
	for _, p := range paths {
		if err := os.WriteFile(p, []byte("one"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	f.settle()
	var held []*os.File
	for _, p := range paths {
		flag := os.O_RDONLY
		switch holder {
		case "alone":
			continue
		case "writer":
			flag = os.O_WRONLY
		}
		h, err := os.OpenFile(p, flag, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		held = append(held, h)
	}
	type times struct{ m, c time.Time }
	before := map[string]times{}
	var since time.Time
	for k, p := range paths {
		m, c := statTimes(t, p)
		if !m.Equal(old) {
			t.Fatalf("%s: mtime %v after the chtimes, want %v", k, m, old)
		}
		before[k] = times{m, c}
		if c.After(since) {
			since = c
		}
	}
	clockPast(t, local, since)
	open := map[string]times{}
	for _, k := range []string{"local", "mount"} {
		w, err := os.OpenFile(paths[k], os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		m, c := statTimes(t, paths[k])
		if cerr := w.Close(); cerr != nil {
			t.Fatal(cerr)
		}
		open[k] = times{m, c}
		if !m.After(before[k].m) || !c.After(before[k].c) {
			t.Errorf("%s while open with O_TRUNC: mtime %v ctime %v, before %v %v: want both later",
				k, m, c, before[k].m, before[k].c)
		}
	}
	for _, h := range held {
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		m, c := statTimes(t, paths["mount"])
		if !m.Equal(open["mount"].m) || c.Before(open["mount"].c) {
			t.Errorf("mount %s: mtime %v ctime %v, want the mtime %v of the open and a ctime not before %v",
				when, m, c, open["mount"].m, open["mount"].c)
		}
		if fi, err := os.Stat(paths["mount"]); err != nil || fi.Size() != 0 {
			t.Errorf("mount %s: %v, size %d", when, err, fi.Size())
		}
	}
	f.settle()
	check("after the commit")
	if got := f.contents("a"); len(got) != 2 || got[1] != "" {
		t.Errorf("versions %q, want one empty version added", got)
	}
	f.mountAgain(mount.Options{Mode: mode})
	check("after a remount")
}
