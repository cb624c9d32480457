package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cli"
)

type policyReport struct {
	Policy string `json:"policy"`
	From   string `json:"from"`
	Files  []struct {
		Path     string   `json:"path"`
		Stores   []string `json:"stores"`
		Policy   string   `json:"policy"`
		Readable string   `json:"readable"`
	} `json:"files"`
	Health map[string][]struct {
		Name string `json:"Name"`
		Up   bool   `json:"Up"`
	} `json:"health"`
}

func policyGet(t *testing.T, r *realmT, path string) policyReport {
	t.Helper()
	out := r.ok("policy", "get", "--json", path)
	var rep policyReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("policy get --json: %v\n%s", err, out)
	}
	return rep
}

// TestPolicyDirStores sets policies over four directory stores: copies:2
// and ec:2+2 on subtrees, local below one of them. put writes each file
// where its policy says and the version records the policy; with the
// device's caches and shard maps gone (as on a device that did not write
// them), every file reads back from the stores; a wiped store is rebuilt
// by 'cairn repair' (which names it), and then two others can go.
func TestPolicyDirStores(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--trash-ttl", "1ms")
	base := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		r.ok("store", "add", n, "file://"+filepath.Join(base, n))
	}
	// Refused: bad syntax, unknown stores, wrong counts, duplicates.
	for _, bad := range []struct {
		pol  string
		code int
	}{
		{"ec:2+2@a,b,c", cli.ExitUsage}, {"copies:3@a,b", cli.ExitUsage}, {"ec:2+2@a,b,c,c", cli.ExitUsage},
		{"ec:0+2@a,b", cli.ExitUsage}, {"raid5@a,b,c", cli.ExitUsage}, {"copies:2@a,nosuch", cli.ExitNotFound},
	} {
		if res := r.run("policy", "set", "home:/x", bad.pol); res.code != bad.code {
			t.Errorf("policy set %s: exit %d, want %d: %s", bad.pol, res.code, bad.code, res.stderr)
		}
	}
	r.ok("policy", "set", "home:/ec", "ec:2+2@a,b,c,d")
	r.ok("policy", "set", "home:/two", "copies:2@a,b")
	r.ok("policy", "set", "home:/ec/here", "local")
	if out := r.ok("policy", "ls", "home"); strings.Count(out, "home:/") != 3 {
		t.Fatalf("policy ls:\n%s", out)
	}

	src := filepath.Join(t.TempDir(), "src")
	files := map[string][]byte{
		"ec/big.bin": randBytes(700 << 10), "ec/small.txt": []byte("hello ec\n"), "ec/here/x.bin": randBytes(50 << 10),
		"two/t.bin": randBytes(200 << 10), "plain.bin": randBytes(30 << 10),
	}
	for name, b := range files {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	for _, ent := range []string{"ec", "two", "plain.bin"} {
		r.ok("put", filepath.Join(src, ent), "home:/")
	}
	self := strings.TrimSpace(r.ok("devices", "--json"))
	rep := policyGet(t, r, "home:/")
	if rep.Policy != "local" || len(rep.Files) != len(files) {
		t.Fatalf("policy get home:/ = %+v", rep)
	}
	for _, f := range rep.Files {
		want := map[string]string{"/ec/big.bin": "ec:2+2@a,b,c,d", "/ec/small.txt": "ec:2+2@a,b,c,d", "/two/t.bin": "copies:2@a,b"}[f.Path]
		if want == "" {
			// Local: the version names this device's node.
			if len(f.Stores) != 1 || meta(f.Stores[0]) || !strings.Contains(self, f.Stores[0]) || f.Readable != "" {
				t.Errorf("%s: %+v, want this device", f.Path, f)
			}
			continue
		}
		if !slices.Equal(f.Stores, []string{want}) || f.Policy != want || f.Readable != "yes" {
			t.Errorf("%s: %+v, want %s", f.Path, f, want)
		}
	}
	if h := rep.Health["ec:2+2@a,b,c,d"]; len(h) != 4 || h[0].Name != "a" || h[3].Name != "d" {
		t.Errorf("health = %+v", rep.Health)
	}
	if g := policyGet(t, r, "home:/ec/big.bin"); g.Policy != "ec:2+2@a,b,c,d" || g.From != "/ec" {
		t.Errorf("policy get of a file = %+v", g)
	}
	// The stores hold the data: each ec member about half of the ec files'
	// bytes, a and b a copy of t.bin, and none of plain.bin.
	du := func(n string) int64 {
		var s int64
		filepath.Walk(filepath.Join(base, n), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				s += fi.Size()
			}
			return nil
		})
		return s
	}
	ecBytes, twoBytes := int64(700<<10+9)/2, int64(200<<10)
	for _, n := range []string{"a", "b"} {
		if s := du(n); s < ecBytes+twoBytes || s > (ecBytes+twoBytes)*12/10 {
			t.Errorf("store %s holds %d bytes, want about %d", n, s, ecBytes+twoBytes)
		}
	}
	for _, n := range []string{"c", "d"} {
		if s := du(n); s < ecBytes || s > ecBytes*12/10 {
			t.Errorf("store %s holds %d bytes, want about %d", n, s, ecBytes)
		}
	}

	// put --store overrides the policy.
	writeFile(t, filepath.Join(src, "over.bin"), randBytes(10<<10), 0o644)
	r.ok("put", "--store", "d", filepath.Join(src, "over.bin"), "home:/ec")
	if g := policyGet(t, r, "home:/ec/over.bin"); len(g.Files) != 1 || !slices.Equal(g.Files[0].Stores, []string{"d"}) {
		t.Fatalf("put --store d under an ec policy: %+v", g.Files)
	}

	// Forget what this device knows: its chunk cache and shard maps.
	forget := func() {
		for _, d := range []string{"cache", "policy"} {
			if err := os.RemoveAll(filepath.Join(r.home, d)); err != nil {
				t.Fatal(err)
			}
		}
	}
	catAll := func(when string) {
		t.Helper()
		for name, b := range files {
			res := r.run("cat", "--no-cache", "home:/"+name)
			if res.code != 0 || res.stdout != string(b) {
				t.Fatalf("%s: cat --no-cache %s: exit %d, %d bytes: %s", when, name, res.code, len(res.stdout), res.stderr)
			}
		}
	}
	forget()
	catAll("all stores up")

	// Store a is wiped: repair finds its shards and copies missing, names
	// it, and rebuilds them.
	if err := os.RemoveAll(filepath.Join(base, "a")); err != nil {
		t.Fatal(err)
	}
	forget()
	out := r.ok("repair")
	t.Logf("repair after wiping a:\n%s", out)
	if !strings.Contains(out, "ec:2+2@a,b,c,d:") || !strings.Contains(out, "copies:2@a,b:") || !strings.Contains(out, "  a: ") {
		t.Fatalf("repair after wiping a:\n%s", out)
	}
	if strings.Contains(out, "  b: ") || strings.Contains(out, "  c: ") {
		t.Fatalf("repair names stores that lost nothing:\n%s", out)
	}
	if out := r.ok("repair"); strings.Contains(out, "  a: ") {
		t.Fatalf("second repair still finds a damaged:\n%s", out)
	}
	// With a rebuilt, ec files survive losing b and c.
	for _, n := range []string{"b", "c"} {
		if err := os.RemoveAll(filepath.Join(base, n)); err != nil {
			t.Fatal(err)
		}
	}
	forget()
	for name, b := range files {
		if name == "two/t.bin" {
			continue // copies:2@a,b: a was rebuilt, checked below
		}
		res := r.run("cat", "--no-cache", "home:/"+name)
		if res.code != 0 || res.stdout != string(b) {
			t.Fatalf("b and c wiped: cat --no-cache %s: exit %d: %s", name, res.code, res.stderr)
		}
	}
	if res := r.run("cat", "--no-cache", "home:/two/t.bin"); res.code != 0 || res.stdout != string(files["two/t.bin"]) {
		t.Fatalf("copies:2 with b wiped: exit %d: %s", res.code, res.stderr)
	}
	// Repair restores b and c; fsck reads everything.
	t.Logf("repair after wiping b and c:\n%s", r.ok("repair"))
	t.Logf("%s", r.ok("policy", "get", "home:/"))
	// gc sweeps the ec members through the wrapper (their shards and maps
	// are no chunk's IDs): a removed file's data goes, the others stay.
	before := storeLs(t, r, nil)["c"].Objects
	r.ok("rm", "home:/ec/big.bin")
	delete(files, "ec/big.bin")
	t.Logf("gc:\n%s", r.ok("gc"))
	// 700 KiB is about 40 chunks: a shard and a map of each leave c.
	if after := storeLs(t, r, nil)["c"].Objects; after > before-60 {
		t.Errorf("gc left %d objects in store c (were %d)", after, before)
	}
	forget()
	catAll("after gc")
	r.ok("fsck", "--read-data")
}

// meta reports whether a version's store name is a policy.
func meta(s string) bool { return strings.Contains(s, ":") }
