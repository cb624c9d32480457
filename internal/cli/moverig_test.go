package cli_test

import (
	"fmt"
	mrand "math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/netnstest"
)

// moveBytesEnv and moveOpsEnv set the size of the file TestMoveWorkload
// moves and the least number of operations its client makes (the
// acceptance run: 1 GiB and 1000); the CI form moves 24 MiB and makes at
// least 20.
const (
	moveBytesEnv = "CAIRN_MOVE_BYTES"
	moveOpsEnv   = "CAIRN_MOVE_OPS"
)

func envInt(t *testing.T, name string, def, least int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < least {
		t.Fatalf("%s=%q", name, s)
	}
	return n
}

// The "move" workload of issue 17 (ZZFS §5.2, Figure 6) on three hosts
// linked at 56 Mbit/s and 2 ms: a file written on the desktop (host 1) is
// moved to the laptop (host 0, the realm's etcd; its node daemon does the
// copy) while a client on a second laptop (host 2), which read the file
// once before, reads the whole file and writes a version with 64 KiB
// changed, in turn, each a `cairn` process timed from the test. No operation waits for the move: each
// takes less than the move, several end while it runs, every read returns
// the last version written, and afterwards every version is on the
// laptop (those written meanwhile were offloaded to the client and
// reclaimed), none on the desktop or the client, fsck --read-data clean.
func TestMoveWorkload(t *testing.T) {
	size := envInt(t, moveBytesEnv, 24<<20, 1<<20)
	least := envInt(t, moveOpsEnv, 20, 2)
	rng := mrand.New(mrand.NewSource(time.Now().UnixNano()))
	net := netnstest.New(t, netnstest.Options{Hosts: 3, Delay: 2 * time.Millisecond, Rate: "56mbit"})
	// A node whose uplink carries a bulk transfer for minutes (the client's
	// first read of a large file, the copy) gets its heartbeats through
	// late: a longer lease in the long form, so it never shows offline;
	// under -race too (every process is 5-10x slower: the desktop showed
	// offline to the client's first read once).
	lease := 2 * time.Second
	if size > 64<<20 || raceEnabled {
		lease = 15 * time.Second
	}
	laptop := netHome(t, net, 0, "laptop")
	laptop.ok("init", "--no-passphrase", "--name", "laptop")
	laptop.serveOn(net.HostPort(0, nodePort), lease.String(), "--reclaim-every", "1s")
	devs := map[string]*realmT{}
	for i, name := range []string{"desktop", "laptop2"} {
		tok := strings.TrimSpace(laptop.ok("invite", "--role", "device", "--name", name))
		d := netHome(t, net, i+1, name)
		d.ok("join", tok, "--no-passphrase")
		d.serveOn(net.HostPort(i+1, nodePort), lease.String(), "--reclaim-every", "-1s")
		devs[name] = d
		laptop.waitState(name, "awake", 10*time.Second)
	}
	desktop, client := devs["desktop"], devs["laptop2"]
	dir := t.TempDir()
	p := filepath.Join(dir, "big.bin")
	data := randBytes(size)
	writeFile(t, p, data, 0o644)
	desktop.ok("put", "-q", p, "home:/")

	var moving atomic.Bool
	moving.Store(true)
	// The client has the file open already (its chunk cache holds it: a
	// cairn read fetches whole files, so a first read of 1 GiB would be a
	// copy of its own); it goes on as the move starts.
	tw := time.Now()
	if got := client.ok("cat", "home:/big.bin"); got != string(data) {
		t.Fatalf("first read: %d bytes", len(got))
	}
	t.Logf("the client's first read (before the move): %v", time.Since(tw).Round(time.Millisecond))
	// The client starts as the move does.
	t0 := time.Now()
	moveDone := make(chan time.Duration, 1)
	go func() {
		if res := laptop.run("move", "-q", "home:/big.bin", "--to", "laptop"); res.code != 0 {
			t.Errorf("move: %+v", res)
		}
		for {
			res := laptop.run("move", "ls", "--json")
			if res.code == 0 && strings.TrimSpace(res.stdout) == "[]" {
				moving.Store(false)
				moveDone <- time.Since(t0)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()
	type op struct {
		write  bool
		d      time.Duration
		during bool
	}
	var ops []op
	var took time.Duration
	for i := 0; ; i++ {
		if took == 0 {
			select {
			case took = <-moveDone:
			default:
			}
		}
		if i >= least && took != 0 {
			break
		}
		during := moving.Load()
		start := time.Now()
		if i%2 == 1 {
			off := rng.Intn(size - 64<<10)
			copy(data[off:], randBytes(64<<10))
			writeFile(t, p, data, 0o644)
			client.ok("put", "-q", p, "home:/")
		} else if got := client.ok("cat", "home:/big.bin"); got != string(data) {
			t.Fatalf("read %d: %d bytes, not the last version written", i, len(got))
		}
		ops = append(ops, op{write: i%2 == 1, d: time.Since(start), during: during && moving.Load()})
		if d := time.Since(start); d > 2*time.Second {
			t.Logf("op %d (write %v) at %v took %v", i, i%2 == 1, start.Sub(t0).Round(time.Millisecond), d.Round(time.Millisecond))
		}
	}
	stat := func(write bool) (n, during int, mean, p99, worst time.Duration) {
		var ds []time.Duration
		for _, o := range ops {
			if o.write == write {
				ds = append(ds, o.d)
				mean += o.d
				if o.during {
					during++
				}
			}
		}
		slices.Sort(ds)
		n = len(ds)
		return n, during, mean / time.Duration(n), ds[(n*99+99)/100-1], ds[n-1]
	}
	var worst time.Duration
	during := 0
	for _, w := range []bool{false, true} {
		n, dn, mean, p99, wst := stat(w)
		kind := map[bool]string{false: "reads", true: "writes"}[w]
		t.Logf("move of %d MiB: %d %s (%d during the move): mean %v, p99 %v, worst %v", size>>20, n, kind, dn, mean.Round(time.Millisecond), p99.Round(time.Millisecond), wst.Round(time.Millisecond))
		worst, during = max(worst, wst), during+dn
	}
	t.Logf("the move took %v", took.Round(time.Millisecond))
	// Under -race every operation is a race-built cairn process of about
	// 2 s and the move lasts about 9 s: one operation during it shows the
	// path (CI's -race pass, 2026-12-02: 2 of 4 twice).
	if min := raceShort(4, 1); during < min {
		t.Fatalf("only %d operations ran during the move (%v), want %d", during, took, min)
	}
	if worst >= took {
		t.Fatalf("the worst operation took %v, the move %v: it waited for the move", worst, took)
	}

	// The versions written meanwhile were offloaded to the client and are
	// reclaimed to the laptop (its node, every second).
	deadline := time.Now().Add(120 * time.Second)
	for len(offloadLs(t, laptop)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not reclaimed: %v", offloadLs(t, laptop))
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, st := range storesOf(t, laptop, "home:/big.bin") {
		if !slices.Equal(st, []string{"laptop"}) && !slices.Equal(st, []string{"copies:1@laptop"}) {
			t.Fatalf("stores after the move: %v", storesOf(t, laptop, "home:/big.bin"))
		}
	}
	if got := laptop.ok("cat", "home:/big.bin"); got != string(data) {
		t.Fatalf("cat on the laptop after the move: %d bytes", len(got))
	}
	fsckJSON(t, laptop)
	for _, d := range []*realmT{desktop, client} {
		if rep := fsckJSON(t, d); rep["chunks_checked"].(float64) != 0 {
			t.Fatalf("fsck: a copy stayed: %v", rep)
		}
	}
	_ = fmt.Sprint()
}
