package pki

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

// whoami answers with the verified client's identity, or 401.
var whoami = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	id, _, err := PeerIdentity(r.TLS)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	fmt.Fprintf(w, "%s %s %s", id.Name, id.Role, r.Proto)
})

func get(c *http.Client, addr string) (string, error) {
	resp, err := c.Get("https://" + addr + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", resp.Status, b)
	}
	return string(b), nil
}

func srvTLS(t *testing.T, c *Credentials, o TLSOptions) *tls.Config {
	t.Helper()
	cfg, err := ServerTLS(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func cliTLS(t *testing.T, c *Credentials, o TLSOptions) *tls.Config {
	t.Helper()
	cfg, err := ClientTLS(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestMutualTLS(t *testing.T) {
	ca := newCA(t, "r1")
	srvCreds := creds(t, ca, "server", Device)
	rev := NewRevocationList()
	addr := serve(t, whoami, srvTLS(t, srvCreds, TLSOptions{Revocations: rev, RequireClientCert: true}))

	dev := creds(t, ca, "laptop", Device)
	c := client(t, cliTLS(t, dev, TLSOptions{Revocations: rev, Peer: RequireNode("server")}))
	got, err := get(c, addr)
	if err != nil || got != "laptop device HTTP/2.0" {
		t.Fatalf("device client: %q, %v", got, err)
	}

	t.Run("NoClientCert", func(t *testing.T) {
		cfg := cliTLS(t, dev, TLSOptions{Revocations: rev})
		cfg.Certificates = nil
		if _, err := get(client(t, cfg), addr); err == nil {
			t.Fatal("a client without a certificate was served")
		}
	})
	t.Run("OtherCA", func(t *testing.T) {
		// Same realm ID, same node name, different CA.
		other := newCA(t, "r1")
		intruder := creds(t, other, "laptop", Device)
		if _, err := get(client(t, cliTLS(t, intruder, TLSOptions{Revocations: rev})), addr); err == nil {
			t.Fatal("a client with another CA's certificate was served")
		}
		// And a client of our realm refuses a server of the other CA.
		otherAddr := serve(t, whoami, srvTLS(t, creds(t, other, "server", Device), TLSOptions{Revocations: rev}))
		_, err := get(client(t, cliTLS(t, dev, TLSOptions{Revocations: rev})), otherAddr)
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("client to a server of another CA: %v", err)
		}
	})
	t.Run("OtherRealmSameCAKeyNever", func(t *testing.T) {
		// A certificate naming another realm, signed by our CA, is refused
		// by Admit (the CA only issues for its own realm, but belt and braces).
		leaf := certWith(t, ca, "x", "cairn://realm/r2/node/x?role=device")
		if _, err := Admit("r1", leaf, rev); !errors.Is(err, cairn.ErrPermission) {
			t.Fatalf("Admit of a foreign realm's node: %v", err)
		}
	})
	t.Run("WrongServerName", func(t *testing.T) {
		cfg := cliTLS(t, dev, TLSOptions{Revocations: rev, Peer: RequireNode("elsewhere")})
		if _, err := get(client(t, cfg), addr); err == nil || !strings.Contains(err.Error(), "expected node elsewhere") {
			t.Fatalf("client expecting another node: %v", err)
		}
	})
	t.Run("Revoked", func(t *testing.T) {
		gone := creds(t, ca, "stolen", Device)
		cg := client(t, cliTLS(t, gone, TLSOptions{Revocations: NoRevocations{}}))
		if _, err := get(cg, addr); err != nil {
			t.Fatalf("before revocation: %v", err)
		}
		if err := rev.RevokeName("stolen"); err != nil {
			t.Fatal(err)
		}
		cg.Transport.(*http.Transport).CloseIdleConnections()
		if _, err := get(cg, addr); err == nil {
			t.Fatal("revoked client served on a new connection")
		}
		// In TLS 1.3 the server refuses a client certificate after the
		// client's side of the handshake is done: HTTP may see an alert or
		// a broken pipe. Read the alert by hand.
		conn, err := tls.Dial("tcp", addr, cliTLS(t, gone, TLSOptions{Revocations: NoRevocations{}}))
		if err == nil {
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "bad certificate") {
			t.Fatalf("revoked client on a raw connection: %v, want the server's bad certificate alert", err)
		}
		// A client refuses a revoked server too.
		if rerr := rev.RevokeSerial(srvCreds.Leaf.SerialNumber); rerr != nil {
			t.Fatal(rerr)
		}
		_, err = get(client(t, cliTLS(t, dev, TLSOptions{Revocations: rev})), addr)
		if err == nil || !strings.Contains(err.Error(), "revoked") {
			t.Fatalf("client to a revoked server: %v", err)
		}
	})
}

func TestRolePolicyAndAnonymous(t *testing.T) {
	ca := newCA(t, "r1")
	srv := creds(t, ca, "server", Device)
	// Only devices at the handshake.
	addr := serve(t, whoami, srvTLS(t, srv, TLSOptions{Revocations: NoRevocations{}, Peer: RequireRole(Device)}))
	for _, role := range []Role{Benefactor, Surrogate} {
		c := client(t, cliTLS(t, creds(t, ca, "n-"+string(role), role), TLSOptions{Revocations: NoRevocations{}}))
		if _, err := get(c, addr); err == nil {
			t.Errorf("a %s passed RequireRole(Device)", role)
		}
	}
	// Without RequireClientCert, an anonymous client completes the
	// handshake and the handler sees no identity.
	dev := creds(t, ca, "d", Device)
	cfg := cliTLS(t, dev, TLSOptions{Revocations: NoRevocations{}})
	cfg.Certificates = nil
	if _, err := get(client(t, cfg), addr); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("anonymous client: %v, want 401 from the handler", err)
	}
	// TLS 1.2 is refused.
	cfg = cliTLS(t, dev, TLSOptions{Revocations: NoRevocations{}})
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, err := get(client(t, cfg), addr); err == nil {
		t.Fatal("a TLS 1.2 client was served")
	}
	if _, err := ServerTLS(srv, TLSOptions{}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("ServerTLS without a revocation source: %v", err)
	}
}
