package cli_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cli"
)

// mountStatus returns r's running mounts as 'cairn status --json' says.
func (r *realmT) mountStatus() []apitypes.MountStatus {
	r.t.Helper()
	var st apitypes.Status
	if err := json.Unmarshal([]byte(r.ok("status", "--json")), &st); err != nil {
		r.t.Fatalf("status --json: %v", err)
	}
	return st.Mounts
}

// TestOfflineMount: device B (joined, its metadata through A's node, the
// gateway) mounts the volume and reads one of A's files; then A's node
// stops (SIGSTOP of the process the test started: the gateway and A's
// store vanish for B, A's own commands still reach its etcd). B's mount
// goes offline and says so (its log, 'cairn status'): it lists the
// volume and reads the file it read before and the file it wrote itself,
// a read of A's other file fails at once (EIO, well under 2 s) instead of
// hanging, a write is taken (and read back), a hard link refused (EROFS). A writes a file meanwhile;
// once A's node runs again, B is online again and its mount shows A's
// new file, and A's realm holds the file B wrote offline.
func TestOfflineMount(t *testing.T) {
	skipWithoutFUSE(t)
	began := time.Now()
	defer func() { t.Logf("%v in all", time.Since(began)) }()
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("2s")
	a.waitState("desk", "awake", 10*time.Second)
	a.ok("mkdir", "home:/s")
	src := t.TempDir()
	one, two := randBytes(100<<10), randBytes(100<<10)
	writeFile(t, filepath.Join(src, "one"), one, 0o644)
	writeFile(t, filepath.Join(src, "two"), two, 0o644)
	a.ok("put", filepath.Join(src, "one"), filepath.Join(src, "two"), "home:/s/")

	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	// mountPoint: should the test fail, its cleanup unmounts what the
	// killed mount process leaves (after foregroundWith's kills it).
	mnt := mountPoint(t)
	_, exited, out := b.foregroundWith(mnt, nil, "--mode", "blocking")
	if got, err := os.ReadFile(filepath.Join(mnt, "s", "one")); err != nil || string(got) != string(one) {
		t.Fatalf("read one online: %v", err)
	}
	mine := []byte("written on the laptop\n")
	if err := os.WriteFile(filepath.Join(mnt, "s", "mine"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	// The local copy is saved with the file just written.
	copies := filepath.Join(b.home, "offline")
	waitFor(t, "the local copy holding mine", 20*time.Second, func() bool {
		ents, _ := os.ReadDir(copies)
		for _, e := range ents {
			if b, err := os.ReadFile(filepath.Join(copies, e.Name())); err == nil && strings.Contains(string(b), `"name":"mine"`) {
				return true
			}
		}
		return false
	})

	t.Logf("%v: b's mount serving, its copy saved", time.Since(began))
	// A's node stops: B loses its gateway (and A's store).
	pid := as.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped, stoppedAt := true, time.Now()
	resume := func() {
		if stopped {
			stopped = false
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	// Before any cleanup that needs A (the mount's, the realm's), whatever
	// way the test ends.
	t.Cleanup(resume)

	var st []apitypes.MountStatus
	waitFor(t, "b's mount offline", 60*time.Second, func() bool {
		st = b.mountStatus()
		return len(st) == 1 && st[0].Offline != nil
	})
	t.Logf("%v after the stop: the mount is offline", time.Since(stoppedAt))
	if !st[0].Offline.Serving || st[0].Offline.CopyRev == 0 {
		t.Fatalf("offline status: %+v", st[0].Offline)
	}
	if s := b.ok("status"); !strings.Contains(s, "offline since") {
		t.Fatalf("status offline:\n%s", s)
	}
	if res := b.fails(cli.ExitUnavailable, "devices"); !strings.Contains(res.stdout, "offline: the metadata service cannot be reached") ||
		!strings.Contains(res.stdout, mnt+": offline since") || !strings.Contains(res.stdout, "serving the local copy from") {
		t.Fatalf("devices offline: %+v", res)
	}
	res := b.fails(cli.ExitUnavailable, "devices", "--json")
	var dj cli.DevicesOffline
	if err := json.Unmarshal([]byte(res.stdout), &dj); err != nil || !dj.Offline || len(dj.Mounts) != 1 || dj.Mounts[0].Offline == nil {
		t.Fatalf("devices --json offline: %v %+v", err, res)
	}
	// Listing, and the data this device holds.
	ents, err := os.ReadDir(filepath.Join(mnt, "s"))
	if err != nil {
		t.Fatalf("list offline: %v", err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "mine one two" {
		t.Fatalf("offline listing %q", names)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "s", "one")); err != nil || string(got) != string(one) {
		t.Fatalf("read a cached file offline: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "s", "mine")); err != nil || string(got) != string(mine) {
		t.Fatalf("read this device's own file offline: %v", err)
	}
	// Data only A holds: at once, EIO.
	t0 := time.Now()
	_, err = os.ReadFile(filepath.Join(mnt, "s", "two"))
	took := time.Since(t0)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of data not on this device offline: %v", err)
	}
	if took > 2*time.Second {
		t.Fatalf("read of data not on this device took %v offline", took)
	}
	t.Logf("offline read of data not on this device failed in %v", took)
	// A write offline is taken: into the offline log, its data into this
	// device's store; replayed once the service is back (below).
	offline := []byte("written offline\n")
	if err := os.WriteFile(filepath.Join(mnt, "s", "new"), offline, 0o644); err != nil {
		t.Fatalf("write offline: %v\nmount log:\n%s", err, out.String())
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "s", "new")); err != nil || string(got) != string(offline) {
		t.Fatalf("read back offline: %q, %v", got, err)
	}
	if err := os.Link(filepath.Join(mnt, "s", "new"), filepath.Join(mnt, "s", "link")); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("hard link offline: %v", err)
	}
	// The read-only commands too, from the same copy and this device's data.
	if got := b.ok("ls", "home:/s"); got != "mine\nnew\none\ntwo\n" {
		t.Fatalf("ls offline: %q", got)
	}
	if got := b.ok("cat", "home:/s/one"); got != string(one) {
		t.Fatal("cat of a cached file offline: wrong content")
	}
	t0 = time.Now()
	res = b.fails(cli.ExitUnavailable, "cat", "home:/s/two")
	if !strings.Contains(res.stderr, "offline: home:/s/two is not on this device") {
		t.Fatalf("cat of data not on this device offline: %+v", res)
	}
	t.Logf("cat of data not on this device failed offline in %v", time.Since(t0))
	if !strings.Contains(out.String(), "offline: metadata service unreachable since") || !strings.Contains(out.String(), "serving the local copy from") {
		t.Fatalf("mount log says nothing of offline:\n%s", out.String())
	}

	// The copy survives a restart: unmounted and mounted again offline,
	// the mount serves it at once.
	b.ok("umount", mnt)
	waitExit(t, exited, out)
	_, exited, out = b.foregroundWith(mnt, nil, "--mode", "blocking")
	t.Logf("%v after the stop: mounted again offline", time.Since(stoppedAt))
	if ents, err := os.ReadDir(filepath.Join(mnt, "s")); err != nil || len(ents) != 4 {
		t.Fatalf("list after the restart offline: %v %v", ents, err)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "s", "one")); err != nil || string(got) != string(one) {
		t.Fatalf("read a cached file after the restart offline: %v", err)
	}
	t0 = time.Now()
	if _, err := os.ReadFile(filepath.Join(mnt, "s", "two")); !errors.Is(err, syscall.EIO) || time.Since(t0) > 2*time.Second {
		t.Fatalf("read of data not here after the restart offline: %v after %v", err, time.Since(t0))
	}
	if st = b.mountStatus(); len(st) != 1 || st[0].Offline == nil {
		t.Fatalf("status after the restart offline: %+v", st)
	}

	// A writes meanwhile (its etcd runs); then its node runs again.
	three := []byte("made while the laptop was offline\n")
	writeFile(t, filepath.Join(src, "three"), three, 0o644)
	a.ok("put", filepath.Join(src, "three"), "home:/s/")
	resume()
	t.Logf("%v after the stop: the service is back", time.Since(stoppedAt))
	waitFor(t, "b's mount online", 60*time.Second, func() bool {
		st = b.mountStatus()
		return len(st) == 1 && st[0].Offline == nil
	})
	t.Logf("%v after the stop: the mount is online", time.Since(stoppedAt))
	waitFor(t, "a's new file on b's mount", 30*time.Second, func() bool {
		got, err := os.ReadFile(filepath.Join(mnt, "s", "three"))
		return err == nil && string(got) == string(three)
	})
	t.Logf("%v after the stop: the mount shows the file made meanwhile", time.Since(stoppedAt))
	if !strings.Contains(out.String(), "online: metadata service reachable again") {
		t.Fatalf("mount log says nothing of being online again:\n%s", out.String())
	}
	// Online again, the commands ask the service (a copy lies on disk).
	if got := b.ok("ls", "home:/s"); got != "mine\nnew\none\nthree\ntwo\n" {
		t.Fatalf("ls online again: %q", got)
	}
	// The offline write was replayed: A sees it.
	waitFor(t, "the offline write in the realm", 30*time.Second, func() bool {
		return a.ok("ls", "home:/s") == "mine\nnew\none\nthree\ntwo\n"
	})
	if got := b.ok("cat", "home:/s/new"); got != string(offline) {
		t.Fatalf("cat of the offline write online: %q", got)
	}
	if !strings.Contains(out.String(), "offline changes replayed") {
		t.Fatalf("mount log says nothing of the replay:\n%s", out.String())
	}
	if got := b.ok("cat", "home:/s/two"); got != string(two) {
		t.Fatal("cat online again: wrong content")
	}
	b.ok("umount", mnt)
	waitExit(t, exited, out)
	t.Logf("%v after the stop: unmounted", time.Since(stoppedAt))
}
