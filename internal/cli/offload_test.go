package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// offloadLs is `offload ls --json` on r.
func offloadLs(t *testing.T, r *realmT) []map[string]any {
	t.Helper()
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.ok("offload", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	return list
}

// storesOf is the stores each version of path names, per `versions --json`.
func storesOf(t *testing.T, r *realmT, path string) [][]string {
	t.Helper()
	var vers []struct {
		Stores []string `json:"stores"`
	}
	if err := json.Unmarshal([]byte(r.ok("versions", "--json", path)), &vers); err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, v := range vers {
		out = append(out, v.Stores)
	}
	return out
}

// fsckJSON is `fsck --read-data --json` on r: it must be clean.
func fsckJSON(t *testing.T, r *realmT) map[string]any {
	t.Helper()
	var rep map[string]any
	if err := json.Unmarshal([]byte(r.ok("fsck", "--read-data", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if d, _ := rep["damaged"].([]any); len(d) > 0 {
		t.Fatalf("fsck: %v", rep)
	}
	return rep
}

// Two devices: the laptop announces standby; `put --store laptop` on the
// desk does not wait for it: the data goes to the desk's own store and
// `offload ls` shows it waiting for the laptop, readable meanwhile; after
// `node resume`, `offload reclaim` copies it to the laptop, records it
// there and deletes the desk's copy; `offload ls` is empty and fsck is
// clean on both. A second round is reclaimed by the laptop's node daemon
// by itself on resume.
func TestOffloadReclaim(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop", "--ttl", "10m"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	bs := b.serveWith("2s", "--reclaim-every", "-1s")
	a.waitState("laptop", "awake", 5*time.Second)

	// Each round writes its own files: three small ones, two with the same
	// content (its objects are sent home once: the second reclaim of them
	// finds them there), and one of several chunks.
	round := func(n int) []string {
		dir := t.TempDir()
		var paths []string
		for i := range 3 {
			p := filepath.Join(dir, fmt.Sprintf("doc%d-%d.txt", n, i))
			writeFile(t, p, bytes.Repeat([]byte(fmt.Sprintf("round %d file %d\n", n, i%2)), 1000+i%2), 0o644)
			paths = append(paths, p)
		}
		big := filepath.Join(dir, fmt.Sprintf("big%d.bin", n))
		writeFile(t, big, randBytes(3<<20), 0o644)
		paths = append(paths, big)
		return paths
	}

	// Round 1: by hand.
	b.ok("node", "standby")
	a.waitState("laptop", "standby", 5*time.Second)
	files := round(1)
	for _, p := range files {
		a.ok("put", "--store", "laptop", p, "home:/docs/")
	}
	list := offloadLs(t, a)
	if len(list) != len(files) {
		t.Fatalf("offload ls: %v", list)
	}
	for _, o := range list {
		if o["home"] != "laptop" || o["now"] != "desk" || !strings.HasPrefix(o["path"].(string), "/docs/") || o["bytes"].(float64) == 0 {
			t.Fatalf("offload entry %v", o)
		}
	}
	if out := a.ok("offload", "ls"); !strings.Contains(out, "home:/docs/big1.bin") || !strings.Contains(out, "laptop") {
		t.Fatalf("offload ls:\n%s", out)
	}
	for _, p := range files {
		name := "home:/docs/" + filepath.Base(p)
		if got := storesOf(t, a, name); !slices.Equal(got[len(got)-1], []string{"desk"}) {
			t.Fatalf("%s stores %v", name, got)
		}
	}
	// Read while the laptop sleeps: from the desk, no wake.
	if got := b.ok("cat", "--wake-timeout", "-1s", "home:/docs/doc1-0.txt"); !strings.HasPrefix(got, "round 1 file 0\n") {
		t.Fatalf("cat on the sleeping laptop's realm: %q", got[:min(len(got), 40)])
	}
	// Nothing to reclaim while the home sleeps.
	if out := a.ok("offload", "reclaim"); !strings.Contains(out, "0 reclaimed") || !strings.Contains(out, fmt.Sprintf("%d waiting", len(files))) {
		t.Fatalf("reclaim while asleep: %s", out)
	}
	b.ok("node", "resume")
	a.waitState("laptop", "awake", 5*time.Second)
	var rep struct{ Reclaimed, Copied, Deleted, Waiting int }
	if err := json.Unmarshal([]byte(a.ok("offload", "reclaim", "--home", "laptop", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	// Every object went home and left the desk: each file's manifest and
	// chunks (two small files share their content: one chunk).
	if rep.Reclaimed != len(files) || rep.Copied < len(files)+3 || rep.Deleted != rep.Copied || rep.Waiting != 0 {
		t.Fatalf("reclaim: %+v", rep)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("offload ls after reclaim: %v", list)
	}
	if out := a.ok("offload", "ls"); !strings.Contains(out, "nothing waits") {
		t.Fatalf("offload ls: %s", out)
	}
	for _, p := range files {
		name := "home:/docs/" + filepath.Base(p)
		if got := storesOf(t, a, name); !slices.Equal(got[len(got)-1], []string{"laptop"}) {
			t.Fatalf("%s stores after reclaim %v", name, got)
		}
	}
	// The laptop holds and verifies them all; the desk holds none of them.
	if rep := fsckJSON(t, b); rep["versions"].(float64) != float64(len(files)) || rep["elsewhere"] != nil {
		t.Fatalf("fsck on the laptop: %v", rep)
	}
	if rep := fsckJSON(t, a); rep["elsewhere"].(float64) != float64(len(files)) || rep["chunks_checked"].(float64) != 0 {
		t.Fatalf("fsck on the desk: %v", rep)
	}
	// A second reclaim has nothing to do.
	if out := a.ok("offload", "reclaim"); !strings.Contains(out, "0 reclaimed") {
		t.Fatalf("second reclaim: %s", out)
	}

	// Round 2: the laptop's node daemon reclaims on resume by itself.
	bs.stop(t)
	b.serveWith("2s")
	a.waitState("laptop", "awake", 5*time.Second)
	b.ok("node", "standby")
	a.waitState("laptop", "standby", 5*time.Second)
	files = round(2)
	for _, p := range files {
		a.ok("put", "--store", "laptop", p, "home:/docs/")
	}
	if list := offloadLs(t, a); len(list) != len(files) {
		t.Fatalf("offload ls, round 2: %v", list)
	}
	b.ok("node", "resume")
	deadline := time.Now().Add(60 * time.Second)
	for len(offloadLs(t, a)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the laptop's node did not reclaim: %v", offloadLs(t, a))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if rep := fsckJSON(t, b); rep["versions"].(float64) != float64(2*len(files)) || rep["elsewhere"] != nil {
		t.Fatalf("fsck on the laptop after round 2: %v", rep)
	}
}

// offloadKills is how many times TestOffloadReclaimKills kills a reclaim:
// CAIRN_OFFLOAD_KILLS (the long run: 200, about 15 minutes on a loaded
// machine: give go test -timeout 40m), else a short form for CI (8; 2
// under -race: race_test.go).
func offloadKills(t *testing.T) int {
	if s := os.Getenv("CAIRN_OFFLOAD_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("CAIRN_OFFLOAD_KILLS=%q", s)
		}
		return n
	}
	return raceShort(8, 2)
}

// SIGKILL of `offload reclaim` at random points, again and again, with
// new offloaded versions whenever everything was reclaimed: afterwards no
// committed version is lost (every file reads back its last content from
// the laptop), the next reclaim leaves no offload entry, and fsck
// --read-data is clean on both devices.
func TestOffloadReclaimKills(t *testing.T) {
	kills := offloadKills(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d, %d kills", seed, kills)
	rng := mrand.New(mrand.NewSource(seed))
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop", "--ttl", "10m"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.serveWith("2s", "--reclaim-every", "-1s")
	a.waitState("laptop", "awake", 5*time.Second)

	want := map[string][]byte{} // path → its last content
	dir := t.TempDir()
	offloadRound := func(n int) {
		b.ok("node", "standby")
		a.waitState("laptop", "standby", 5*time.Second)
		for i := range 5 {
			size := 1 + rng.Intn(96<<10)
			if i == 0 {
				size = 1<<20 + rng.Intn(1<<20)
			}
			data := randBytes(size)
			p := filepath.Join(dir, fmt.Sprintf("f%d", i))
			writeFile(t, p, data, 0o644)
			a.ok("put", "--store", "laptop", p, "home:/k/")
			want["home:/k/"+filepath.Base(p)] = data
		}
		b.ok("node", "resume")
		a.waitState("laptop", "awake", 5*time.Second)
	}
	rounds := 1
	offloadRound(rounds)
	killed := 0
	for k := 0; k < kills; k++ {
		if len(offloadLs(t, a)) == 0 {
			rounds++
			offloadRound(rounds)
		}
		cmd := a.command("-q", "offload", "reclaim")
		cmd.Env = a.env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Duration(rng.Intn(700)) * time.Millisecond):
			cmd.Process.Kill()
			<-done
			killed++
		}
	}
	t.Logf("%d rounds of offloads, %d reclaims killed before they ended", rounds, killed)
	// The next reclaim leaves no entry. (Its deletes may wait out the GC
	// fence of a killed run: its lease lapses within 10 s.)
	deadline := time.Now().Add(60 * time.Second)
	for {
		res := a.run("offload", "reclaim")
		if res.code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reclaim after the kills: %+v", res)
		}
		time.Sleep(time.Second)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("offload entries left: %v", list)
	}
	for p, data := range want {
		if got := a.ok("cat", p); got != string(data) {
			t.Fatalf("%s: %d bytes, want %d", p, len(got), len(data))
		}
		for _, st := range storesOf(t, a, p) {
			if !slices.Equal(st, []string{"laptop"}) {
				t.Fatalf("%s: stores %v", p, storesOf(t, a, p))
			}
		}
	}
	fsckJSON(t, a)
	if rep := fsckJSON(t, b); rep["elsewhere"] != nil {
		t.Fatalf("fsck on the laptop: %v", rep)
	}
}

// objectsOn counts the objects in node's store at addr, as the desk sees
// them.
func objectsOn(t *testing.T, a *realmT, addr, node string) int {
	t.Helper()
	st := dial(t, a.home, addr, node)
	defer st.Close()
	n := 0
	if err := st.List(context.Background(), func(cairn.ID, int64) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// Three devices, a copies:2 policy over the desk and the laptop, the
// laptop in standby: a write on the desk does not wait, its second copy
// goes to the second laptop (the desk already holds one), so two copies
// exist throughout, the version names the policy with laptop2 in the
// laptop's place, and `offload ls` shows it; after reclaim the version
// names the policy again, every copy is on the desk and the laptop and
// none on the second laptop, and the policy reports the files readable.
func TestOffloadPolicyMember(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	join := func(name string) (*realmT, *server) {
		tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", name, "--ttl", "10m"))
		r := joiner(t)
		r.ok("join", tok, "--no-passphrase")
		s := r.serveWith("2s", "--reclaim-every", "-1s")
		a.waitState(name, "awake", 5*time.Second)
		return r, s
	}
	b, bs := join("laptop")
	_, cs := join("laptop2")
	const pol = "copies:2@desk,laptop"
	a.ok("policy", "set", "home:/docs", pol)

	b.ok("node", "standby")
	a.waitState("laptop", "standby", 5*time.Second)
	dir := t.TempDir()
	want := map[string][]byte{}
	for i := range 4 {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i))
		data := randBytes(64<<10 + i)
		writeFile(t, p, data, 0o644)
		a.ok("put", p, "home:/docs/")
		want["home:/docs/"+filepath.Base(p)] = data
	}
	for p := range want {
		if got := storesOf(t, a, p); !slices.Equal(got[len(got)-1], []string{"copies:2@desk,laptop2"}) {
			t.Fatalf("%s stores %v", p, got)
		}
	}
	list := offloadLs(t, a)
	if len(list) != len(want) || list[0]["home"] != "laptop" || list[0]["now"] != "laptop2" {
		t.Fatalf("offload ls: %v", list)
	}
	if n := objectsOn(t, a, cs.addr, "laptop2"); n < 2*len(want) {
		t.Fatalf("laptop2 holds %d objects", n)
	}

	b.ok("node", "resume")
	a.waitState("laptop", "awake", 5*time.Second)
	var rep struct{ Reclaimed, Copied, Deleted int }
	if err := json.Unmarshal([]byte(a.ok("offload", "reclaim", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Reclaimed != len(want) || rep.Copied < 2*len(want) || rep.Deleted != rep.Copied {
		t.Fatalf("reclaim: %+v", rep)
	}
	if list := offloadLs(t, a); len(list) != 0 {
		t.Fatalf("offload ls after reclaim: %v", list)
	}
	for p, data := range want {
		if got := storesOf(t, a, p); !slices.Equal(got[len(got)-1], []string{pol}) {
			t.Fatalf("%s stores after reclaim %v", p, got)
		}
		if got := a.ok("cat", p); got != string(data) {
			t.Fatalf("%s: read back %d bytes", p, len(got))
		}
	}
	if n := objectsOn(t, a, cs.addr, "laptop2"); n != 0 {
		t.Fatalf("laptop2 still holds %d objects", n)
	}
	if n := objectsOn(t, a, bs.addr, "laptop"); n != rep.Copied {
		t.Fatalf("the laptop holds %d objects, %d were copied", n, rep.Copied)
	}
	var pr struct {
		Files []struct {
			Path, Readable string
		} `json:"files"`
	}
	if err := json.Unmarshal([]byte(a.ok("policy", "get", "--json", "home:/docs")), &pr); err != nil {
		t.Fatal(err)
	}
	if len(pr.Files) != len(want) {
		t.Fatalf("policy get: %+v", pr)
	}
	for _, f := range pr.Files {
		if f.Readable != "yes" {
			t.Fatalf("policy get: %+v", pr)
		}
	}
	fsckJSON(t, a)
}
