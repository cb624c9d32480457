package cli_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
)

// ACLs inside a volume, through the CLI of four devices: the owner's desk
// and phone, a read-only member's (bob) and a stranger's (carol). Allowed
// operations work, forbidden ones fail with exit 4, and nothing forbidden
// shows in a listing; an ACL is inherited down the tree; device:phone:none
// denies the owner's phone.
func TestACLCLI(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	for _, u := range []string{"alice", "bob", "carol"} {
		a.ok("user", "add", u)
	}
	a.ok("volume", "create", "team")
	a.ok("mkdir", "-p", "team:/pub/secret", "team:/shared")
	src := filepath.Join(t.TempDir(), "a.txt")
	writeFile(t, src, []byte("public\n"), 0o644)
	putJSON(t, a, src, "team:/pub/")
	sec := filepath.Join(t.TempDir(), "s.txt")
	writeFile(t, sec, []byte("secret\n"), 0o644)
	putJSON(t, a, sec, "team:/pub/secret/")
	a.ok("share", "team", "bob", "--read")
	a.ok("acl", "set", "team:/shared", "bob:rw")
	a.ok("acl", "set", "team:/pub/secret", "bob:none")
	a.ok("acl", "set", "team:/pub/secret", "device:phone:none")
	a.fails(cli.ExitUsage, "acl", "set", "team:/pub", "bob:w")
	a.fails(cli.ExitUsage, "acl", "set", "team:/pub", "bob")

	var rep struct {
		Access []struct {
			Principal, Perm, Why string
		}
	}
	if err := json.Unmarshal([]byte(a.ok("acl", "get", "--json", "team:/pub/secret/s.txt")), &rep); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, x := range rep.Access {
		got[x.Principal] = x.Perm
	}
	want := map[string]string{"user:alice": "rw", "user:bob": "none", "user:carol": "none", "device:phone": "none"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("acl get: %s has %q, want %q (%+v)", k, got[k], v, rep.Access)
		}
	}
	if out := a.ok("acl", "get", "team:/shared/x"); !strings.Contains(out, "user:bob") || !strings.Contains(out, "acl on /shared") {
		t.Fatalf("acl get team:/shared/x:\n%s", out)
	}

	join := func(user, name string) *realmT {
		tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", name, "--user", user))
		d := joiner(t)
		d.ok("join", tok, "--no-passphrase")
		return d
	}
	bob, carol, phone := join("bob", "bobpc"), join("carol", "carolpc"), join("alice", "phone")
	up := filepath.Join(t.TempDir(), "up.txt")
	writeFile(t, up, []byte("uploaded\n"), 0o644)

	// bob reads /pub but not /pub/secret, which he does not even see.
	if out := bob.ok("ls", "-R", "team:/"); strings.Contains(out, "secret") || !strings.Contains(out, "a.txt") {
		t.Fatalf("bob's ls -R team:/:\n%s", out)
	}
	if got := bob.ok("cat", "team:/pub/a.txt"); got != "public\n" {
		t.Fatalf("bob cat: %q", got)
	}
	// Every refusal is logged with the user and device refused; every
	// grant and revocation with who made it.
	if res := bob.fails(cli.ExitPermission, "cat", "team:/pub/secret/s.txt"); !strings.Contains(res.stderr, `msg="acl: access denied"`) ||
		!strings.Contains(res.stderr, "user=bob device=bobpc") {
		t.Fatalf("bob's refused read is not logged with his user and device:\n%s", res.stderr)
	}
	if res := a.run("-v", "acl", "set", "team:/pub", "carol:none"); res.code != 0 || !strings.Contains(res.stderr, `msg="acl: granted"`) ||
		!strings.Contains(res.stderr, "principal=user:carol perm=none by_user=alice by_device=desk") {
		t.Fatalf("acl set -v: %+v", res)
	}
	if res := a.run("-v", "acl", "rm", "team:/pub", "carol"); res.code != 0 || !strings.Contains(res.stderr, `msg="acl: revoked"`) ||
		!strings.Contains(res.stderr, "principal=user:carol by_user=alice by_device=desk") {
		t.Fatalf("acl rm -v: %+v", res)
	}
	bob.fails(cli.ExitPermission, "ls", "team:/pub/secret")
	// and writes only below /shared (inherited, two levels down).
	bob.fails(cli.ExitPermission, "put", up, "team:/pub/")
	bob.fails(cli.ExitPermission, "mkdir", "team:/pub/d")
	bob.fails(cli.ExitPermission, "rm", "team:/pub/a.txt")
	bob.fails(cli.ExitPermission, "mv", "team:/pub/a.txt", "team:/shared/a.txt")
	bob.ok("mkdir", "-p", "team:/shared/x/y")
	putJSON(t, bob, up, "team:/shared/x/y/")
	if got := bob.ok("cat", "team:/shared/x/y/up.txt"); got != "uploaded\n" {
		t.Fatalf("bob's upload read back: %q", got)
	}
	if out := a.ok("ls", "team:/shared/x/y"); !strings.Contains(out, "up.txt") {
		t.Fatalf("bob's upload, seen by the owner:\n%s", out)
	}
	bob.fails(cli.ExitPermission, "acl", "set", "team:/pub", "bob:rw")
	bob.fails(cli.ExitPermission, "acl", "get", "team:/pub/secret")
	if out := bob.ok("acl", "get", "team:/shared"); !strings.Contains(out, "acl on /shared") {
		t.Fatalf("bob's acl get team:/shared:\n%s", out)
	}

	// The same through a mount on bob's device: EACCES, not listed.
	mnt := t.TempDir()
	bob.mountVol("team", mnt)
	if ents, err := os.ReadDir(filepath.Join(mnt, "pub")); err != nil || len(ents) != 1 || ents[0].Name() != "a.txt" {
		t.Fatalf("bob's mount lists pub: %v %v", ents, err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "pub", "a.txt")); err != nil || string(b) != "public\n" {
		t.Fatalf("bob's mount reads pub/a.txt: %q %v", b, err)
	}
	for what, err := range map[string]error{
		"read pub/secret/s.txt": func() error { _, err := os.ReadFile(filepath.Join(mnt, "pub", "secret", "s.txt")); return err }(),
		"stat pub/secret":       func() error { _, err := os.Stat(filepath.Join(mnt, "pub", "secret")); return err }(),
		"write pub/m.txt":       os.WriteFile(filepath.Join(mnt, "pub", "m.txt"), []byte("no"), 0o644),
		"mkdir pub/m":           os.Mkdir(filepath.Join(mnt, "pub", "m"), 0o755),
		"remove pub/a.txt":      os.Remove(filepath.Join(mnt, "pub", "a.txt")),
	} {
		if !errors.Is(err, syscall.EACCES) {
			t.Errorf("bob's mount: %s: %v, want EACCES", what, err)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "shared", "m.txt"), []byte("yes"), 0o644); err != nil {
		t.Fatalf("bob's mount writes shared/m.txt: %v", err)
	}
	// A directory the mount learns of from its watch is written into as
	// its place says (its path is known from the lookup).
	if _, err := os.ReadDir(filepath.Join(mnt, "shared")); err != nil {
		t.Fatal(err)
	}
	a.ok("mkdir", "team:/shared/late")
	waitFor(t, "shared/late in bob's mount", 10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(mnt, "shared", "late"))
		return err == nil
	})
	if err := os.WriteFile(filepath.Join(mnt, "shared", "late", "f.txt"), []byte("yes"), 0o644); err != nil {
		t.Fatalf("bob's mount writes shared/late/f.txt: %v", err)
	}

	// The same through a WebDAV gateway on bob's device: 403, not listed.
	pass := strings.TrimSpace(bob.ok("dav", "passwd", "add", "bob"))
	d := bob.startDav("team", "--listen", "127.0.0.1:0")
	// (The certificate of a joined device names no IP address: TLS is
	// not what this test checks.)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, x := range []struct {
		method, path string
		body         []byte
		want         int
	}{
		{"GET", "pub/a.txt", nil, http.StatusOK},
		{"GET", "pub/secret/s.txt", nil, http.StatusForbidden},
		{"PUT", "pub/new.txt", []byte("no"), http.StatusForbidden},
		{"DELETE", "pub/a.txt", nil, http.StatusForbidden},
		{"MKCOL", "pub/col", nil, http.StatusForbidden},
		{"PUT", "shared/dav.txt", []byte("yes"), http.StatusCreated},
	} {
		if code, b := davDo(t, c, x.method, d.url+x.path, "bob", pass, x.body); code != x.want {
			t.Fatalf("bob's WebDAV %s %s: %d %s, want %d", x.method, x.path, code, b, x.want)
		}
	}
	req, _ := http.NewRequest("PROPFIND", d.url+"pub/", nil)
	req.SetBasicAuth("bob", pass)
	req.Header.Set("Depth", "1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMultiStatus || strings.Contains(string(body), "secret") || !strings.Contains(string(body), "a.txt") {
		t.Fatalf("bob's PROPFIND /pub/: %d\n%s", resp.StatusCode, body)
	}
	d.stop(t)

	// carol: the volume is not shared with her.
	carol.fails(cli.ExitPermission, "ls", "team:/")
	carol.fails(cli.ExitPermission, "cat", "team:/pub/a.txt")
	carol.fails(cli.ExitPermission, "put", up, "team:/pub/")

	// alice's phone: all but /pub/secret; her desk: all.
	if out := phone.ok("ls", "team:/pub"); strings.Contains(out, "secret") || !strings.Contains(out, "a.txt") {
		t.Fatalf("phone's ls team:/pub:\n%s", out)
	}
	phone.fails(cli.ExitPermission, "cat", "team:/pub/secret/s.txt")
	putJSON(t, phone, up, "team:/pub/")
	if out := a.ok("ls", "team:/pub"); !strings.Contains(out, "secret") {
		t.Fatalf("desk's ls team:/pub:\n%s", out)
	}
	if got := a.ok("cat", "team:/pub/secret/s.txt"); got != "secret\n" {
		t.Fatalf("desk cat: %q", got)
	}

	// Taking the device entry back lets the phone read again.
	a.ok("acl", "rm", "team:/pub/secret", "device:phone")
	if got := phone.ok("cat", "team:/pub/secret/s.txt"); got != "secret\n" {
		t.Fatalf("phone cat after acl rm: %q", got)
	}
	a.fails(cli.ExitNotFound, "acl", "rm", "team:/pub/secret", "device:phone")
}

// mountVol mounts volume vol at dir (--foreground --mode blocking) until
// the test ends.
func (r *realmT) mountVol(vol, dir string) {
	r.t.Helper()
	cmd := r.command("mount", "--foreground", "--mode", "blocking", vol, dir)
	cmd.Env = r.env
	var out outBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &proc{done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
		if isMounted(dir) {
			exec.Command("fusermount3", "-uz", dir).Run()
		}
	})
	waitFor(r.t, "mount --foreground serving", 20*time.Second, func() bool {
		select {
		case <-p.done:
			r.t.Fatalf("mount --foreground exited early: %v\n%s", p.err, out.String())
		default:
		}
		return isMounted(dir)
	})
}
