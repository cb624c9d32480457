package mount_test

import (
	"os"
	"path/filepath"
	"testing"

	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/mount"
)

// TestUnlinkAcksQueuedCommit: an unlink on this mount of a file whose
// commit is queued acks the commit's record in the queue's journal at
// once: a mount killed after the unlink leaves no record for the next
// one to commit, which would bring the removed file back under its name
// (found by TestMountNonBlockingKilledLoop). A file with another name
// keeps its record until its last name goes.
func TestUnlinkAcksQueuedCommit(t *testing.T) {
	for _, mode := range []mount.Mode{mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			release := mount.HoldQueue(f.m)
			defer release()
			qdir := filepath.Join(mount.CacheDir(f.m), "queue")
			pending := func() int {
				recs, err := journal.Read(qdir)
				if err != nil {
					t.Fatal(err)
				}
				return len(recs)
			}
			a, b := filepath.Join(f.mnt, "a"), filepath.Join(f.mnt, "b")
			if err := os.WriteFile(a, []byte("queued"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Write-back queues at the kernel's release, just after.
			eventually(t, "the commit queued", func() bool { return pending() == 1 })
			if err := os.Link(a, b); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(a); err != nil {
				t.Fatal(err)
			}
			if n := pending(); n != 1 {
				t.Fatalf("after the unlink of one of two names: %d records pending, want 1", n)
			}
			if err := os.Remove(b); err != nil {
				t.Fatal(err)
			}
			if n := pending(); n != 0 {
				t.Fatalf("after the unlink of the last name: %d records pending, want 0", n)
			}
		})
	}
}
