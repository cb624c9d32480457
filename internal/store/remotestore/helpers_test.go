package remotestore

import (
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node"
	"cairn.dev/cairn/internal/pki"
)

// realm is a CA with a revocation list, for tests.
type realm struct {
	ca  *pki.CA
	rev *pki.RevocationList
}

func newRealm(t testing.TB) *realm {
	t.Helper()
	ca, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	return &realm{ca: ca, rev: pki.NewRevocationList()}
}

func (r *realm) creds(t testing.TB, name string, role pki.Role) *pki.Credentials {
	t.Helper()
	c, err := r.ca.NewCredentials(pki.NodeIdentity{Realm: r.ca.Realm, Name: name, Role: role}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts a node named name serving st on 127.0.0.1 and returns its
// address. The node and st are closed when the test ends.
func (r *realm) serve(t testing.TB, name string, st cairn.Store) string {
	t.Helper()
	addr, _ := r.serveWith(t, name, st, nil)
	return addr
}

// serveWith is serve with the handler wrapped by wrap (if not nil); its
// listener counts the TCP connections the node accepts and the bytes it
// receives.
func (r *realm) serveWith(t testing.TB, name string, st cairn.Store, wrap func(http.Handler) http.Handler) (string, *countingListener) {
	t.Helper()
	tlsConf, err := node.ServerTLS(r.creds(t, name, pki.Device))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := node.NewServer(node.Config{Store: st, Realm: r.ca.Realm, Revocations: r.rev}, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		srv.Handler = wrap(srv.Handler)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: l}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
		st.Close()
	})
	return ln.Addr().String(), ln
}

type countingListener struct {
	net.Listener
	accepted atomic.Int64
	received atomic.Int64 // bytes read from every connection: TLS records, as on the wire
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &countingConn{Conn: c, n: &l.received}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// client opens a remote store on addr as a device named name, expecting the
// node to be named node.
func (r *realm) client(t testing.TB, addr, name, nodeName string) *Store {
	t.Helper()
	return r.clientAs(t, addr, r.creds(t, name, pki.Device), nodeName)
}

func (r *realm) clientAs(t testing.TB, addr string, c *pki.Credentials, nodeName string) *Store {
	t.Helper()
	cfg, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: r.rev, Peer: pki.RequireNode(nodeName)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Addr: addr, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
