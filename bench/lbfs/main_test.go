//go:build lbfsbench

// Package lbfs is the driver of bench/lbfs.sh, the acceptance benchmark of
// issue 3 (transfers that send only what is new, LBFS). It builds two hosts
// joined by an emulated link (internal/netnstest: per-uplink one-way delay
// and rate, forwarded in this process, so the test must run while the tools
// talk) and measures, for each workload, the bytes host 0 (the client)
// sends and receives, and the wall time, while cairn, `rsync -az` and a
// full copy store a new version over an old one already on host 1.
//
// Host 0 holds a cairn realm (`cairn init --no-passphrase`, embedded etcd:
// metadata stays on the client) and runs `cairn node serve`, the join and
// registrar endpoint. Host 1 joined it as a benefactor and runs its own
// `cairn node serve`: cairn writes with `cairn put --store store1`. Host 1
// also runs an rsync daemon with two modules, "lbfs" (rsync -az) and
// "full" (the full copy: `rsync -a --whole-file`, no -z, into an emptied
// destination).
//
// It is built only with the lbfsbench tag (never in `go test ./...`) and
// configured by bench/lbfs.sh through the environment:
//
//	LBFS_CAIRN      the cairn binary (required)
//	LBFS_WORK       a scratch directory (required)
//	LBFS_INPUTS     DIR/<workload>/{old,new}/ for every workload but doc,
//	                which is generated here (DIR/doc)
//	LBFS_WORKLOADS  default "doc xtools rebuild"
//	LBFS_TOOLS      default "cairn rsync full"
//	LBFS_RUNS       default 1: each run builds fresh hosts, realm and daemons
//	LBFS_DELAY      one-way delay of each uplink, default 15ms (~30 ms RTT)
//	LBFS_RATE       rate of each uplink, default 1.5mbit
//	LBFS_IDLE       how long the idle background traffic is sampled, default 10s
//	LBFS_CHUNK_AVG  if set, `cairn init --chunk-avg` (default: cairn's own)
//	LBFS_OUT        JSON lines, one per measurement (required)
package lbfs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/netnstest"
)

const (
	client = 0 // host 0: the realm, cairn put, the rsync client
	server = 1 // host 1: the benefactor node and the rsync daemon

	nodePort  = 7461
	rsyncPort = 8873
	storeName = "store1"
)

// Result is one line of LBFS_OUT.
type Result struct {
	Run      int    `json:"run"`
	Workload string `json:"workload"`
	Tool     string `json:"tool"` // cairn, rsync, full
	// Phase: old (the version already stored, stored first), new (the
	// measurement), or force (cairn only, after the others: `put --force`
	// of the unchanged new tree, which re-reads every file and asks the
	// node about every chunk but finds nothing new: the cost of the
	// questions alone).
	Phase    string  `json:"phase"`
	Up       uint64  `json:"up"`   // bytes host 0 sent (IP packets on its interface)
	Down     uint64  `json:"down"` // bytes host 0 received
	UpPkts   uint64  `json:"up_packets"`
	DownPkts uint64  `json:"down_packets"`
	Seconds  float64 `json:"seconds"`
	Command  string  `json:"command"`
	// Output is the command's stdout when it is JSON (cairn put --json),
	// else its last lines (rsync --stats).
	Output json.RawMessage `json:"output,omitempty"`
	Text   string          `json:"text,omitempty"`
	// Idle: for tool "idle", the background traffic over Seconds with no
	// command running (the nodes' heartbeats).
}

