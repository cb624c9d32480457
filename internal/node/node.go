// Package node is a node's chunk service: an http.Handler that serves a
// cairn.Store to the realm's devices over HTTP/2 and mutual TLS 1.3 (DESIGN
// decisions 8 and 9), speaking the node wire protocol, version 1
// (internal/node/wire; doc/format.md).
//
// Only GET /health is served to anyone. The join exchange (if configured)
// is authenticated by its one-time token; every other request needs a
// client certificate of the realm that is not revoked (checked on every
// request, not only at the handshake) and whose role may make it (Allowed):
// the chunk operations are for devices, the registrar (if configured) for
// benefactors and surrogates.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// Config configures a node's chunk service.
type Config struct {
	// Store is what the node serves. Required.
	Store cairn.Store
	// Realm is the realm ID whose nodes may connect. Required.
	Realm string
	// Revocations is consulted on every request. Required.
	Revocations pki.Revocations
	// Join, if set, serves the join exchange at wire.PathJoin
	// (pki.Authority.JoinHandler) on this node.
	Join http.Handler
	// Registrar, if set, takes the reports of benefactors and surrogates
	// at wire.PathRegister (see Registrar).
	Registrar Registrar
	// MetaService, if set, answers GET wire.PathMetaService (devices
	// only) with where the realm's metadata service is now: its gateways'
	// addresses (host:port).
	MetaService func(ctx context.Context) ([]string, error)
	// Waker, if set, makes this node a wake proxy: it sends Wake-on-LAN
	// magic packets for the realm's devices at wire.PathWake (see Waker).
	Waker Waker
	// Logger receives refusals and failures. nil discards.
	Logger *slog.Logger

	// StallTimeout cuts a request whose body, or a reply that the client,
	// makes no progress for this long (slow-loris). Default 60 s.
	StallTimeout time.Duration
	// HandshakeTimeout bounds a connection's TLS handshake and the reading
	// of its request headers. Default 10 s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection with no open stream for this long.
	// Default 120 s.
	IdleTimeout time.Duration
	// PutConcurrency is how many objects of one put batch are stored at
	// once (lets a local store's group commit cover many). Default 32.
	PutConcurrency int
}

func (c Config) withDefaults() (Config, error) {
	if c.Store == nil {
		return c, cairn.E("node config", cairn.Invalid, "", errors.New("no store"))
	}
	if err := pki.ValidRealm(c.Realm); err != nil {
		return c, err
	}
	if c.Revocations == nil {
		return c, cairn.E("node config", cairn.Invalid, "", errors.New("no revocation list (pki.NoRevocations{} revokes nothing)"))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 60 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.PutConcurrency <= 0 {
		c.PutConcurrency = 32
	}
	return c, nil
}

// Op names a request of the protocol, for authorization.
type Op string

// The operations.
const (
	OpHas    Op = "has"
	OpPut    Op = "put"
	OpGet    Op = "get"
	OpDelete Op = "delete"
	OpList   Op = "list"
	OpStats  Op = "stats"
	// OpRegister is a benefactor's or surrogate's report to its registrar.
	OpRegister Op = "register"
	// OpMetaService asks where the realm's metadata service is.
	OpMetaService Op = "metaservice"
	// OpWake asks a wake proxy to send a magic packet for a node.
	OpWake Op = "wake"
)

// Allowed reports whether a client of role may make op. In protocol version
// 1 only devices are clients of the chunk service: the owner's machines
// place, fetch and collect chunks; benefactors and surrogates only serve. A
// benefactor's or surrogate's certificate (they run on machines cairn does
// not trust) therefore opens no chunk operation on any other node: it can
// neither learn which chunks a node holds nor fetch, add or remove any. It
// opens one thing: its own reports to a registrar (a device registers
// directly in the metadata service, so it has no use for one).
func Allowed(role pki.Role, op Op) bool {
	switch op {
	case OpHas, OpPut, OpGet, OpDelete, OpList, OpStats, OpMetaService, OpWake:
		return role == pki.Device
	case OpRegister:
		return role == pki.Benefactor || role == pki.Surrogate
	}
	return false
}

// Handler serves the protocol. Make one with NewHandler.
type Handler struct {
	cfg Config
	log *slog.Logger
}

// NewHandler returns the chunk service for cfg.
func NewHandler(cfg Config) (*Handler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, log: cfg.Logger}, nil
}

