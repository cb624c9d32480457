package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"testing"
	"time"
)

// newCA creates a CA for realm in a fresh directory.
func newCA(t *testing.T, realm string) *CA {
	t.Helper()
	ca, err := CreateCA(t.TempDir(), realm)
	if err != nil {
		t.Fatalf("CreateCA: %v", err)
	}
	return ca
}

func creds(t *testing.T, ca *CA, name string, role Role) *Credentials {
	t.Helper()
	c, err := ca.NewCredentials(NodeIdentity{Realm: ca.Realm, Name: name, Role: role}, IssueOptions{})
	if err != nil {
		t.Fatalf("NewCredentials %s: %v", name, err)
	}
	return c
}

// serve runs an HTTP/2-only server with cfg on 127.0.0.1 and returns its
// address; it stops when the test ends.
func serve(t *testing.T, h http.Handler, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	srv := &http.Server{Handler: h, TLSConfig: cfg, Protocols: &protos, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: discardLog()}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	})
	return ln.Addr().String()
}

// client returns an HTTP/2-only client with cfg.
func client(t *testing.T, cfg *tls.Config) *http.Client {
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: &protos}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func discardLog() *log.Logger { return log.New(io.Discard, "", 0) }

func mustCSR(t *testing.T, key crypto.Signer, cn string) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
