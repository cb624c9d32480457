package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/storetest"
)

func TestHealthIsTheOnlyAnonymousEndpoint(t *testing.T) {
	f := start(t, nil)
	anon := f.client(t, nil)
	r := f.do(t, anon, "GET", wire.PathHealth, nil)
	if r.status != 200 || string(r.body) != "ok\n" || r.proto != 2 {
		t.Fatalf("health: %d %q HTTP/%d", r.status, r.body, r.proto)
	}
	id, data := storetest.Blob(1, 100)
	for _, req := range []struct{ method, path string }{
		{"POST", wire.PathHas}, {"POST", wire.PathPut}, {"POST", wire.PathGet},
		{"GET", wire.PathList}, {"GET", wire.PathStats}, {"GET", wire.PathObject + id.String()},
		{"PUT", wire.PathObject + id.String()}, {"DELETE", wire.PathObject + id.String()},
		{"POST", wire.PathJoin}, {"POST", wire.PathRegister}, {"GET", "/nope"},
	} {
		r := f.do(t, anon, req.method, req.path, data)
		if r.status != http.StatusUnauthorized || !errors.Is(r.err(), cairn.ErrPermission) {
			t.Errorf("anonymous %s %s: %d %v; want 401 Permission", req.method, req.path, r.status, r.err())
		}
	}
	if u, _ := f.store.Stats(t.Context()); u.Objects != 0 {
		t.Fatal("an anonymous put stored something")
	}
}

func TestProtocol(t *testing.T) {
	f := start(t, nil)
	c := f.client(t, f.creds(t, "laptop", pki.Device))
	a, da := storetest.Blob(1, 1000)
	b, db := storetest.Blob(2, 16<<10)
	m, _ := storetest.Blob(3, 10)

	// Single put, and a put whose data does not match its ID.
	if r := f.do(t, c, "PUT", wire.PathObject+a.String(), da); r.status != http.StatusNoContent {
		t.Fatalf("put: %d %v", r.status, r.err())
	}
	r := f.do(t, c, "PUT", wire.PathObject+m.String(), da)
	if r.status != http.StatusUnprocessableEntity || !errors.Is(r.err(), cairn.ErrCorrupt) {
		t.Fatalf("put under a wrong ID: %d %v", r.status, r.err())
	}

	// Batch put: b is stored, the mislabelled object is reported by index.
	var batch []byte
	batch = wire.AppendObject(batch, b, db)
	batch = wire.AppendObject(batch, m, db)
	r = f.do(t, c, "POST", wire.PathPut, batch, "Content-Type", wire.TypeObjects)
	var res wire.PutResult
	if r.status != 200 || wire.DecodeJSON(r.body, &res) != nil || len(res.Failed) != 1 || res.Failed[0].Index != 1 ||
		!errors.Is(res.Failed[0].Error.Err(), cairn.ErrCorrupt) {
		t.Fatalf("put batch: %d %+v", r.status, res)
	}

	// Has answers with the missing.
	r = f.do(t, c, "POST", wire.PathHas, idsBody(a, m, b, m), zstdHdr, wire.Zstd)
	missing, err := wire.DecodeBitmap(r.body, 4)
	if r.status != 200 || err != nil || fmt.Sprint(missing) != "[false true false true]" || r.header.Get("Content-Encoding") != wire.Zstd {
		t.Fatalf("has: %d %v %v", r.status, missing, err)
	}

	// Get one; get a missing one.
	r = f.do(t, c, "GET", wire.PathObject+b.String(), nil)
	if r.status != 200 || !bytes.Equal(r.body, db) || r.header.Get("Content-Encoding") != "" {
		t.Fatalf("get: %d, %d bytes", r.status, len(r.body))
	}
	r = f.do(t, c, "GET", wire.PathObject+m.String(), nil)
	if r.status != 404 || !errors.Is(r.err(), cairn.ErrNotFound) {
		t.Fatalf("get missing: %d %v", r.status, r.err())
	}

	// Batch get: in order, the missing one reported in place.
	r = f.do(t, c, "POST", wire.PathGet, idsBody(b, m, a), zstdHdr, wire.Zstd)
	if r.status != 200 {
		t.Fatalf("get batch: %d %v", r.status, r.err())
	}
	rd := bytes.NewReader(r.body)
	for i, want := range []struct {
		id   cairn.ID
		data []byte
	}{{b, db}, {m, nil}, {a, da}} {
		id, data, eerr, err := wire.ReadGetEntry(rd)
		if err != nil || id != want.id || !bytes.Equal(data, want.data) || (want.data == nil) != errors.Is(eerr, cairn.ErrNotFound) {
			t.Fatalf("get batch entry %d: %s %d bytes, %v, %v", i, id.Short(), len(data), eerr, err)
		}
	}
	if rd.Len() != 0 {
		t.Fatalf("get batch: %d bytes after the last entry", rd.Len())
	}

	// List and stats.
	listed := list(t, f, c)
	if len(listed) != 2 || listed[a] != int64(len(da)) || listed[b] != int64(len(db)) {
		t.Fatalf("list: %v", listed)
	}
	r = f.do(t, c, "GET", wire.PathStats, nil)
	var st wire.Stats
	if r.status != 200 || wire.DecodeJSON(r.body, &st) != nil || st.Objects != 2 || st.Bytes != int64(len(da)+len(db)) {
		t.Fatalf("stats: %d %+v", r.status, st)
	}

	// Delete.
	if r := f.do(t, c, "DELETE", wire.PathObject+a.String(), nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %v", r.status, r.err())
	}
	if r := f.do(t, c, "GET", wire.PathObject+a.String(), nil); r.status != 404 {
		t.Fatalf("get after delete: %d", r.status)
	}
}

