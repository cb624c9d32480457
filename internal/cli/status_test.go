package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/mount"
)

// TestStatusCommand: 'cairn status' lists the running mount with what it
// has pending, as text and JSON; --wait-idle returns at once when nothing
// is, and fails after --timeout, naming what is pending, while a written
// file's commit is held back (the queue delay); the mount's socket goes
// with it.
func TestStatusCommand(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	if out := r.ok("status"); !strings.Contains(out, "no mounts") {
		t.Fatalf("status without a mount: %q", out)
	}
	mnt := mountPoint(t)
	_, exited, out := r.foregroundWith(mnt, []string{"CAIRN_MOUNT_QUEUE_DELAY=1h"}, "--mode", "write-back")
	status := func(args ...string) []mount.Status {
		t.Helper()
		var all []mount.Status
		if err := json.Unmarshal([]byte(r.ok(append([]string{"status", "--json"}, args...)...)), &all); err != nil {
			t.Fatal(err)
		}
		if len(all) != 1 || all[0].Mountpoint != mnt || all[0].Volume != "home" || all[0].Mode != "write-back" {
			t.Fatalf("status: %+v, want the one mount", all)
		}
		return all
	}
	if s := status("--wait-idle", "--timeout", "1m")[0]; s.Pending != 0 {
		t.Fatalf("idle mount: %+v", s)
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("held back by the queue delay\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s := status()[0]; s.Pending < 1 || s.Closed+s.Queued != 1 {
		t.Fatalf("right after a close: %+v, want the file pending", s)
	}
	text := r.ok("status")
	if !strings.Contains(text, "MOUNTPOINT") || !strings.Contains(text, mnt) {
		t.Fatalf("status:\n%s", text)
	}
	res := r.fails(cli.ExitUnavailable, "status", "--wait-idle", "--timeout", "500ms")
	if !strings.Contains(res.stderr, "timed out") || !strings.Contains(res.stderr, mnt) {
		t.Fatalf("--wait-idle past its timeout: %q", res.stderr)
	}
	r.ok("umount", mnt)
	waitExit(t, exited, out)
	if got := r.ok("cat", "home:/f"); got != "held back by the queue delay\n" {
		t.Fatalf("after the unmount: %q", got)
	}
	socks, _ := filepath.Glob(filepath.Join(r.home, "run", "*"))
	if len(socks) != 0 {
		t.Fatalf("left in run/ after the unmount: %v", socks)
	}
	if out := r.ok("status", "--wait-idle"); !strings.Contains(out, "no mounts") {
		t.Fatalf("status after the unmount: %q", out)
	}
}
