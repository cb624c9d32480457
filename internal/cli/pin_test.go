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

	"cairn.dev/cairn/internal/cli"
)

// pinLs returns 'pin ls --json'.
func (r *realmT) pinLs() []cli.PinJSON {
	r.t.Helper()
	var out []cli.PinJSON
	if err := json.Unmarshal([]byte(r.ok("pin", "ls", "--json")), &out); err != nil {
		r.t.Fatalf("pin ls --json: %v", err)
	}
	return out
}

// TestPinOffline: device B (joined: its metadata through A's node) runs
// its node and pins home:/s (never mounting it): the data is fetched.
// A then changes a pinned file and adds one; B's node fetches both in the
// background (its watch). A's node stops (SIGSTOP: B loses the metadata
// service and A's store): B reads every pinned file offline ('get' of the
// subtree), from the local copy of the namespace its node saved and the
// data it pinned; a file outside the pin fails at once with the offline
// error (the long form also: 'pin ls' offline, reads through a mount).
// Unpinned, the data leaves the pin store (the director's
// TestHoardSurvivesEvictionUntilUnhoarded shows that it is then evicted
// as any cached data).
func TestPinOffline(t *testing.T) {
	began := time.Now()
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("2s")
	a.waitState("desk", "awake", 10*time.Second)
	a.ok("mkdir", "-p", "home:/s/sub", "home:/u")
	src := t.TempDir()
	files := map[string][]byte{"one": randBytes(100 << 10), "two": randBytes(30 << 10), "sub/three": randBytes(5 << 10)}
	for name, b := range files {
		writeFile(t, filepath.Join(src, "s", name), b, 0o644)
	}
	a.ok("put", filepath.Join(src, "s", "one"), filepath.Join(src, "s", "two"), "home:/s/")
	a.ok("put", filepath.Join(src, "s", "sub", "three"), "home:/s/sub/")
	other := randBytes(20 << 10)
	writeFile(t, filepath.Join(src, "other"), other, 0o644)
	a.ok("put", filepath.Join(src, "other"), "home:/u/")

	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.serve("2s")
	t.Logf("%v: realm, device and nodes up", time.Since(began))

	if got := b.ok("pin", "home:/s", "--wait", "--priority", "5"); !strings.Contains(got, "pinned home:/s (priority 5)") || !strings.Contains(got, "for 3 files") {
		t.Fatalf("pin --wait: %q", got)
	}
	// Pinned again without --priority: the priority stays.
	if got := b.ok("pin", "home:/s"); got != "pin updated: home:/s (priority 5)\n" {
		t.Fatalf("pin again: %q", got)
	}
	b.fails(cli.ExitUsage, "pin")
	if res := b.run("pin", "home:/nope"); res.code == 0 {
		t.Fatalf("pin of a missing path: %+v", res)
	}
	ls := b.pinLs()
	if len(ls) != 1 || ls[0].Path != "home:/s" || ls[0].Priority != 5 || ls[0].Files != 3 || !ls[0].Complete || ls[0].HereBytes != 135<<10 {
		t.Fatalf("pin ls after --wait: %+v", ls)
	}
	if s := b.ok("pin", "ls"); !strings.Contains(s, "home:/s  priority 5  3 files, 135.0 KiB of 135.0 KiB here") {
		t.Fatalf("pin ls: %q", s)
	}

	// Another device changes the subtree: B's node fetches it.
	t0 := time.Now()
	files["two"] = randBytes(40 << 10)
	files["sub/four"] = randBytes(8 << 10)
	writeFile(t, filepath.Join(src, "s", "two"), files["two"], 0o644)
	writeFile(t, filepath.Join(src, "s", "sub", "four"), files["sub/four"], 0o644)
	a.ok("put", filepath.Join(src, "s", "two"), "home:/s/")
	a.ok("put", filepath.Join(src, "s", "sub", "four"), "home:/s/sub/")
	for {
		ls = b.pinLs()
		if len(ls) == 1 && ls[0].Files == 4 && ls[0].Complete && ls[0].Bytes == 153<<10 {
			break
		}
		if time.Since(t0) > 20*time.Second {
			t.Fatalf("B's node did not fetch the changes: %+v", ls)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("changes made on A pinned on B within %v", time.Since(t0))

	// A's node stops: B has no metadata service and no other store.
	pid := as.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	dst := filepath.Join(t.TempDir(), "got")
	res := b.run("get", "home:/s", dst)
	if res.code != 0 {
		t.Fatalf("get of the pinned subtree offline: %+v", res)
	}
	for name, want := range files {
		if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(got) != string(want) {
			t.Fatalf("offline copy of %s: %v (%d bytes, want %d)", name, err, len(got), len(want))
		}
	}
	t0 = time.Now()
	res = b.fails(cli.ExitUnavailable, "cat", "home:/u/other")
	if !strings.Contains(res.stderr, "offline: home:/u/other is not on this device") {
		t.Fatalf("cat of an unpinned file offline: %+v", res)
	}
	// The CLI's offline open tries the service for 3 s first.
	if took := time.Since(t0); took > 6*time.Second {
		t.Fatalf("cat of an unpinned file offline took %v", took)
	}
	// The long form (CAIRN_TEST_PIN_MOUNT=1; each offline command costs
	// the CLI's 3 s try of the service) runs 'pin ls' offline and reads
	// the files through a mount too, started offline on a volume never
	// mounted here.
	if os.Getenv("CAIRN_TEST_PIN_MOUNT") != "" {
		if ls = b.pinLs(); len(ls) != 1 || !ls[0].Complete || ls[0].Files != 4 {
			t.Fatalf("pin ls offline: %+v", ls)
		}
		skipWithoutFUSE(t)
		mnt := t.TempDir()
		_, exited, out := b.foregroundWith(mnt, nil, "--mode", "blocking")
		for name, want := range files {
			if got, err := os.ReadFile(filepath.Join(mnt, "s", name)); err != nil || string(got) != string(want) {
				t.Fatalf("mount offline: read of pinned %s: %v", name, err)
			}
		}
		t1 := time.Now()
		if _, err := os.ReadFile(filepath.Join(mnt, "u", "other")); !errors.Is(err, syscall.EIO) || time.Since(t1) > 2*time.Second {
			t.Fatalf("mount offline: read of an unpinned file: %v after %v", err, time.Since(t1))
		}
		b.ok("umount", mnt)
		waitExit(t, exited, out)
		t.Logf("every pinned file read through a mount started offline")
	}
	syscall.Kill(pid, syscall.SIGCONT)

	// Unpinned: B's node hands the data to the chunk cache.
	pinned := func() int64 {
		var n int64
		filepath.Walk(filepath.Join(b.home, "pinned"), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n += fi.Size()
			}
			return nil
		})
		return n
	}
	if n := pinned(); n < 153<<10 {
		t.Fatalf("pin store holds %d bytes before unpin", n)
	}
	b.ok("unpin", "home:/s")
	t0 = time.Now()
	for n := pinned(); n >= 16<<10; n = pinned() {
		if time.Since(t0) > 20*time.Second {
			t.Fatalf("pin store still holds %d bytes after unpin", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pin store emptied %v after unpin", time.Since(t0))
	if res := b.run("unpin", "home:/s"); res.code == 0 {
		t.Fatalf("unpin of what is not pinned: %+v", res)
	}
	if got := b.ok("pin", "ls"); got != "no pins\n" {
		t.Fatalf("pin ls after unpin: %q", got)
	}
	t.Logf("%v in all", time.Since(began))
}
