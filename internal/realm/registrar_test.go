package realm

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/remotestore"
	"cairn.dev/cairn/internal/store/storetest"
)

const regLease = 2 * time.Second

// testLog is where the nodes of these tests log: stderr with
// CAIRN_TEST_LOG=1, else nowhere.
func testLog() *slog.Logger {
	if os.Getenv("CAIRN_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// served is a node running in the test: stop ends it and returns what it
// returned; done is closed when it has returned on its own.
type served struct {
	addr string
	err  chan error
	stop func() error
}

func serveDevice(t *testing.T, r *Realm) *served {
	t.Helper()
	return run(t, func(ctx context.Context, ready func(string)) error {
		return r.Serve(ctx, ServeOptions{Listen: "127.0.0.1:0", Lease: regLease, Ready: func(a string, _ bool) { ready(a) }})
	})
}

func serveStandalone(t *testing.T, home string, o StandaloneOptions) *served {
	t.Helper()
	return run(t, func(ctx context.Context, ready func(string)) error {
		o.Listen, o.Lease, o.Logger = "127.0.0.1:0", regLease, testLog()
		o.Ready = func(a, _ string) { ready(a) }
		return ServeStandalone(ctx, home, o)
	})
}

func run(t *testing.T, fn func(ctx context.Context, ready func(string)) error) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{err: make(chan error, 1)}
	ready := make(chan string, 1)
	go func() { s.err <- fn(ctx, func(a string) { ready <- a }) }()
	var result error
	done := false
	s.stop = func() error {
		cancel()
		if !done {
			result, done = <-s.err, true
		}
		return result
	}
	t.Cleanup(func() { s.stop() })
	select {
	case s.addr = <-ready:
	case err := <-s.err:
		result, done = err, true
		t.Fatalf("node did not start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("node did not start")
	}
	return s
}

// wait returns what the node returned by itself within d.
func (s *served) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-s.err:
		s.err <- err
		return err
	case <-time.After(d):
		t.Fatalf("node still running after %v", d)
		return nil
	}
}

