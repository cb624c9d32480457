package cli_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cli"
)

var webServing = regexp.MustCompile(`serving the web page at (\S+) \(pid`)

// startWeb starts 'cairn web ARGS...' and returns once it serves; it is
// stopped (SIGTERM) at cleanup unless stop ran first.
func (r *realmT) startWeb(args ...string) *davProc {
	r.t.Helper()
	d := &davProc{cmd: r.command(append([]string{"web"}, args...)...), done: make(chan struct{})}
	d.cmd.Env = r.env
	pr, pw := io.Pipe()
	d.cmd.Stdout, d.cmd.Stderr = pw, pw
	if err := d.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			if m := webServing.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	go func() { d.err = d.cmd.Wait(); pw.Close(); close(d.done) }()
	r.t.Cleanup(func() { d.stop(r.t) })
	select {
	case d.url = <-urlc:
	case <-d.done:
		r.t.Fatalf("cairn web exited before serving: %v\n%s", d.err, d.output())
	case <-time.After(60 * time.Second):
		r.t.Fatalf("cairn web did not serve within 60s\n%s", d.output())
	}
	return d
}

// webGet GETs url's path as alice and decodes a 200's JSON into v.
func webGet(t *testing.T, c *http.Client, url, pass string, v any) {
	t.Helper()
	code, b := davDo(t, c, "GET", url, "alice", pass, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, b)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, b)
	}
}

// cliJSON runs 'cairn ARGS... --json' and decodes what it prints into v.
func cliJSON(t *testing.T, r *realmT, v any, args ...string) {
	t.Helper()
	out := r.ok(append(args, "--json")...)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("cairn %v --json: %v\n%s", args, err, out)
	}
}

