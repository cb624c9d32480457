package cli_test

import (
	"encoding/json"
	mrand "math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// moveLs is `move ls --json` on r.
type moveRow struct {
	Volume, Path, To string
	Versions         int
	Bytes            int64
	From             []string
}

func moveLs(t *testing.T, r *realmT) []moveRow {
	t.Helper()
	var list []moveRow
	if err := json.Unmarshal([]byte(r.ok("move", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	return list
}

// twoDevices is a desk (the realm's etcd) and a laptop, both serving, the
// laptop's node not reclaiming by itself.
func twoDevices(t *testing.T) (a, b *realmT, as, bs *server) {
	a = newRealm(t, "--no-passphrase", "--name", "desk")
	as = a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop", "--ttl", "10m"))
	b = joiner(t)
	b.ok("join", tok, "--no-passphrase")
	bs = b.serveWith("2s", "--reclaim-every", "-1s")
	a.waitState("laptop", "awake", 5*time.Second)
	return a, b, as, bs
}

// `cairn move home:/docs --to laptop` on the desk records the move (one
// offload entry per version, marked as the move's) and returns; the files
// stay readable from the desk; a version written meanwhile is offloaded to
// the desk (which holds the rest of the file) instead of being sent whole
// to the laptop, which receives nothing until the copy runs; `move
// --wait` copies, records the versions on the laptop and deletes the
// desk's copies, leaving a file outside the path alone; afterwards new
// versions go to the laptop (policy copies:1@laptop) and no entry is left.
func TestMove(t *testing.T) {
	a, b, as, bs := twoDevices(t)
	dir := t.TempDir()
	bigP, smallP, otherP := filepath.Join(dir, "big.bin"), filepath.Join(dir, "small.txt"), filepath.Join(dir, "other.txt")
	big := randBytes(3 << 20)
	writeFile(t, bigP, big, 0o644)
	writeFile(t, smallP, []byte("a small file\n"), 0o644)
	writeFile(t, otherP, []byte("stays on the desk\n"), 0o644)
	a.ok("put", bigP, smallP, "home:/docs/")
	a.ok("put", otherP, "home:/")

	// Bad input: refused, nothing recorded.
	for _, args := range [][]string{
		{"move", "home:/docs"},
		{"move", "home:/docs", "--to", "nosuch"},
		{"move", "home:/docs", "--to", "copies:2@desk,laptop"},
		{"move", "nosuchvol:/docs", "--to", "laptop"},
	} {
		if res := a.run(args...); res.code == 0 {
			t.Fatalf("%v: %+v", args, res)
		}
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("entries after refused moves: %v", list)
	}

	out := a.ok("move", "home:/docs", "--to", "laptop")
	if !strings.Contains(out, "recorded 2 versions of 2 files") || !strings.Contains(out, "background") {
		t.Fatalf("move:\n%s", out)
	}
	list := offloadLs(t, a)
	if len(list) != 2 {
		t.Fatalf("offload ls: %v", list)
	}
	for _, o := range list {
		if o["home"] != "laptop" || o["now"] != "desk" || o["move"] != "/docs" {
			t.Fatalf("entry %v", o)
		}
	}
	if ms := moveLs(t, a); len(ms) != 1 || ms[0].Path != "/docs" || ms[0].To != "laptop" || ms[0].Versions != 2 || ms[0].Bytes < 3<<20 || !slices.Equal(ms[0].From, []string{"desk"}) {
		t.Fatalf("move ls: %+v", ms)
	}
	if out := a.ok("move", "ls"); !strings.Contains(out, "home:/docs") || !strings.Contains(out, "laptop") {
		t.Fatalf("move ls:\n%s", out)
	}
	// Readable meanwhile, from where the data is.
	if got := b.ok("cat", "home:/docs/big.bin"); got != string(big) {
		t.Fatalf("cat on the laptop during the move: %d bytes", len(got))
	}
	if got := storesOf(t, a, "home:/docs/big.bin"); !slices.Equal(got[0], []string{"desk"}) {
		t.Fatalf("stores during the move: %v", got)
	}
	// A new version meanwhile: offloaded, kept on the desk; the laptop
	// gets nothing (a version written there would send the whole file).
	copy(big[1<<20:], randBytes(64<<10))
	writeFile(t, bigP, big, 0o644)
	a.ok("put", bigP, "home:/docs/")
	if got := storesOf(t, a, "home:/docs/big.bin"); len(got) != 2 || !slices.Equal(got[1], []string{"desk"}) {
		t.Fatalf("stores of the version written during the move: %v", got)
	}
	if list := offloadLs(t, a); len(list) != 3 {
		t.Fatalf("offload ls after a write during the move: %v", list)
	}
	if n := objectsOn(t, a, bs.addr, "laptop"); n != 0 {
		t.Fatalf("the laptop holds %d objects before the copy", n)
	}

	out = a.ok("move", "home:/docs", "--to", "laptop", "--wait")
	if !strings.Contains(out, "moved home:/docs to laptop") {
		t.Fatalf("move --wait:\n%s", out)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("entries after the move: %v", list)
	}
	if out := a.ok("move", "ls"); !strings.Contains(out, "no move in progress") {
		t.Fatalf("move ls after: %s", out)
	}
	for _, p := range []string{"home:/docs/big.bin", "home:/docs/small.txt"} {
		for _, st := range storesOf(t, a, p) {
			if !slices.Equal(st, []string{"laptop"}) {
				t.Fatalf("%s after the move: %v", p, storesOf(t, a, p))
			}
		}
	}
	if got := storesOf(t, a, "home:/other.txt"); !slices.Equal(got[0], []string{"desk"}) {
		t.Fatalf("a file outside the path moved: %v", got)
	}
	if got := a.ok("cat", "home:/docs/big.bin"); got != string(big) {
		t.Fatalf("cat on the desk after the move: %d bytes", len(got))
	}
	// The laptop holds and verifies the three versions; the desk only the
	// other file.
	if rep := fsckJSON(t, b); rep["versions"].(float64) != 4 || rep["elsewhere"].(float64) != 1 {
		t.Fatalf("fsck on the laptop: %v", rep)
	}
	if rep := fsckJSON(t, a); rep["elsewhere"].(float64) != 3 {
		t.Fatalf("fsck on the desk: %v", rep)
	}
	_ = as
	// New versions go to the laptop now.
	copy(big[2<<20:], randBytes(64<<10))
	writeFile(t, bigP, big, 0o644)
	a.ok("put", bigP, "home:/docs/")
	if got := storesOf(t, a, "home:/docs/big.bin"); !slices.Equal(got[len(got)-1], []string{"copies:1@laptop"}) {
		t.Fatalf("stores after the move: %v", got)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("entries after a write past the move: %v", list)
	}
}

// moveKills is how many times TestMoveKills kills the copy of a move:
// CAIRN_MOVE_KILLS, else 3 (CI).
func moveKills(t *testing.T) int {
	if s := os.Getenv("CAIRN_MOVE_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CAIRN_MOVE_KILLS=%q", s)
		}
		return n
	}
	return 3
}

// The copy of a move killed (SIGKILL of the reclaim doing it) at random
// points once it has copied something, again and again: the next run
// sends only what the laptop still lacks (no object twice), and at the
// end the laptop holds exactly the file's objects, the desk none, no entry
// is left, the file reads back and fsck --read-data is clean.
func TestMoveKills(t *testing.T) {
	kills := moveKills(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d, %d kills", seed, kills)
	rng := mrand.New(mrand.NewSource(seed))
	a, b, as, bs := twoDevices(t)
	p := filepath.Join(t.TempDir(), "big.bin")
	data := randBytes(24 << 20)
	writeFile(t, p, data, 0o644)
	a.ok("put", p, "home:/")
	total := objectsOn(t, a, as.addr, "desk")
	if total < 100 {
		t.Fatalf("the desk holds %d objects", total)
	}
	a.ok("move", "home:/big.bin", "--to", "laptop")
	killed := 0
	for k := 0; k < kills; k++ {
		before := objectsOn(t, a, bs.addr, "laptop")
		if before == total {
			break
		}
		cmd := a.command("-q", "offload", "reclaim")
		cmd.Env = a.env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Kill it once it copied something, a little later at random.
		deadline := time.Now().Add(60 * time.Second)
		for objectsOn(t, a, bs.addr, "laptop") == before && time.Now().Before(deadline) {
			select {
			case <-done:
				t.Fatalf("the copy ended before it was killed (%d of %d objects were there)", before, total)
			case <-time.After(20 * time.Millisecond):
			}
		}
		time.Sleep(time.Duration(rng.Intn(100)) * time.Millisecond)
		cmd.Process.Kill()
		<-done
		if len(offloadLs(t, a)) == 0 {
			break // it ended first: the move is done
		}
		killed++
		if got := a.ok("cat", "home:/big.bin"); got != string(data) {
			t.Fatalf("cat after a kill: %d bytes", len(got))
		}
	}
	before := objectsOn(t, a, bs.addr, "laptop")
	t.Logf("%d copies killed; the laptop holds %d of %d objects", killed, before, total)
	if killed == 0 {
		t.Fatalf("no kill mid-copy: the first copy ended before it was killed")
	}
	// The last run sends only what is missing. (Its deletes may wait out
	// the GC fence of a killed run: its lease lapses within 10 s.)
	var rep struct{ Reclaimed, Copied, Deleted int }
	deadline := time.Now().Add(60 * time.Second)
	for {
		res := a.run("offload", "reclaim", "--json")
		if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
			t.Fatalf("reclaim: %+v", res)
		}
		if res.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reclaim after the kills: %+v", res)
		}
		time.Sleep(time.Second)
	}
	if rep.Copied > total-before {
		t.Fatalf("the last copy sent %d objects, %d were missing", rep.Copied, total-before)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("entries left: %v", list)
	}
	if n := objectsOn(t, a, bs.addr, "laptop"); n != total {
		t.Fatalf("the laptop holds %d objects, the file has %d", n, total)
	}
	if n := objectsOn(t, a, as.addr, "desk"); n != 0 {
		t.Fatalf("the desk still holds %d objects", n)
	}
	if got := b.ok("cat", "home:/big.bin"); got != string(data) {
		t.Fatalf("cat after the move: %d bytes", len(got))
	}
	if got := storesOf(t, a, "home:/big.bin"); !slices.Equal(got[0], []string{"laptop"}) {
		t.Fatalf("stores: %v", got)
	}
	fsckJSON(t, b)
}

// A move under a mount (to a registered store): a file closed in the
// mount while its move waits is offloaded (kept on this device, an
// offload entry naming the store), not written to the store; after
// `move --wait` every version is on the store, and the next close goes
// there by the policy.
func TestMountMove(t *testing.T) {
	skipWithoutFUSE(t)
	r := newRealm(t)
	r.ok("store", "add", "a", "file://"+filepath.Join(t.TempDir(), "a"))
	mnt := mountPoint(t)
	_, exited, out := r.foregroundWith(mnt, nil, "--mode", "blocking")
	if err := os.MkdirAll(filepath.Join(mnt, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	data := randBytes(300 << 10)
	p := filepath.Join(mnt, "m", "f.bin")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	self := storesOf(t, r, "home:/m/f.bin")[0]
	if len(self) != 1 || self[0] == "a" {
		t.Fatalf("stores before the move: %v", self)
	}
	r.ok("move", "home:/m", "--to", "a")
	copy(data[1000:], "written during the move")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := storesOf(t, r, "home:/m/f.bin"); len(got) != 2 || !slices.Equal(got[1], self) {
		t.Fatalf("stores of the version closed during the move: %v", got)
	}
	list := offloadLs(t, r)
	if len(list) != 2 {
		t.Fatalf("offload ls: %v", list)
	}
	for _, o := range list {
		if o["home"] != "a" || o["now"] != self[0] || (o["version"].(float64) == 2) != (o["move"] == nil) {
			t.Fatalf("entry %v", o)
		}
	}
	r.ok("move", "home:/m", "--to", "a", "--wait")
	for _, st := range storesOf(t, r, "home:/m/f.bin") {
		if !slices.Equal(st, []string{"a"}) {
			t.Fatalf("stores after the move: %v", storesOf(t, r, "home:/m/f.bin"))
		}
	}
	time.Sleep(2500 * time.Millisecond) // the mount reads the moves again
	copy(data[2000:], "written after the move")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := storesOf(t, r, "home:/m/f.bin"); !slices.Equal(got[len(got)-1], []string{"copies:1@a"}) {
		t.Fatalf("stores after the move: %v", got)
	}
	if len(offloadLs(t, r)) != 0 {
		t.Fatalf("offload ls: %v", offloadLs(t, r))
	}
	if got := r.ok("cat", "--no-cache", "home:/m/f.bin"); got != string(data) {
		t.Fatal("does not read back from the store")
	}
	r.ok("umount", mnt)
	waitExit(t, exited, out)
}
