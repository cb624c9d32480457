package pki

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

var bg = context.Background()

type realm struct {
	ca   *CA
	auth *Authority
	addr string
	hits atomic.Int64 // join requests that reached the handler
}

// newRealm starts a join endpoint served by a device of a fresh realm.
func newRealm(t *testing.T, tokens TokenStore) *realm {
	t.Helper()
	r := &realm{ca: newCA(t, "r1")}
	r.auth = &Authority{CA: r.ca, Tokens: tokens}
	inviter := creds(t, r.ca, "inviter", Device)
	mux := http.NewServeMux()
	jh := r.auth.JoinHandler()
	mux.Handle(JoinPath, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.hits.Add(1)
		jh.ServeHTTP(w, req)
	}))
	r.addr = serve(t, mux, srvTLS(t, inviter, TLSOptions{Revocations: NoRevocations{}}))
	r.auth.Addr = r.addr
	return r
}

func (r *realm) token(t *testing.T, role Role, name string, payload []byte) string {
	t.Helper()
	tok, err := r.auth.NewToken(bg, role, name, time.Hour, payload)
	if err != nil {
		t.Fatalf("NewToken: %v", err)
	}
	return tok
}

func TestJoinDevice(t *testing.T) {
	r := newRealm(t, NewTokenList())
	keys := []byte("volume keys: 32 bytes each, sealed end to end")
	tok := r.token(t, Device, "laptop", keys)
	c, payload, err := Join(bg, tok, JoinOptions{Name: "ignored", Hosts: []string{"laptop.lan", "192.0.2.4"}})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if c.Identity != (NodeIdentity{Realm: "r1", Name: "laptop", Role: Device}) {
		t.Fatalf("identity %+v", c.Identity)
	}
	if !bytes.Equal(payload, keys) {
		t.Fatalf("payload %q, want %q", payload, keys)
	}
	if len(c.Leaf.DNSNames) != 1 || len(c.Leaf.IPAddresses) != 1 {
		t.Fatalf("a device gets its hosts: DNS %v IP %v", c.Leaf.DNSNames, c.Leaf.IPAddresses)
	}
	if Fingerprint(c.CA) != r.ca.Fingerprint() {
		t.Fatal("joined with another CA")
	}
	// The new credentials work for mutual TLS with the realm.
	dir := t.TempDir()
	if serr := c.Save(dir); serr != nil {
		t.Fatal(serr)
	}
	c, err = LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, whoami, srvTLS(t, creds(t, r.ca, "srv", Device), TLSOptions{Revocations: NoRevocations{}, RequireClientCert: true}))
	if got, err := get(client(t, cliTLS(t, c, TLSOptions{Revocations: NoRevocations{}})), addr); err != nil || !strings.HasPrefix(got, "laptop device") {
		t.Fatalf("joined device over mTLS: %q, %v", got, err)
	}
}

func TestJoinUntrustedRoles(t *testing.T) {
	r := newRealm(t, NewTokenList())
	for _, role := range []Role{Benefactor, Surrogate} {
		if _, err := r.auth.NewToken(bg, role, "x", time.Hour, []byte("keys")); !errors.Is(err, cairn.ErrInvalid) {
			t.Fatalf("NewToken for a %s with a payload: %v, want Invalid", role, err)
		}
		tok := r.token(t, role, "", nil)
		c, payload, err := Join(bg, tok, JoinOptions{Name: "spare-" + string(role), Hosts: []string{"spare.lan", "192.0.2.9"}})
		if err != nil {
			t.Fatal(err)
		}
		if c.Identity.Role != role || c.Identity.Name != "spare-"+string(role) || payload != nil {
			t.Fatalf("joined %+v with payload %q", c.Identity, payload)
		}
		if len(c.Leaf.DNSNames)+len(c.Leaf.IPAddresses) != 0 {
			t.Fatalf("a %s got host SANs %v %v", role, c.Leaf.DNSNames, c.Leaf.IPAddresses)
		}
	}
	// No name in the token and none proposed.
	tok := r.token(t, Benefactor, "", nil)
	if _, _, err := Join(bg, tok, JoinOptions{}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Join without any name: %v, want Invalid", err)
	}
}

