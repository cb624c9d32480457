// Package web serves cairn's web page and its JSON API (doc/api.md):
// the realm's devices, stores, volumes, the work in progress on this
// device, a file's versions and the trash. It reads only what a Source
// gives it; the CLI's Source reads the registry and the metadata service
// and never dials a node that is not online, so drawing the page never
// wakes a sleeping device. Every request needs a user and app password
// (internal/httpauth, the users of 'cairn dav passwd').
package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"html/template"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/httpauth"
	"cairn.dev/cairn/internal/vpath"
)

// Source is where the page's data comes from.
type Source interface {
	// Device is the name of the device serving the page.
	Device() string
	Devices(ctx context.Context) ([]apitypes.Device, error)
	Stores(ctx context.Context) ([]apitypes.StoreInfo, error)
	Volumes(ctx context.Context) ([]apitypes.Volume, error)
	Work(ctx context.Context) (apitypes.Work, error)
	// Status is this device and the realm on one screen ('cairn status').
	Status(ctx context.Context) (*apitypes.Status, error)
	// Versions lists the kept versions of the file at path (a clean
	// slash path) of volume vol, oldest first.
	Versions(ctx context.Context, vol, path string) ([]apitypes.FileVersion, error)
	Trash(ctx context.Context, vol string) ([]apitypes.TrashItem, error)
	// Restore makes an old version current, or brings back a removed
	// entry, as 'cairn restore' does (req is checked: a clean path).
	Restore(ctx context.Context, req apitypes.RestoreRequest) (*apitypes.RestoreResult, error)
	// Download returns the size of version n (0: the current one) of the
	// file at path of volume vol, and a function that writes its bytes.
	Download(ctx context.Context, vol, path string, n uint64) (size int64, write func(io.Writer) error, err error)
}

// Options configure a Handler.
type Options struct {
	Users  *httpauth.Users // required
	Logger *slog.Logger
	// SlowTTL is how long the answers of Stores (which lists every store
	// it asks) and Volumes (which walks every namespace) are reused.
	// Default one minute.
	SlowTTL time.Duration
	// Metrics, if set, serves GET /metrics (Prometheus' text format,
	// doc/metrics.md) behind the same login as the page.
	Metrics http.Handler
}

// Handler serves the page and the API.
type Handler struct {
	src   Source
	guard *httpauth.Guard
	log   *slog.Logger
	mux   *http.ServeMux
	page  *template.Template

	csrf *http.CrossOriginProtection

	stores  cached[[]apitypes.StoreInfo]
	volumes cached[[]apitypes.Volume]
	status  cached[*apitypes.Status]
}

// statusTTL is how long a status (which asks every awake store once) is
// reused.
const statusTTL = 5 * time.Second

// cached keeps a slow answer for ttl.
type cached[T any] struct {
	mu   sync.Mutex
	ttl  time.Duration
	at   time.Time
	val  T
	fill func(context.Context) (T, error)
}

func (c *cached[T]) get(ctx context.Context) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.ttl {
		return c.val, nil
	}
	v, err := c.fill(ctx)
	if err != nil {
		return v, err
	}
	c.val, c.at = v, time.Now()
	return v, nil
}

//go:embed assets
var assets embed.FS

// New returns the handler of src's page and API.
func New(src Source, o Options) (*Handler, error) {
	if o.Users == nil {
		return nil, cairn.E("web", cairn.Invalid, "", errors.New("no users"))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SlowTTL <= 0 {
		o.SlowTTL = time.Minute
	}
	page, err := template.New("page.html").Funcs(template.FuncMap{"bytes": apitypes.IBytes, "time": showTime, "rate": showRate, "requests": sumRequests}).ParseFS(assets, "assets/page.html")
	if err != nil {
		return nil, cairn.E("web", cairn.Other, "page.html", err)
	}
	h := &Handler{src: src, log: o.Logger, page: page, mux: http.NewServeMux(), csrf: http.NewCrossOriginProtection(),
		guard: httpauth.NewGuard(o.Users, "cairn web", "'cairn dav passwd add USER' makes one", o.Logger)}
	h.stores = cached[[]apitypes.StoreInfo]{ttl: o.SlowTTL, fill: src.Stores}
	h.volumes = cached[[]apitypes.Volume]{ttl: o.SlowTTL, fill: src.Volumes}
	h.status = cached[*apitypes.Status]{ttl: min(statusTTL, o.SlowTTL), fill: src.Status}
	h.mux.HandleFunc("GET /{$}", h.servePage)
	h.mux.HandleFunc("GET /page.js", h.serveAsset("assets/page.js", "text/javascript; charset=utf-8"))
	h.mux.HandleFunc("GET /page.css", h.serveAsset("assets/page.css", "text/css; charset=utf-8"))
	h.mux.HandleFunc("GET /api/v1/{$}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"version": apitypes.Version, "device": src.Device(),
			"endpoints": []string{"status", "devices", "stores", "volumes", "work", "versions", "trash", "download", "restore"}})
	})
	h.mux.HandleFunc("GET /api/v1/devices", apiOf(h, src.Devices))
	h.mux.HandleFunc("GET /api/v1/stores", apiOf(h, h.stores.get))
	h.mux.HandleFunc("GET /api/v1/volumes", apiOf(h, h.volumes.get))
	h.mux.HandleFunc("GET /api/v1/work", apiOf(h, src.Work))
	h.mux.HandleFunc("GET /api/v1/status", apiOf(h, h.status.get))
	h.mux.HandleFunc("GET /api/v1/versions", func(w http.ResponseWriter, r *http.Request) {
		vol, path, err := ParseVersionsQuery(r.URL.RawQuery)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		vs, err := src.Versions(r.Context(), vol, path)
		h.answer(w, r, vs, err)
	})
	h.mux.HandleFunc("GET /api/v1/trash", func(w http.ResponseWriter, r *http.Request) {
		vol, err := ParseVolumeQuery(r.URL.RawQuery)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		items, err := src.Trash(r.Context(), vol)
		h.answer(w, r, items, err)
	})
	h.mux.HandleFunc("GET /api/v1/download", h.serveDownload)
	h.mux.HandleFunc("/api/v1/restore", h.serveRestore)
	if o.Metrics != nil {
		h.mux.Handle("GET /metrics", o.Metrics)
	}
	h.mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such API endpoint: "+r.URL.Path+" (see /api/v1/)")
	})
	return h, nil
}

