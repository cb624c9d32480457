package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// davProc is a running 'cairn dav'.
type davProc struct {
	url  string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (d *davProc) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

var davServing = regexp.MustCompile(`serving \S+ over WebDAV at (\S+) \(pid`)

// startDav starts 'cairn dav ARGS...' and returns once it serves. It is
// stopped (SIGTERM) at cleanup unless stop ran first.
func (r *realmT) startDav(args ...string) *davProc {
	r.t.Helper()
	d := &davProc{cmd: r.command(append([]string{"dav"}, args...)...), done: make(chan struct{})}
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
			if m := davServing.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
	}()
	go func() { d.err = d.cmd.Wait(); pw.Close(); close(d.done) }()
	r.t.Cleanup(func() { d.stop(r.t) })
	select {
	case d.url = <-urlc:
	case <-d.done:
		r.t.Fatalf("cairn dav exited before serving: %v\n%s", d.err, d.output())
	case <-time.After(30 * time.Second):
		r.t.Fatalf("cairn dav did not serve within 30s\n%s", d.output())
	}
	return d
}

// stop sends SIGTERM and waits for a clean exit.
func (d *davProc) stop(t *testing.T) {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if d.err != nil {
			t.Errorf("cairn dav exited with %v after SIGTERM\n%s", d.err, d.output())
		}
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Errorf("cairn dav did not stop within 30s of SIGTERM\n%s", d.output())
	}
}

