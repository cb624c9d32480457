package mount_test

import (
	"os"
	"testing"

	"cairn.dev/cairn/internal/mount"
)

// TestFsyncWaitsOnlyForClosedWriters (write-back mode): an fsync waits
// for the releases of the file's writers that were closed (their commit
// is queued at the release, which comes after close returned), and not
// for a writer that is simply still open elsewhere: before, every fsync
// of a file another descriptor kept open for writing waited its whole
// bound (1 s). A close followed by an fsync on another descriptor still
// finds the close's commit queued and synced.
func TestFsyncWaitsOnlyForClosedWriters(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	p := f.path("log")
	if err := os.WriteFile(p, []byte("start\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	keep, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Closed on every path: a descriptor on the mount left open when the
	// test process exits hangs its exit (the mount served it).
	defer w.Close()
	for i := range 3 {
		if _, err = w.WriteString("line\n"); err != nil {
			t.Fatal(err)
		}
		if err = w.Sync(); err != nil {
			t.Fatalf("fsync %d: %v", i, err)
		}
	}
	if n := mount.ReleaseWaitsOut(f.m); n != 0 {
		t.Fatalf("%d fsyncs waited their whole bound for a writer that was never closed", n)
	}
	// A writer closed, then an fsync on another descriptor: waited for,
	// not timed out.
	if err = w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err = keep.WriteString("end\n"); err != nil {
		t.Fatal(err)
	}
	if err = keep.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := mount.ReleaseWaitsOut(f.m); n != 0 {
		t.Fatalf("an fsync after a close waited its whole bound (%d): the closed writer's release never counted", n)
	}
	if got, _ := os.ReadFile(p); string(got) != "start\nline\nline\nline\nend\n" {
		t.Fatalf("file reads %q", got)
	}
}
