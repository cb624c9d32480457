package cli_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store/storetest"
)

// register posts a raw report body to the registrar at addr with a client
// presenting c; verify false makes it accept any server, as an attacker
// would. It returns the HTTP status, or the error of a refused connection.
func register(t *testing.T, addr string, c *pki.Credentials, verify bool, body []byte) (int, error) {
	t.Helper()
	cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		t.Fatal(err)
	}
	if !verify {
		cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: &protos}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "https://"+addr+wire.PathRegister, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Encoding", wire.Zstd)
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A benefactor and a surrogate, on loopback: each joins with a certificate
// only, runs `node serve` on its own home (no realm.json, no key, no etcd),
// and shows online in `devices` with its role and disk through the device
// it reports to; a device stores and fetches chunks on the benefactor; a
// killed surrogate goes offline within its lease; a removed benefactor's
// serve stops with exit 4. The registrar believes certificates only.
func TestBenefactorAndSurrogateServe(t *testing.T) {
	ctx := context.Background()
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	s := a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	a.fails(cli.ExitUsage, "node", "serve", "--registrar", "elsewhere:7461")

	join := func(role, name string) *realmT {
		tok := strings.TrimSpace(a.ok("invite", "--role", role, "--name", name))
		j := joiner(t)
		if out := j.ok("join", tok); !strings.Contains(out, "as "+role+" "+name) {
			t.Fatalf("%s join: %s", role, out)
		}
		if _, err := os.Stat(realm.RegistrarPath(j.home)); err != nil {
			t.Fatalf("%s: no registrar state: %v", name, err)
		}
		return j
	}
	ben, sur := join("benefactor", "donor"), join("surrogate", "cafe")

	// The registrar believes the certificate, not the body: a report that
	// names desk changes cafe's record only; a certificate of another CA
	// naming cafe is refused.
	cafe, err := pki.LoadCredentials(realm.CredentialsDir(sur.home))
	if err != nil {
		t.Fatal(err)
	}
	claim := wire.Compress(nil, []byte(`{"name":"desk","role":"device","addr":"evil.example:1","capacity":1,"lease":2000000000}`))
	if status, rerr := register(t, s.addr, cafe, true, claim); rerr != nil || status != 200 {
		t.Fatalf("cafe's report: %d %v", status, rerr)
	}
	devs := a.devices()
	if d := devs["desk"]; d["role"] != "device" || d["addr"] != s.addr {
		t.Fatalf("a report naming desk changed desk: %v", d)
	}
	if d := devs["cafe"]; d["role"] != "surrogate" || d["addr"] != "evil.example:1" || d["state"] != "awake" {
		t.Fatalf("cafe after its report: %v", d)
	}
	other, err := pki.CreateCA(t.TempDir(), cafe.Identity.Realm)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := other.NewCredentials(cafe.Identity, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if status, err := register(t, s.addr, forged, false, wire.EncodeReport(wire.Report{Addr: "evil.example:2", Lease: int64(2 * time.Second)})); err == nil {
		t.Fatalf("another CA's certificate was answered %d", status)
	}
	if d := a.devices()["cafe"]; d["addr"] != "evil.example:1" {
		t.Fatalf("a forged certificate changed cafe: %v", d)
	}

	// Both serve.
	bs, cs := ben.serve("2s"), sur.serve("2s")
	for _, x := range []*server{bs, cs} {
		if !strings.Contains(x.out.String(), "registered through "+s.addr) {
			t.Fatalf("serve: %s", x.out)
		}
	}
	for name, want := range map[string]struct {
		role string
		s    *server
	}{"donor": {"benefactor", bs}, "cafe": {"surrogate", cs}} {
		d := a.waitState(name, "awake", 5*time.Second)
		if d["role"] != want.role || d["addr"] != want.s.addr || d["capacity"].(float64) <= 0 || d["free"].(float64) <= 0 || d["last_seen"] == nil {
			t.Fatalf("%s in devices: %v", name, d)
		}
	}
	if out := a.ok("devices"); !strings.Contains(out, "benefactor") || !strings.Contains(out, "surrogate") || !strings.Contains(out, bs.addr) {
		t.Fatalf("devices:\n%s", out)
	}

	// A device stores and fetches chunks on the benefactor's node.
	st := dial(t, a.home, bs.addr, "donor")
	defer st.Close()
	id, data := storetest.Blob(3, 100000)
	if err := st.Put(ctx, id, data); err != nil {
		t.Fatalf("put on the benefactor: %v", err)
	}
	if got, err := st.Get(ctx, id); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get from the benefactor: %v", err)
	}
	if u, err := st.Stats(ctx); err != nil || u.Objects != 1 {
		t.Fatalf("benefactor's store: %+v %v", u, err)
	}
	// The surrogate's certificate opens nothing on it.
	if _, err := dial(t, sur.home, bs.addr, "donor").Get(ctx, id); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("surrogate reads the benefactor: %v", err)
	}

	// A killed surrogate goes offline within its lease.
	killAndWaitOffline(t, a, cs, "cafe")

	// A removed benefactor's serve stops with exit 4, and it is refused
	// if it starts again.
	a.ok("node", "remove", "donor")
	select {
	case err := <-bs.done:
		bs.done <- err
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != cli.ExitPermission {
			t.Fatalf("removed benefactor's serve ended with %v\n%s", err, bs.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removed benefactor still serves")
	}
	if d := a.devices()["donor"]; d["state"] != "removed" {
		t.Fatalf("donor after removal: %v", d)
	}
	ben.fails(cli.ExitPermission, "node", "serve", "--listen", "127.0.0.1:0", "--lease", "2s")
}

// `node standby` and `node resume` work in a benefactor's home (its node
// has power states too); while it sleeps, `gc` skips its store and says
// so, exits 0, and never wakes it; resumed, the next gc sweeps it.
func TestNodeStandbyBenefactorAndGC(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "benefactor", "--name", "donor"))
	ben := joiner(t)
	ben.ok("join", tok)
	ben.serve("2s")
	a.waitState("donor", "awake", 5*time.Second)

	if out := ben.ok("node", "standby"); !strings.Contains(out, "donor is in standby since") {
		t.Fatalf("benefactor standby: %s", out)
	}
	d := a.waitState("donor", "standby", 5*time.Second)
	res := a.run("gc")
	if res.code != 0 || !strings.Contains(res.stderr, "gc: skipped: node donor is standby since ") {
		t.Fatalf("gc with donor in standby: %+v", res)
	}
	if strings.Contains(res.stdout, "store donor") {
		t.Fatalf("gc swept donor: %s", res.stdout)
	}
	if d2 := a.devices()["donor"]; d2["state"] != "standby" || d2["since"] != d["since"] {
		t.Fatalf("donor after gc: %v (was %v)", d2, d)
	}
	if out := ben.ok("node", "resume"); !strings.Contains(out, "donor is awake") {
		t.Fatalf("benefactor resume: %s", out)
	}
	a.waitState("donor", "awake", 5*time.Second)
	if out := a.ok("gc"); !strings.Contains(out, "store donor") {
		t.Fatalf("gc after donor resumed: %s", out)
	}
}

