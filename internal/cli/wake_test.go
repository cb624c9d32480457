package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/netnstest"
	"cairn.dev/cairn/internal/netnstest/sleeprig"
)

// On the sleep rig: device A (host 0, the realm's etcd), device B (host
// 1) and P (host 2, B's wake proxy, where the rig's wake agent listens).
// A file only B holds: with B asleep (SIGSTOP, link down, offline), A's
// get wakes B through P (the agent sees the packet from P's address),
// shows progress and succeeds. A read A can answer without B (its chunk
// cache, a file on awake P, a copies:2 file's copy on P) sends no packet. A wake that never comes
// fails after --wake-timeout, naming B. With no proxy set, A, on B's LAN,
// sends the packets itself.
func TestWakeOnRead(t *testing.T) {
	ctx := context.Background()
	r := sleeprig.New(t, sleeprig.Options{Net: netnstest.Options{Hosts: 3, Delay: 2 * time.Millisecond, Rate: "56mbit"},
		Proxy: 2, ResumeTime: time.Second})
	const lease = 2 * time.Second
	a := netHome(t, r.Net, 0, "a")
	a.ok("init", "--no-passphrase", "--name", "a")
	a.serveOn(r.HostPort(0, nodePort), lease.String())
	devs := map[string]*realmT{}
	servers := map[string]*server{}
	for i, name := range []string{"b", "p"} {
		tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", name))
		d := netHome(t, r.Net, i+1, name)
		d.ok("join", tok, "--no-passphrase")
		servers[name] = d.serveOn(r.HostPort(i+1, nodePort), lease.String())
		devs[name] = d
		a.waitState(name, "awake", 10*time.Second)
	}
	b, p := devs["b"], devs["p"]
	r.Attach(1, servers["b"].cmd.Process)
	a.ok("node", "set-wake", "b", "--mac", r.MAC(1).String(), "--broadcast", netnstest.Broadcast.String(), "--proxy", "p")

	data := randBytes(100_000)
	src := filepath.Join(t.TempDir(), "f.bin")
	writeFile(t, src, data, 0o644)
	putJSON(t, b, src, "home:/")
	writeFile(t, src, []byte("on p\n"), 0o644)
	os.Rename(src, filepath.Join(filepath.Dir(src), "g.txt"))
	putJSON(t, p, filepath.Join(filepath.Dir(src), "g.txt"), "home:/")

	// A file kept copies:2 on b and p, written by b.
	b.ok("mkdir", "home:/two")
	a.ok("policy", "set", "home:/two", "copies:2@b,p")
	two := randBytes(50_000)
	writeFile(t, src, two, 0o644)
	putJSON(t, b, src, "home:/two/")

	sleep := func() {
		if err := r.Sleep(ctx, 1); err != nil {
			t.Fatal(err)
		}
		a.waitState("b", "offline", 3*lease+5*time.Second)
	}
	sleep()
	// A file on awake P: read, no packet.
	if got := a.ok("cat", "home:/g.txt"); got != "on p\n" {
		t.Fatalf("cat g.txt: %q", got)
	}
	if ev := r.Events(); len(ev) != 0 {
		t.Fatalf("a read of a file on awake p sent packets: %+v", ev)
	}

	// The same file's copy on awake p: read from it, b is not woken.
	if got := a.ok("cat", "home:/two/f.bin"); got != string(two) {
		t.Fatalf("cat two/f.bin: %d bytes, want %d", len(got), len(two))
	}
	if ev := r.Events(); len(ev) != 0 {
		t.Fatalf("a read of a copies:2 file with its copy on awake p sent packets: %+v", ev)
	}

	// 1. Only B holds f.bin: the get wakes it through P.
	dest := filepath.Join(t.TempDir(), "out.bin")
	t0 := time.Now()
	res := a.run("get", "home:/f.bin", dest)
	took := time.Since(t0)
	if res.code != 0 {
		t.Fatalf("get of a file only sleeping b holds: exit %d\n%s", res.code, res.stderr)
	}
	if got, err := os.ReadFile(dest); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get wrote %d bytes (%v), want the %d b wrote", len(got), err, len(data))
	}
	if !strings.Contains(res.stderr, "waking b… ") {
		t.Fatalf("get showed no progress: %q", res.stderr)
	}
	ev := r.Events()
	if len(ev) == 0 || ev[0].Outcome != sleeprig.Scheduled || ev[0].Host != 1 || ev[0].From.Addr() != r.Addr(2) {
		t.Fatalf("agent events %+v: want a wake of host 1 sent by the proxy %v", ev, r.Addr(2))
	}
	t.Logf("get that woke b took %v (resume time %v); stderr %q", took.Round(time.Millisecond), r.ResumeTime(), res.stderr)
	a.waitState("b", "awake", 10*time.Second)

	// 2. The same get again with B asleep: A's chunk cache holds the
	// data now, so no packet.
	sleep()
	n := len(r.Events())
	a.ok("get", "home:/f.bin", filepath.Join(t.TempDir(), "again.bin"))
	if ev := r.Events(); len(ev) != n {
		t.Fatalf("a get answered from the cache sent packets: %+v", ev[n:])
	}

	// 3. A wake that never comes: a short --wake-timeout, an error
	// naming b. (--no-cache: past the chunk cache, to b's copy.)
	r.Hold(1, true)
	res = a.run("get", "--no-cache", "--wake-timeout", "3s", "home:/f.bin", filepath.Join(t.TempDir(), "never.bin"))
	if res.code == 0 || !strings.Contains(res.stderr, "no awake store holds the data") || !strings.Contains(res.stderr, "held by b") {
		t.Fatalf("get with a wake that never comes: exit %d\n%s", res.code, res.stderr)
	}
	if res.code != cli.ExitUnavailable {
		t.Fatalf("get with a wake that never comes: exit %d, want %d (unavailable)\n%s", res.code, cli.ExitUnavailable, res.stderr)
	}
	t.Logf("a wake that never comes: %s", strings.TrimSpace(res.stderr))
	ev = r.Events()
	if len(ev) <= n || ev[len(ev)-1].Outcome != sleeprig.Held {
		t.Fatalf("no packet for the held host: %+v", ev[n:])
	}

	// 4. No proxy: A is on b's LAN (the record's broadcast address is
	// its interface's), so it sends the packets itself.
	r.Hold(1, false)
	a.ok("node", "set-wake", "b", "--mac", r.MAC(1).String(), "--broadcast", netnstest.Broadcast.String())
	n = len(ev)
	res = a.run("get", "--no-cache", "home:/f.bin", filepath.Join(t.TempDir(), "direct.bin"))
	if res.code != 0 || !strings.Contains(res.stderr, "waking b… ") {
		t.Fatalf("get that wakes b by a broadcast of its own: exit %d\n%s", res.code, res.stderr)
	}
	ev = r.Events()
	if len(ev) <= n || ev[n].Outcome != sleeprig.Scheduled || ev[n].From.Addr() != r.Addr(0) {
		t.Fatalf("agent events %+v: want a wake of host 1 sent by a (%v)", ev[n:], r.Addr(0))
	}
}