// ServeHTTP authenticates the request, then serves it. GET and HEAD are
// served everywhere; the one request that changes the realm, POST
// /api/v1/restore, must come from the page's own origin (a cross-site
// request is refused: net/http's CrossOriginProtection, from
// Sec-Fetch-Site or Origin) and carry a JSON body (which a cross-site
// form cannot send without a CORS preflight, which is never granted).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user := h.guard.Authenticate(w, r)
	if user == "" {
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, user))
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/restore":
		if err := h.csrf.Check(r); err != nil {
			h.log.Warn("web: cross-origin request refused", "path", r.URL.Path, "origin", r.Header.Get("Origin"), "err", err)
			writeError(w, http.StatusForbidden, "cross-origin request refused: "+err.Error())
			return
		}
	default:
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed here: only POST /api/v1/restore changes the realm")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// userKey keys the authenticated user in a request's context.
type userKey struct{}

// maxRestoreBody bounds the body of POST /api/v1/restore.
const maxRestoreBody = 64 << 10

func (h *Handler) serveRestore(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, "a restore is a POST with a JSON body (doc/api.md)")
		return
	}
	if ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); strings.TrimSpace(ct) != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "the body must be JSON (Content-Type: application/json)")
		return
	}
	req, err := ParseRestore(http.MaxBytesReader(w, r.Body, maxRestoreBody))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	res, err := h.src.Restore(r.Context(), req)
	if err == nil {
		h.log.Info("web: restored", "user", r.Context().Value(userKey{}), "vol", req.Vol, "path", req.Path, "version", req.Version, "from_trash", req.FromTrash, "to", req.To)
	}
	h.answer(w, r, res, err)
}

// ParseRestore reads and checks a restore request: a valid volume, clean
// absolute paths that name a file or directory below the root (no ".."),
// exactly one of version and from_trash, to only with from_trash.
func ParseRestore(body io.Reader) (apitypes.RestoreRequest, error) {
	var req apitypes.RestoreRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, cairn.E("web restore", cairn.Invalid, "", err)
	}
	if dec.More() {
		return req, cairn.E("web restore", cairn.Invalid, "", errors.New("one JSON object only"))
	}
	if err := vpath.ValidVolume(req.Vol); err != nil {
		return req, cairn.E("web restore", cairn.Invalid, req.Vol, err)
	}
	var err error
	if req.Path, err = cleanFilePath(req.Path); err != nil {
		return req, err
	}
	if (req.Version == 0) == !req.FromTrash {
		return req, cairn.E("web restore", cairn.Invalid, req.Path, errors.New("give exactly one of version and from_trash"))
	}
	if req.To != "" {
		if !req.FromTrash {
			return req, cairn.E("web restore", cairn.Invalid, req.To, errors.New("to is for a restore from the trash"))
		}
		if req.To, err = cleanFilePath(req.To); err != nil {
			return req, err
		}
	}
	return req, nil
}