// NewServer returns an http.Server for the chunk service: HTTP/2 only, over
// tlsConf (pki.ServerTLS), with cfg's timeouts. Serve it with
// srv.ServeTLS(listener, "", "").
func NewServer(cfg Config, tlsConf *tls.Config) (*http.Server, error) {
	h, err := NewHandler(cfg)
	if err != nil {
		return nil, err
	}
	cfg = h.cfg
	if tlsConf == nil || tlsConf.MinVersion < tls.VersionTLS13 {
		return nil, cairn.E("node server", cairn.Invalid, "", errors.New("want a TLS 1.3 configuration (pki.ServerTLS)"))
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	return &http.Server{
		Handler:           h,
		TLSConfig:         tlsConf,
		Protocols:         &protos,
		ReadHeaderTimeout: cfg.HandshakeTimeout, // also bounds the TLS handshake
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          256,
			MaxReadFrameSize:              1 << 20,
			MaxReceiveBufferPerConnection: 64 << 20,
			MaxReceiveBufferPerStream:     8 << 20,
			SendPingTimeout:               cfg.IdleTimeout / 2,
			PingTimeout:                   cfg.StallTimeout / 2,
			WriteByteTimeout:              cfg.StallTimeout,
		},
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == wire.PathHealth:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.fail(w, r, http.StatusMethodNotAllowed, cairn.E("health", cairn.Invalid, "", errors.New("method not allowed")))
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
		return
	case p == wire.PathJoin && h.cfg.Join != nil:
		// Anonymous: its small body must arrive within one stall timeout.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(h.cfg.StallTimeout))
		h.cfg.Join.ServeHTTP(w, r)
		return
	}
	id, err := h.authenticate(r)
	if err != nil {
		status := http.StatusForbidden
		switch {
		case r.TLS == nil || len(r.TLS.VerifiedChains) == 0:
			status = http.StatusUnauthorized
		case cairn.KindOf(err) != cairn.Permission:
			// The revocation list cannot be trusted now (not loaded
			// yet, or its source lost): refused all the same, but as
			// an outage, so the client retries instead of taking it
			// for a removal.
			status = http.StatusServiceUnavailable
			err = cairn.E("admit", cairn.Unavailable, id.Name, err)
		}
		h.log.Warn("request refused", "remote", r.RemoteAddr, "path", p, "err", err)
		h.fail(w, r, status, err)
		return
	}
	op, target, status, err := route(r.Method, p)
	if err != nil {
		h.fail(w, r, status, err)
		return
	}
	if op == OpRegister && h.cfg.Registrar == nil {
		h.fail(w, r, http.StatusNotFound, cairn.E("route", cairn.Invalid, p, errors.New("this node is no registrar")))
		return
	}
	if op == OpMetaService && h.cfg.MetaService == nil {
		h.fail(w, r, http.StatusNotFound, cairn.E("route", cairn.Invalid, p, errors.New("this node does not know the metadata service")))
		return
	}
	if op == OpWake && h.cfg.Waker == nil {
		h.fail(w, r, http.StatusNotFound, cairn.E("route", cairn.Invalid, p, errors.New("this node is no wake proxy")))
		return
	}
	if !Allowed(id.Role, op) {
		h.log.Warn("request refused by role", "node", id.Name, "role", id.Role, "op", op)
		h.fail(w, r, http.StatusForbidden, cairn.E(string(op), cairn.Permission, id.Name, fmt.Errorf("a %s may not %s", id.Role, op)))
		return
	}
	switch {
	case target != "":
		oid, err := cairn.ParseID(target)
		if err != nil {
			h.fail(w, r, 0, err)
			return
		}
		switch op {
		case OpPut:
			h.putOne(w, r, oid)
		case OpGet:
			h.getOne(w, r, oid)
		case OpDelete:
			h.deleteOne(w, r, oid)
		}
	case op == OpHas:
		h.has(w, r)
	case op == OpPut:
		h.putBatch(w, r)
	case op == OpGet:
		h.getBatch(w, r)
	case op == OpList:
		h.list(w, r)
	case op == OpStats:
		h.stats(w, r)
	case op == OpRegister:
		h.register(w, r, id)
	case op == OpMetaService:
		h.metaService(w, r)
	case op == OpWake:
		h.wake(w, r, id)
	}
}

// routes maps the fixed paths to their method and operation.
var routes = map[string]struct {
	method string
	op     Op
}{
	wire.PathHas:   {http.MethodPost, OpHas},
	wire.PathPut:   {http.MethodPost, OpPut},
	wire.PathGet:   {http.MethodPost, OpGet},
	wire.PathList:  {http.MethodGet, OpList},
	wire.PathStats: {http.MethodGet, OpStats},
	// Served only with a Registrar: see ServeHTTP.
	wire.PathRegister: {http.MethodPost, OpRegister},
	// Served only with MetaService: see ServeHTTP.
	wire.PathMetaService: {http.MethodGet, OpMetaService},
	// Served only with a Waker.
	wire.PathWake: {http.MethodPost, OpWake},
}

