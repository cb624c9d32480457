package dav

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/webdav"
)

// WebDAV locks (RFC 4918 §6, §9.10, §9.11) live in this gateway's memory:
// they bind clients of this gateway only, vanish when it stops, and are
// separate from cairn's writer locks (etcd leases, taken by every commit).
// x/net/webdav's own lock system (webdav.NewMemLS) has no shared locks and
// ignores the entity tags and "Not" of If headers, so the gateway answers
// LOCK and UNLOCK itself and gives x/net/webdav, for every other request,
// a view of the same locks (reqLocks) that evaluates If headers fully.

// lockManager holds the locks: exclusive or shared write locks of depth 0
// or infinity, each with a timeout, plus the temporary ones x/net/webdav
// takes for the length of a request that submits no lock token.
type lockManager struct {
	mu    sync.Mutex
	locks map[string]*davLock // by token
	now   func() time.Time
}

type davLock struct {
	token     string
	root      string // clean slash path
	shared    bool
	zeroDepth bool
	owner     string // the DAV:owner XML the client gave
	timeout   time.Duration
	expires   time.Time
	temp      bool // held by x/net/webdav for one request
}

var (
	errLockMismatch = errors.New("the lock does not cover the request URI")
)

func newLockManager() *lockManager {
	return &lockManager{locks: map[string]*davLock{}, now: time.Now}
}

// isUnder reports whether name is strictly below dir.
func isUnder(name, dir string) bool {
	if dir == "/" {
		return name != "/"
	}
	return strings.HasPrefix(name, dir+"/")
}

// covers reports whether l applies to name.
func (l *davLock) covers(name string) bool {
	return l.root == name || !l.zeroDepth && isUnder(name, l.root)
}