func (h *Handler) serveDownload(w http.ResponseWriter, r *http.Request) {
	vol, path, n, err := ParseDownloadQuery(r.URL.RawQuery)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	size, write, err := h.src.Download(r.Context(), vol, path, n)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	name := path[strings.LastIndexByte(path, '/')+1:]
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	if r.Method == http.MethodHead {
		return
	}
	if err := write(w); err != nil {
		// The status is sent: all that can be done is to cut the body
		// short (the client sees fewer bytes than Content-Length).
		h.log.Warn("web: download cut short", "vol", vol, "path", path, "version", n, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// ParseDownloadQuery reads a download's query: vol and path as for the
// versions, and version=N (optional; absent: the current version).
func ParseDownloadQuery(raw string) (vol, path string, n uint64, err error) {
	q, err := parseQuery(raw, "vol", "path", "version")
	if err != nil {
		return "", "", 0, err
	}
	if v := q["version"]; len(v) > 0 {
		if len(v) > 1 {
			return "", "", 0, cairn.E("web query", cairn.Invalid, "version", errors.New("parameter version given more than once"))
		}
		if n, err = strconv.ParseUint(v[0], 10, 64); err != nil || n == 0 {
			return "", "", 0, cairn.E("web query", cairn.Invalid, v[0], errors.New("version must be a number from 1"))
		}
		delete(q, "version")
	}
	vol, path, err = ParseVersionsQuery(q.Encode())
	return vol, path, n, err
}

func apiOf[T any](h *Handler, get func(context.Context) (T, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := get(r.Context())
		h.answer(w, r, v, err)
	}
}

func (h *Handler) answer(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, v)
}

// fail answers an error as JSON, with the status its kind calls for.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, cairn.ErrInvalid), errors.Is(err, cairn.ErrIsDir), errors.Is(err, cairn.ErrNotDir):
		code = http.StatusBadRequest
	case errors.Is(err, cairn.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, cairn.ErrUnavailable):
		code = http.StatusServiceUnavailable
	}
	if code >= 500 {
		h.log.Warn("web request failed", "path", r.URL.Path, "err", err)
	}
	writeError(w, code, err.Error())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// APIError is the body of every API error.
type APIError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(APIError{Error: msg})
}

// maxQuery bounds a query string: a volume name and a path.
const maxQuery = vpath.MaxPath*3 + 256

// ParseVolumeQuery reads the trash's query: vol=VOLUME (required, once).
func ParseVolumeQuery(raw string) (string, error) {
	q, err := parseQuery(raw, "vol")
	if err != nil {
		return "", err
	}
	vol, err := one(q, "vol")
	if err != nil {
		return "", err
	}
	if err := vpath.ValidVolume(vol); err != nil {
		return "", cairn.E("web query", cairn.Invalid, vol, err)
	}
	return vol, nil
}

// ParseVersionsQuery reads the versions' query: vol=VOLUME&path=/a/b,
// each once. The path must be absolute and name a file: no "..", no
// empty or "." component survives (a path never leaves its volume); it
// comes back clean ("/a/b").
func ParseVersionsQuery(raw string) (vol, path string, err error) {
	q, err := parseQuery(raw, "vol", "path")
	if err != nil {
		return "", "", err
	}
	if vol, err = one(q, "vol"); err != nil {
		return "", "", err
	}
	if err = vpath.ValidVolume(vol); err != nil {
		return "", "", cairn.E("web query", cairn.Invalid, vol, err)
	}
	p, err := one(q, "path")
	if err != nil {
		return "", "", err
	}
	if p, err = cleanFilePath(p); err != nil {
		return "", "", err
	}
	return vol, p, nil
}

// cleanFilePath checks that p is absolute, names something below the
// root and never leaves its volume (no ".."), and returns it clean
// ("/a/b").
func cleanFilePath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", cairn.E("web query", cairn.Invalid, p, errors.New("path must start with '/'"))
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", cairn.E("web query", cairn.Invalid, p, errors.New("'..' is not allowed in a path"))
		}
	}
	parts, err := vpath.SplitClean(p)
	if err != nil {
		return "", cairn.E("web query", cairn.Invalid, p, err)
	}
	if len(parts) == 0 {
		return "", cairn.E("web query", cairn.IsDir, p, errors.New("the root is a directory: give a file's path"))
	}
	return "/" + strings.Join(parts, "/"), nil
}

func parseQuery(raw string, allowed ...string) (url.Values, error) {
	if len(raw) > maxQuery {
		return nil, cairn.E("web query", cairn.Invalid, "", errors.New("query too long"))
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, cairn.E("web query", cairn.Invalid, "", err)
	}
	for k := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return nil, cairn.E("web query", cairn.Invalid, k, errors.New("unknown parameter (want "+strings.Join(allowed, ", ")+")"))
		}
	}
	return q, nil
}

func one(q url.Values, key string) (string, error) {
	v := q[key]
	switch {
	case len(v) == 0 || v[0] == "":
		return "", cairn.E("web query", cairn.Invalid, key, errors.New("missing parameter "+key))
	case len(v) > 1:
		return "", cairn.E("web query", cairn.Invalid, key, errors.New("parameter "+key+" given more than once"))
	}
	return v[0], nil
}