// A benefactor serving with --donate shows its donation in devices; a
// directory under stripe:1 is put onto it (the whole dataset reserved
// first) and cat reads it back; an import larger than the donation is
// refused before anything is written.
func TestStripePutCat(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)
	tok := strings.TrimSpace(a.ok("invite", "--role", "benefactor", "--name", "donor"))
	ben := joiner(t)
	ben.ok("join", tok)
	ben.serveWith("2s", "--donate", "4MiB")
	d := a.waitState("donor", "awake", 5*time.Second)
	if d["donated"].(float64) != 4<<20 || d["donor_free"].(float64) <= 0 || d["donor_free"].(float64) > 4<<20 {
		t.Fatalf("donor in devices: %v", d)
	}
	if out := a.ok("devices"); !strings.Contains(out, "DONATED") || !strings.Contains(out, "4.0 MiB") {
		t.Fatalf("devices:\n%s", out)
	}
	a.ok("policy", "set", "home:/data", "stripe:1")
	src := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("striped over donated space\n"), 40000) // ~1 MiB
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	a.ok("put", src, "home:/data/")
	if got := a.ok("cat", "home:/data/f"); got != string(data) {
		t.Fatalf("cat: %d bytes, want %d", len(got), len(data))
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, make([]byte, 5<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := a.fails(cli.ExitPermission, "put", big, "home:/data/"); !strings.Contains(res.stderr, "not enough donated space") {
		t.Fatalf("put past the donation: %s", res.stderr)
	}
}