// route maps a request to its operation and, for wire.PathObject, the ID
// text; or to an error reply (404, 405).
func route(method, p string) (op Op, target string, status int, err error) {
	if rt, ok := routes[p]; ok {
		if method != rt.method {
			return "", "", http.StatusMethodNotAllowed, cairn.E(string(rt.op), cairn.Invalid, p, fmt.Errorf("method %s not allowed, want %s", method, rt.method))
		}
		return rt.op, "", 0, nil
	}
	if t, ok := strings.CutPrefix(p, wire.PathObject); ok {
		switch method {
		case http.MethodPut:
			return OpPut, t, 0, nil
		case http.MethodGet:
			return OpGet, t, 0, nil
		case http.MethodDelete:
			return OpDelete, t, 0, nil
		}
		return "", "", http.StatusMethodNotAllowed, cairn.E("object", cairn.Invalid, p, fmt.Errorf("method %s not allowed, want PUT, GET or DELETE", method))
	}
	return "", "", http.StatusNotFound, cairn.E("route", cairn.Invalid, p, errors.New("no such endpoint"))
}

// authenticate returns the verified, unrevoked client of r.
func (h *Handler) authenticate(r *http.Request) (pki.NodeIdentity, error) {
	id, leaf, err := pki.PeerIdentity(r.TLS)
	if err != nil {
		return id, err
	}
	return pki.Admit(h.cfg.Realm, leaf, h.cfg.Revocations)
}

// fail writes err as an error reply: status (0: from err's Kind), the
// error encoded as wire.EncodeError.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status == 0 {
		status = wire.Status(cairn.KindOf(err))
	}
	if status >= 500 {
		h.log.Error("request failed", "path", r.URL.Path, "err", err)
	}
	body := wire.EncodeError(err)
	hd := w.Header()
	hd.Set("Content-Type", wire.TypeJSON)
	hd.Set("Content-Encoding", wire.Zstd)
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// stall refreshes a read or write deadline on progress, so that a peer
// that stops sending or reading is cut after StallTimeout while a slow but
// moving one is not.
type stall struct {
	rc      *http.ResponseController
	timeout time.Duration
	last    time.Time
	read    bool
}

func (h *Handler) stallReader(w http.ResponseWriter, r io.Reader) io.Reader {
	s := &stall{rc: http.NewResponseController(w), timeout: h.cfg.StallTimeout, read: true}
	s.refresh(true)
	return &stallReader{s: s, r: r}
}

func (h *Handler) stallWriter(w http.ResponseWriter) io.Writer {
	s := &stall{rc: http.NewResponseController(w), timeout: h.cfg.StallTimeout}
	s.refresh(true)
	return &stallWriter{s: s, w: w}
}

func (s *stall) refresh(force bool) {
	now := time.Now()
	if !force && now.Sub(s.last) < s.timeout/8 {
		return
	}
	s.last = now
	if s.read {
		_ = s.rc.SetReadDeadline(now.Add(s.timeout))
	} else {
		_ = s.rc.SetWriteDeadline(now.Add(s.timeout))
	}
}

type stallReader struct {
	s *stall
	r io.Reader
}

func (r *stallReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.s.refresh(false)
	}
	return n, err
}

type stallWriter struct {
	s *stall
	w http.ResponseWriter
}

func (w *stallWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if n > 0 {
		w.s.refresh(false)
	}
	return n, err
}

func (w *stallWriter) Flush() error { return w.s.rc.Flush() }

