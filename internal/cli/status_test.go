package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/apitypes"
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
		var st apitypes.Status
		if err := json.Unmarshal([]byte(r.ok(append([]string{"status", "--json"}, args...)...)), &st); err != nil {
			t.Fatal(err)
		}
		all := st.Mounts
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

// TestStatusOneScreen: 'cairn status' shows this device, where the
// metadata lives, the realm's nodes by state, what waits (the upload
// queue), and what is wrong: a store that cannot be opened, a node that
// went offline without announcing it; a node in standby is listed as
// asleep and its store is not asked. --json says the same.
func TestStatusOneScreen(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	status := func() apitypes.Status {
		t.Helper()
		var st apitypes.Status
		cliJSON(t, r, &st, "status")
		return st
	}
	text := r.ok("status")
	for _, want := range []string{"device    desk (device)", "metadata  reachable", "pending   nothing", "problems  none", "no mounts"} {
		if !strings.Contains(text, want) {
			t.Fatalf("status of a new realm lacks %q:\n%s", want, text)
		}
	}
	if st := status(); st.Device != "desk" || !st.Metadata.Reachable || st.Summary == nil || st.Summary.Volumes != 1 || len(st.Problems) != 0 {
		t.Fatalf("status --json of a new realm: %+v", st)
	}

	r.env = append(r.env, cli.EnvNoAutoDrain+"=1")
	queued := filepath.Join(t.TempDir(), "queued.bin")
	writeFile(t, queued, randBytes(3000), 0o644)
	r.ok("put", "--background", queued, "home:/")
	broken := filepath.Join(t.TempDir(), "broken")
	r.ok("store", "add", "broken", "file://"+broken)
	if err := os.RemoveAll(broken); err != nil {
		t.Fatal(err)
	}
	writeFile(t, broken, []byte("not a directory any more"), 0o644)

	s := r.serve("2s")
	r.waitState("desk", "awake", 5*time.Second)
	r.ok("store", "add", "mynode", "node://desk")
	st := status()
	if st.Pending.Queue.Files != 1 || st.Summary.Nodes["awake"] != 1 || st.Summary.Stores != 2 {
		t.Fatalf("status with a queued file and an awake node: %+v", st)
	}
	if len(st.Problems) != 1 || st.Problems[0].What != "store broken" {
		t.Fatalf("problems: %+v, want the broken store's only", st.Problems)
	}
	text = r.ok("status")
	if !strings.Contains(text, "1 file(s) (2.9 KiB) in the upload queue") || !strings.Contains(text, "problems  store broken: does not answer") {
		t.Fatalf("status:\n%s", text)
	}

	r.ok("node", "standby")
	if st := status(); st.Summary.Nodes["standby"] != 1 || len(st.Summary.Asleep) != 1 || st.Summary.Asleep[0] != "desk" || len(st.Problems) != 1 {
		t.Fatalf("status with the node in standby: %+v", st)
	}
	if text := r.ok("status"); !strings.Contains(text, "(asleep: desk)") {
		t.Fatalf("status with the node in standby:\n%s", text)
	}
	r.ok("node", "resume")
	s.cmd.Process.Signal(syscall.SIGTERM)
	err := <-s.done
	s.done <- err // for the cleanup of serve
	r.waitState("desk", "offline", time.Minute)
	st = status()
	found := false
	for _, p := range st.Problems {
		found = found || (p.What == "node desk" && strings.Contains(p.Detail, "offline without announcing it"))
	}
	if !found || st.Summary.Nodes["offline"] != 1 {
		t.Fatalf("status with the node offline: %+v", st)
	}
}
