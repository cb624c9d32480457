package node

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/memstore"
)

// fixture is a node serving a memstore over loopback, in realm "r1".
type fixture struct {
	ca    *pki.CA
	rev   *pki.RevocationList
	store *memstore.Store
	addr  string
}

func start(t *testing.T, tune func(*Config)) *fixture {
	t.Helper()
	ca, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ca: ca, rev: pki.NewRevocationList(), store: memstore.New()}
	cfg := Config{Store: f.store, Realm: "r1", Revocations: f.rev}
	if tune != nil {
		tune(&cfg)
	}
	// As the product's nodes: revocations are checked per request only.
	tlsConf, err := ServerTLS(f.creds(t, "node", pki.Benefactor))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
		f.store.Close()
	})
	return f
}

func (f *fixture) creds(t *testing.T, name string, role pki.Role) *pki.Credentials {
	t.Helper()
	c, err := f.ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: name, Role: role}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// client returns an HTTP/2 client presenting c (nil: no certificate).
func (f *fixture) client(t *testing.T, c *pki.Credentials) *http.Client {
	t.Helper()
	if c == nil {
		c = f.creds(t, "anon", pki.Device)
		cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = nil
		return httpClient(t, cfg)
	}
	cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}})
	if err != nil {
		t.Fatal(err)
	}
	return httpClient(t, cfg)
}

func httpClient(t *testing.T, cfg *tls.Config) *http.Client {
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: &protos}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

type reply struct {
	status int
	header http.Header
	body   []byte
	proto  int
}

// err decodes the reply's error body.
func (r reply) err() error {
	return wire.DecodeError(r.status, r.header.Get("Content-Encoding"), r.body)
}

func (f *fixture) do(t *testing.T, c *http.Client, method, path string, body []byte, hdr ...string) reply {
	t.Helper()
	rep, err := f.try(c, method, path, body, hdr...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return rep
}

func (f *fixture) try(c *http.Client, method, path string, body []byte, hdr ...string) (reply, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "https://"+f.addr+path, rd)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, proto: resp.ProtoMajor}, err
}

const zstdHdr = "Content-Encoding"

func idsBody(ids ...cairn.ID) []byte { return wire.EncodeIDs(ids) }
