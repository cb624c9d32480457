package dav_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/dav"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/volkey"
)

// syncBuf collects a gateway's log; a failing test prints it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fixture is a volume (embedded etcd, memory store) served by a gateway
// on 127.0.0.1, with one user.
type fixture struct {
	t          *testing.T
	svc        *meta.Service
	master     volkey.Master
	st         *memstore.Store
	vol        *fs.Volume
	users      *dav.Users
	user, pass string
	h          *dav.Handler
	srv        *httptest.Server
	logs       *syncBuf
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	svc, err := meta.New(etcdtest.New(t), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	// As realm.Init writes it: a special file raises its format.
	if ierr := svc.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); ierr != nil {
		t.Fatal(ierr)
	}
	master := keyring.NewMaster()
	if cerr := svc.CreateVolume(ctx, meta.Volume{Name: "v", KeyCheck: fs.KeyCheck(master), ChunkMin: 4096, ChunkAvg: 16384, ChunkMax: 131072,
		KeepVersions: 10, TrashTTL: time.Hour}, 0o755, uint32(os.Getuid()), uint32(os.Getgid())); cerr != nil {
		t.Fatal(cerr)
	}
	f := &fixture{t: t, svc: svc, master: master, st: memstore.New(), logs: &syncBuf{}}
	f.vol = f.openVolume()
	f.users = dav.OpenUsers(filepath.Join(t.TempDir(), "passwd.json"))
	f.user = "alice"
	f.pass, err = f.users.Add(f.user, false)
	if err != nil {
		t.Fatal(err)
	}
	f.h = f.newHandler(f.vol)
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", f.logs.String())
		}
	})
	return f
}

// openVolume opens the fixture's volume again (another device, or a
// gateway started anew).
func (f *fixture) openVolume() *fs.Volume {
	f.t.Helper()
	mv, err := f.svc.Open(context.Background(), "v")
	if err != nil {
		f.t.Fatal(err)
	}
	vol, err := fs.Open(f.svc, mv, f.master, f.st, fs.Options{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { vol.Close() })
	return vol
}

func (f *fixture) newHandler(vol *fs.Volume) *dav.Handler {
	f.t.Helper()
	h, err := dav.New(vol, dav.Options{Users: f.users, CacheDir: f.t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { h.Close() })
	return h
}

// req sends a request as the fixture's user; hdr is name, value pairs.
func (f *fixture) req(method, path string, body io.Reader, hdr ...string) *http.Response {
	f.t.Helper()
	return f.reqTo(f.srv.URL, method, path, body, hdr...)
}

func (f *fixture) reqTo(base, method, path string, body io.Reader, hdr ...string) *http.Response {
	f.t.Helper()
	r, err := http.NewRequest(method, base+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	r.SetBasicAuth(f.user, f.pass)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// status sends a request and checks its status; it returns the body.
func (f *fixture) status(want int, method, path, body string, hdr ...string) (string, *http.Response) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	resp := f.req(method, path, rd, hdr...)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		f.t.Fatalf("%s %s: status %d, want %d\n%s", method, path, resp.StatusCode, want, b)
	}
	return string(b), resp
}

// content reads a file straight from the volume (not through the gateway).
func (f *fixture) content(path string) []byte {
	f.t.Helper()
	ctx := context.Background()
	var parts []string
	for _, p := range strings.Split(path, "/") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	e, err := f.vol.Meta.Lookup(ctx, parts)
	if err != nil {
		f.t.Fatalf("lookup %s: %v", path, err)
	}
	var b bytes.Buffer
	if err := f.vol.ReadFile(ctx, e, nil, &b); err != nil {
		f.t.Fatalf("read %s: %v", path, err)
	}
	return b.Bytes()
}
