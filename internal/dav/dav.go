// Package dav serves an open volume over WebDAV (RFC 4918), for file
// managers and programs that speak it (ZZFS §4.2: legacy applications
// through a WebDAV service). golang.org/x/net/webdav does the protocol;
// this package gives it the volume (FS), keeps dead properties in the
// metadata (props.go), answers LOCK and UNLOCK itself with exclusive and
// shared locks (locks.go), and checks who is asking (HTTP Basic
// authentication against app passwords, auth.go).
//
// Consistency is the mount's, close-to-open: a GET streams the version
// current when it began; a PUT is staged in a local file and committed as
// a new version when the body is complete (fs.Volume.WriteFile, under the
// file's writer lock), so readers see the old version or the new one,
// never a mix, and an upload cut short commits nothing. DELETE moves to
// the volume's trash. WebDAV locks live in the gateway's memory (see
// locks.go): they bind the clients of one gateway process.
package dav

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/webdav"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/httpauth"
)

// Options configure a Handler.
type Options struct {
	// Users are who may log in. Required: a gateway without users would
	// refuse every request.
	Users *Users
	// Realm names the gateway in the WWW-Authenticate challenge (what a
	// client shows when it asks for a password). Default "cairn".
	Realm string
	// CacheDir is where uploads are staged until their commit: a directory
	// per gateway is made inside it and removed by Close. Default: a
	// "cairn-dav" directory in os.TempDir().
	CacheDir string
	// UID and GID own the files and collections the gateway creates.
	// Default: the process's.
	UID, GID *uint32
	// Logger gets each request (Debug) and what cannot be returned to a
	// client (Warn, Error).
	Logger *slog.Logger
}

// Handler is the gateway's http.Handler.
type Handler struct {
	fs    *FS
	locks *lockManager
	guard *httpauth.Guard
	log   *slog.Logger
	stage string
}

// maxXMLBody bounds the XML body of PROPFIND, PROPPATCH and LOCK.
const maxXMLBody = 1 << 20

// New returns the gateway for volume v.
func New(v *fs.Volume, o Options) (*Handler, error) {
	if o.Users == nil {
		return nil, cairn.E("webdav", cairn.Invalid, "", errors.New("no users"))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Realm == "" {
		o.Realm = "cairn"
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(os.TempDir(), "cairn-dav")
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	if o.UID != nil {
		uid = *o.UID
	}
	if o.GID != nil {
		gid = *o.GID
	}
	if err := os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return nil, cairn.E("webdav", cairn.IO, o.CacheDir, err)
	}
	sweep(o.CacheDir, o.Logger)
	stage, err := os.MkdirTemp(o.CacheDir, fmt.Sprintf("dav-%d-*", os.Getpid()))
	if err != nil {
		return nil, cairn.E("webdav", cairn.IO, o.CacheDir, err)
	}
	log := o.Logger.With("volume", v.Name())
	return &Handler{
		fs:    &FS{vol: v, stage: stage, uid: uid, gid: gid, log: log},
		locks: newLockManager(),
		guard: httpauth.NewGuard(o.Users, o.Realm, "'cairn dav passwd add'", log),
		log:   log,
		stage: stage,
	}, nil
}

// sweep removes the staging directories of gateways that are gone (what
// they held was never committed, and no client was told it was stored).
func sweep(dir string, log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(dir, "dav-*-*"))
	for _, d := range dirs {
		f := strings.SplitN(filepath.Base(d), "-", 3)
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // alive
		}
		if err := os.RemoveAll(d); err != nil {
			log.Warn("could not remove a dead gateway's staging directory", "dir", d, "err", err)
		}
	}
}

// Close removes the staging directory. Call it once the server has
// stopped (no request in flight).
func (h *Handler) Close() error { return os.RemoveAll(h.stage) }

// statusWriter records the status a handler answered, for the log. A
// request the volume's ACLs refused (denied, set by FS.pathErr) is
// answered 403 where x/net/webdav would say 404, 405 or 500.
type statusWriter struct {
	http.ResponseWriter
	status int
	denied atomic.Bool
}

type deniedKey struct{}

