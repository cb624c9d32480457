package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store/remotestore"
)

// init makes the realm CA and this device's credentials, named --name.
func TestInitMakesCA(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	ca, err := pki.LoadCA(realm.CADir(r.home))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.LoadCredentials(realm.CredentialsDir(r.home))
	if err != nil {
		t.Fatal(err)
	}
	if c.Identity.Name != "desk" || c.Identity.Role != pki.Device || c.Identity.Realm != ca.Realm || pki.Fingerprint(c.CA) != ca.Fingerprint() {
		t.Fatalf("credentials: %+v", c.Identity)
	}
	if fi, err := os.Stat(filepath.Join(realm.CADir(r.home), pki.CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi, err)
	}
	// A bad name is refused before anything is made.
	bad := &realmT{t: t, home: filepath.Join(t.TempDir(), "bad")}
	bad.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+bad.home)
	if res := bad.fails(2, "init", "--no-passphrase", "--name", "Not A Name"); !strings.Contains(res.stderr, "node name") {
		t.Fatalf("stderr: %s", res.stderr)
	}
	if _, err := os.Stat(filepath.Join(bad.home, "realm.json")); err == nil {
		t.Fatal("a realm was made with a bad name")
	}
}

// server is a background `cairn node serve`.
type server struct {
	cmd  *exec.Cmd
	addr string
	line string // the "serving ..." line
	out  *bytes.Buffer
	errb *bytes.Buffer // stderr: read it only once done has answered
	done chan error
}

// serve starts `cairn node serve` on a loopback port with a short lease and
// waits until it is ready.
func (r *realmT) serve(lease string) *server {
	r.t.Helper()
	return r.serveOn("127.0.0.1:0", lease)
}

// serveWith is serve with more flags of node serve.
func (r *realmT) serveWith(lease string, extra ...string) *server {
	r.t.Helper()
	return r.serveOn("127.0.0.1:0", lease, extra...)
}

// stop ends the node with SIGTERM and waits for it to exit.
func (s *server) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-s.done; err != nil {
		t.Fatalf("node serve after SIGTERM: %v\n%s", err, s.out)
	}
	s.done <- nil
}

// serveOn starts `cairn node serve --listen listen` and waits until it is
// ready.
func (r *realmT) serveOn(listen, lease string, extra ...string) *server {
	r.t.Helper()
	cmd := r.command(append([]string{"node", "serve", "--listen", listen, "--lease", lease}, extra...)...)
	cmd.Env = r.env
	pr, pw := io.Pipe()
	var out, errb bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, pw)
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	s := &server{cmd: cmd, out: &out, errb: &errb, done: make(chan error, 1)}
	go func() { s.done <- cmd.Wait(); pw.Close() }()
	r.t.Cleanup(func() { cmd.Process.Kill(); <-s.done })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "serving ") {
				line <- sc.Text()
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case l := <-line:
		f := strings.Fields(l)
		s.addr, s.line = f[3], l
	case <-time.After(20 * time.Second):
		r.t.Fatalf("node serve did not start: %s", errb.String())
	}
	return s
}

func (r *realmT) devices() map[string]map[string]any {
	r.t.Helper()
	var list []map[string]any
	if err := json.Unmarshal([]byte(r.ok("devices", "--json")), &list); err != nil {
		r.t.Fatal(err)
	}
	m := map[string]map[string]any{}
	for _, d := range list {
		m[d["name"].(string)] = d
	}
	return m
}

