package surrogate

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
)

// FuzzDecoders feeds every request and reply decoder arbitrary bytes: none
// may panic, and what one accepts must meet its checks.
func FuzzDecoders(f *testing.F) {
	f.Add([]byte(`{"format":1,"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
	f.Add([]byte(`{"format":1,"client":"00112233445566778899aabbccddeeff","quota":5,"sealed":"","expires":"2026-01-01T00:00:00Z","lease_ms":1,"now":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"format":1,"used":1,"chunks":1,"quota":2}`))
	f.Add([]byte(`{"format":1,"offer":1,"free":1,"quota":1,"lease_ms":1,"clients":0}`))
	f.Add(AppendObject(nil, cairn.ID{1}, []byte("abc")))
	f.Add(EncodeIDs([]cairn.ID{{1}, {2}}))
	f.Add([]byte("00112233445566778899aabbccddeeff"))
	f.Add([]byte("1700000000000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRegisterRequest(b); err == nil && (len(r.Key) != KeySize || r.Format != Version || r.Want < 0) {
			t.Fatalf("register request accepted: %+v", r)
		}
		if r, err := DecodeRegisterReply(b); err == nil && (len(r.Sealed) != sealedKeySize || r.Lease <= 0) {
			t.Fatalf("register reply accepted: %+v", r)
		}
		_, _ = DecodeLeaseReply(b)
		_, _ = DecodeUsageReply(b)
		_, _ = DecodeInfo(b)
		if objs, err := DecodeStage(b); err == nil {
			var re []byte
			for _, o := range objs {
				re = AppendObject(re, o.ID, o.Data)
			}
			if !bytes.Equal(re, b) {
				t.Fatal("stage batch does not re-encode to its bytes")
			}
		}
		if ids, err := DecodeIDs(b); err == nil && !bytes.Equal(EncodeIDs(ids), b) {
			t.Fatal("ID list does not re-encode to its bytes")
		}
		_, _ = ParseClientID(string(b))
		_, _ = ParseNonce(string(b))
		_, _ = ParseTime(string(b))
		_, _ = ParseMAC(string(b))
	})
}

// FuzzHandler drives the service, as a verified device with one
// registration, with arbitrary methods, paths, bodies and headers, signed
// with the session key when sign is set (so the fuzzer reaches the handlers
// behind the MAC). It must never panic nor answer 500, and never keep a
// chunk under an ID its bytes do not hash to.
func FuzzHandler(f *testing.F) {
	ca, err := pki.CreateCA(f.TempDir(), "r1")
	if err != nil {
		f.Fatal(err)
	}
	dev, err := ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: "d", Role: pki.Device}, pki.IssueOptions{})
	if err != nil {
		f.Fatal(err)
	}
	state := &tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{{dev.Leaf, ca.Cert}}}
	dir := f.TempDir()
	s, err := NewServer(Config{Dir: dir, Offer: 1 << 20, Realm: "r1", Revocations: pki.NoRevocations{}, MaxClients: 1 << 30})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	// One registration whose key the fuzzer signs with.
	c := &client{chunks: map[cairn.ID]int64{}, nonces: map[Nonce]time.Time{}, quota: 1 << 18, expires: time.Now().Add(time.Hour)}
	c.id[0], c.key[0] = 7, 9
	c.dir = filepath.Join(dir, c.id.String())
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		f.Fatal(err)
	}
	s.clients[c.id] = c
	s.granted = c.quota

	data := []byte("some ciphertext")
	id := cairn.ID(blake3.Sum256(data))
	f.Add("POST", PathStage, AppendObject(nil, id, data), true, uint16(1))
	f.Add("POST", PathStage, AppendObject(nil, cairn.ID{1}, data), true, uint16(2))
	f.Add("GET", PathChunk+id.String(), []byte(nil), true, uint16(3))
	f.Add("POST", PathUnstage, EncodeIDs([]cairn.ID{id}), true, uint16(4))
	f.Add("POST", PathRenew, []byte(nil), true, uint16(5))
	f.Add("POST", PathRegister, []byte(`{"format":1,"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","want":5}`), false, uint16(6))
	f.Add("GET", PathInfo, []byte(nil), false, uint16(7))
	f.Add("POST", PathStage, []byte("garbage"), false, uint16(8))
	f.Add("GET", PathChunk+"zz", []byte(nil), true, uint16(9))
	f.Fuzz(func(t *testing.T, method, path string, body []byte, sign bool, n uint16) {
		if path == PathDeregister {
			return // would end the registration the rest relies on
		}
		req, err := http.NewRequest("GET", "https://sur/", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Method = method
		req.URL.Path = path
		req.TLS = state
		if sign {
			var nonce Nonce
			nonce[0], nonce[1] = byte(n), byte(n>>8)
			rand := blake3.Sum256(append([]byte(method+path), body...))
			copy(nonce[2:], rand[:])
			ms := time.Now().UnixMilli()
			req.Header.Set(HeaderClient, c.id.String())
			req.Header.Set(HeaderTime, strconv.FormatInt(ms, 10))
			req.Header.Set(HeaderNonce, hex.EncodeToString(nonce[:]))
			req.Header.Set(HeaderMAC, hex.EncodeToString(MAC(&c.key, method, path, c.id, ms, nonce, body)))
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code == http.StatusInternalServerError {
			t.Fatalf("%s %s: 500: %s", method, path, w.Body.Bytes())
		}
		ents, _ := os.ReadDir(c.dir)
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(c.dir, e.Name()))
			if err != nil {
				continue
			}
			if got := cairn.ID(blake3.Sum256(b)).String(); got != e.Name() {
				t.Fatalf("staged %s holds bytes hashing to %s", e.Name(), got)
			}
		}
	})
}
