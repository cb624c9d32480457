package web

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/httpauth"
	"cairn.dev/cairn/internal/meta"
)

func urlEscape(s string) string { return url.QueryEscape(s) }

// fakeSource serves fixed data, counting the slow calls, and records
// the restores asked of it.
type fakeSource struct {
	storeCalls atomic.Int32
	restores   []apitypes.RestoreRequest
}

func (f *fakeSource) Device() string { return "dev<1>" }
func (f *fakeSource) Devices(ctx context.Context) ([]apitypes.Device, error) {
	return []apitypes.Device{{Name: "<b>laptop</b>", Role: "device", State: "online", Capacity: 100, Free: 40, Used: 60}}, nil
}
func (f *fakeSource) Stores(ctx context.Context) ([]apitypes.StoreInfo, error) {
	f.storeCalls.Add(1)
	return []apitypes.StoreInfo{{StoreRecord: meta.StoreRecord{Name: "s3", URL: "s3://b/p"}, Health: "ok", Objects: 3, Bytes: 2048}}, nil
}
func (f *fakeSource) Volumes(ctx context.Context) ([]apitypes.Volume, error) {
	return []apitypes.Volume{{Name: "home", Files: 2, Policies: []meta.PolicyRecord{}}}, nil
}
func (f *fakeSource) Status(ctx context.Context) (*apitypes.Status, error) {
	return &apitypes.Status{Device: "<b>laptop</b>", Problems: []apitypes.Problem{{What: "store <i>s3</i>", Detail: "does not answer"}}, Mounts: []apitypes.MountStatus{}}, nil
}

func (f *fakeSource) Work(ctx context.Context) (apitypes.Work, error) {
	return apitypes.Work{Mounts: []apitypes.MountStatus{}}, nil
}
func (f *fakeSource) Versions(ctx context.Context, vol, path string) ([]apitypes.FileVersion, error) {
	return nil, cairn.E("versions", cairn.NotFound, vol+":"+path, nil)
}
func (f *fakeSource) Trash(ctx context.Context, vol string) ([]apitypes.TrashItem, error) {
	return []apitypes.TrashItem{}, nil
}
func (f *fakeSource) Restore(ctx context.Context, req apitypes.RestoreRequest) (*apitypes.RestoreResult, error) {
	f.restores = append(f.restores, req)
	return &apitypes.RestoreResult{Path: req.Vol + ":" + req.Path, Version: 3}, nil
}
func (f *fakeSource) Download(ctx context.Context, vol, path string, n uint64) (int64, func(io.Writer) error, error) {
	if path != "/docs/a <b>.txt" {
		return 0, nil, cairn.E("download", cairn.NotFound, vol+":"+path, nil)
	}
	body := fmt.Sprintf("version %d of %s", n, path)
	return int64(len(body)), func(w io.Writer) error { _, err := io.WriteString(w, body); return err }, nil
}

