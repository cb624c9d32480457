package node

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// fakeRegistrar records what it is given and answers err, if set.
type fakeRegistrar struct {
	mu    sync.Mutex
	peers []pki.NodeIdentity
	reps  []wire.Report
	err   error
}

func (f *fakeRegistrar) Register(ctx context.Context, peer pki.NodeIdentity, rep wire.Report) (wire.RegisterReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return wire.RegisterReply{}, f.err
	}
	f.peers, f.reps = append(f.peers, peer), append(f.reps, rep)
	return wire.RegisterReply{Lease: rep.Lease, Registrars: []string{"desk:7461"}}, nil
}

func report(addr string) []byte {
	return wire.EncodeReport(wire.Report{Addr: addr, Capacity: 100, Free: 50, Used: 7, Lease: int64(3 * time.Second)})
}

// The register route: benefactors and surrogates only, identity from the
// certificate alone, the body bounded and checked, the registrar's error
// Kind carried to the peer.
func TestRegisterRoute(t *testing.T) {
	reg := &fakeRegistrar{}
	f := start(t, func(c *Config) { c.Registrar = reg })
	for _, role := range []pki.Role{pki.Benefactor, pki.Surrogate} {
		c := f.client(t, f.creds(t, "x-"+string(role), role))
		// A body that claims another name and role: they are not part of a
		// report.
		body := wire.Compress(nil, []byte(`{"name":"desk","role":"device","addr":"h:1","lease":3000000000}`))
		r := f.do(t, c, "POST", wire.PathRegister, body, zstdHdr, wire.Zstd)
		if r.status != 200 {
			t.Fatalf("%s register: %d %v", role, r.status, r.err())
		}
		rep, err := wire.DecodeRegisterReply(r.body)
		if err != nil || len(rep.Registrars) != 1 || rep.Lease != int64(3*time.Second) {
			t.Fatalf("%s reply: %+v %v", role, rep, err)
		}
		reg.mu.Lock()
		got := reg.peers[len(reg.peers)-1]
		reg.mu.Unlock()
		if got.Name != "x-"+string(role) || got.Role != role || got.Realm != "r1" {
			t.Fatalf("registrar was told %+v", got)
		}
		if !Allowed(role, OpRegister) {
			t.Fatalf("Allowed(%s, register)", role)
		}
	}
	// A device registers in the metadata itself: refused here.
	dev := f.client(t, f.creds(t, "laptop", pki.Device))
	if Allowed(pki.Device, OpRegister) {
		t.Fatal("Allowed(device, register)")
	}
	if r := f.do(t, dev, "POST", wire.PathRegister, report("h:1"), zstdHdr, wire.Zstd); r.status != 403 || !errors.Is(r.err(), cairn.ErrPermission) {
		t.Fatalf("device register: %d %v", r.status, r.err())
	}
	ben := f.client(t, f.creds(t, "donor", pki.Benefactor))
	for _, tc := range []struct {
		name   string
		method string
		body   []byte
		hdr    []string
		status int
	}{
		{"uncompressed", "POST", []byte(`{"addr":"h:1","lease":3000000000}`), nil, 415},
		{"garbage", "POST", []byte("not zstd"), []string{zstdHdr, wire.Zstd}, 400},
		{"no address", "POST", report(""), []string{zstdHdr, wire.Zstd}, 400},
		{"huge body", "POST", make([]byte, wire.MaxReport+1), []string{zstdHdr, wire.Zstd}, 413},
		{"bomb", "POST", wire.Compress(nil, make([]byte, 1<<20)), []string{zstdHdr, wire.Zstd}, 400},
		{"wrong method", "GET", nil, nil, 405},
	} {
		r := f.do(t, ben, tc.method, wire.PathRegister, tc.body, tc.hdr...)
		if r.status != tc.status {
			t.Errorf("%s: %d %v, want %d", tc.name, r.status, r.err(), tc.status)
		}
	}
	// The registrar's verdict keeps its Kind.
	for _, tc := range []struct {
		err    error
		status int
		is     error
	}{
		{cairn.E("register node", cairn.Permission, "donor", errors.New("removed")), 403, cairn.ErrPermission},
		{cairn.E("register node", cairn.Unavailable, "donor", errors.New("etcd")), 503, cairn.ErrUnavailable},
	} {
		reg.mu.Lock()
		reg.err = tc.err
		reg.mu.Unlock()
		r := f.do(t, ben, "POST", wire.PathRegister, report("h:1"), zstdHdr, wire.Zstd)
		if r.status != tc.status || !errors.Is(r.err(), tc.is) {
			t.Errorf("registrar error %v: %d %v", tc.err, r.status, r.err())
		}
	}
	// Benefactors still open no chunk operation (TestUntrustedRolesRefused),
	// and a node without a registrar has no such endpoint.
	g := start(t, nil)
	if r := g.do(t, g.client(t, g.creds(t, "donor", pki.Benefactor)), "POST", wire.PathRegister, report("h:1"), zstdHdr, wire.Zstd); r.status != 404 {
		t.Fatalf("register without a registrar: %d %v", r.status, r.err())
	}
}

