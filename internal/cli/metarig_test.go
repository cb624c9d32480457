package cli_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/netnstest"
	"cairn.dev/cairn/internal/netnstest/sleeprig"
)

// metaRigLongEnv, set to a duration (e.g. 2m), makes TestMetaHandoffOnRig
// write for that long before and again after the standby, instead of a
// few writes: the long run by hand.
const metaRigLongEnv = "CAIRN_META_RIG_LONG"

// The acceptance test of the metadata handoff (issue 16) on the sleep
// rig: three devices, each in its own host, 56 Mbit/s links with 2 ms of
// delay. A (host 0, the first device) hosts the metadata service; B and C
// joined, all serve. B writes 64 KB files in a loop while A announces
// standby (`cairn node standby`, which hands the metadata member to an
// awake device first): no write fails, the longest write is reported, and
// every file written before and during the handoff is listed and reads
// back. Then the device now hosting the metadata sleeps unannounced (the
// rig's Sleep: SIGSTOP of its node and etcd, link down): the other
// devices' commands fail with exit code unavailable and an error naming
// the metadata service, and once it is woken the next command succeeds,
// with nothing restarted.
func TestMetaHandoffOnRig(t *testing.T) {
	ctx := context.Background()
	long := time.Duration(0)
	if v := os.Getenv(metaRigLongEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", metaRigLongEnv, v, err)
		}
		long = d
	}
	// The wake agent's proxy is A's host: A is never put to sleep by the
	// rig here (its standby is announced, its processes keep running).
	r := sleeprig.New(t, sleeprig.Options{Net: netnstest.Options{Hosts: 3, Delay: 2 * time.Millisecond, Rate: "56mbit"},
		Proxy: 0, ResumeTime: time.Second})
	start := time.Now()
	step := func(what string) { t.Logf("%6.2fs %s", time.Since(start).Seconds(), what) }
	// Leases of 6 s: a membership change can hold etcd's writes for a
	// few seconds on a loaded machine.
	const lease = 6 * time.Second
	a := netHome(t, r.Net, 0, "a")
	a.ok("init", "--no-passphrase", "--name", "a")
	as := a.serveOn(r.HostPort(0, nodePort), lease.String())
	devs := map[string]*realmT{"a": a}
	servers := map[string]*server{"a": as}
	for i, name := range []string{"b", "c"} {
		tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", name))
		d := netHome(t, r.Net, i+1, name)
		d.ok("join", tok, "--no-passphrase")
		servers[name] = d.serveOn(r.HostPort(i+1, nodePort), lease.String())
		devs[name] = d
		a.waitState(name, "awake", 15*time.Second)
	}
	b := devs["b"]
	if out := b.ok("devices"); !strings.Contains(out, "metadata: a (leader, gateway ") {
		t.Fatalf("devices before the standby: %s", out)
	}
	step("three devices serving, a hosts the metadata")

	// 64 KB files, each different, so that every put stores new chunks.
	srcDir := t.TempDir()
	content := func(i int) []byte {
		b := randBytes(64 << 10)
		copy(b, fmt.Sprintf("file %06d\n", i))
		return b
	}
	type op struct {
		took time.Duration
		end  time.Time
	}
	type outcome struct {
		ops  []op
		fail []string
		sums map[int][]byte
	}
	b.ok("mkdir", "home:/w")
	stop := make(chan struct{})
	var made atomic.Int64
	res := make(chan outcome, 1)
	go func() {
		o := outcome{sums: map[int][]byte{}}
		for i := 0; ; i++ {
			select {
			case <-stop:
				res <- o
				return
			default:
			}
			data := content(i)
			src := filepath.Join(srcDir, fmt.Sprintf("f%06d.bin", i))
			if err := os.WriteFile(src, data, 0o644); err != nil {
				o.fail = append(o.fail, err.Error())
				continue
			}
			t0 := time.Now()
			if r := b.run("put", src, "home:/w/"); r.code != 0 {
				o.fail = append(o.fail, fmt.Sprintf("put %d: exit %d: %s", i, r.code, r.stderr))
			}
			o.ops = append(o.ops, op{time.Since(t0), time.Now()})
			o.sums[i] = data
			made.Add(1)
		}
	}()
	stopped := false
	finish := func() outcome {
		if !stopped {
			close(stop)
			stopped = true
		}
		return <-res
	}
	// writeFor waits until b has made n more writes, and for at least d.
	writeFor := func(n int64, d time.Duration) {
		t.Helper()
		target, until := made.Load()+n, time.Now().Add(d)
		deadline := until.Add(3 * time.Minute)
		for made.Load() < target || time.Now().Before(until) {
			if time.Now().After(deadline) {
				o := finish()
				t.Fatalf("b made %d writes, want %d; failures: %q", made.Load(), target, o.fail)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	writeFor(5, long)
	before := made.Load()
	t0 := time.Now()
	sb := a.run("node", "standby")
	standbyTook, standbyEnd := time.Since(t0), time.Now()
	if sb.code != 0 || !strings.Contains(sb.stdout, "handed the metadata service to ") || !strings.Contains(sb.stdout, "a is in standby") {
		finish()
		t.Fatalf("node standby on a: %+v", sb)
	}
	writeFor(5, long)
	o := finish()
	step(fmt.Sprintf("b wrote %d files, a's standby took %v", len(o.ops), standbyTook.Round(time.Millisecond)))
	if len(o.fail) > 0 {
		t.Fatalf("%d of %d writes of b failed while the metadata moved: %q", len(o.fail), len(o.ops), o.fail)
	}

	// The longest write, and the median of those made before the standby.
	var longest, longestDuring time.Duration
	var pre []time.Duration
	for i, w := range o.ops {
		longest = max(longest, w.took)
		if i < int(before) {
			pre = append(pre, w.took)
		}
		// A write that overlapped the standby.
		if w.end.After(t0) && w.end.Add(-w.took).Before(standbyEnd) {
			longestDuring = max(longestDuring, w.took)
		}
	}
	slices.Sort(pre)
	median := pre[len(pre)/2]
	t.Logf("%d writes of 64 KB by b (%d before a's standby), none failed; standby took %v; longest write %v (%v during the handoff), median before %v",
		len(o.ops), before, standbyTook.Round(time.Millisecond), longest.Round(time.Millisecond), longestDuring.Round(time.Millisecond), median.Round(time.Millisecond))
	fmt.Printf("RESULTS.md: | metadata handoff on the rig (3 hosts, 56mbit, 2ms) | %d writes of 64 KB, 0 failed | longest write %v (during the handoff %v) | median before %v | standby %v |\n",
		len(o.ops), longest.Round(time.Millisecond), longestDuring.Round(time.Millisecond), median.Round(time.Millisecond), standbyTook.Round(time.Millisecond))

	// Where the metadata went.
	m := regexp.MustCompile(`metadata: (\w+) \(leader, gateway `).FindStringSubmatch(b.ok("devices"))
	if m == nil || (m[1] != "b" && m[1] != "c") {
		t.Fatalf("devices after the handoff: %v", m)
	}
	host := map[string]int{"a": 0, "b": 1, "c": 2}[m[1]]
	for _, d := range []*realmT{a, devs["b"], devs["c"]} {
		if out := d.ok("devices"); !strings.Contains(out, "metadata: "+m[1]+" (leader, gateway ") {
			t.Fatalf("devices on %s after the handoff: %s", d.home, out)
		}
	}
	// Every file is there, and reads back, from every device.
	ls := devs["c"].ok("ls", "home:/w/")
	for i := range len(o.ops) {
		if !strings.Contains(ls, fmt.Sprintf("f%06d.bin\n", i)) {
			t.Fatalf("write %d missing after the handoff: %s", i, ls)
		}
	}
	// Every file read back, or in a long run every 5th; spread over the
	// three devices.
	stride := 3
	if len(o.ops) > 150 {
		stride = 15
	}
	for i, d := range []*realmT{a, devs["b"], devs["c"]} {
		for j := i; j < len(o.ops); j += stride {
			if got := d.ok("cat", fmt.Sprintf("home:/w/f%06d.bin", j)); got != string(o.sums[j]) {
				t.Fatalf("cat of write %d on %s: %d bytes, not the %d written", j, d.home, len(got), len(o.sums[j]))
			}
		}
	}
	step(fmt.Sprintf("all %d files listed and read back; the metadata is on %s", len(o.ops), m[1]))

	// 2. The new host sleeps without announcing it: its node and its etcd
	// server stop, its link goes down.
	srv := servers[m[1]]
	r.Attach(host, srv.cmd.Process)
	// A member taken over by a handoff runs in the node's process; one
	// started by init, in an etcd daemon of the home.
	etcdPID := etcdServerPID(t, devs[m[1]].home)
	if etcdPID != 0 {
		p, err := os.FindProcess(etcdPID)
		if err != nil {
			t.Fatal(err)
		}
		r.Attach(host, p)
	}
	if err := r.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Wake(context.Background(), host) }) // before the homes' cleanups stop the daemons
	step(m[1] + " asleep")
	var others []*realmT
	for name, d := range devs {
		if name != m[1] {
			others = append(others, d)
		}
	}
	const bound = 2 * time.Minute // generous: the CLI tries an unavailable service again for 15 s
	// A read on one of the others, a write on the other (each waits
	// for the service's return for 15 s before it fails).
	for i, d := range others {
		for _, args := range [][][]string{{{"ls", "home:/w/"}}, {{"put", filepath.Join(srcDir, "f000000.bin"), "home:/asleep.bin"}}}[i] {
			t0 := time.Now()
			res := d.run(args...)
			took := time.Since(t0)
			if res.code != cli.ExitUnavailable || !strings.HasPrefix(res.stderr, "cairn: reach the metadata service: ") {
				t.Fatalf("%s on %s with the metadata host asleep: exit %d, want %d (unavailable) and an error naming the metadata service\n%s",
					args[0], d.home, res.code, cli.ExitUnavailable, res.stderr)
			}
			if took > bound {
				t.Fatalf("%s on %s with the metadata host asleep failed after %v, want within %v", args[0], d.home, took, bound)
			}
			t.Logf("%s on %s, metadata host asleep: exit %d after %v: %s", args[0], filepath.Base(d.home), res.code, took.Round(time.Millisecond), strings.TrimSpace(res.stderr))
		}
	}

	// 3. It wakes: the next command succeeds, nothing restarted.
	if err := r.Wake(ctx, host); err != nil {
		t.Fatal(err)
	}
	step(m[1] + " woken")
	for _, d := range others {
		t0 := time.Now()
		if out := d.ok("ls", "home:/w/"); out != ls {
			t.Fatalf("ls on %s after the wake: %d bytes, want the %d listed before", d.home, len(out), len(ls))
		}
		t.Logf("ls on %s after the wake: %v", filepath.Base(d.home), time.Since(t0).Round(time.Millisecond))
	}
	putJSON(t, others[0], filepath.Join(srcDir, "f000001.bin"), "home:/woken.bin")
	for name, s := range servers {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("%s's node ended: %v\n%s", name, err, s.errb)
		default:
		}
	}
	if got := etcdServerPID(t, devs[m[1]].home); got != etcdPID {
		t.Fatalf("%s's etcd server is pid %d after the wake, was %d: restarted", m[1], got, etcdPID)
	}
}

// etcdServerPID is the pid of home's etcd daemon, from its endpoint file
// ("addr memberID pid"), or 0 if home has none.
func etcdServerPID(t *testing.T, home string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(home, "etcd", "endpoint"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) != 3 {
		t.Fatalf("endpoint file of %s: %q", home, raw)
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}