// TestPage: the page escapes what the realm names, the slow answers are
// reused, errors map to statuses.
func TestPage(t *testing.T) {
	users := httpauth.OpenUsers(filepath.Join(t.TempDir(), "passwd.json"))
	pass, err := users.Add("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	h, err := New(src, Options{Users: users, SlowTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		req.SetBasicAuth("alice", pass)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := get("/")
	body := rec.Body.String()
	if rec.Code != http.StatusOK || strings.Contains(body, "<b>laptop</b>") || !strings.Contains(body, "&lt;b&gt;laptop&lt;/b&gt;") ||
		!strings.Contains(body, "dev&lt;1&gt;") || !strings.Contains(body, "2.0 KiB") ||
		strings.Contains(body, "<i>s3</i>") || !strings.Contains(body, "<strong>store &lt;i&gt;s3&lt;/i&gt;</strong>: does not answer") {
		t.Fatalf("page: %d\n%s", rec.Code, body)
	}
	get("/api/v1/stores")
	get("/")
	if n := src.storeCalls.Load(); n != 1 {
		t.Fatalf("Stores called %d times within its TTL, want 1", n)
	}
	if rec := get("/api/v1/versions?vol=home&path=/x"); rec.Code != http.StatusNotFound {
		t.Fatalf("versions of a missing file: %d %s", rec.Code, rec.Body)
	}
	if rec := get("/api/v1/"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"version": 1`) {
		t.Fatalf("API index: %d %s", rec.Code, rec.Body)
	}
	req := httptest.NewRequest("GET", "/api/v1/devices", nil)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || rec.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("no credentials: %d", rec.Code)
	}
}

// TestRestoreAndDownload: POST /api/v1/restore takes a JSON body from the
// page's own origin and hands a checked request to the source; a
// cross-site request, a form body, a path outside the volume, a request
// with both or neither of version and from_trash, and other methods are
// refused before the source sees them. GET /api/v1/download sends a
// version's bytes as an attachment whose name is the file's, quoted.
func TestRestoreAndDownload(t *testing.T) {
	users := httpauth.OpenUsers(filepath.Join(t.TempDir(), "passwd.json"))
	pass, err := users.Add("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	h, err := New(src, Options{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, path, ctype, body string, hdr ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "https://cairn.test"+path, strings.NewReader(body))
		req.SetBasicAuth("alice", pass)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	const js = "application/json"
	rec := do("POST", "/api/v1/restore", js, `{"vol":"home","path":"/docs//a.txt","version":2}`, "Sec-Fetch-Site", "same-origin", "Origin", "https://cairn.test")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"version": 3`) {
		t.Fatalf("same-origin restore: %d %s", rec.Code, rec.Body)
	}
	if len(src.restores) != 1 || src.restores[0] != (apitypes.RestoreRequest{Vol: "home", Path: "/docs/a.txt", Version: 2}) {
		t.Fatalf("restores: %+v", src.restores)
	}
	rec = do("POST", "/api/v1/restore", js, `{"vol":"home","path":"/gone","from_trash":true,"to":"/back"}`)
	if rec.Code != http.StatusOK || len(src.restores) != 2 || src.restores[1].To != "/back" {
		t.Fatalf("restore from the trash (no browser headers): %d %s %+v", rec.Code, rec.Body, src.restores)
	}
	for _, c := range []struct {
		name, method, ctype, body string
		hdr                       []string
		code                      int
	}{
		{"cross-site", "POST", js, `{"vol":"home","path":"/a","version":1}`, []string{"Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"other origin", "POST", js, `{"vol":"home","path":"/a","version":1}`, []string{"Origin", "https://evil.test"}, http.StatusForbidden},
		{"form body", "POST", "application/x-www-form-urlencoded", `vol=home&path=/a&version=1`, nil, http.StatusUnsupportedMediaType},
		{"outside the volume", "POST", js, `{"vol":"home","path":"/a/../../etc","version":1}`, nil, http.StatusBadRequest},
		{"relative", "POST", js, `{"vol":"home","path":"a","version":1}`, nil, http.StatusBadRequest},
		{"both", "POST", js, `{"vol":"home","path":"/a","version":1,"from_trash":true}`, nil, http.StatusBadRequest},
		{"neither", "POST", js, `{"vol":"home","path":"/a"}`, nil, http.StatusBadRequest},
		{"to without trash", "POST", js, `{"vol":"home","path":"/a","version":1,"to":"/b"}`, nil, http.StatusBadRequest},
		{"unknown field", "POST", js, `{"vol":"home","path":"/a","version":1,"x":1}`, nil, http.StatusBadRequest},
		{"two objects", "POST", js, `{"vol":"home","path":"/a","version":1}{}`, nil, http.StatusBadRequest},
		{"bad volume", "POST", js, `{"vol":"../x","path":"/a","version":1}`, nil, http.StatusBadRequest},
		{"GET", "GET", "", "", nil, http.StatusMethodNotAllowed},
		{"PUT", "PUT", js, `{}`, nil, http.StatusMethodNotAllowed},
		{"POST elsewhere", "POST", js, `{}`, []string{"Sec-Fetch-Site", "same-origin"}, http.StatusMethodNotAllowed},
	} {
		path := "/api/v1/restore"
		if c.name == "POST elsewhere" {
			path = "/api/v1/versions"
		}
		if rec := do(c.method, path, c.ctype, c.body, c.hdr...); rec.Code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, rec.Code, rec.Body, c.code)
		}
	}
	if len(src.restores) != 2 {
		t.Fatalf("refused requests reached the source: %+v", src.restores[2:])
	}

	rec = do("GET", "/api/v1/download?vol=home&path="+urlEscape("/docs/a <b>.txt")+"&version=2", "", "")
	if rec.Code != http.StatusOK || rec.Body.String() != "version 2 of /docs/a <b>.txt" ||
		rec.Header().Get("Content-Disposition") != `attachment; filename="a <b>.txt"` || rec.Header().Get("Content-Length") != "28" {
		t.Fatalf("download: %d %q %v", rec.Code, rec.Body, rec.Header())
	}
	for q, code := range map[string]int{
		"vol=home&path=/nope":                  http.StatusNotFound,
		"vol=home&path=/a/../../x":             http.StatusBadRequest,
		"vol=home&path=/a&version=0":           http.StatusBadRequest,
		"vol=home&path=/a&version=x":           http.StatusBadRequest,
		"vol=home&path=/a&version=1&version=2": http.StatusBadRequest,
		"vol=home&path=/":                      http.StatusBadRequest,
	} {
		if rec := do("GET", "/api/v1/download?"+q, "", ""); rec.Code != code {
			t.Errorf("download?%s: %d %s, want %d", q, rec.Code, rec.Body, code)
		}
	}
}