// markDenied records, in a request's context, that the ACLs refused it.
func markDenied(ctx context.Context) {
	if w, ok := ctx.Value(deniedKey{}).(*statusWriter); ok {
		w.denied.Store(true)
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.denied.Load() && (code == http.StatusNotFound || code == http.StatusMethodNotAllowed || code == http.StatusInternalServerError || code == http.StatusConflict) {
		code = http.StatusForbidden
	}
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP authenticates the request, then serves it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	user := h.guard.Authenticate(sw, r)
	if user != "" {
		h.serve(sw, r.WithContext(context.WithValue(r.Context(), deniedKey{}, sw)))
	}
	if sw.status == 0 {
		sw.status = http.StatusOK // headers written without WriteHeader
	}
	h.log.Debug("webdav request", "method", r.Method, "path", r.URL.Path, "user", user, "status", sw.status,
		"dur", time.Since(start).Round(time.Microsecond))
}

// readBody reads a request's XML body (at most maxXMLBody) or answers 413
// or 400 and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxXMLBody+1))
	if err != nil {
		http.Error(w, "cannot read the request body", http.StatusBadRequest)
		return nil, false
	}
	if len(b) > maxXMLBody {
		http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
		return nil, false
	}
	return b, true
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case "LOCK":
		h.serveLock(w, r)
		return
	case "UNLOCK":
		h.serveUnlock(w, r)
		return
	}
	var lists []ifList
	if hdr := r.Header.Get("If"); hdr != "" {
		var err error
		if lists, err = parseIf(hdr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	dst := ""
	if d := r.Header.Get("Destination"); d != "" {
		if u, err := url.Parse(d); err == nil {
			dst = slashClean(u.Path)
		}
	}
	locks := &reqLocks{m: h.locks, fs: h.fs, ctx: r.Context(), method: r.Method,
		src: slashClean(r.URL.Path), dst: dst, submitted: ifTokens(lists)}
	if r.Method == "MOVE" && dst != "" {
		// An overwriting MOVE of a file onto a file keeps the
		// destination's history (FS.RemoveAll, FS.Rename).
		r = r.WithContext(context.WithValue(r.Context(), moveKey{}, moveOf{src: locks.src, dst: dst}))
	}
	switch r.Method {
	case "COPY", "MOVE":
		// x/net/webdav would copy a collection into itself until its
		// recursion limit, and an overwriting move or copy onto an
		// ancestor would first delete the source (to the trash).
		if src := locks.src; dst != "" && (isUnder(dst, src) || isUnder(src, dst)) {
			http.Error(w, "the destination is inside the source or the source inside the destination", http.StatusForbidden)
			return
		}
	}
	switch r.Method {
	case "PUT", "DELETE", "MKCOL", "PROPPATCH", "COPY", "MOVE":
		if lists != nil && locks.locked(lists, r.Host) {
			http.Error(w, "locked: the If header does not submit the lock token", http.StatusLocked)
			return
		}
	}
	switch r.Method {
	case "PROPFIND", "PROPPATCH":
		body, ok := readBody(w, r)
		if !ok {
			return
		}
		if err := checkXMLBody(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.Method == "PROPFIND" {
			if d, err := parseDepth(r.Header.Get("Depth"), depthInfinity); err == nil && d == depthInfinity {
				// RFC 4918 §9.1: a server may refuse a PROPFIND of the
				// whole tree (one request walking every entry).
				w.Header().Set("Content-Type", `application/xml; charset="utf-8"`)
				w.WriteHeader(http.StatusForbidden)
				io.WriteString(w, `<?xml version="1.0" encoding="utf-8"?>`+"\n"+
					`<D:error xmlns:D="DAV:"><D:propfind-finite-depth/></D:error>`)
				return
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if r.Method == "PROPFIND" {
			r = r.WithContext(withListCache(r.Context()))
		}
	case "PUT", "DELETE":
		if !h.preconditions(w, r) {
			return
		}
	}
	if r.Method == "PUT" {
		// x/net/webdav answers 201 to every PUT; replacing a file is 204
		// (RFC 4918 §9.7.1).
		if fi, err := h.fs.Stat(r.Context(), locks.src); err == nil && !fi.IsDir() {
			w = &replacedWriter{ResponseWriter: w}
		}
	}
	wd := &webdav.Handler{
		FileSystem: h.fs,
		LockSystem: locks,
		Logger: func(r *http.Request, err error) {
			if err != nil {
				h.log.Debug("webdav", "method", r.Method, "path", r.URL.Path, "err", err)
			}
		},
	}
	wd.ServeHTTP(w, r)
}

// replacedWriter turns a PUT's 201 Created into 204 No Content.
type replacedWriter struct{ http.ResponseWriter }

func (w *replacedWriter) WriteHeader(code int) {
	if code == http.StatusCreated {
		code = http.StatusNoContent
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *replacedWriter) Write(p []byte) (int, error) {
	if string(p) == "Created" {
		return len(p), nil // x/net/webdav's status text: no body with a 204
	}
	return w.ResponseWriter.Write(p)
}

// preconditions applies If-Match and If-None-Match to a PUT or DELETE
// (x/net/webdav does not): "*" asks that the resource exist or not, a list
// of entity tags that its current one be among them. On failure it answers
// 412 and returns false.
func (h *Handler) preconditions(w http.ResponseWriter, r *http.Request) bool {
	im, inm := r.Header.Get("If-Match"), r.Header.Get("If-None-Match")
	if im == "" && inm == "" {
		return true
	}
	etag := h.fs.etag(r.Context(), slashClean(r.URL.Path))
	exists := etag != ""
	if !exists {
		if _, err := h.fs.Stat(r.Context(), slashClean(r.URL.Path)); err == nil {
			exists = true // a collection: exists, no entity tag
		}
	}
	match := func(list string) bool {
		for _, t := range strings.Split(list, ",") {
			t = strings.TrimSpace(t)
			if t == "*" && exists || t != "" && etag != "" && sameETag(t, etag) {
				return true
			}
		}
		return false
	}
	if im != "" && !match(im) || inm != "" && match(inm) {
		http.Error(w, "precondition failed", http.StatusPreconditionFailed)
		return false
	}
	return true
}