func TestDavPasswd(t *testing.T) {
	r := newRealm(t)
	res := r.run("dav", "passwd", "add", "alice")
	pass := strings.TrimSpace(res.stdout)
	if res.code != 0 || !regexp.MustCompile(`^[a-z2-7]{26}$`).MatchString(pass) || !strings.Contains(res.stderr, "shown only now") {
		t.Fatalf("passwd add: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	r.fails(8, "dav", "passwd", "add", "alice")
	again := strings.TrimSpace(r.ok("dav", "passwd", "add", "--replace", "alice"))
	if again == pass {
		t.Fatal("--replace kept the same password")
	}
	r.ok("dav", "passwd", "add", "bob")
	r.fails(2, "dav", "passwd", "add", "no:colons")
	if out := r.ok("dav", "passwd", "ls"); !regexp.MustCompile(`(?s)USER\s+ADDED\nalice\s+\d{4}-.*\nbob\s+`).MatchString(out) {
		t.Fatalf("passwd ls:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(r.home, "dav", "passwd.json"))
	if err != nil || strings.Contains(string(b), again) || !strings.Contains(string(b), "$argon2id$") {
		t.Fatalf("passwd.json (%v) holds the password or no hash:\n%s", err, b)
	}
	r.ok("dav", "passwd", "rm", "bob")
	r.fails(3, "dav", "passwd", "rm", "bob")
	if out := r.ok("dav", "passwd", "ls"); strings.Contains(out, "bob") {
		t.Fatalf("bob still listed:\n%s", out)
	}
	r.fails(2, "dav", "passwd", "add")
}

func TestDavRefuses(t *testing.T) {
	r := newRealm(t)
	res := r.fails(3, "dav", "home", "--listen", "127.0.0.1:0", "--http")
	if !strings.Contains(res.stderr, "cairn dav passwd add") {
		t.Fatalf("no users: stderr %q", res.stderr)
	}
	r.ok("dav", "passwd", "add", "alice")
	for _, addr := range []string{"0.0.0.0:4918", ":4918", "192.0.2.1:80"} {
		res := r.fails(2, "dav", "home", "--listen", addr, "--http")
		if !strings.Contains(res.stderr, "refusing plain HTTP") {
			t.Fatalf("--http on %s: stderr %q", addr, res.stderr)
		}
	}
	r.fails(2, "dav", "home", "--listen", "nonsense")
	r.fails(2, "dav", "home:/sub")
	r.fails(3, "dav", "nosuchvolume", "--listen", "127.0.0.1:0", "--http")
}

// davClient trusts the realm CA of r.
func davClient(t *testing.T, r *realmT) *http.Client {
	pem, err := os.ReadFile(filepath.Join(r.home, "pki", "node", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in ca.crt")
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func davDo(t *testing.T, c *http.Client, method, url, user, pass string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestDavServe: 'cairn dav' over HTTPS with a certificate of the realm
// CA; what a client writes is in the volume, what cairn puts is served,
// and SIGTERM stops it cleanly.
func TestDavServe(t *testing.T) {
	r := newRealm(t)
	pass := strings.TrimSpace(r.ok("dav", "passwd", "add", "alice"))
	d := r.startDav("home", "--listen", "127.0.0.1:0")
	if !strings.HasPrefix(d.url, "https://127.0.0.1:") || !strings.Contains(d.output(), "signed by the realm CA") {
		t.Fatalf("cairn dav:\n%s", d.output())
	}
	c := davClient(t, r)
	data := randBytes(200 << 10)
	if code, b := davDo(t, c, "PUT", d.url+"a.bin", "alice", pass, data); code != http.StatusCreated {
		t.Fatalf("PUT: %d %s", code, b)
	}
	if got := r.ok("cat", "home:/a.bin"); got != string(data) {
		t.Fatalf("cairn cat of what was PUT: %d bytes, want %d", len(got), len(data))
	}
	local := filepath.Join(t.TempDir(), "b.txt")
	writeFile(t, local, []byte("put by cairn"), 0o644)
	r.ok("put", local, "home:/")
	if code, b := davDo(t, c, "GET", d.url+"b.txt", "alice", pass, nil); code != http.StatusOK || string(b) != "put by cairn" {
		t.Fatalf("GET of what cairn put: %d %q", code, b)
	}
	if code, _ := davDo(t, c, "GET", d.url+"b.txt", "", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET without credentials: %d", code)
	}
	if code, _ := davDo(t, c, "GET", d.url+"b.txt", "alice", "wrong", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET with a wrong password: %d", code)
	}
	if code, _ := davDo(t, c, "DELETE", d.url+"b.txt", "alice", pass, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if out := r.ok("trash", "home"); !strings.Contains(out, "home:/b.txt") {
		t.Fatalf("cairn trash after a DELETE:\n%s", out)
	}
	d.stop(t)
	if !strings.Contains(d.output(), "stopped") {
		t.Fatalf("no 'stopped' after SIGTERM:\n%s", d.output())
	}
}

// TestDavfs2 mounts the gateway with davfs2 (the kernel's FUSE, davfs2's
// WebDAV client, its locks on) and reads and writes through it; the bytes
// are checked with cairn itself. It needs root and davfs2, which CI has
// (scripts/test-deps.sh installs davfs2).
func TestDavfs2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("davfs2 test needs root (mount -t davfs)")
	}
	if _, err := exec.LookPath("mount.davfs"); err != nil {
		t.Skip("davfs2 is not installed (Debian package davfs2; scripts/test-deps.sh installs it)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	r := newRealm(t)
	pass := strings.TrimSpace(r.ok("dav", "passwd", "add", "alice"))
	before := randBytes(100 << 10)
	local := filepath.Join(t.TempDir(), "before.bin")
	writeFile(t, local, before, 0o644)
	r.ok("put", local, "home:/")
	d := r.startDav("home", "--listen", "127.0.0.1:0")

	// davfs2 reads its files as its own user after dropping root: a
	// directory it can traverse, not t.TempDir (0700).
	dir, err := os.MkdirTemp("", "cairn-davfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	mnt, cache := filepath.Join(dir, "mnt"), filepath.Join(dir, "cache")
	os.Mkdir(mnt, 0o755)
	os.Mkdir(cache, 0o777)
	os.Chmod(cache, 0o777)
	ca, err := os.ReadFile(filepath.Join(r.home, "pki", "node", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "ca.crt"), ca, 0o644)
	writeFile(t, filepath.Join(dir, "secrets"), []byte(fmt.Sprintf("%s alice %s\n", d.url, pass)), 0o600)
	// buf_size 64: davfs2 1.6's default buffer fails every readdir
	// (EINVAL) on Linux 6.16 and later.
	conf := fmt.Sprintf("secrets %s\ntrust_ca_cert %s\ncache_dir %s\nuse_locks 1\ndelay_upload 0\n"+
		"dir_refresh 1\nfile_refresh 1\nask_auth 0\nbuf_size 64\n",
		filepath.Join(dir, "secrets"), filepath.Join(dir, "ca.crt"), cache)
	writeFile(t, filepath.Join(dir, "davfs2.conf"), []byte(conf), 0o644)

	mounted := func() bool {
		b, _ := os.ReadFile("/proc/mounts")
		return strings.Contains(string(b), " "+mnt+" ")
	}
	umount := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, cerr := exec.CommandContext(ctx, "umount", mnt).CombinedOutput(); cerr != nil {
			t.Errorf("umount %s: %v\n%s", mnt, cerr, out)
			exec.Command("umount", "-l", mnt).Run()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	out, err := exec.CommandContext(ctx, "mount", "-t", "davfs", d.url, mnt, "-o", "conf="+filepath.Join(dir, "davfs2.conf")).CombinedOutput()
	cancel()
	if err != nil {
		t.Fatalf("mount -t davfs: %v\n%s\ngateway:\n%s", err, out, d.output())
	}
	t.Cleanup(func() {
		if mounted() {
			umount()
		}
	})

	got, err := os.ReadFile(filepath.Join(mnt, "before.bin"))
	if err != nil || !bytes.Equal(got, before) {
		t.Fatalf("reading through davfs2: %d bytes, %v; want the %d put", len(got), err, len(before))
	}
	written := randBytes(300 << 10)
	if err := os.WriteFile(filepath.Join(mnt, "written.bin"), written, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "sub", "note.txt"), []byte("a note"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "sub", "note.txt"), filepath.Join(mnt, "sub", "renamed.txt")); err != nil {
		t.Fatal(err)
	}
	// davfs2 uploads a file once it is closed (delay_upload 0): soon.
	deadline := time.Now().Add(20 * time.Second)
	for r.run("cat", "home:/written.bin").stdout != string(written) {
		if time.Now().After(deadline) {
			t.Fatalf("what was written through davfs2 is not in the volume after 20s\ngateway:\n%s", d.output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	umount() // uploads whatever is left
	if got := r.ok("cat", "home:/sub/renamed.txt"); got != "a note" {
		t.Fatalf("sub/renamed.txt holds %q", got)
	}
	if res := r.run("cat", "home:/sub/note.txt"); res.code != 3 {
		t.Fatalf("the renamed file's old name: exit %d, want 3 (not found)", res.code)
	}
}

// TestDavPolicy: what a WebDAV client writes follows the placement policy
// of where it lands, as put does; a policy set while the gateway runs
// applies to later writes.
func TestDavPolicy(t *testing.T) {
	r := newRealm(t)
	base := t.TempDir()
	for _, n := range []string{"a", "b"} {
		r.ok("store", "add", n, "file://"+filepath.Join(base, n))
	}
	r.ok("policy", "set", "home:/two", "copies:2@a,b")
	r.ok("mkdir", "home:/two")
	r.ok("mkdir", "home:/later")
	pass := strings.TrimSpace(r.ok("dav", "passwd", "add", "alice"))
	d := r.startDav("home", "--listen", "127.0.0.1:0")
	defer d.stop(t)
	c := davClient(t, r)
	put := func(p string, data []byte) {
		t.Helper()
		if code, b := davDo(t, c, "PUT", d.url+p, "alice", pass, data); code != http.StatusCreated && code != http.StatusNoContent {
			t.Fatalf("PUT %s: %d %s", p, code, b)
		}
	}
	where := func(p string) string {
		t.Helper()
		rep := policyGet(t, r, "home:"+p)
		if len(rep.Files) != 1 {
			t.Fatalf("policy get %s: %+v", p, rep)
		}
		return strings.Join(rep.Files[0].Stores, ",")
	}
	two, plain := randBytes(100<<10), randBytes(20<<10)
	put("two/t.bin", two)
	put("plain.bin", plain)
	if w := where("/two/t.bin"); w != "copies:2@a,b" {
		t.Errorf("/two/t.bin written through WebDAV is stored at %q, want the policy copies:2@a,b", w)
	}
	if w := where("/plain.bin"); strings.Contains(w, ":") {
		t.Errorf("/plain.bin is stored at %q, want this device", w)
	}
	r.ok("policy", "set", "home:/later", "copies:2@a,b")
	// The gateway reads the policies again after at most 2 s.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		put("later/x.bin", randBytes(10<<10))
		if where("/later/x.bin") == "copies:2@a,b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a policy set while the gateway runs is not applied after 10 s: %s", where("/later/x.bin"))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if got := r.ok("cat", "--no-cache", "home:/two/t.bin"); got != string(two) {
		t.Fatal("/two/t.bin does not read back from its stores")
	}
}