// readBody reads r's body, at most max bytes (413 beyond), with the stall
// timeout. compressed says whether the body must carry Content-Encoding
// zstd (415 otherwise) or must not.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request, op string, max int64, compressed bool) ([]byte, bool) {
	enc := r.Header.Get("Content-Encoding")
	if compressed != (enc == wire.Zstd) || (!compressed && enc != "") {
		want := "no Content-Encoding"
		if compressed {
			want = "Content-Encoding: zstd"
		}
		h.fail(w, r, http.StatusUnsupportedMediaType, cairn.E(op, cairn.Invalid, "", fmt.Errorf("want %s, have %q", want, enc)))
		return nil, false
	}
	if r.ContentLength > max {
		h.fail(w, r, http.StatusRequestEntityTooLarge, cairn.E(op, cairn.Invalid, "", fmt.Errorf("body of %d bytes exceeds %d", r.ContentLength, max)))
		return nil, false
	}
	n := r.ContentLength
	if n < 0 {
		n = 512
	}
	buf := getBuf(int(n) + 1) // +1: room to see EOF without growing
	body, err := readAll(buf, h.stallReader(w, http.MaxBytesReader(w, r.Body, max)))
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			h.fail(w, r, http.StatusRequestEntityTooLarge, cairn.E(op, cairn.Invalid, "", fmt.Errorf("body exceeds %d bytes", max)))
		case errors.Is(err, os.ErrDeadlineExceeded):
			h.fail(w, r, http.StatusRequestTimeout, cairn.E(op, cairn.IO, "", fmt.Errorf("body stalled for %v", h.cfg.StallTimeout)))
		default:
			h.fail(w, r, http.StatusBadRequest, cairn.E(op, cairn.IO, "", fmt.Errorf("reading the body: %w", err)))
		}
		return nil, false
	}
	return body, true
}

// Request bodies up to poolMax bytes are read into pooled buffers, handed
// back when the request is done (stores do not keep what Put is given).
const poolMax = 8 << 20

var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

// getBuf returns an empty buffer of capacity at least n.
func getBuf(n int) []byte {
	if n > poolMax {
		return make([]byte, 0, n)
	}
	bp := bodyPool.Get().(*[]byte)
	if cap(*bp) < n {
		return make([]byte, 0, max(n, 64<<10))
	}
	return (*bp)[:0]
}

// putBuf returns a buffer from getBuf to the pool.
func putBuf(b []byte) {
	if cap(b) > poolMax+1 {
		return
	}
	b = b[:0]
	bodyPool.Put(&b)
}