func TestJoinTokenUsedOnce(t *testing.T) {
	r := newRealm(t, NewTokenList())
	tok := r.token(t, Device, "d1", nil)
	if _, _, err := Join(bg, tok, JoinOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, err := Join(bg, tok, JoinOptions{})
	if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("second Join: %v, want Permission: already used", err)
	}

	// Many joiners at once: exactly one wins.
	tok = r.token(t, Benefactor, "b1", nil)
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range 8 {
		wg.Go(func() {
			if _, _, err := Join(bg, tok, JoinOptions{}); err == nil {
				ok.Add(1)
			} else if !errors.Is(err, cairn.ErrPermission) {
				t.Errorf("concurrent Join: %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d concurrent joins with one token succeeded, want 1", ok.Load())
	}
}

func TestJoinTokenExpires(t *testing.T) {
	r := newRealm(t, NewTokenList())
	tok := r.token(t, Device, "d1", nil)
	r.auth.now = func() time.Time { return time.Now().Add(time.Hour + time.Second) }
	_, _, err := Join(bg, tok, JoinOptions{})
	if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("Join with an expired token: %v, want Permission: expired", err)
	}
	if _, err := r.auth.NewToken(bg, Device, "d", 0, nil); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("NewToken with ttl 0: %v", err)
	}
	// An unknown token.
	other := newRealm(t, NewTokenList())
	tok = other.token(t, Device, "d2", nil)
	pt, _ := ParseToken(tok)
	pt.Addr = r.addr
	pt.CAFingerprint = r.ca.Fingerprint()
	if _, _, err := Join(bg, pt.String(), JoinOptions{}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Join with an unknown token: %v, want NotFound", err)
	}
}

// joinRequest builds a valid request for tok, as Join would.
func joinRequest(t *testing.T, tok string) (Token, JoinRequest) {
	t.Helper()
	pt, err := ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := newKey()
	csr := mustCSR(t, key, "joiner")
	mk := pt.MACKey()
	return pt, JoinRequest{Format: joinFormat, Token: pt.IDString(), CSR: csr, MAC: requestMAC(mk[:], pt.IDString(), csr)}
}

func TestJoinTampered(t *testing.T) {
	r := newRealm(t, NewTokenList())
	tok := r.token(t, Benefactor, "", nil)
	pt, good := joinRequest(t, tok)

	csr := bytes.Clone(good.CSR)
	csr[len(csr)/2] ^= 1
	badCSR := good
	badCSR.CSR = csr
	badMAC := good
	badMAC.MAC = bytes.Clone(good.MAC)
	badMAC.MAC[0] ^= 1
	otherCSR := good
	k2, _ := newKey()
	otherCSR.CSR = mustCSR(t, k2, "joiner") // a valid CSR, but not the one the MAC covers
	for name, req := range map[string]JoinRequest{"csr": badCSR, "mac": badMAC, "swapped csr": otherCSR} {
		if _, err := r.auth.Redeem(bg, req); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("Redeem with tampered %s: %v, want Permission", name, err)
		}
	}
	// A CSR whose own signature fails, with a MAC that covers it (only a
	// token holder could make one): Invalid.
	mk := pt.MACKey()
	broken := good
	broken.CSR = csr
	broken.MAC = requestMAC(mk[:], pt.IDString(), csr)
	if _, err := r.auth.Redeem(bg, broken); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("Redeem with a broken CSR: %v, want Invalid", err)
	}
	// Failed attempts did not burn the token.
	resp, err := r.auth.Redeem(bg, good)
	if err != nil {
		t.Fatalf("Redeem after failed attempts: %v", err)
	}
	// A tampered response is refused by the joiner.
	key, _ := newKey()
	for _, field := range []string{"cert", "ca", "mac"} {
		bad := *resp
		switch field {
		case "cert":
			bad.Cert = bytes.Clone(resp.Cert)
			bad.Cert[40] ^= 1
		case "ca":
			bad.CA = bytes.Clone(resp.CA)
			bad.CA[40] ^= 1
		case "mac":
			bad.MAC = bytes.Clone(resp.MAC)
			bad.MAC[3] ^= 1
		}
		if _, _, err := openJoinResponse(pt, key, &bad); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("tampered response %s: %v, want Permission", field, err)
		}
	}
}

func TestJoinPayloadSealed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	tl, err := OpenTokenList(path)
	if err != nil {
		t.Fatal(err)
	}
	r := newRealm(t, tl)
	secret := []byte("the volume master key is 0123456789abcdef")
	tok := r.token(t, Device, "phone", secret)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v", fi.Mode().Perm())
	}
	if bytes.Contains(b, secret) || bytes.Contains(b, []byte("master key")) {
		t.Fatal("the token file holds the payload in the clear")
	}
	pt, _ := ParseToken(tok)
	rec, err := tl.Get(bg, pt.IDString())
	if err != nil {
		t.Fatal(err)
	}
	// The server's record alone (MAC key, sealed payload) does not open it.
	var fake Token
	copy(fake.ID[:], pt.ID[:])
	copy(fake.Secret[:], rec.MACKey)
	if _, oerr := openPayload(fake, Device, rec.Payload); oerr == nil {
		t.Fatal("payload opened with the record's MAC key")
	}
	if _, oerr := openPayload(pt, Surrogate, rec.Payload); oerr == nil {
		t.Fatal("payload opened under another role")
	}
	_, got, err := Join(bg, tok, JoinOptions{})
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("Join: %q, %v", got, err)
	}
	// Once used, the record keeps no payload, also in a reopened list.
	tl2, err := OpenTokenList(path)
	if err != nil {
		t.Fatal(err)
	}
	rec, err = tl2.Get(bg, pt.IDString())
	if err != nil || rec.Payload != nil || rec.Used.IsZero() || rec.UsedBy != "phone" {
		t.Fatalf("used record: %+v, %v", rec, err)
	}
}