// failingRevocations cannot answer: its source is lost.
type failingRevocations struct{}

func (failingRevocations) Revoked(*x509.Certificate) (bool, error) {
	return true, cairn.E("watch revocations", cairn.Unavailable, "", errors.New("lost the metadata service"))
}

// While the revocation list cannot be trusted, every request is refused
// with 503: an outage, not a removal. A revoked certificate finishes the
// handshake (ServerTLS) and is refused with an authenticated 403; a
// standalone node dialing a registrar (HandshakeRevocations) refuses a
// revoked one at the handshake, and lets one through while its list is
// unknown.
func TestRevocationsUnavailable(t *testing.T) {
	f := start(t, func(c *Config) { c.Revocations = failingRevocations{}; c.Registrar = &fakeRegistrar{} })
	dev := f.client(t, f.creds(t, "laptop", pki.Device))
	r := f.do(t, dev, "GET", wire.PathStats, nil)
	if r.status != http.StatusServiceUnavailable || !errors.Is(r.err(), cairn.ErrUnavailable) {
		t.Fatalf("stats while the list is lost: %d %v", r.status, r.err())
	}
	ben := f.client(t, f.creds(t, "donor", pki.Benefactor))
	if r := f.do(t, ben, "POST", wire.PathRegister, report("h:1"), zstdHdr, wire.Zstd); r.status != http.StatusServiceUnavailable {
		t.Fatalf("register while the list is lost: %d %v", r.status, r.err())
	}
	if r := f.do(t, f.client(t, nil), "GET", wire.PathStats, nil); r.status != http.StatusUnauthorized {
		t.Fatalf("anonymous: %d", r.status)
	}

	// Every certificate of "gone" is issued before the name is revoked: a
	// name's revocation covers the certificates issued until then, to the
	// second (x509 times), so one issued after it may pass.
	rev := pki.NewRevocationList()
	g := start(t, func(c *Config) { c.Revocations = rev })
	gone := f.creds(t, "gone", pki.Device)
	goneAtG := g.client(t, g.creds(t, "gone", pki.Device))
	if err := rev.RevokeName("gone"); err != nil {
		t.Fatal(err)
	}
	h := HandshakeRevocations(rev)
	if ok, err := h.Revoked(gone.Leaf); !ok || err != nil {
		t.Fatalf("revoked certificate at the handshake: %v %v", ok, err)
	}
	if ok, err := HandshakeRevocations(failingRevocations{}).Revoked(gone.Leaf); ok || err != nil {
		t.Fatalf("unanswerable list at the handshake: %v %v", ok, err)
	}
	// The revoked device finishes the handshake and is refused, 403.
	r, err := g.try(goneAtG, "GET", wire.PathStats, nil)
	if err != nil || r.status != http.StatusForbidden || !errors.Is(r.err(), cairn.ErrPermission) || !strings.Contains(r.err().Error(), "revoked") {
		t.Fatalf("revoked device: %+v %v", r, err)
	}
}