func list(t *testing.T, f *fixture, c *http.Client) map[cairn.ID]int64 {
	t.Helper()
	r := f.do(t, c, "GET", wire.PathList, nil)
	if r.status != 200 {
		t.Fatalf("list: %d %v", r.status, r.err())
	}
	lr, err := wire.NewListReader(bytes.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	m := map[cairn.ID]int64{}
	for {
		id, size, err := lr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		m[id] = size
	}
}

func TestUntrustedRolesRefused(t *testing.T) {
	f := start(t, nil)
	dev := f.client(t, f.creds(t, "laptop", pki.Device))
	a, da := storetest.Blob(1, 1000)
	if r := f.do(t, dev, "PUT", wire.PathObject+a.String(), da); r.status != http.StatusNoContent {
		t.Fatal(r.err())
	}
	n, dn := storetest.Blob(2, 1000)
	for _, role := range []pki.Role{pki.Benefactor, pki.Surrogate} {
		c := f.client(t, f.creds(t, "x-"+string(role), role))
		for _, req := range []struct {
			op           Op
			method, path string
			body         []byte
			hdr          []string
		}{
			{OpHas, "POST", wire.PathHas, idsBody(a), []string{zstdHdr, wire.Zstd}},
			{OpPut, "PUT", wire.PathObject + n.String(), dn, nil},
			{OpPut, "POST", wire.PathPut, wire.AppendObject(nil, n, dn), nil},
			{OpGet, "GET", wire.PathObject + a.String(), nil, nil},
			{OpGet, "POST", wire.PathGet, idsBody(a), []string{zstdHdr, wire.Zstd}},
			{OpDelete, "DELETE", wire.PathObject + a.String(), nil, nil},
			{OpList, "GET", wire.PathList, nil, nil},
			{OpStats, "GET", wire.PathStats, nil, nil},
		} {
			if Allowed(role, req.op) {
				t.Fatalf("Allowed(%s, %s)", role, req.op)
			}
			r := f.do(t, c, req.method, req.path, req.body, req.hdr...)
			if r.status != http.StatusForbidden || !errors.Is(r.err(), cairn.ErrPermission) {
				t.Errorf("%s %s %s: %d %v; want 403 Permission", role, req.method, req.path, r.status, r.err())
			}
		}
		if r := f.do(t, c, "GET", wire.PathHealth, nil); r.status != 200 {
			t.Errorf("%s health: %d", role, r.status)
		}
	}
	// Nothing changed.
	if m := list(t, f, dev); len(m) != 1 || m[a] != 1000 {
		t.Fatalf("after refused requests the store holds %v", m)
	}
	for _, op := range []Op{OpHas, OpPut, OpGet, OpDelete, OpList, OpStats} {
		if !Allowed(pki.Device, op) {
			t.Errorf("a device may not %s", op)
		}
	}
}

func TestRevokedAndForeign(t *testing.T) {
	f := start(t, nil)
	c := f.client(t, f.creds(t, "laptop", pki.Device))
	if r := f.do(t, c, "GET", wire.PathStats, nil); r.status != 200 {
		t.Fatal(r.err())
	}
	if err := f.rev.RevokeName("laptop"); err != nil {
		t.Fatal(err)
	}
	// The connection is still open: the next request is refused all the same.
	r := f.do(t, c, "GET", wire.PathStats, nil)
	if r.status != http.StatusForbidden || !strings.Contains(r.err().Error(), "revoked") {
		t.Fatalf("revoked device on its open connection: %d %v", r.status, r.err())
	}
	// A new connection gets through the handshake (no TLS alert: a client
	// cannot tell an alert from a stranger's) and is refused, 403.
	c.Transport.(*http.Transport).CloseIdleConnections()
	if r, err := f.try(c, "GET", wire.PathStats, nil); err != nil || r.status != http.StatusForbidden || !strings.Contains(r.err().Error(), "revoked") {
		t.Fatalf("revoked device on a new connection: %+v %v", r, err)
	}
	// A certificate of another CA (same realm ID, same name).
	other, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	oc, err := other.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: "laptop2", Role: pki.Device}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pki.ClientTLS(oc, pki.TLSOptions{Revocations: pki.NoRevocations{}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.InsecureSkipVerify, cfg.VerifyConnection = true, nil // an attacker accepts any server
	if _, err := f.try(httpClient(t, cfg), "GET", wire.PathStats, nil); err == nil {
		t.Fatal("a client with another CA's certificate was served")
	}
}

func TestMalformedRequests(t *testing.T) {
	f := start(t, nil)
	c := f.client(t, f.creds(t, "laptop", pki.Device))
	a, da := storetest.Blob(1, 100)
	big := make([]cairn.ID, wire.MaxIDs+1)
	for _, tc := range []struct {
		name         string
		method, path string
		body         []byte
		hdr          []string
		status       int
	}{
		{"has uncompressed", "POST", wire.PathHas, make([]byte, 64), nil, 415},
		{"has garbage", "POST", wire.PathHas, []byte("not zstd"), []string{zstdHdr, wire.Zstd}, 400},
		{"has odd length", "POST", wire.PathHas, wire.Compress(nil, make([]byte, 33)), []string{zstdHdr, wire.Zstd}, 400},
		{"has too many", "POST", wire.PathHas, wire.EncodeIDs(big), []string{zstdHdr, wire.Zstd}, 400},
		{"has huge body", "POST", wire.PathHas, make([]byte, wire.MaxIDs*cairn.IDSize+5000), []string{zstdHdr, wire.Zstd}, 413},
		{"get batch garbage", "POST", wire.PathGet, []byte{0x28, 0xb5, 0x2f, 0xfd, 1, 2}, []string{zstdHdr, wire.Zstd}, 400},
		{"put compressed", "PUT", wire.PathObject + a.String(), da, []string{zstdHdr, wire.Zstd}, 415},
		{"put bad id", "PUT", wire.PathObject + "xyz", da, nil, 400},
		{"put batch truncated", "POST", wire.PathPut, wire.AppendObject(nil, a, da)[:50], nil, 400},
		{"unknown path", "GET", "/v1/nothing", nil, nil, 404},
		{"v2", "GET", "/v2/stats", nil, nil, 404},
		{"wrong method", "GET", wire.PathHas, nil, nil, 405},
		{"wrong object method", "POST", wire.PathObject + a.String(), da, nil, 405},
	} {
		r := f.do(t, c, tc.method, tc.path, tc.body, tc.hdr...)
		if r.status != tc.status || !errors.Is(r.err(), cairn.ErrInvalid) {
			t.Errorf("%s: %d %v; want %d Invalid", tc.name, r.status, r.err(), tc.status)
		}
	}
	// An object larger than MaxObject, announced by Content-Length: refused
	// before it is read.
	req, _ := http.NewRequest("PUT", "https://"+f.addr+wire.PathObject+a.String(), io.LimitReader(zeros{}, wire.MaxObject+1))
	req.ContentLength = wire.MaxObject + 1
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("oversized put: %d", resp.StatusCode)
	}
	if u, _ := f.store.Stats(t.Context()); u.Objects != 0 {
		t.Fatalf("malformed requests stored %d objects", u.Objects)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestSlowClientsAreCut(t *testing.T) {
	f := start(t, func(c *Config) {
		c.StallTimeout = 300 * time.Millisecond
		c.HandshakeTimeout = 300 * time.Millisecond
		c.Join = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestTimeout)
			}
		})
	})
	// A connection that never starts the TLS handshake is closed.
	conn, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, rerr := conn.Read(make([]byte, 1)); rerr == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("idle TCP connection: read %v after %v; want closed within the handshake timeout", rerr, time.Since(start))
	}

	// A device that announces a body and stops sending is cut.
	c := f.client(t, f.creds(t, "laptop", pki.Device))
	a, da := storetest.Blob(1, 1<<20)
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write(da[:1000]) }() // then nothing
	req, _ := http.NewRequest("PUT", "https://"+f.addr+wire.PathObject+a.String(), pr)
	req.ContentLength = int64(len(da))
	start = time.Now()
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if time.Since(start) > 5*time.Second || (err == nil && resp.StatusCode != http.StatusRequestTimeout) {
		t.Fatalf("stalled upload: %v, %v after %v", resp, err, time.Since(start))
	}
	// An anonymous join request that trickles is cut too.
	anon := f.client(t, nil)
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	go func() { _, _ = pw2.Write([]byte("{")) }()
	req, _ = http.NewRequest("POST", "https://"+f.addr+wire.PathJoin, pr2)
	req.ContentLength = 1000
	start = time.Now()
	resp, err = anon.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if time.Since(start) > 5*time.Second || (err == nil && resp.StatusCode != http.StatusRequestTimeout) {
		t.Fatalf("stalled join: %v, %v after %v", resp, err, time.Since(start))
	}

	// The node is still healthy.
	if r := f.do(t, c, "GET", wire.PathStats, nil); r.status != 200 {
		t.Fatalf("after a stalled upload: %d", r.status)
	}
}
