package remotestore

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// The whole path a new machine takes: a device of the realm serves its
// store and the join exchange on one listener; a new device joins with a
// token (and receives its payload), then stores and fetches chunks there;
// a surrogate that joined is refused; once removed, the device is refused.
func TestJoinThenUseNode(t *testing.T) {
	r := newRealm(t)
	tokens := pki.NewTokenList()
	auth := &pki.Authority{CA: r.ca, Tokens: tokens}
	home := r.creds(t, "home", pki.Device)
	tlsConf, err := node.ServerTLS(home)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := node.NewServer(node.Config{Store: memstore.New(), Realm: r.ca.Realm, Revocations: r.rev, Join: auth.JoinHandler()}, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })
	auth.Addr = ln.Addr().String()

	keys := []byte("volume keys")
	tok, err := auth.NewToken(bg, pki.Device, "laptop", 10*time.Minute, keys)
	if err != nil {
		t.Fatal(err)
	}
	laptop, payload, err := pki.Join(bg, tok, pki.JoinOptions{})
	if err != nil || !bytes.Equal(payload, keys) {
		t.Fatalf("Join: %q, %v", payload, err)
	}
	s := r.clientAs(t, auth.Addr, laptop, "home")
	defer s.Close()
	id, data := storetest.Blob(1, 5000)
	if perr := s.Put(bg, id, data); perr != nil {
		t.Fatal(perr)
	}
	if got, gerr := s.Get(bg, id); gerr != nil || !bytes.Equal(got, data) {
		t.Fatalf("Get: %v", gerr)
	}

	tok, err = auth.NewToken(bg, pki.Surrogate, "cafe-box", 10*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	cafe, payload, err := pki.Join(bg, tok, pki.JoinOptions{})
	if err != nil || payload != nil {
		t.Fatalf("surrogate Join: %q, %v", payload, err)
	}
	sur := r.clientAs(t, auth.Addr, cafe, "home")
	defer sur.Close()
	if _, gerr := sur.Get(bg, id); !errors.Is(gerr, cairn.ErrPermission) {
		t.Fatalf("surrogate Get: %v", gerr)
	}

	if rerr := r.rev.RevokeName("laptop"); rerr != nil {
		t.Fatal(rerr)
	}
	if _, gerr := s.Get(bg, id); !errors.Is(gerr, cairn.ErrPermission) {
		t.Fatalf("removed device Get: %v", gerr)
	}
	// Plain HTTP gets nothing (net/http answers 400 on a TLS port); the
	// health check stays open to all over TLS.
	resp, err := http.Get("http://" + auth.Addr + "/health")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP: %s", resp.Status)
		}
	}
	if err := sur.Health(bg); err != nil {
		t.Fatal(err)
	}
}