type bench struct {
	t        *testing.T
	n        *netnstest.Net
	cairn    string
	work     string
	inputs   string
	tools    map[string]bool
	out      *os.File
	run      int
	client   string // CAIRN_HOME of host 0
	store    string // CAIRN_HOME of host 1
	stageDir string
	rsyncDst string // host 1's rsync module directories
	fullDst  string
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func TestLBFS(t *testing.T) {
	cairnBin, work, outPath := os.Getenv("LBFS_CAIRN"), os.Getenv("LBFS_WORK"), os.Getenv("LBFS_OUT")
	if cairnBin == "" || work == "" || outPath == "" {
		t.Fatal("LBFS_CAIRN, LBFS_WORK and LBFS_OUT are required (run bench/lbfs.sh)")
	}
	inputs := env("LBFS_INPUTS", filepath.Join(work, "inputs"))
	delay, err := time.ParseDuration(env("LBFS_DELAY", "15ms"))
	if err != nil {
		t.Fatal(err)
	}
	idle, err := time.ParseDuration(env("LBFS_IDLE", "10s"))
	if err != nil {
		t.Fatal(err)
	}
	runs, err := strconv.Atoi(env("LBFS_RUNS", "1"))
	if err != nil || runs < 1 {
		t.Fatalf("LBFS_RUNS=%q: want a positive number", os.Getenv("LBFS_RUNS"))
	}
	tools := map[string]bool{}
	for _, s := range strings.Fields(env("LBFS_TOOLS", "cairn rsync full")) {
		tools[s] = true
	}
	workloads := strings.Fields(env("LBFS_WORKLOADS", "doc xtools rebuild"))
	for _, w := range workloads {
		if w == "doc" {
			if err := genDoc(filepath.Join(inputs, "doc")); err != nil {
				t.Fatal(err)
			}
		}
		for _, v := range []string{"old", "new"} {
			if _, err := os.Stat(filepath.Join(inputs, w, v)); err != nil {
				t.Fatalf("workload %s: %v", w, err)
			}
		}
	}
	out, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()

	for run := 1; run <= runs; run++ {
		t.Run(fmt.Sprintf("run%d", run), func(t *testing.T) {
			dir := filepath.Join(work, fmt.Sprintf("run%d", run))
			b := &bench{t: t, cairn: cairnBin, work: dir, inputs: inputs, tools: tools, out: out, run: run,
				client:   filepath.Join(work, fmt.Sprintf("realm-client-%d", run)),
				store:    filepath.Join(work, fmt.Sprintf("realm-store-%d", run)),
				stageDir: filepath.Join(dir, "stage"), rsyncDst: filepath.Join(dir, "host1", "lbfs"), fullDst: filepath.Join(dir, "host1", "full")}
			for _, d := range []string{b.stageDir, b.rsyncDst, b.fullDst} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			b.n = netnstest.New(t, netnstest.Options{Hosts: 2, Delay: delay, Rate: env("LBFS_RATE", "1.5mbit")})
			if tools["rsync"] || tools["full"] {
				b.startRsyncd()
			}
			if tools["cairn"] {
				b.startCairn()
			}
			b.idle(idle)
			for _, w := range workloads {
				b.workload(w)
			}
		})
	}
}

// genDoc writes DIR/old/report.bin, 1.5 MiB of incompressible bytes from a
// fixed seed (a docx or odt is a zip: mostly incompressible), and
// DIR/new/report.bin, the same document edited in the middle: 3 KiB
// inserted at the middle and 1 KiB overwritten 40 KiB after it.
func genDoc(dir string) error {
	const size, ins, chg = 1536 << 10, 3 << 10, 1 << 10
	var seed [32]byte
	copy(seed[:], "cairn lbfs bench: document edit")
	rng := rand.NewChaCha8(seed)
	old := make([]byte, size)
	rng.Read(old)
	insert, change := make([]byte, ins), make([]byte, chg)
	rng.Read(insert)
	rng.Read(change)
	mid := size / 2
	edited := make([]byte, 0, size+ins)
	edited = append(edited, old[:mid]...)
	edited = append(edited, insert...)
	edited = append(edited, old[mid:]...)
	at := mid + ins + 40<<10
	copy(edited[at:at+chg], change)
	for v, data := range map[string][]byte{"old": old, "new": edited} {
		d := filepath.Join(dir, v)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "report.bin"), data, 0o644); err != nil {
			return err
		}
	}
	// Fixed mtimes, the new version saved an hour after the old one.
	mt := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, v := range []string{"old", "new"} {
		if err := os.Chtimes(filepath.Join(dir, v, "report.bin"), mt, mt); err != nil {
			return err
		}
		mt = mt.Add(time.Hour)
	}
	return nil
}

// bg starts a long-running command and returns a channel that gets the
// first stdout line matching ready; the process is stopped (SIGTERM, then
// SIGKILL after 10 s) at cleanup.
func (b *bench) bg(host int, name, logName string, env []string, ready string, args ...string) {
	t := b.t
	t.Helper()
	cmd := b.n.Command(host, name, args...)
	cmd.Env = append(os.Environ(), env...)
	logf, err := os.Create(filepath.Join(b.work, logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed once the process has exited; werr is then its error
	var werr error
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
		io.Copy(logf, stdout)
		werr = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("%s did not stop on SIGTERM in 10 s: killing pid %d", name, cmd.Process.Pid)
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	if ready == "" {
		return
	}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l := <-lines:
			if strings.Contains(l, ready) {
				t.Logf("host %d: %s", host, l)
				return
			}
		case <-done:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("%s %s exited before it was ready: %v\n%s", name, strings.Join(args, " "), werr, log)
		case <-deadline:
			t.Fatalf("%s %s: not ready after 60 s", name, strings.Join(args, " "))
		}
	}
}

