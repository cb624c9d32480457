package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// `cairn meta move`: the metadata service moves from the first device to
// another, and both reach it afterwards with no edit of their config; it
// is refused without --to and on a device that does not host it.
func TestMetaMoveCommand(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	src := filepath.Join(t.TempDir(), "d.txt")
	writeFile(t, src, []byte("written before the move\n"), 0o644)
	putJSON(t, a, src, "home:/before")

	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.serveOn("127.0.0.2:0", "2s")
	a.waitState("laptop", "awake", 5*time.Second)

	if out := b.ok("devices"); !strings.Contains(out, "metadata: desk (leader, gateway ") {
		t.Fatalf("devices before the move: %s", out)
	}
	if res := a.run("meta", "move"); res.code == 0 || !strings.Contains(res.stderr, "--to") {
		t.Fatalf("meta move without --to: %+v", res)
	}
	if res := b.run("meta", "move", "--to", "desk"); res.code == 0 || !strings.Contains(res.stderr, "does not host") {
		t.Fatalf("meta move on a device that does not host it: %+v", res)
	}
	if out := a.ok("meta", "move", "--to", "laptop"); !strings.Contains(out, "moved the metadata service to laptop") {
		t.Fatalf("meta move: %q", out)
	}
	// The old host's node, not restarted, follows its member to laptop's
	// gateway: it reports there, awake, and keeps running.
	a.waitState("desk", "awake", 10*time.Second)
	var cfg struct {
		Etcd    []string `json:"etcd"`
		Gateway []string `json:"gateway"`
	}
	raw, err := os.ReadFile(filepath.Join(a.home, "realm.json"))
	if err != nil || json.Unmarshal(raw, &cfg) != nil || len(cfg.Gateway) != 1 {
		t.Fatalf("desk's realm.json after the move: %s %v", raw, err)
	}
	for _, r := range []*realmT{a, b} {
		if got := r.ok("cat", "home:/before/d.txt"); got != "written before the move\n" {
			t.Fatalf("cat after the move: %q", got)
		}
	}
	for _, r := range []*realmT{a, b} {
		if out := r.ok("devices"); !strings.Contains(out, "metadata: laptop (leader, gateway 127.0.0.2:") {
			t.Fatalf("devices after the move: %s", out)
		}
	}
	putJSON(t, b, src, "home:/after")
	if out := a.ok("ls", "home:/"); out != "after/\nbefore/\n" {
		t.Fatalf("ls on desk after the move: %q", out)
	}
	// Its node still reports: its record's last report moves on.
	seen := a.waitState("desk", "awake", 10*time.Second)["last_seen"]
	deadline := time.Now().Add(30 * time.Second)
	for a.waitState("desk", "awake", 10*time.Second)["last_seen"] == seen {
		if time.Now().After(deadline) {
			t.Fatalf("desk's node stopped reporting after the move (last seen %v)", seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case err := <-as.done:
		as.done <- err
		t.Fatalf("desk's node ended after the move: %v\n%s", err, as.errb)
	default:
	}
}

// threeMembers makes a realm of three devices, desk, laptop and nas, whose
// metadata service has a member on each (`cairn meta add`), and returns
// them and their nodes by name.
func threeMembers(t *testing.T) (map[string]*realmT, map[string]*server) {
	// Leases of 6 s: a membership change can hold etcd's writes for a
	// few seconds on a loaded machine, and a lease that lapses meanwhile
	// makes the next 'meta add' refuse a device that reads offline.
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("6s")
	a.waitState("desk", "awake", 5*time.Second)
	join := func(name, listen string) (*realmT, *server) {
		tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", name))
		r := joiner(t)
		r.ok("join", tok, "--no-passphrase")
		s := r.serveOn(listen, "6s")
		a.waitState(name, "awake", 5*time.Second)
		return r, s
	}
	b, bs := join("laptop", "127.0.0.2:0")
	c, cs := join("nas", "127.0.0.3:0")
	a.ok("meta", "add", "laptop")
	a.waitState("nas", "awake", 15*time.Second)
	if out := a.ok("meta", "add", "nas"); !strings.Contains(out, "nas now serves the metadata too") {
		t.Fatalf("meta add: %q", out)
	}
	if res := a.run("meta", "add", "nas"); res.code == 0 || !strings.Contains(res.stderr, "already") {
		t.Fatalf("meta add of a member: %+v", res)
	}
	out := b.ok("devices")
	for _, want := range []string{"desk (", "laptop (", "nas ("} {
		if !strings.Contains(out, want) || strings.Count(out, "leader, gateway") != 1 {
			t.Fatalf("devices with three members: %s", out)
		}
	}
	return map[string]*realmT{"desk": a, "laptop": b, "nas": c}, map[string]*server{"desk": as, "laptop": bs, "nas": cs}
}

// writeLoops has each device of ws put a small file in a loop, under
// home:/PREFIX<n>, until the returned stop is called, which returns, by
// device, the names written, the failures and the longest write.
// waitWrites(n) waits until each has made n more writes.
func writeLoops(t *testing.T, ws map[string]*realmT) (waitWrites func(n int64), stop func() map[string]*writeOutcome) {
	src := filepath.Join(t.TempDir(), "f.txt")
	writeFile(t, src, []byte("three members\n"), 0o644)
	quit := make(chan struct{})
	outs := map[string]chan *writeOutcome{}
	made := map[string]*atomic.Int64{}
	for name, r := range ws {
		ch, n := make(chan *writeOutcome, 1), new(atomic.Int64)
		outs[name], made[name] = ch, n
		go func() {
			o := &writeOutcome{}
			for i := 0; ; i++ {
				select {
				case <-quit:
					ch <- o
					return
				default:
				}
				dst := fmt.Sprintf("%s%03d", name, i)
				t0 := time.Now()
				if res := r.run("put", src, "home:/"+dst); res.code != 0 {
					o.fail = append(o.fail, res.stderr)
				} else {
					o.written = append(o.written, dst)
				}
				o.longest = max(o.longest, time.Since(t0))
				n.Add(1)
			}
		}()
	}
	stopped := false
	stop = func() map[string]*writeOutcome {
		if !stopped {
			stopped = true
			close(quit)
		}
		res := map[string]*writeOutcome{}
		for name, ch := range outs {
			res[name] = <-ch
		}
		return res
	}
	waitWrites = func(n int64) {
		t.Helper()
		target := map[string]int64{}
		for name, m := range made {
			target[name] = m.Load() + n
		}
		deadline := time.Now().Add(2 * time.Minute)
		for name, m := range made {
			for m.Load() < target[name] {
				if time.Now().After(deadline) {
					stop()
					t.Fatalf("%s made %d writes, want %d", name, m.Load(), target[name])
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return waitWrites, stop
}

type writeOutcome struct {
	written []string
	fail    []string
	longest time.Duration
}

// `cairn meta add` makes a 3-member metadata service; one member's node
// (a follower's: nas joined last) is SIGKILLed while two devices write:
// no write fails, and every device works on.
func TestMetaAddThreeMembers(t *testing.T) {
	rs, ss := threeMembers(t)
	waitWrites, stop := writeLoops(t, map[string]*realmT{"desk": rs["desk"], "laptop": rs["laptop"]})
	waitWrites(3)
	cs := ss["nas"]
	cs.cmd.Process.Kill() // SIGKILL: nas's member and gateway go at once
	cs.done <- <-cs.done  // (for the cleanup's wait)
	waitWrites(5)
	outs := stop()
	for name, o := range outs {
		if len(o.fail) > 0 || len(o.written) == 0 {
			t.Fatalf("%s: %d writes failed, %d made, with a member killed: %q", name, len(o.fail), len(o.written), o.fail)
		}
	}
	for _, r := range rs {
		r.ok("ls", "home:/")
	}
	t.Logf("%d + %d writes, none failed, with one of three members killed", len(outs["desk"].written), len(outs["laptop"].written))
}

// The 3-member metadata service survives its LEADER's SIGKILL: the
// process that hosts the leading member (desk's etcd daemon, or a joined
// device's node) is killed while the two other devices write in a loop:
// no write fails, every write is there afterwards.
func TestMetaThreeMembersLeaderKilled(t *testing.T) {
	rs, ss := threeMembers(t)
	leader := ""
	if m := regexp.MustCompile(`([a-z]+) \(leader, gateway`).FindStringSubmatch(rs["laptop"].ok("devices")); m != nil {
		leader = m[1]
	}
	if rs[leader] == nil {
		t.Fatalf("no leader among the members: %s", rs["laptop"].ok("devices"))
	}
	writers := map[string]*realmT{}
	for name, r := range rs {
		if name != leader {
			writers[name] = r
		}
	}
	waitWrites, stop := writeLoops(t, writers)
	waitWrites(3)
	// SIGKILL, by PID, the processes this test started that host the
	// leader: its node, and for desk (the realm's first member) the etcd
	// daemon its commands spawned.
	if leader == "desk" {
		pid := etcdServerPID(t, rs["desk"].home)
		if pid <= 1 {
			stop()
			t.Fatalf("desk's etcd daemon: pid %d", pid)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			stop()
			t.Fatal(err)
		}
	}
	s := ss[leader]
	s.cmd.Process.Kill()
	s.done <- <-s.done // (for the cleanup's wait)
	killed := time.Now()
	waitWrites(5)
	outs := stop()
	var names []string
	var longest time.Duration
	for name, o := range outs {
		if len(o.fail) > 0 || len(o.written) == 0 {
			t.Fatalf("%s: %d writes failed, %d made, with the leader (%s) killed: %q", name, len(o.fail), len(o.written), leader, o.fail)
		}
		names = append(names, o.written...)
		longest = max(longest, o.longest)
	}
	for name, r := range writers {
		ls := r.ok("ls", "home:/")
		for _, w := range names {
			if !strings.Contains(ls, w+"/\n") {
				t.Fatalf("%s written, missing on %s after the leader's SIGKILL: %s", w, name, ls)
			}
		}
	}
	t.Logf("leader %s killed; %d writes by %d devices, none failed, none lost; longest write %v (writes went on for %v after the kill)",
		leader, len(names), len(outs), longest.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// `cairn node standby` on the device that hosts the metadata service
// hands it to an awake device first, while another device writes: no
// write fails, every write is there afterwards, and the old host's node,
// which keeps running, follows the service to its new gateway: it reads
// standby, then awake again after `cairn node resume`, with no restart.
func TestStandbyHandsMetaAway(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.serveOn("127.0.0.2:0", "2s")
	a.waitState("laptop", "awake", 5*time.Second)

	src := filepath.Join(t.TempDir(), "f.txt")
	writeFile(t, src, []byte("written while desk goes to sleep\n"), 0o644)
	type outcome struct {
		n       int
		fail    []string
		longest time.Duration
	}
	stop := make(chan struct{})
	var made atomic.Int64
	res := make(chan outcome, 1)
	go func() {
		var o outcome
		for i := 0; ; i++ {
			select {
			case <-stop:
				res <- o
				return
			default:
			}
			t0 := time.Now()
			if r := b.run("put", src, fmt.Sprintf("home:/w%03d", i)); r.code != 0 {
				o.fail = append(o.fail, r.stderr)
			}
			o.longest = max(o.longest, time.Since(t0))
			o.n++
			made.Add(1)
		}
	}()
	waitWrites := func(n int64) {
		t.Helper()
		target := made.Load() + n
		deadline := time.Now().Add(2 * time.Minute)
		for made.Load() < target {
			if time.Now().After(deadline) {
				close(stop)
				t.Fatalf("laptop made %d writes, want %d", made.Load(), target)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitWrites(3)
	if r := a.run("node", "standby"); r.code != 0 || !strings.Contains(r.stdout, "handed the metadata service to laptop") || !strings.Contains(r.stdout, "desk is in standby") {
		close(stop)
		as.cmd.Process.Kill()
		err := <-as.done
		as.done <- err
		t.Fatalf("node standby: %+v\ndesk's node: %s", r, as.errb)
	}
	waitWrites(3)
	close(stop)
	o := <-res
	if len(o.fail) > 0 {
		t.Fatalf("%d of %d writes failed while the metadata moved: %q", len(o.fail), o.n, o.fail)
	}
	ls := b.ok("ls", "home:/")
	for i := range o.n {
		if !strings.Contains(ls, fmt.Sprintf("w%03d/\n", i)) {
			t.Fatalf("write %d missing after the handoff: %s", i, ls)
		}
	}
	for _, r := range []*realmT{a, b} {
		if out := r.ok("devices"); !strings.Contains(out, "metadata: laptop (leader, gateway 127.0.0.2:") {
			t.Fatalf("devices after the handoff: %s", out)
		}
	}
	a.waitState("desk", "standby", 10*time.Second)
	// desk's node was not restarted: it follows the metadata service to
	// laptop's gateway and registers there, awake.
	if out := a.ok("node", "resume"); !strings.Contains(out, "desk is awake") {
		t.Fatalf("node resume: %q", out)
	}
	b.waitState("desk", "awake", 10*time.Second)
	select {
	case err := <-as.done:
		as.done <- err
		t.Fatalf("desk's node ended: %v\n%s", err, as.errb)
	default:
	}
	if got := a.ok("cat", "home:/w000/f.txt"); got != "written while desk goes to sleep\n" {
		t.Fatalf("cat on desk after the resume: %q", got)
	}
	t.Logf("%d writes of laptop during desk's standby, none failed; longest write %v", o.n, o.longest.Round(time.Millisecond))
}

// How long a device tries an unavailable metadata service again is
// --meta-wait or $CAIRN_META_WAIT (default 15 s), and the error says
// once that the service is unavailable and what was tried.
func TestMetaWaitOption(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	as := a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.ok("ls", "home:/")
	// desk's node, the gateway laptop knows, goes: nothing answers there.
	as.cmd.Process.Kill()
	as.done <- <-as.done // (for the cleanup's wait)

	check := func(res result, took time.Duration, how string) {
		t.Helper()
		if res.code != 6 || !strings.HasPrefix(res.stderr, "cairn: reach the metadata service: unavailable: the metadata service is unavailable: tried 1 gateway for ") ||
			strings.Contains(res.stderr, "connect etcd") || strings.Count(res.stderr, "unavailable") > 2 {
			t.Fatalf("ls with %s and the metadata service gone: exit %d, stderr %q", how, res.code, res.stderr)
		}
		// The default would be 15 s.
		if took > 12*time.Second {
			t.Fatalf("ls with %s failed after %v", how, took)
		}
		t.Logf("%s: failed after %v: %s", how, took.Round(time.Millisecond), strings.TrimSpace(res.stderr))
	}
	t0 := time.Now()
	res := b.run("--meta-wait", "1s", "ls", "home:/")
	check(res, time.Since(t0), "--meta-wait 1s")
	t0 = time.Now()
	res = b.runEnv([]string{"CAIRN_META_WAIT=0"}, "ls", "home:/")
	check(res, time.Since(t0), "CAIRN_META_WAIT=0")
	if res := b.run("--meta-wait", "soon", "ls", "home:/"); res.code != 2 || !strings.Contains(res.stderr, "--meta-wait") {
		t.Fatalf("--meta-wait soon: %+v", res)
	}
	if out := b.ok("--help"); !strings.Contains(out, "--meta-wait") {
		t.Fatalf("--help does not tell of --meta-wait: %s", out)
	}
}
