package node

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// FuzzHandler drives the chunk service, as a verified device, with
// arbitrary methods, paths, encodings and bodies. It must never panic, never
// answer 5xx (the store behind it does not fail), and never keep an object
// under an ID its bytes do not hash to.
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
	st := memstore.New()
	h, err := NewHandler(Config{Store: st, Realm: "r1", Revocations: pki.NoRevocations{}})
	if err != nil {
		f.Fatal(err)
	}
	a, da := storetest.Blob(1, 100)
	if err := st.Put(f.Context(), a, da); err != nil {
		f.Fatal(err)
	}
	b, db := storetest.Blob(2, 50)
	methods := []string{"GET", "PUT", "POST", "DELETE", "HEAD", "PATCH"}
	f.Add(uint8(2), wire.PathHas, true, wire.EncodeIDs([]cairn.ID{a, b}))
	f.Add(uint8(2), wire.PathGet, true, wire.EncodeIDs([]cairn.ID{a, b}))
	f.Add(uint8(2), wire.PathPut, false, wire.AppendObject(wire.AppendObject(nil, b, db), a, db))
	f.Add(uint8(1), wire.PathObject+b.String(), false, db)
	f.Add(uint8(1), wire.PathObject+a.String(), false, db)
	f.Add(uint8(0), wire.PathObject+a.String(), false, []byte(nil))
	f.Add(uint8(3), wire.PathObject+b.String(), false, []byte(nil))
	f.Add(uint8(0), wire.PathList, false, []byte(nil))
	f.Add(uint8(0), wire.PathStats, false, []byte(nil))
	f.Add(uint8(0), "/v1/o/../stats", false, []byte(nil))
	f.Fuzz(func(t *testing.T, m uint8, path string, compressed bool, body []byte) {
		req := httptest.NewRequest(methods[int(m)%len(methods)], "https://node/", bytes.NewReader(body))
		req.URL.Path = path
		req.TLS = state
		if compressed {
			req.Header.Set("Content-Encoding", wire.Zstd)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %q: %d %v", req.Method, path, w.Code, wire.DecodeError(w.Code, w.Header().Get("Content-Encoding"), w.Body.Bytes()))
		}
		err := st.List(t.Context(), func(id cairn.ID, size int64) error {
			data, err := st.Get(t.Context(), id)
			if err != nil {
				return err
			}
			if cairn.ID(blake3.Sum256(data)) != id {
				t.Fatalf("object %s stored under a wrong ID", id.Short())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// The handler, asked as a benefactor, refuses everything but /health
// whatever the request.
func FuzzHandlerUntrusted(f *testing.F) {
	ca, err := pki.CreateCA(f.TempDir(), "r1")
	if err != nil {
		f.Fatal(err)
	}
	ben, err := ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: "b", Role: pki.Benefactor}, pki.IssueOptions{})
	if err != nil {
		f.Fatal(err)
	}
	state := &tls.ConnectionState{HandshakeComplete: true, VerifiedChains: [][]*x509.Certificate{{ben.Leaf, ca.Cert}}}
	h, err := NewHandler(Config{Store: memstore.New(), Realm: "r1", Revocations: pki.NoRevocations{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("GET", wire.PathList, []byte(nil))
	f.Add("POST", wire.PathHas, wire.EncodeIDs(nil))
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		if method == "" || len(method) > 10 {
			return
		}
		req := httptest.NewRequest("GET", "https://node/", bytes.NewReader(body))
		req.Method, req.URL.Path, req.TLS = method, path, state
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if path == wire.PathHealth {
			return
		}
		if w.Code != http.StatusForbidden && w.Code != http.StatusNotFound && w.Code != http.StatusMethodNotAllowed {
			t.Fatalf("benefactor %s %q: %d", method, path, w.Code)
		}
	})
}