// startRsyncd runs an rsync daemon in host 1 with the modules lbfs and full.
func (b *bench) startRsyncd() {
	conf := filepath.Join(b.work, "rsyncd.conf")
	body := fmt.Sprintf(`use chroot = no
uid = root
gid = root
pid file = %s
[lbfs]
path = %s
read only = no
[full]
path = %s
read only = no
`, filepath.Join(b.work, "rsyncd.pid"), b.rsyncDst, b.fullDst)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.bg(server, "rsync", "rsyncd.log", nil, "", "--daemon", "--no-detach", "--config="+conf,
		"--address="+b.n.Addr(server).String(), fmt.Sprintf("--port=%d", rsyncPort), "--log-file="+filepath.Join(b.work, "rsyncd.xfer.log"))
	// Wait until it accepts connections.
	for i := 0; ; i++ {
		c, err := b.n.Dial(client, "tcp", b.n.HostPort(server, rsyncPort), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if i == 100 {
			b.t.Fatalf("rsync daemon on host 1 does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cmd runs a command in host's namespace and returns its stdout; it fails
// the test if the command fails.
func (b *bench) cmd(host int, env []string, name string, args ...string) []byte {
	b.t.Helper()
	c := b.n.Command(host, name, args...)
	c.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		b.t.Fatalf("host %d: %s %s: %v\nstdout: %s\nstderr: %s", host, name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

func (b *bench) cairnEnv(home string) []string { return []string{"CAIRN_HOME=" + home} }

// startCairn makes the realm on host 0, its node, and the benefactor on
// host 1, and waits until host 0 sees the benefactor online.
func (b *bench) startCairn() {
	t := b.t
	for _, h := range []string{b.client, b.store} {
		os.RemoveAll(h)
		home := h
		t.Cleanup(func() { stopEtcd(t, home) })
	}
	ce, se := b.cairnEnv(b.client), b.cairnEnv(b.store)
	initArgs := []string{"init", "--no-passphrase", "--name", "client"}
	if a := os.Getenv("LBFS_CHUNK_AVG"); a != "" {
		initArgs = append(initArgs, "--chunk-avg", a)
	}
	b.cmd(client, ce, b.cairn, initArgs...)
	b.bg(client, b.cairn, "node-client.log", ce, "serving ", "node", "serve", "--listen", b.n.HostPort(client, nodePort))
	tok := strings.TrimSpace(string(b.cmd(client, ce, b.cairn, "invite", "--role", "benefactor", "--name", storeName)))
	b.cmd(server, se, b.cairn, "join", tok, "--no-passphrase")
	b.bg(server, b.cairn, "node-store.log", se, "serving ", "node", "serve", "--listen", b.n.HostPort(server, nodePort))
	deadline := time.Now().Add(60 * time.Second)
	for {
		var nodes []struct{ Name, State string }
		if err := json.Unmarshal(b.cmd(client, ce, b.cairn, "devices", "--json"), &nodes); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			// "awake" since issue 16's power states, "online" before (bench/ab.sh runs
			// this driver with older binaries too)
			if n.Name == storeName && (n.State == "awake" || n.State == "online") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not online after 60 s: %+v", storeName, nodes)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// stopEtcd stops the embedded etcd daemon of home, if one runs (its pid is
// the third field of home/etcd/endpoint, and its environment names home).
func stopEtcd(t *testing.T, home string) {
	ep, err := os.ReadFile(filepath.Join(home, "etcd", "endpoint"))
	if err != nil {
		return
	}
	f := strings.Fields(string(ep))
	if len(f) < 3 {
		return
	}
	pid, err := strconv.Atoi(f[2])
	if err != nil || pid <= 0 {
		return
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || !bytes.Contains(append([]byte{0}, environ...), []byte("\x00CAIRN_HOME="+home+"\x00")) {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for range 100 {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && (st[i+2] == 'Z' || st[i+2] == 'X') {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("etcd daemon %d of %s still runs 10 s after SIGTERM", pid, home)
}

type counts struct{ up, down, upPkts, downPkts uint64 }

func (c counts) sub(d counts) counts {
	return counts{c.up - d.up, c.down - d.down, c.upPkts - d.upPkts, c.downPkts - d.downPkts}
}

// counters returns host 0's bytes and packets sent and received (netnstest
// reads the same counters but gives only the bytes).
func (b *bench) counters() counts {
	out, err := exec.Command("ip", "-n", b.n.NS(client), "-s", "-j", "link", "show", "dev", netnstest.Dev).Output()
	if err != nil {
		b.t.Fatalf("link stats of host 0: %v", err)
	}
	type dir struct{ Bytes, Packets uint64 }
	var v []struct {
		Stats64 struct{ Rx, Tx dir } `json:"stats64"`
	}
	if err := json.Unmarshal(out, &v); err != nil || len(v) != 1 {
		b.t.Fatalf("link stats of host 0: %v: %s", err, out)
	}
	s := v[0].Stats64
	return counts{s.Tx.Bytes, s.Rx.Bytes, s.Tx.Packets, s.Rx.Packets}
}

// quiet waits until the link has carried what the command sent: the last
// packets and acknowledgements are at most a round trip away.
func (b *bench) quiet() { time.Sleep(300 * time.Millisecond) }

func (b *bench) idle(d time.Duration) {
	if d <= 0 {
		return
	}
	b.quiet()
	c0 := b.counters()
	t0 := time.Now()
	time.Sleep(d)
	c := b.counters().sub(c0)
	b.emit(Result{Workload: "-", Tool: "idle", Phase: "idle", Up: c.up, Down: c.down, UpPkts: c.upPkts, DownPkts: c.downPkts, Seconds: time.Since(t0).Seconds(), Command: "sleep"})
}

func (b *bench) emit(r Result) {
	r.Run = b.run
	line, err := json.Marshal(r)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.out.Write(append(line, '\n')); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("%s %-5s %-5s up %10d (%6d pkts) down %9d (%6d pkts) %7.2f s", r.Workload, r.Tool, r.Phase, r.Up, r.UpPkts, r.Down, r.DownPkts, r.Seconds)
}

// stage makes b.stageDir/w exactly the tree src, changing only what differs
// (rsync --checksum --delete, locally, outside the namespaces): like a
// new version written over the old one.
func (b *bench) stage(w, src string) string {
	dst := filepath.Join(b.stageDir, w)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if out, err := exec.Command("rsync", "-a", "--checksum", "--delete", src+"/", dst+"/").CombinedOutput(); err != nil {
		b.t.Fatalf("stage %s: %v: %s", src, err, out)
	}
	return dst
}

// measure runs one command in host 0 and emits its bytes and wall time.
func (b *bench) measure(w, tool, phase string, env []string, name string, args ...string) {
	b.t.Helper()
	b.quiet()
	c0 := b.counters()
	t0 := time.Now()
	out := b.cmd(client, env, name, args...)
	sec := time.Since(t0).Seconds()
	b.quiet()
	c := b.counters().sub(c0)
	r := Result{Workload: w, Tool: tool, Phase: phase, Up: c.up, Down: c.down, UpPkts: c.upPkts, DownPkts: c.downPkts, Seconds: sec, Command: name + " " + strings.Join(args, " ")}
	if json.Valid(out) && len(bytes.TrimSpace(out)) > 0 {
		r.Output = json.RawMessage(bytes.TrimSpace(out))
	} else {
		r.Text = string(out)
	}
	if err := os.WriteFile(filepath.Join(b.work, fmt.Sprintf("%s-%s-%s.out", w, tool, phase)), out, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.emit(r)
}

// workload stores the old version with every tool (not measured as the
// result: it is what is already there), then the new one over it.
func (b *bench) workload(w string) {
	rsyncURL := func(mod string) string {
		return fmt.Sprintf("rsync://%s/%s/", b.n.HostPort(server, rsyncPort), mod)
	}
	ce := b.cairnEnv(b.client)
	for _, phase := range []string{"old", "new"} {
		src := b.stage(w, filepath.Join(b.inputs, w, phase))
		if b.tools["cairn"] {
			b.measure(w, "cairn", phase, ce, b.cairn, "put", "--json", "--store", storeName, src, "home:/")
		}
		if b.tools["rsync"] {
			b.measure(w, "rsync", phase, nil, "rsync", "-az", "--stats", src, rsyncURL("lbfs"))
		}
		if b.tools["full"] && phase == "new" {
			// A full copy: the destination emptied first, every byte
			// sent as it is (--whole-file: no delta; no -z).
			if err := os.RemoveAll(filepath.Join(b.fullDst, w)); err != nil {
				b.t.Fatal(err)
			}
			b.measure(w, "full", phase, nil, "rsync", "-a", "--whole-file", "--stats", src, rsyncURL("full"))
		}
	}
	if b.tools["cairn"] {
		src := filepath.Join(b.stageDir, w)
		b.measure(w, "cairn", "force", ce, b.cairn, "put", "--json", "--force", "--store", storeName, src, "home:/")
	}
}