// waitState polls `devices` until node name is in state want.
func (r *realmT) waitState(name, want string, within time.Duration) map[string]any {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		d := r.devices()[name]
		if d != nil && d["state"] == want {
			return d
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("node %s: %v, want state %s within %v", name, d, want, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// `node serve` registers with a lease and reports its disk; SIGTERM
// deregisters it (offline at once, exit 0); a killed node goes offline
// when its lease lapses.
func TestNodeServe(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	if d := r.devices()["desk"]; d == nil || d["role"] != "device" || d["state"] != "offline" {
		t.Fatalf("devices after init: %v", r.devices())
	}
	s := r.serve("2s")
	if !strings.Contains(s.out.String(), "join endpoint") {
		t.Fatalf("the CA holder does not serve joins: %s", s.out)
	}
	d := r.waitState("desk", "awake", 5*time.Second)
	if d["addr"] != s.addr || d["capacity"].(float64) <= 0 || d["free"].(float64) <= 0 || d["last_seen"] == nil {
		t.Fatalf("online record: %v", d)
	}
	if out := r.ok("devices"); !strings.Contains(out, "desk") || !strings.Contains(out, "awake") || !strings.Contains(out, s.addr) {
		t.Fatalf("devices:\n%s", out)
	}
	// The node serves this device's store to this device's certificate.
	st := dial(t, r.home, s.addr, "desk")
	if _, err := st.Stats(context.Background()); err != nil {
		t.Fatalf("stats from its own device: %v", err)
	}
	st.Close()

	s.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-s.done; err != nil {
		t.Fatalf("node serve after SIGTERM: %v\n%s", err, s.out)
	}
	s.done <- nil
	if d := r.devices()["desk"]; d["state"] != "offline" {
		t.Fatalf("after SIGTERM: %v", d)
	}

	s = r.serve("2s")
	r.waitState("desk", "awake", 5*time.Second)
	killAndWaitOffline(t, r, s, "desk")
}

// killAndWaitOffline kills a node and waits until it shows offline: within
// its lease (2 s) plus the time a `devices` command takes. The test holds
// the embedded etcd up meanwhile, as the realm's running devices do (an
// etcd that restarts extends leases; then the age of the node's last
// report, two leases, decides).
func killAndWaitOffline(t *testing.T, r *realmT, s *server, name string) {
	t.Helper()
	conn, err := etcdsvc.Connect(context.Background(), r.home, etcdsvc.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	s.cmd.Process.Kill()
	r.waitState(name, "offline", 2*time.Second+5*time.Second)
	t.Logf("killed node offline after %v (lease 2s)", time.Since(start))
}

// dial opens a remote store on the node at addr, named node, with the
// credentials of the home.
func dial(t *testing.T, home, addr, node string) *remotestore.Store {
	t.Helper()
	c, err := pki.LoadCredentials(realm.CredentialsDir(home))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireNode(node)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := remotestore.New(remotestore.Options{Addr: addr, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// joiner is a home that has not joined a realm yet.
func joiner(t *testing.T) *realmT {
	r := &realmT{t: t, home: filepath.Join(t.TempDir(), "joiner")}
	r.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+r.home, "CAIRN_ETCD_LINGER=300ms", "CAIRN_PASSPHRASE=")
	t.Cleanup(func() { etcdsvc.StopDaemon(r.home) })
	return r
}

// The whole path of a second machine, on loopback: the first device serves
// its node and join endpoint; a device joins with a one-time token, gets
// the realm config and volume keys, and appears in `devices`; a surrogate
// joins with a certificate only, which the node refuses; a removed device
// is refused on its open connection; a killed node goes offline.
func TestInviteJoinRemove(t *testing.T) {
	ctx := context.Background()
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	if res := a.fails(cli.ExitUnavailable, "invite", "--role", "device"); !strings.Contains(res.stderr, "node serve") {
		t.Fatalf("invite without a join endpoint: %s", res.stderr)
	}
	a.fails(cli.ExitUsage, "invite")
	s := a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	src := filepath.Join(t.TempDir(), "d.txt")
	writeFile(t, src, []byte("written on desk\n"), 0o644)
	putJSON(t, a, src, "home:/desk")

	// A device joins.
	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop", "--ttl", "10m"))
	if !strings.HasPrefix(tok, "cairn-join-v1-") {
		t.Fatalf("token %q", tok)
	}
	b := joiner(t)
	if out := b.ok("join", tok, "--no-passphrase"); !strings.Contains(out, "as device laptop") {
		t.Fatalf("join: %s", out)
	}
	if res := joiner(t).fails(cli.ExitPermission, "join", tok, "--no-passphrase"); !strings.Contains(res.stderr, "already used") {
		t.Fatalf("second use of a token: %s", res.stderr)
	}
	c, err := pki.LoadCredentials(realm.CredentialsDir(b.home))
	if err != nil || c.Identity.Name != "laptop" || c.Identity.Role != pki.Device {
		t.Fatalf("laptop credentials: %+v %v", c, err)
	}
	devs := b.devices()
	if len(devs) != 2 || devs["desk"]["state"] != "awake" || devs["laptop"]["state"] != "offline" || devs["laptop"]["role"] != "device" {
		t.Fatalf("devices on the new device: %v", devs)
	}
	if out := b.ok("ls", "home:/"); out != "desk/\n" {
		t.Fatalf("ls on the new device: %q", out)
	}
	// It holds the volume key: what it writes it reads back (its own store).
	src2 := filepath.Join(t.TempDir(), "l.txt")
	writeFile(t, src2, []byte("written on laptop\n"), 0o644)
	putJSON(t, b, src2, "home:/laptop")
	if got := b.ok("cat", "home:/laptop/l.txt"); got != "written on laptop\n" {
		t.Fatalf("cat on laptop: %q", got)
	}
	// The new device runs its own node (no join endpoint: it holds no CA),
	// which the first device's certificate opens.
	bs := b.serve("2s")
	if strings.Contains(bs.out.String(), "join endpoint") {
		t.Fatalf("a joined device serves joins: %s", bs.out)
	}
	a.waitState("laptop", "awake", 5*time.Second)
	desk := dial(t, a.home, bs.addr, "laptop")
	if _, err := desk.Stats(ctx); err != nil {
		t.Fatalf("desk asks laptop's node: %v", err)
	}
	desk.Close()
	laptop := dial(t, b.home, s.addr, "desk")
	defer laptop.Close()
	if err := laptop.List(ctx, func(cairn.ID, int64) error { return nil }); err != nil {
		t.Fatalf("laptop lists desk's store: %v", err)
	}

	// A device named by itself, keyring sealed with a passphrase.
	tok = strings.TrimSpace(a.ok("invite", "--role", "device"))
	phone := joiner(t)
	// A joiner may not take a member's name; the token survives the refusal.
	if res := phone.runEnv([]string{"CAIRN_PASSPHRASE=pw"}, "join", tok, "--name", "desk"); res.code != cli.ExitExist || !strings.Contains(res.stderr, "already has a device named desk") {
		t.Fatalf("join as desk: %+v", res)
	}
	if _, err := os.Stat(filepath.Join(phone.home, "realm.json")); err == nil {
		t.Fatal("a refused join wrote realm.json")
	}
	if res := phone.runEnv([]string{"CAIRN_PASSPHRASE=pw"}, "join", tok, "--name", "phone"); res.code != 0 || !strings.Contains(res.stdout, "as device phone") {
		t.Fatalf("join with a passphrase: %+v", res)
	}
	if res := phone.runEnv([]string{"CAIRN_PASSPHRASE=pw"}, "put", "--json", src2, "home:/phone"); res.code != 0 {
		t.Fatalf("put on phone: %+v", res)
	}
	phone.fails(cli.ExitPermission, "cat", "home:/phone/l.txt")
	if res := phone.runEnv([]string{"CAIRN_PASSPHRASE=pw"}, "cat", "home:/phone/l.txt"); res.stdout != "written on laptop\n" {
		t.Fatalf("cat on phone: %+v", res)
	}

	// A surrogate joins: a certificate, no key, no metadata.
	tok = strings.TrimSpace(a.ok("invite", "--role", "surrogate", "--name", "cafe"))
	sur := joiner(t)
	if out := sur.ok("join", tok); !strings.Contains(out, "as surrogate cafe") {
		t.Fatalf("surrogate join: %s", out)
	}
	for _, f := range []string{"realm.json", "keyring"} {
		if _, err := os.Stat(filepath.Join(sur.home, f)); err == nil {
			t.Fatalf("a surrogate received %s", f)
		}
	}
	sur.fails(cli.ExitNotFound, "ls", "home:/")
	cafe := dial(t, sur.home, s.addr, "desk")
	defer cafe.Close()
	var zero cairn.ID
	if _, err := cafe.Get(ctx, zero); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("surrogate get: %v", err)
	}
	if err := cafe.List(ctx, func(cairn.ID, int64) error { return nil }); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("surrogate list: %v", err)
	}
	if d := a.devices()["cafe"]; d == nil || d["role"] != "surrogate" || d["state"] != "offline" {
		t.Fatalf("surrogate in devices: %v", d)
	}

	// Removal: the laptop is refused, also on its open connection.
	a.fails(cli.ExitUsage, "node", "remove", "desk")
	a.fails(cli.ExitNotFound, "node", "remove", "ghost")
	a.ok("node", "remove", "laptop")
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := laptop.List(ctx, func(cairn.ID, int64) error { return nil })
		if errors.Is(err, cairn.ErrPermission) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed laptop still served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	again := dial(t, b.home, s.addr, "desk")
	defer again.Close()
	if _, err := again.Get(ctx, zero); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("removed laptop, new connection: %v", err)
	}
	if d := a.devices()["laptop"]; d["state"] != "removed" || d["removed"] == nil {
		t.Fatalf("removed laptop in devices: %v", d)
	}
	// Its running node notices at its next report and stops.
	select {
	case err := <-bs.done:
		bs.done <- err
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != cli.ExitPermission {
			t.Fatalf("removed node's serve ended with %v\n%s", err, bs.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removed node still serves")
	}

	// The killed node goes offline within its lease.
	killAndWaitOffline(t, a, s, "desk")
}

// A realm made before cairn had a CA gets one on first need, unless the
// metadata records that another device holds it.
func TestLazyCA(t *testing.T) {
	ctx := context.Background()
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	// Make it look like an old realm: no pki directory, no CA record, no
	// registry entry.
	if err := os.RemoveAll(filepath.Join(r.home, "pki")); err != nil {
		t.Fatal(err)
	}
	conn, err := etcdsvc.Connect(ctx, r.home, etcdsvc.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, derr := conn.Client().Delete(ctx, "/cairn/v1/pki/ca"); derr != nil {
		t.Fatal(derr)
	}
	if _, derr := conn.Client().Delete(ctx, "/cairn/v1/node/desk"); derr != nil {
		t.Fatal(derr)
	}
	conn.Close()
	old := r.ok("devices", "--json")
	if strings.TrimSpace(old) != "[]" {
		t.Fatalf("old realm devices: %s", old)
	}
	// node serve makes the CA (named by the host name) and serves.
	s := r.serve("2s")
	c, err := pki.LoadCredentials(realm.CredentialsDir(r.home))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadCA(realm.CADir(r.home)); err != nil {
		t.Fatal(err)
	}
	r.waitState(c.Identity.Name, "awake", 5*time.Second)
	if !strings.Contains(s.out.String(), "join endpoint") {
		t.Fatalf("serve: %s", s.out)
	}
	// Another home on the same metadata, without the CA: it is told where
	// the CA is instead of making a second one.
	if err := os.RemoveAll(filepath.Join(r.home, "pki")); err != nil {
		t.Fatal(err)
	}
	res := r.fails(cli.ExitExist, "invite", "--role", "device")
	if !strings.Contains(res.stderr, "held by device "+c.Identity.Name) {
		t.Fatalf("invite without the CA: %s", res.stderr)
	}
}

// `node standby` announces the running node's standby: `devices` shows it
// with since and how to wake it, its lease ended cleanly (never offline);
// `node resume` makes it awake again; with no node running both say so.
func TestNodeStandbyAndResume(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	if res := r.run("node", "standby"); res.code == 0 || !strings.Contains(res.stderr, "no node runs here") {
		t.Fatalf("standby with no node running: %+v", res)
	}
	r.serve("2s")
	d := r.waitState("desk", "awake", 5*time.Second)
	if d["since"] == nil || d["wake"] != nil {
		t.Fatalf("awake on loopback: %v", d)
	}
	out := r.ok("node", "standby")
	if !strings.Contains(out, "desk is in standby since") || !strings.Contains(out, "no wake method") {
		t.Fatalf("node standby: %s", out)
	}
	d = r.devices()["desk"]
	if d["state"] != "standby" || d["since"] == nil || d["since"] == d["registered"] {
		t.Fatalf("devices after standby: %v", d)
	}
	if out := r.ok("devices"); !strings.Contains(out, "standby") || !strings.Contains(out, "no wake method") || !strings.Contains(out, "SINCE") {
		t.Fatalf("devices:\n%s", out)
	}
	out = r.ok("node", "resume")
	if !strings.Contains(out, "desk is awake") {
		t.Fatalf("node resume: %s", out)
	}
	if d := r.devices()["desk"]; d["state"] != "awake" {
		t.Fatalf("devices after resume: %v", d)
	}
}

// `node set-wake` records a wake method by hand, shown by `devices` and
// kept over what the node learns; --learn forgets it.
func TestNodeSetWake(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	r.fails(cli.ExitUsage, "node", "set-wake", "desk")
	if res := r.run("node", "set-wake", "desk", "--mac", "not-a-mac"); res.code == 0 || !strings.Contains(res.stderr, "not a 48-bit MAC") {
		t.Fatalf("a bad MAC: %+v", res)
	}
	out := r.ok("node", "set-wake", "desk", "--mac", "02:00:5E:10:00:01", "--broadcast", "192.0.2.255", "--proxy", "nas")
	if !strings.Contains(out, "wake-on-lan 02:00:5e:10:00:01 to 192.0.2.255 by nas") {
		t.Fatalf("set-wake: %s", out)
	}
	r.serve("2s")
	d := r.waitState("desk", "awake", 5*time.Second)
	w, _ := d["wake"].(map[string]any)
	if w["mac"] != "02:00:5e:10:00:01" || w["broadcast"] != "192.0.2.255" || w["proxy"] != "nas" || w["set"] != true {
		t.Fatalf("devices after set-wake and a registration: %v", d)
	}
	if out := r.ok("devices"); !strings.Contains(out, "wake-on-lan 02:00:5e:10:00:01 to 192.0.2.255 by nas") {
		t.Fatalf("devices:\n%s", out)
	}
	r.ok("node", "set-wake", "desk", "--learn")
	if d := r.devices()["desk"]; d["wake"] != nil {
		t.Fatalf("after --learn: %v", d)
	}
	if res := r.run("node", "set-wake", "ghost", "--learn"); res.code == 0 {
		t.Fatalf("set-wake of an unknown node: %+v", res)
	}
}

// `node serve --always-on` and `node set-always-on` mark a device
// always-on: `devices` (and --json) shows it, `--off` removes it, and a
// device marked always-on that announces standby warns.
func TestNodeAlwaysOn(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	r.fails(cli.ExitUsage, "node", "set-always-on")
	if res := r.run("node", "set-always-on", "ghost"); res.code == 0 {
		t.Fatalf("set-always-on of an unknown node: %+v", res)
	}
	r.serveOn("127.0.0.1:0", "2s", "--always-on")
	d := r.waitState("desk", "awake", 5*time.Second)
	if d["always_on"] != true {
		t.Fatalf("devices after serve --always-on: %v", d)
	}
	if out := r.ok("devices"); !strings.Contains(out, "device, always-on") {
		t.Fatalf("devices:\n%s", out)
	}
	res := r.run("node", "standby")
	if res.code != 0 || !strings.Contains(res.stderr, "warning: desk is marked always-on") {
		t.Fatalf("standby of an always-on device: %+v", res)
	}
	r.ok("node", "resume")
	if out := r.ok("node", "set-always-on", "desk", "--off"); !strings.Contains(out, "desk is not marked always-on") {
		t.Fatalf("--off: %s", out)
	}
	if d := r.devices()["desk"]; d["always_on"] != nil {
		t.Fatalf("devices after --off: %v", d)
	}
	if res := r.run("node", "standby"); res.code != 0 || strings.Contains(res.stderr, "always-on") {
		t.Fatalf("standby of a device not marked: %+v", res)
	}
	if out := r.ok("node", "set-always-on", "desk"); !strings.Contains(out, "desk is marked always-on") {
		t.Fatalf("set-always-on: %s", out)
	}
	if out := r.ok("devices"); !strings.Contains(out, "device, always-on") {
		t.Fatalf("devices:\n%s", out)
	}
}
