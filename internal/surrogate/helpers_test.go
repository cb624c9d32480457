package surrogate

import (
	"crypto/rand"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/pki"
)

// fixture is a surrogate served over mutual TLS on 127.0.0.1, in realm r1.
type fixture struct {
	t    testing.TB
	ca   *pki.CA
	dir  string
	cfg  Config
	srv  *Server
	addr string
}

func start(t testing.TB, tune func(*Config)) *fixture {
	t.Helper()
	ca, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ca: ca, dir: t.TempDir()}
	f.cfg = Config{Dir: f.dir, Offer: 1 << 20, Realm: "r1", Revocations: pki.NoRevocations{}}
	if tune != nil {
		tune(&f.cfg)
	}
	f.serve()
	return f
}

// serve starts (or, after a crash, restarts) the service on the same
// directory.
func (f *fixture) serve() {
	t := f.t
	t.Helper()
	srv, err := NewServer(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	tlsConf, err := pki.ServerTLS(f.creds("sur", pki.Surrogate), pki.TLSOptions{Revocations: pki.NoRevocations{}})
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	hs := &http.Server{Handler: srv, TLSConfig: tlsConf, Protocols: &protos}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		hs.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
		srv.Close()
	})
}

func (f *fixture) creds(name string, role pki.Role) *pki.Credentials {
	f.t.Helper()
	c, err := f.ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: name, Role: role}, pki.IssueOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// client is a device's client of the surrogate.
func (f *fixture) client(name string) *Client {
	return f.clientAs(name, pki.Device)
}

func (f *fixture) clientAs(name string, role pki.Role) *Client {
	f.t.Helper()
	tlsConf, err := ClientTLS(f.creds(name, role), pki.NoRevocations{})
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := NewClient(f.addr, tlsConf)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(c.Close)
	return c
}

func (f *fixture) register(c *Client) *Session {
	f.t.Helper()
	s, err := c.Register(f.t.Context(), 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

// chunk is a real chunk: a random plaintext encoded by the pipeline
// (compressed, sealed with its convergent key), named by the hash of its
// ciphertext.
type chunk struct {
	plain  []byte
	ref    manifest.Ref
	stored []byte
}

func newChunk(t *testing.T, n int) chunk {
	t.Helper()
	var conv [32]byte
	plain := make([]byte, n)
	rand.Read(plain)
	ref, stored := pipeline.EncodeChunk(conv, plain)
	return chunk{plain: plain, ref: ref, stored: stored}
}

func (c chunk) obj() Object { return Object{ID: c.ref.ID, Data: c.stored} }

func objs(cs ...chunk) []Object {
	var o []Object
	for _, c := range cs {
		o = append(o, c.obj())
	}
	return o
}

func wantKind(t *testing.T, what string, err error, k cairn.Kind) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, k)
	}
	if cairn.KindOf(err) != k {
		t.Fatalf("%s: %v (kind %v), want kind %v", what, err, cairn.KindOf(err), k)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
