package mount_test

import (
	"bytes"
	"os"
	"testing"
	"time"

	"cairn.dev/cairn/internal/mount"
)

// TestLinkWaitsForCloseRelease: in write-back mode a close's commit is
// queued at the kernel's release, which can reach the mount after a link
// or rename of the file that the program made right after its close
// (git: write an object to a temporary file, close, link it to its
// name). Recorded first, such a change left, after a kill of the mount
// before the release, a name with no content: an empty git object (seen
// once in 200 kills of TestMountWriteBackKilledTarGit). The change must
// wait for the release, so that the journal holds the content first.
func TestLinkWaitsForCloseRelease(t *testing.T) {
	for _, op := range []string{"link", "rename"} {
		t.Run(op, func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mount.WriteBack})
			holdRelease := mount.HoldRelease(f.m)
			defer holdRelease()
			data := randBytes(64 << 10)
			tmp, final := f.path("tmp_obj"), f.path("object")
			if err := os.WriteFile(tmp, data, 0o444); err != nil {
				t.Fatal(err)
			}
			type result struct {
				at  time.Time
				err error
			}
			done := make(chan result, 1)
			go func() {
				var err error
				if op == "link" {
					err = os.Link(tmp, final)
				} else {
					err = os.Rename(tmp, final)
				}
				done <- result{time.Now(), err}
			}()
			// The release is held: the change must not be recorded yet.
			time.Sleep(200 * time.Millisecond)
			unheld := time.Now()
			holdRelease()
			res := <-done
			if res.err != nil {
				t.Fatalf("%s: %v", op, res.err)
			}
			if res.at.Before(unheld) {
				t.Fatalf("the %s returned %v before the file's release: it is recorded before the close's commit is queued", op, unheld.Sub(res.at))
			}
			got, err := os.ReadFile(final)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("after the %s: %d bytes, %v; want the %d written", op, len(got), err, len(data))
			}
		})
	}
}