// readAll is io.ReadAll into buf.
func readAll(buf []byte, r io.Reader) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func checkID(op string, id cairn.ID, data []byte) error {
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E(op, cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	return nil
}

func (h *Handler) has(w http.ResponseWriter, r *http.Request) {
	body, ok := h.readBody(w, r, "has", wire.MaxIDs*cairn.IDSize+4096, true)
	if !ok {
		return
	}
	ids, err := wire.DecodeIDs(body)
	putBuf(body)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	found, err := h.cfg.Store.Has(r.Context(), ids)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	if len(found) != len(ids) {
		h.fail(w, r, 0, cairn.E("has", cairn.Other, "", fmt.Errorf("store answered %d of %d", len(found), len(ids))))
		return
	}
	for i := range found {
		found[i] = !found[i] // the reply names the missing
	}
	h.reply(w, wire.TypeBitmap, wire.EncodeBitmap(found))
}

// reply writes a compressed 200 reply.
func (h *Handler) reply(w http.ResponseWriter, typ string, body []byte) {
	hd := w.Header()
	hd.Set("Content-Type", typ)
	hd.Set("Content-Encoding", wire.Zstd)
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = h.stallWriter(w).Write(body)
}

func (h *Handler) putOne(w http.ResponseWriter, r *http.Request, id cairn.ID) {
	data, ok := h.readBody(w, r, "put", wire.MaxObject, false)
	if !ok {
		return
	}
	defer putBuf(data)
	if err := checkID("put", id, data); err != nil {
		h.fail(w, r, 0, err)
		return
	}
	if err := h.cfg.Store.Put(r.Context(), id, data); err != nil {
		h.fail(w, r, 0, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) putBatch(w http.ResponseWriter, r *http.Request) {
	body, ok := h.readBody(w, r, "put", wire.MaxBatchBytes, false)
	if !ok {
		return
	}
	defer putBuf(body)
	objs, err := wire.DecodeObjects(body)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	ctx := r.Context()
	errs := make([]error, len(objs))
	sem := make(chan struct{}, h.cfg.PutConcurrency)
	var wg sync.WaitGroup
	for i, o := range objs {
		if err = checkID("put", o.ID, o.Data); err != nil {
			errs[i] = err
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = h.cfg.Store.Put(ctx, o.ID, o.Data)
		})
	}
	wg.Wait()
	var res wire.PutResult
	for i, err := range errs {
		if err != nil {
			res.Failed = append(res.Failed, wire.PutFailure{Index: i, Error: wire.BodyOf(err)})
		}
	}
	b, err := wire.EncodeJSON(res)
	if err != nil {
		h.fail(w, r, 0, cairn.E("put", cairn.Other, "", err))
		return
	}
	h.reply(w, wire.TypeJSON, b)
}

func (h *Handler) getOne(w http.ResponseWriter, r *http.Request, id cairn.ID) {
	data, err := h.cfg.Store.Get(r.Context(), id)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", wire.TypeObject)
	hd.Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = h.stallWriter(w).Write(data)
}

// Read-ahead of a get request: getWorkers goroutines read at most getAhead
// objects ahead of what has been sent.
const (
	getWorkers = 4
	getAhead   = 16
)

// getBatch answers a get request with a get stream. The objects are read
// a few at a time ahead of the writer, and written in request order.
func (h *Handler) getBatch(w http.ResponseWriter, r *http.Request) {
	body, ok := h.readBody(w, r, "get", wire.MaxIDs*cairn.IDSize+4096, true)
	if !ok {
		return
	}
	ids, err := wire.DecodeIDs(body)
	putBuf(body)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	type result struct {
		data []byte
		err  error
	}
	// getAhead workers read objects in order, each into its slot; the
	// writer below sends them in order. A worker runs at most getAhead
	// objects ahead of the writer (slots are released as they are sent).
	results := make([]chan result, len(ids))
	for i := range results {
		results[i] = make(chan result, 1)
	}
	next := make(chan int)
	sem := make(chan struct{}, getAhead)
	go func() {
		defer close(next)
		for i := range ids {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range min(getWorkers, len(ids)) {
		go func() {
			for i := range next {
				data, err := h.cfg.Store.Get(ctx, ids[i])
				results[i] <- result{data, err}
			}
		}()
	}
	w.Header().Set("Content-Type", wire.TypeGetReply)
	out := h.stallWriter(w)
	buf := make([]byte, 0, 256<<10)
	flush := func() bool {
		if len(buf) == 0 {
			return true
		}
		_, err := out.Write(buf)
		buf = buf[:0]
		return err == nil
	}
	for i, id := range ids {
		var res result
		select {
		case res = <-results[i]:
		case <-ctx.Done():
			return
		}
		<-sem
		if res.err != nil {
			buf = wire.AppendGetError(buf, id, res.err)
		} else {
			if len(buf)+len(res.data) > cap(buf) && !flush() {
				return
			}
			buf = wire.AppendGetEntry(buf, id, res.data)
		}
		if len(buf) >= 128<<10 && !flush() {
			return
		}
	}
	flush()
}

func (h *Handler) deleteOne(w http.ResponseWriter, r *http.Request, id cairn.ID) {
	if err := h.cfg.Store.Delete(r.Context(), id); err != nil {
		h.fail(w, r, 0, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listFlushEvery is how many list records go out between flushes.
const listFlushEvery = 4096

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Type", wire.TypeList)
	hd.Set("Content-Encoding", wire.Zstd)
	w.WriteHeader(http.StatusOK)
	out := h.stallWriter(w).(*stallWriter)
	lw := wire.NewListWriter(out)
	defer lw.Close()
	n := 0
	var werr error
	err := h.cfg.Store.List(r.Context(), func(id cairn.ID, size int64) error {
		if werr = lw.Object(id, size); werr != nil {
			return werr
		}
		if n++; n%listFlushEvery == 0 {
			if werr = lw.Flush(); werr == nil {
				werr = out.Flush()
			}
			return werr
		}
		return nil
	})
	switch {
	case werr != nil:
		return // the client is gone
	case err != nil:
		h.log.Warn("list failed", "err", err)
		_ = lw.Fail(err)
	default:
		_ = lw.End()
	}
}

func (h *Handler) stats(w http.ResponseWriter, r *http.Request) {
	ss, ok := h.cfg.Store.(cairn.StoreStats)
	if !ok {
		h.fail(w, r, http.StatusNotImplemented, cairn.E("stats", cairn.Other, "", errors.New("this node's store reports no statistics")))
		return
	}
	u, err := ss.Stats(r.Context())
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	b, err := wire.EncodeJSON(wire.Stats{Objects: u.Objects, Bytes: u.Bytes, Disk: u.Disk})
	if err != nil {
		h.fail(w, r, 0, cairn.E("stats", cairn.Other, "", err))
		return
	}
	h.reply(w, wire.TypeJSON, b)
}

// metaService answers where the realm's metadata service is.
func (h *Handler) metaService(w http.ResponseWriter, r *http.Request) {
	gws, err := h.cfg.MetaService(r.Context())
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	b, err := wire.EncodeJSON(gws)
	if err != nil {
		h.fail(w, r, 0, cairn.E("metadata service", cairn.Other, "", err))
		return
	}
	h.reply(w, wire.TypeJSON, b)
}
