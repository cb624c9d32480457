package mount_test

import (
	"os"
	"testing"
	"time"

	"cairn.dev/cairn/internal/mount"
)

// TestKernelForgetKeepsQueuedWrites: the kernel may let a node go once no
// descriptor is open (here: asked to drop its entry, as memory pressure
// would have it evict the inode), while the file's commit is still
// queued. The file looked up again is the same file on this mount: it
// reads what was written, and an open for writing shares the lock the
// queue holds instead of waiting for it (EBUSY).
func TestKernelForgetKeepsQueuedWrites(t *testing.T) {
	for _, mode := range []mount.Mode{mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode, QueueDelay: time.Hour, LockWait: 200 * time.Millisecond})
			if err := os.WriteFile(f.path("x"), []byte("queued"), 0o644); err != nil {
				t.Fatal(err)
			}
			f.waitClosed(0)
			if !mount.ForgetRoot(f.m, "x", 5*time.Second) {
				t.Skip("the kernel kept the node (no forget to test)")
			}
			if b, err := os.ReadFile(f.path("x")); err != nil || string(b) != "queued" {
				t.Fatalf("x after the kernel let its node go: %q, %v", b, err)
			}
			w, err := os.OpenFile(f.path("x"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatalf("open for writing after the kernel let the node go: %v", err)
			}
			w.WriteString(" and more")
			w.Close()
			if err := f.m.Unmount(); err != nil { // finishes the queue
				t.Fatal(err)
			}
			f.m.Wait()
			if got := string(f.cat("x")); got != "queued and more" {
				t.Fatalf("x committed: %q", got)
			}
			f.start(mount.Options{Mode: mode})
		})
	}
}