func TestJoinMITM(t *testing.T) {
	r := newRealm(t, NewTokenList())
	tok := r.token(t, Device, "d1", []byte("keys"))
	pt, _ := ParseToken(tok)

	// A man in the middle with his own CA (same realm ID, same names).
	evil := newRealm(t, NewTokenList())
	pt.Addr = evil.addr
	_, _, err := Join(bg, pt.String(), JoinOptions{})
	if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "pins") {
		t.Fatalf("Join through a substituted CA: %v, want Permission", err)
	}
	// One that also presents the real CA certificate in its chain (public
	// knowledge) but whose leaf the real CA did not sign.
	fake := creds(t, evil.ca, "inviter", Device)
	fake.CA = r.ca.Cert
	mux := http.NewServeMux()
	var hits atomic.Int64
	mux.HandleFunc(JoinPath, func(http.ResponseWriter, *http.Request) { hits.Add(1) })
	pt.Addr = serve(t, mux, srvTLS(t, fake, TLSOptions{Revocations: NoRevocations{}}))
	if _, _, err = Join(bg, pt.String(), JoinOptions{}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("Join through a forged chain: %v, want Permission", err)
	}
	// A benefactor of the real realm cannot play join endpoint either.
	pt.Addr = serve(t, mux, srvTLS(t, creds(t, r.ca, "spare", Benefactor), TLSOptions{Revocations: NoRevocations{}}))
	if _, _, err = Join(bg, pt.String(), JoinOptions{}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("Join through a benefactor: %v, want Permission", err)
	}
	if evil.hits.Load() != 0 || hits.Load() != 0 {
		t.Fatal("a join request reached a server the token does not pin")
	}
	// The real endpoint still accepts the token.
	if _, _, err := Join(bg, tok, JoinOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestParseToken(t *testing.T) {
	r := newRealm(t, NewTokenList())
	tok := r.token(t, Device, "d", nil)
	pt, err := ParseToken(" " + tok + "\n")
	if err != nil || pt.Addr != r.addr || pt.CAFingerprint != r.ca.Fingerprint() || pt.String() != tok {
		t.Fatalf("ParseToken = %+v, %v", pt, err)
	}
	for i := len(TokenPrefix); i < len(tok); i++ {
		b := []byte(tok)
		b[i] = 'A' + (b[i]+1)%26
		if b[i] == tok[i] {
			continue
		}
		if _, err := ParseToken(string(b)); !errors.Is(err, cairn.ErrInvalid) {
			t.Fatalf("ParseToken with byte %d changed: %v", i, err)
		}
	}
	for _, bad := range []string{"", "cairn-join-v1-", "cairn-join-v2-AAAA", tok[:len(tok)-3]} {
		if _, err := ParseToken(bad); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("ParseToken(%q): %v", bad, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	t := Token{Addr: "127.0.0.1:7000"}
	f.Add(t.String())
	f.Add("cairn-join-v1-AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		pt, err := ParseToken(s)
		if err != nil {
			return
		}
		if again, err := ParseToken(pt.String()); err != nil || again != pt {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}

// FuzzJoinHandler drives the join endpoint with arbitrary bodies: it never
// panics, never issues a certificate, and answers 4xx.
func FuzzJoinHandler(f *testing.F) {
	ca, err := CreateCA(f.TempDir(), "r1")
	if err != nil {
		f.Fatal(err)
	}
	a := &Authority{CA: ca, Tokens: NewTokenList(), Addr: "127.0.0.1:1"}
	tok, err := a.NewToken(bg, Device, "d", time.Hour, []byte("k"))
	if err != nil {
		f.Fatal(err)
	}
	pt, _ := ParseToken(tok)
	f.Add([]byte(`{"format":1,"token":"` + pt.IDString() + `","csr":"AAAA","mac":"AAAA"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"format":1,"token":"` + pt.IDString() + `"}{}`))
	h := a.JoinHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, JoinPath, bytes.NewReader(body)))
		if w.Code < 400 || w.Code >= 500 {
			t.Fatalf("status %d for %q", w.Code, body)
		}
	})
}
