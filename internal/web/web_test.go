package web

import (
	"context"
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

// fakeSource serves fixed data, counting the slow calls.
type fakeSource struct {
	storeCalls atomic.Int32
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
	return &apitypes.Status{Device: "<b>laptop</b>", Problems: []apitypes.Problem{}, Mounts: []apitypes.MountStatus{}}, nil
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
		!strings.Contains(body, "dev&lt;1&gt;") || !strings.Contains(body, "2.0 KiB") {
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