// TestWebServe: 'cairn web' over HTTPS with a certificate of the realm
// CA, the app passwords of 'cairn dav'; every API endpoint answers what
// the CLI's --json prints for the same realm, in the same types; the page
// draws the device; bad queries are refused with clear errors.
func TestWebServe(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "webdev1")
	pass := strings.TrimSpace(r.ok("dav", "passwd", "add", "alice"))
	local := filepath.Join(t.TempDir(), "a.txt")
	writeFile(t, local, []byte("first"), 0o644)
	r.ok("put", local, "home:/")
	writeFile(t, local, []byte("second, longer"), 0o644)
	r.ok("put", local, "home:/")
	writeFile(t, filepath.Join(filepath.Dir(local), "gone.txt"), []byte("removed"), 0o644)
	r.ok("put", filepath.Join(filepath.Dir(local), "gone.txt"), "home:/")
	r.ok("rm", "home:/gone.txt")
	// A file waits in the upload queue (no drainer: every command of the
	// test runs without one).
	r.env = append(r.env, cli.EnvNoAutoDrain+"=1")
	queued := filepath.Join(t.TempDir(), "queued.bin")
	writeFile(t, queued, randBytes(3000), 0o644)
	r.ok("put", "--background", queued, "home:/")
	// A store on this device's node, which then stops: the page must not
	// dial it.
	s := r.serve("5s")
	r.ok("store", "add", "mynode", "node://webdev1")
	s.cmd.Process.Signal(syscall.SIGTERM)
	err := <-s.done
	s.done <- err // for the cleanup of serve
	if err != nil {
		t.Fatalf("node serve after SIGTERM: %v", err)
	}
	r.waitState("webdev1", "offline", time.Minute)

	w := r.startWeb("--listen", "127.0.0.1:0")
	if !strings.HasPrefix(w.url, "https://127.0.0.1:") || !strings.Contains(w.output(), "signed by the realm CA") {
		t.Fatalf("cairn web:\n%s", w.output())
	}
	c := davClient(t, r)
	for _, p := range []string{"", "api/v1/devices", "api/v1/versions?vol=home&path=/a.txt"} {
		if code, _ := davDo(t, c, "GET", w.url+p, "", "", nil); code != http.StatusUnauthorized {
			t.Fatalf("GET /%s without credentials: %d", p, code)
		}
		if code, _ := davDo(t, c, "GET", w.url+p, "alice", "wrong", nil); code != http.StatusUnauthorized {
			t.Fatalf("GET /%s with a wrong password: %d", p, code)
		}
	}

	var apiDevs, cliDevs []apitypes.Device
	webGet(t, c, w.url+"api/v1/devices", pass, &apiDevs)
	cliJSON(t, r, &cliDevs, "devices")
	if !reflect.DeepEqual(apiDevs, cliDevs) || len(apiDevs) == 0 || apiDevs[0].Name != "webdev1" {
		t.Fatalf("devices: API %+v, CLI %+v", apiDevs, cliDevs)
	}

	var apiStores, cliStores []apitypes.StoreInfo
	webGet(t, c, w.url+"api/v1/stores", pass, &apiStores)
	cliJSON(t, r, &cliStores, "store", "ls")
	if len(apiStores) != len(cliStores) {
		t.Fatalf("stores: API %+v, CLI %+v", apiStores, cliStores)
	}
	nodeStores := 0
	for i := range apiStores {
		a, b := apiStores[i], cliStores[i]
		if a.URL == "node://webdev1" {
			nodeStores++
			if a.Health != "not asked: node webdev1 is offline (a device is never woken to be asked)" || a.StoreRecord != b.StoreRecord || b.Health == "ok" {
				t.Fatalf("the offline node's store: API %+v, CLI %+v", a, b)
			}
			continue
		}
		// Latency and the request counts move with every look.
		if a.StoreRecord != b.StoreRecord || a.Health != b.Health || a.Objects != b.Objects || a.Bytes != b.Bytes || (a.Price == nil) != (b.Price == nil) {
			t.Fatalf("store %d: API %+v, CLI %+v", i, a, b)
		}
	}

	if nodeStores != 1 {
		t.Fatalf("stores: %+v, want one of node://webdev1", apiStores)
	}

	var work apitypes.Work
	var cliStatus, apiStatus apitypes.Status
	webGet(t, c, w.url+"api/v1/work", pass, &work)
	cliJSON(t, r, &cliStatus, "status")
	cliMounts := cliStatus.Mounts
	webGet(t, c, w.url+"api/v1/status", pass, &apiStatus)
	if !reflect.DeepEqual(apiStatus, cliStatus) || apiStatus.Pending.Queue.Files != 1 || len(apiStatus.Problems) != 1 || apiStatus.Problems[0].What != "node webdev1" {
		t.Fatalf("status: API %+v, CLI %+v", apiStatus, cliStatus)
	}
	var ql cli.QueueList
	cliJSON(t, r, &ql, "queue", "ls")
	if !reflect.DeepEqual(work.Mounts, cliMounts) || work.Queue.Files != 1 || work.Queue.Files != ql.Files || work.Queue.Bytes != ql.Bytes || work.Queue.Draining != ql.Draining {
		t.Fatalf("work: API %+v, status --json %+v, queue ls --json %+v", work, cliMounts, ql)
	}

	var apiVers, cliVers []apitypes.FileVersion
	webGet(t, c, w.url+"api/v1/versions?vol=home&path=/a.txt", pass, &apiVers)
	cliJSON(t, r, &cliVers, "versions", "home:/a.txt")
	if !reflect.DeepEqual(apiVers, cliVers) || len(apiVers) != 2 || apiVers[1].Size != int64(len("second, longer")) {
		t.Fatalf("versions: API %+v, CLI %+v", apiVers, cliVers)
	}

	var apiTrash, cliTrash []apitypes.TrashItem
	webGet(t, c, w.url+"api/v1/trash?vol=home", pass, &apiTrash)
	cliJSON(t, r, &cliTrash, "trash", "home")
	if !reflect.DeepEqual(apiTrash, cliTrash) || len(apiTrash) != 1 || apiTrash[0].Path != "home:/gone.txt" {
		t.Fatalf("trash: API %+v, CLI %+v", apiTrash, cliTrash)
	}

	// The page's buttons: download version 1, make it current again,
	// bring the removed file back.
	if code, b := davDo(t, c, "GET", w.url+"api/v1/download?vol=home&path=/a.txt&version=1", "alice", pass, nil); code != http.StatusOK || string(b) != "first" {
		t.Fatalf("download of version 1: %d %q", code, b)
	}
	post := func(body string, origin string) (int, []byte) {
		req, err := http.NewRequest("POST", w.url+"api/v1/restore", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("alice", pass)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Origin", origin)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	origin := strings.TrimSuffix(w.url, "/")
	if code, b := post(`{"vol":"home","path":"/a.txt","version":1}`, "https://attacker.example"); code != http.StatusForbidden {
		t.Fatalf("cross-site restore: %d %s", code, b)
	}
	if code, b := post(`{"vol":"home","path":"/a.txt","version":1}`, origin); code != http.StatusOK || !strings.Contains(string(b), `"version": 3`) {
		t.Fatalf("restore of version 1: %d %s", code, b)
	}
	if got := r.ok("cat", "home:/a.txt"); got != "first" {
		t.Fatalf("after the restore of version 1: %q", got)
	}
	if code, b := post(`{"vol":"home","path":"/gone.txt","from_trash":true}`, origin); code != http.StatusOK || !strings.Contains(string(b), `"removed"`) {
		t.Fatalf("restore from the trash: %d %s", code, b)
	}
	if got := r.ok("cat", "home:/gone.txt"); got != "removed" {
		t.Fatalf("after the restore from the trash: %q", got)
	}
	r.ok("rm", "home:/gone.txt")

	var vols []apitypes.Volume
	webGet(t, c, w.url+"api/v1/volumes", pass, &vols)
	if len(vols) != 1 || vols[0].Name != "home" || vols[0].Files != 1 || vols[0].Bytes != int64(len("first")) {
		t.Fatalf("volumes: %+v", vols)
	}

	for q, want := range map[string]int{
		"versions?vol=home&path=/nosuch":        http.StatusNotFound,
		"versions?vol=home&path=/../etc/passwd": http.StatusBadRequest,
		"versions?vol=home&path=a.txt":          http.StatusBadRequest,
		"versions?vol=home":                     http.StatusBadRequest,
		"versions?vol=Bad!&path=/a.txt":         http.StatusBadRequest,
		"versions?vol=home&path=/a.txt&path=/b": http.StatusBadRequest,
		"versions?vol=home&path=/":              http.StatusBadRequest,
		"versions?vol=nosuchvol&path=/a.txt":    http.StatusNotFound,
		"trash?vol=home&x=1":                    http.StatusBadRequest,
		"nosuch":                                http.StatusNotFound,
	} {
		code, b := davDo(t, c, "GET", w.url+"api/v1/"+q, "alice", pass, nil)
		var e struct{ Error string }
		if code != want || json.Unmarshal(b, &e) != nil || e.Error == "" {
			t.Errorf("GET /api/v1/%s: %d %s, want %d and a JSON error", q, code, b, want)
		}
	}
	if code, _ := davDo(t, c, "POST", w.url+"api/v1/devices", "alice", pass, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", code)
	}

	code, page := davDo(t, c, "GET", w.url, "alice", pass, nil)
	if code != http.StatusOK || !strings.Contains(string(page), "<td>webdev1</td>") || !strings.Contains(string(page), `id="stores"`) {
		t.Fatalf("page: %d\n%s", code, page)
	}
	for _, asset := range []string{"page.js", "page.css"} {
		if code, b := davDo(t, c, "GET", w.url+asset, "alice", pass, nil); code != http.StatusOK || len(b) == 0 {
			t.Fatalf("GET /%s: %d", asset, code)
		}
	}
	w.stop(t)
}

// TestWebRefuses: plain HTTP only on loopback, no users no page.
func TestWebRefuses(t *testing.T) {
	r := newRealm(t)
	res := r.fails(3, "web", "--listen", "127.0.0.1:0", "--http")
	if !strings.Contains(res.stderr, "cairn dav passwd add") {
		t.Fatalf("no users: stderr %q", res.stderr)
	}
	r.ok("dav", "passwd", "add", "alice")
	for _, addr := range []string{"0.0.0.0:4920", ":4920", "192.0.2.1:80"} {
		res := r.fails(2, "web", "--listen", addr, "--http")
		if !strings.Contains(res.stderr, "refusing plain HTTP") {
			t.Fatalf("--http on %s: stderr %q", addr, res.stderr)
		}
	}
	r.fails(2, "web", "--listen", "nonsense")
}