// firstDevice makes a realm on an etcd of its own, its device "desk"
// serving its node (and so the join endpoint and a registrar).
func firstDevice(t *testing.T) (*Realm, *served) {
	t.Helper()
	a, err := Init(context.Background(), t.TempDir(), Options{Etcd: etcdtest.New(t).Endpoints(), NoPassphrase: true, NodeName: "desk", Logger: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, serveDevice(t, a)
}

// joinAs joins a new home to a's realm as role, named name.
func joinAs(t *testing.T, a *Realm, role pki.Role, name string) string {
	t.Helper()
	ctx := context.Background()
	tok, err := a.Invite(ctx, InviteOptions{Role: role, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	if _, err := Join(ctx, home, tok, JoinOptions{NoPassphrase: true}); err != nil {
		t.Fatal(err)
	}
	return home
}

func waitNode(t *testing.T, m *meta.Service, name, state string, within time.Duration) *meta.NodeStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := m.Node(context.Background(), name)
		if err == nil && st.State == state {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %+v %v; want %s within %v", name, st, err, state, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dialNode(t *testing.T, home, addr, name string) *remotestore.Store {
	t.Helper()
	c, err := pki.LoadCredentials(CredentialsDir(home))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireNode(name)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := remotestore.New(remotestore.Options{Addr: addr, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A benefactor joins with a certificate only, serves its own store to the
// realm's devices, and is kept in the registry by the device it reports
// to; it learns the revocation list from it, so a removed device is
// refused; leaving takes it offline at once, and removing it stops it with
// Permission.
func TestBenefactorRegistersThroughADevice(t *testing.T) {
	ctx := context.Background()
	a, as := firstDevice(t)
	home := joinAs(t, a, pki.Benefactor, "donor")
	for _, f := range []string{"realm.json", "keyring"} {
		if _, err := os.Stat(home + "/" + f); err == nil {
			t.Fatalf("a benefactor's home holds %s", f)
		}
	}
	st, err := loadRegistrarState(home)
	if err != nil || !slices.Equal(st.Registrars, []string{as.addr}) || st.Revoked != nil {
		t.Fatalf("registrar state after join: %+v %v", st, err)
	}

	bs := serveStandalone(t, home, StandaloneOptions{})
	rec := waitNode(t, a.Meta, "donor", meta.NodeOnline, 5*time.Second)
	if rec.Role != "benefactor" || rec.Addr != bs.addr || rec.Capacity <= 0 || rec.Free <= 0 || rec.Lease != int64(regLease) || rec.LastSeen == 0 {
		t.Fatalf("registry record: %+v", rec)
	}
	if st, err = loadRegistrarState(home); err != nil || st.Revoked == nil || st.Registrars[0] != as.addr {
		t.Fatalf("registrar state after the first report: %+v %v", st, err)
	}

	// A device stores and fetches chunks on it.
	laptop := joinAs(t, a, pki.Device, "laptop")
	rs := dialNode(t, laptop, bs.addr, "donor")
	id, data := storetest.Blob(7, 50000)
	if perr := rs.Put(ctx, id, data); perr != nil {
		t.Fatal(perr)
	}
	if got, gerr := rs.Get(ctx, id); gerr != nil || string(got) != string(data) {
		t.Fatalf("get from the benefactor: %v", gerr)
	}
	// Its use and serving figures reach the registry with its reports.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, _ := a.Meta.Node(ctx, "donor")
		if rec.Used > 0 && rec.Served >= int64(len(data)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("figures not reported: %+v", rec)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The laptop is removed: the benefactor learns it at its next report.
	if rerr := a.Meta.RemoveNode(ctx, "laptop", time.Time{}); rerr != nil {
		t.Fatal(rerr)
	}
	deadline = time.Now().Add(regLease + 3*time.Second)
	for {
		_, gerr := rs.Get(ctx, id)
		if errors.Is(gerr, cairn.ErrPermission) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed device still served by the benefactor: %v", gerr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		// Kept in the home just after it is applied.
		if st, err = loadRegistrarState(home); err == nil && !st.Revoked.Serials[leafOf(t, laptop).SerialNumber.Text(16)].IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revocation not kept: %+v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Leaving: offline at once; a restart finds its list and its store.
	if err := bs.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if rec, _ := a.Meta.Node(ctx, "donor"); rec.State != meta.NodeOffline {
		t.Fatalf("after leaving: %+v", rec)
	}
	bs = serveStandalone(t, home, StandaloneOptions{})
	waitNode(t, a.Meta, "donor", meta.NodeOnline, 5*time.Second)
	// Its own certificate is no device's: it opens no chunk operation.
	if _, err := dialNode(t, home, bs.addr, "donor").Get(ctx, id); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("a benefactor reads a benefactor: %v", err)
	}

	// Removed: its serve ends with Permission at its next report.
	if err := a.Meta.RemoveNode(ctx, "donor", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := bs.wait(t, regLease+5*time.Second); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("removed benefactor's serve returned %v", err)
	}
	// And cannot start again.
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ServeStandalone(ctx2, home, StandaloneOptions{Listen: "127.0.0.1:0", Lease: regLease}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("removed benefactor starting again: %v", err)
	}
}

// post sends a report to the registrar at addr with a client made of creds
// and cfg's changes, and returns the status, or the transport error.
func post(t *testing.T, addr string, cfg *tls.Config, body []byte) (int, error) {
	t.Helper()
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: &protos}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+wire.PathRegister, bytes.NewReader(body))
	req.Header.Set("Content-Encoding", wire.Zstd)
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The registrar believes the certificate only: a certificate of another CA
// (same realm, same name) is refused, and a body naming another node or
// role changes nothing but the reporter's own record.
func TestRegistrarTrustsCertificatesOnly(t *testing.T) {
	ctx := context.Background()
	a, as := firstDevice(t)
	home := joinAs(t, a, pki.Surrogate, "cafe")
	creds, err := pki.LoadCredentials(CredentialsDir(home))
	if err != nil {
		t.Fatal(err)
	}
	desk, err := a.Meta.Node(ctx, "desk")
	if err != nil {
		t.Fatal(err)
	}
	body := wire.Compress(nil, []byte(`{"name":"desk","role":"device","addr":"evil.example:1","capacity":1,"lease":2000000000}`))

	other, err := pki.CreateCA(t.TempDir(), a.Config.RealmID)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cafe", "desk"} {
		oc, nerr := other.NewCredentials(pki.NodeIdentity{Realm: a.Config.RealmID, Name: name, Role: pki.Surrogate}, pki.IssueOptions{})
		if nerr != nil {
			t.Fatal(nerr)
		}
		cfg, nerr := pki.ClientTLS(oc, pki.TLSOptions{Revocations: pki.NoRevocations{}})
		if nerr != nil {
			t.Fatal(nerr)
		}
		cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil // an attacker accepts any server
		if status, perr := post(t, as.addr, cfg, body); perr == nil {
			t.Fatalf("another CA's %s was answered %d", name, status)
		}
	}
	if st, _ := a.Meta.Node(ctx, "cafe"); st.State != meta.NodeOffline || st.Addr != "" {
		t.Fatalf("a foreign certificate registered cafe: %+v", st)
	}

	cfg, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		t.Fatal(err)
	}
	if status, err := post(t, as.addr, cfg, body); err != nil || status != 200 {
		t.Fatalf("cafe's report: %d %v", status, err)
	}
	cafe := waitNode(t, a.Meta, "cafe", meta.NodeOnline, time.Second)
	if cafe.Role != "surrogate" || cafe.Addr != "evil.example:1" {
		t.Fatalf("cafe's record: %+v", cafe)
	}
	if now, _ := a.Meta.Node(ctx, "desk"); now.Role != "device" || now.Addr != desk.Addr || now.Registered != desk.Registered {
		t.Fatalf("desk's record changed: %+v, was %+v", now, desk)
	}
	// Its lease is held for it: no report for a lease, and it is offline.
	start := time.Now()
	waitNode(t, a.Meta, "cafe", meta.NodeOffline, regLease+2*time.Second)
	t.Logf("offline %v after its last report (lease %v)", time.Since(start), regLease)
}

// A node whose registrar stops reports to another device, named in the
// registrar's replies.
func TestRegistrarFailover(t *testing.T) {
	ctx := context.Background()
	a, as := firstDevice(t)
	lhome := joinAs(t, a, pki.Device, "laptop")
	l, err := Open(ctx, lhome, Options{NoPassphrase: true, Logger: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ls := serveDevice(t, l)
	waitNode(t, a.Meta, "laptop", meta.NodeOnline, 5*time.Second)

	home := joinAs(t, a, pki.Surrogate, "cafe")
	kiosk := joinAs(t, a, pki.Surrogate, "kiosk")
	serveStandalone(t, home, StandaloneOptions{})
	waitNode(t, a.Meta, "cafe", meta.NodeOnline, 5*time.Second)
	st, err := loadRegistrarState(home)
	if err != nil || !slices.Equal(st.Registrars, []string{as.addr, ls.addr}) {
		t.Fatalf("registrars known: %+v %v", st, err)
	}
	if err := as.stop(); err != nil {
		t.Fatal(err)
	}
	// desk ended the lease it held; cafe reports to laptop within a third
	// of its lease.
	deadline := time.Now().Add(regLease + 3*time.Second)
	for {
		st, err := loadRegistrarState(home)
		rec, _ := l.Meta.Node(ctx, "cafe")
		if err == nil && len(st.Registrars) > 0 && st.Registrars[0] == ls.addr && rec != nil && rec.State == meta.NodeOnline {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover: %+v %+v", st, rec)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A node that knows only the stopped device reaches none; told
	// another registrar, it registers there.
	var got string
	ks := run(t, func(ctx context.Context, ready func(string)) error {
		return ServeStandalone(ctx, kiosk, StandaloneOptions{Listen: "127.0.0.1:0", Lease: regLease, Logger: testLog(),
			Ready: func(_, reg string) { got = reg; ready(reg) }})
	})
	if got != "" {
		t.Fatalf("kiosk reached registrar %q", got)
	}
	ks.stop()
	ks = run(t, func(ctx context.Context, ready func(string)) error {
		return ServeStandalone(ctx, kiosk, StandaloneOptions{Listen: "127.0.0.1:0", Lease: regLease, Logger: testLog(), Registrars: []string{ls.addr},
			Ready: func(_, reg string) { got = reg; ready(reg) }})
	})
	if got != ls.addr {
		t.Fatalf("kiosk told of laptop reached %q", got)
	}
	waitNode(t, l.Meta, "kiosk", meta.NodeOnline, time.Second)
}

// A benefactor has power states too: `node standby` in its home (its
// control socket) drains its chunk service and has its registrar record
// the standby (a report with standby): it reads standby, not offline,
// past two leases, and readers treat it as a device in standby (the
// director does not dial it); `node resume` reports again, awake.
func TestBenefactorStandby(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	home := joinAs(t, a, pki.Benefactor, "donor")
	bs := serveStandalone(t, home, StandaloneOptions{})
	waitNode(t, a.Meta, "donor", meta.NodeAwake, 5*time.Second)
	laptop := joinAs(t, a, pki.Device, "laptop")
	rs := dialNode(t, laptop, bs.addr, "donor")
	if _, err := rs.Has(ctx, []cairn.ID{{1}}); err != nil {
		t.Fatal(err)
	}

	rep, err := Control(ctx, home, "standby")
	if err != nil || rep.State != meta.NodeStandby || rep.Node != "donor" {
		t.Fatalf("standby: %+v %v", rep, err)
	}
	rec := waitNode(t, a.Meta, "donor", meta.NodeStandby, 5*time.Second)
	if rec.Standby == 0 || rec.Role != "benefactor" {
		t.Fatalf("standby record: %+v", rec)
	}
	if _, err := rs.Has(ctx, []cairn.ID{{1}}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("a chunk request to a benefactor in standby: %v", err)
	}
	if _, err := a.dir().OpenNode(ctx, "donor"); !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "standby") {
		t.Fatalf("the director opens a benefactor in standby: %v", err)
	}
	// No reports while asleep, and the registrar's lease is over: it stays
	// standby past two leases.
	time.Sleep(2 * regLease)
	if rec2 := waitNode(t, a.Meta, "donor", meta.NodeStandby, time.Second); rec2.Standby != rec.Standby {
		t.Fatalf("after two leases: %+v", rec2)
	}

	if rep, err = Control(ctx, home, "resume"); err != nil || rep.State != meta.NodeAwake {
		t.Fatalf("resume: %+v %v", rep, err)
	}
	if rec := waitNode(t, a.Meta, "donor", meta.NodeAwake, 5*time.Second); rec.Standby != 0 {
		t.Fatalf("resumed record: %+v", rec)
	}
	if _, err := rs.Has(ctx, []cairn.ID{{1}}); err != nil {
		t.Fatalf("a chunk request after resume: %v", err)
	}
	// Stopped while in standby, it stays standby (it does not say it leaves).
	if _, err := Control(ctx, home, "standby"); err != nil {
		t.Fatal(err)
	}
	if err := bs.stop(); err != nil {
		t.Fatal(err)
	}
	waitNode(t, a.Meta, "donor", meta.NodeStandby, time.Second)
}