func (m *lockManager) expireLocked() {
	now := m.now()
	for t, l := range m.locks {
		if now.After(l.expires) {
			delete(m.locks, t)
		}
	}
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// create takes a new lock on root, or fails with webdav.ErrLocked if a
// lock in the way conflicts: any exclusive one, or any one when this one is
// exclusive. In the way are locks that cover root, and, for a lock of
// depth infinity, locks below root.
func (m *lockManager) create(root string, shared, zeroDepth bool, owner string, timeout time.Duration, temp bool) (davLock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	for _, x := range m.locks {
		inWay := x.covers(root) || !zeroDepth && isUnder(x.root, root)
		if inWay && (!x.shared || !shared) {
			return davLock{}, webdav.ErrLocked
		}
	}
	l := &davLock{token: newToken(), root: root, shared: shared, zeroDepth: zeroDepth, owner: owner,
		timeout: timeout, expires: m.now().Add(timeout), temp: temp}
	m.locks[l.token] = l
	return *l, nil
}

// refresh gives lock token a new timeout; name must be in its scope.
func (m *lockManager) refresh(token, name string, timeout time.Duration) (davLock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	l := m.locks[token]
	if l == nil || l.temp {
		return davLock{}, webdav.ErrNoSuchLock
	}
	if !l.covers(name) {
		return davLock{}, errLockMismatch
	}
	l.timeout, l.expires = timeout, m.now().Add(timeout)
	return *l, nil
}

// unlock removes lock token; name, if not empty, must be in its scope.
func (m *lockManager) unlock(token, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	l := m.locks[token]
	if l == nil {
		return webdav.ErrNoSuchLock
	}
	if name != "" && (l.temp || !l.covers(name)) {
		return errLockMismatch
	}
	delete(m.locks, token)
	return nil
}

// target is a resource a request changes: alone (PUT, PROPPATCH, MKCOL)
// or with everything below it (DELETE, MOVE, COPY's destination).
type target struct {
	name    string
	subtree bool
}

// allowed reports whether the submitted tokens let a request change the
// targets: every lock that covers a target, or lies below a subtree
// target, must be matched by a submitted token of a lock on the same root
// (for a shared lock, any of the shared locks there will do).
func (m *lockManager) allowedLocked(targets []target, submitted []string) bool {
	roots := map[string]bool{}
	for _, t := range submitted {
		if l := m.locks[t]; l != nil && !l.temp {
			roots[l.root] = true
		}
	}
	for _, x := range m.locks {
		for _, t := range targets {
			if (x.covers(t.name) || t.subtree && isUnder(x.root, t.name)) && !roots[x.root] {
				return false
			}
		}
	}
	return true
}

// tokenMatches reports whether token names a lock whose scope has name.
func (m *lockManager) tokenMatchesLocked(token, name string) bool {
	l := m.locks[token]
	return l != nil && !l.temp && l.covers(name)
}

// reqLocks is the webdav.LockSystem x/net/webdav gets for one request.
type reqLocks struct {
	m         *lockManager
	fs        *FS
	ctx       context.Context
	method    string
	src, dst  string   // the request URI's path and a COPY/MOVE destination
	submitted []string // every lock token the If header names (not negated)
}

var _ webdav.LockSystem = (*reqLocks)(nil)

// targets are the resources the request changes.
func (l *reqLocks) targets() []target {
	switch l.method {
	case "DELETE":
		return []target{{l.src, true}}
	case "MOVE":
		return []target{{l.src, true}, {l.dst, true}}
	case "COPY":
		return []target{{l.dst, true}}
	}
	return []target{{l.src, false}}
}

// Confirm is asked once per list of the If header, with the list's
// conditions and the resource they apply to (name0: a resource tag or the
// request URI; "" for a COPY's untagged list, which applies to its source).
// The request may go ahead if the list holds (every condition: a state
// token that is the token of a lock covering that resource, an entity tag
// equal to its current one, each possibly negated) and the tokens the
// whole If header submits unlock every resource the request changes: its
// own, not name0 or name1 (a list tagged with another resource must not
// unlock this one). Otherwise ErrConfirmationFailed: 412 if no list holds.
func (l *reqLocks) Confirm(now time.Time, name0, name1 string, conds ...webdav.Condition) (func(), error) {
	res := name0
	if res == "" {
		res = l.src
	}
	if !l.holds(slashClean(res), conds) || !l.allowed() {
		return nil, webdav.ErrConfirmationFailed
	}
	return func() {}, nil
}

// holds reports whether every condition of a list holds for resource res.
func (l *reqLocks) holds(res string, conds []webdav.Condition) bool {
	etag, etagRead := "", false
	for _, c := range conds {
		var ok bool
		if c.Token != "" {
			l.m.mu.Lock()
			l.m.expireLocked()
			ok = l.m.tokenMatchesLocked(c.Token, res)
			l.m.mu.Unlock()
		} else {
			if !etagRead {
				etag, etagRead = l.fs.etag(l.ctx, res), true
			}
			ok = etag != "" && sameETag(c.ETag, etag)
		}
		if ok == c.Not {
			return false
		}
	}
	return true
}

// allowed reports whether the submitted tokens unlock the targets.
func (l *reqLocks) allowed() bool {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	l.m.expireLocked()
	return l.m.allowedLocked(l.targets(), l.submitted)
}

// locked tells a request whose If header holds (some list is true) but
// does not submit the tokens of the locks in its way: RFC 4918 wants 423
// Locked for it, where x/net/webdav, which sees only failed lists, would
// answer 412. host is the request's, for tagged lists (a tag naming
// another host applies to nothing here).
func (l *reqLocks) locked(lists []ifList, host string) bool {
	if l.allowed() {
		return false
	}
	for _, list := range lists {
		res := l.src
		if list.Tag != "" {
			u, err := url.Parse(list.Tag)
			if err != nil || u.Host != "" && u.Host != host {
				continue
			}
			res = u.Path
		}
		conds := make([]webdav.Condition, len(list.Conds))
		for i, c := range list.Conds {
			conds[i] = webdav.Condition{Not: c.Not, Token: c.Token, ETag: c.ETag}
		}
		if l.holds(slashClean(res), conds) {
			return true
		}
	}
	return false
}

// sameETag compares entity tags strongly, ignoring a weak prefix on the
// client's side.
func sameETag(a, b string) bool {
	return strings.TrimPrefix(a, "W/") == strings.TrimPrefix(b, "W/")
}

// Create is what x/net/webdav calls for a request that submits no lock
// token: a temporary exclusive lock on the resource the request changes,
// of depth infinity for DELETE, MOVE and COPY (so a locked resource below
// blocks them too), released when the request ends. A lock in the way
// fails it with 423 Locked.
func (l *reqLocks) Create(now time.Time, d webdav.LockDetails) (string, error) {
	root := slashClean(d.Root)
	zero := true
	for _, t := range l.targets() {
		if t.name == root && t.subtree {
			zero = false
		}
	}
	lk, err := l.m.create(root, false, zero, "", time.Hour, true)
	if err != nil {
		return "", err
	}
	return lk.token, nil
}

func (l *reqLocks) Refresh(now time.Time, token string, duration time.Duration) (webdav.LockDetails, error) {
	lk, err := l.m.refresh(token, l.src, duration)
	if err != nil {
		return webdav.LockDetails{}, err
	}
	return webdav.LockDetails{Root: lk.root, Duration: lk.timeout, OwnerXML: lk.owner, ZeroDepth: lk.zeroDepth}, nil
}

func (l *reqLocks) Unlock(now time.Time, token string) error { return l.m.unlock(token, "") }

func slashClean(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

// serveLock answers LOCK: a new lock (201 if it created an empty file at
// an unmapped URL, else 200), or, with an empty body, the refresh of the
// lock named in the If header.
func (h *Handler) serveLock(w http.ResponseWriter, r *http.Request) {
	// Validated as sent: a ".." is refused, never resolved.
	if _, err := h.fs.split("lock", r.URL.Path); err != nil {
		http.Error(w, "invalid path", http.StatusBadRequest)
		return
	}
	name := slashClean(r.URL.Path)
	timeout, err := parseTimeout(r.Header.Get("Timeout"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	if len(bytes.TrimSpace(body)) == 0 {
		lists, perr := parseIf(r.Header.Get("If"))
		if perr != nil {
			http.Error(w, "a lock refresh needs an If header naming the lock", http.StatusBadRequest)
			return
		}
		for _, tok := range ifTokens(lists) {
			if lk, rerr := h.locks.refresh(tok, name, timeout); rerr == nil {
				writeLock(w, http.StatusOK, lk, false)
				return
			}
		}
		http.Error(w, "no lock of this resource matches the If header", http.StatusPreconditionFailed)
		return
	}
	req, err := parseLockInfo(body)
	if err != nil {
		status := http.StatusBadRequest
		if err == errUnsupportedLock {
			status = http.StatusNotImplemented
		}
		http.Error(w, err.Error(), status)
		return
	}
	depth, err := parseDepth(r.Header.Get("Depth"), depthInfinity)
	if err != nil || depth == depthOne {
		http.Error(w, "a LOCK's Depth must be 0 or infinity", http.StatusBadRequest)
		return
	}
	lk, err := h.locks.create(name, req.Shared, depth == depthZero, req.Owner, timeout, false)
	if err != nil {
		http.Error(w, "locked", http.StatusLocked)
		return
	}
	ctx := r.Context()
	status := http.StatusOK
	if _, err := h.fs.Stat(ctx, name); errors.Is(err, os.ErrNotExist) {
		// RFC 4918 §7.3: a LOCK of an unmapped URL makes an empty file.
		f, oerr := h.fs.OpenFile(ctx, name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
		if oerr == nil {
			oerr = f.Close()
		}
		if oerr != nil {
			h.locks.unlock(lk.token, "")
			st := http.StatusInternalServerError
			if errors.Is(oerr, os.ErrNotExist) {
				st = http.StatusConflict
			}
			h.log.Debug("lock of an unmapped URL could not create it", "path", name, "err", oerr)
			http.Error(w, "cannot create the resource", st)
			return
		}
		status = http.StatusCreated
	} else if err != nil {
		h.locks.unlock(lk.token, "")
		http.Error(w, "cannot read the resource", http.StatusInternalServerError)
		return
	}
	writeLock(w, status, lk, true)
}

// writeLock answers a LOCK with the lock's DAV:lockdiscovery.
func writeLock(w http.ResponseWriter, status int, lk davLock, withToken bool) {
	if withToken {
		w.Header().Set("Lock-Token", "<"+lk.token+">")
	}
	w.Header().Set("Content-Type", `application/xml; charset="utf-8"`)
	w.WriteHeader(status)
	scope, depth := "exclusive", "infinity"
	if lk.shared {
		scope = "shared"
	}
	if lk.zeroDepth {
		depth = "0"
	}
	owner := ""
	if lk.owner != "" {
		owner = "<D:owner>" + lk.owner + "</D:owner>"
	}
	href := (&url.URL{Path: lk.root}).EscapedPath()
	fmt.Fprintf(w, `<?xml version="1.0" encoding="utf-8"?>`+"\n"+
		`<D:prop xmlns:D="DAV:"><D:lockdiscovery><D:activelock>`+
		`<D:locktype><D:write/></D:locktype><D:lockscope><D:%s/></D:lockscope>`+
		`<D:depth>%s</D:depth>%s<D:timeout>Second-%d</D:timeout>`+
		`<D:locktoken><D:href>%s</D:href></D:locktoken>`+
		`<D:lockroot><D:href>%s</D:href></D:lockroot>`+
		`</D:activelock></D:lockdiscovery></D:prop>`,
		scope, depth, owner, int64(lk.timeout/time.Second), html.EscapeString(lk.token), html.EscapeString(href))
}

// serveUnlock answers UNLOCK: 204, or 409 if the token names no lock whose
// scope has the request URI.
func (h *Handler) serveUnlock(w http.ResponseWriter, r *http.Request) {
	tok, err := parseLockToken(r.Header.Get("Lock-Token"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := h.locks.unlock(tok, slashClean(r.URL.Path)); err != nil {
		http.Error(w, "no such lock on this resource", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
