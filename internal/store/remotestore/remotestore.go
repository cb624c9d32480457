// Package remotestore is a cairn.Store whose objects live on another node:
// a client of the node's chunk service (internal/node) speaking the node
// wire protocol, version 1 (internal/node/wire, doc/format.md) over HTTP/2
// and mutual TLS 1.3.
//
// One Store keeps one HTTP/2 connection to its node (more only when the
// node's stream limit is reached) and multiplexes every call over it, so
// concurrent Puts and Gets pipeline on the wire. Has splits a large batch
// into requests of Options.HasBatch IDs and keeps several in flight (LBFS:
// a large file costs about two round trips before its new chunks are sent).
// Put sends only what the node lacks: concurrent Puts are gathered into
// batches, and each batch first asks the node which of its objects it is
// missing (put.go; Options.SendAlways turns this off).
//
// Errors keep the Kind the node gave them (errors.Is(err, cairn.ErrNotFound)
// for a missing object; Permission for a node's 401 or 403: this client
// is not admitted, which only the verified node can say); a node that
// cannot be reached, or a handshake that fails either way (a TLS alert is
// not authenticated: anyone can send one), gives Kind Unavailable; a
// canceled context gives Kind Canceled. Get verifies that what
// it received hashes to the ID it asked for (Kind Corrupt otherwise): a node
// may lie, the client does not believe it.
package remotestore

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/store"
)

// Options configure a Store.
type Options struct {
	// Addr is the node's host:port. Required.
	Addr string
	// TLS is the client configuration: pki.ClientTLS, usually with
	// TLSOptions.Peer = pki.RequireNode(<the node's name>). Required.
	TLS *tls.Config
	// HasBatch is how many IDs go in one has request. Default 1024; at
	// most wire.MaxIDs.
	HasBatch int
	// HasInFlight is how many has requests of one Has call run at once.
	// Default 4.
	HasInFlight int
	// GetBatch is how many concurrent Gets are coalesced into one get
	// request at most. Default 128; at most wire.MaxIDs. 1 turns
	// coalescing off.
	GetBatch int
	// PutBatchBytes is how many bytes of concurrent Puts are coalesced into
	// one put batch at most. Default 4 MiB; at most wire.MaxBatchBytes.
	// Objects larger than a quarter of it go alone. 0 takes the default;
	// a negative value turns coalescing off.
	PutBatchBytes int
	// InFlight is how many coalesced get requests, and how many put
	// batches (each a has question, then a put of what is missing), are in
	// flight at once. Default 4.
	InFlight int
	// SendAlways makes Put send every object without asking the node
	// first whether it has it. By default each put batch, and each large
	// object sent alone, is preceded by a has request for its IDs, and
	// only the objects the node lacks are sent: rewriting data the node
	// holds costs a round trip and 32 bytes per object instead of the
	// data. Asking is skipped anyway for less than 4 KiB of objects, and
	// for an ID that Has has just reported missing (a caller that asks
	// Has before it Puts pays no second question). Set SendAlways when
	// almost everything written is new and bandwidth is plentiful (a fast
	// LAN, loopback, filling an empty node): the question then only adds
	// a round trip to each batch.
	SendAlways bool
	// DialContext replaces the default dialer (tests, network namespaces).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives notes. nil discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() (Options, error) {
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return o, cairn.E("remote store", cairn.Invalid, o.Addr, fmt.Errorf("want host:port: %w", err))
	}
	if o.TLS == nil || o.TLS.MinVersion < tls.VersionTLS13 {
		return o, cairn.E("remote store", cairn.Invalid, o.Addr, errors.New("want a TLS 1.3 client configuration (pki.ClientTLS)"))
	}
	if o.HasBatch <= 0 {
		o.HasBatch = 1024
	}
	if o.HasBatch > wire.MaxIDs {
		o.HasBatch = wire.MaxIDs
	}
	if o.HasInFlight <= 0 {
		o.HasInFlight = 4
	}
	if o.GetBatch <= 0 {
		o.GetBatch = 128
	}
	o.GetBatch = min(o.GetBatch, wire.MaxIDs)
	if o.PutBatchBytes == 0 {
		o.PutBatchBytes = 4 << 20
	}
	o.PutBatchBytes = min(o.PutBatchBytes, wire.MaxBatchBytes)
	if o.InFlight <= 0 {
		o.InFlight = 4
	}
	if o.DialContext == nil {
		o.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Store is a cairn.Store on a remote node. Make one with New.
type Store struct {
	o      Options
	base   string
	tr     *http.Transport
	client *http.Client
	closed atomic.Bool

	// Coalescing: calls queue here, and up to Options.InFlight runners
	// each take what has queued and send it as one request. Under load the
	// batches fill by themselves; an idle store sends a lone call at once.
	ctx    context.Context // of the runners' requests; canceled by Close
	cancel context.CancelFunc
	gets   queue[*getCall]
	hases  queue[*hasCall]
	puts   queue[*putCall]

	missing missingIDs // what Has recently reported missing
}

var (
	_ cairn.Store      = (*Store)(nil)
	_ cairn.StoreStats = (*Store)(nil)
)

// New returns a Store for the node at o.Addr. It does not connect: the
// first call does.
func New(o Options) (*Store, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		TLSClientConfig:        o.TLS,
		Protocols:              &protos,
		DialContext:            o.DialContext,
		TLSHandshakeTimeout:    10 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true, // non-chunk bodies are zstd by protocol
		// One HTTP/2 connection carries every call; without this, calls
		// made while it is being dialed would each dial their own.
		MaxConnsPerHost: 1,
		IdleConnTimeout: 5 * time.Minute,
		HTTP2: &http.HTTP2Config{
			MaxReadFrameSize:              1 << 20,
			MaxReceiveBufferPerConnection: 64 << 20,
			MaxReceiveBufferPerStream:     8 << 20,
			SendPingTimeout:               30 * time.Second,
			PingTimeout:                   15 * time.Second,
		},
	}
	s := &Store{o: o, base: "https://" + o.Addr, tr: tr, client: &http.Client{Transport: tr}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.gets.max, s.puts.max, s.hases.max = o.InFlight, o.InFlight, o.HasInFlight
	return s, nil
}

// Addr is the node's address.
func (s *Store) Addr() string { return s.o.Addr }

// errClosed is returned by every method after Close.
var errClosed = errors.New("remote store is closed")

// begin checks ctx and that s is open.
func (s *Store) begin(ctx context.Context, op, path string) error {
	if err := store.CtxErr(ctx, op, path); err != nil {
		return err
	}
	if s.closed.Load() {
		return cairn.E(op, cairn.Invalid, path, errClosed)
	}
	return nil
}

// do sends a request and returns the response if its status is want; any
// other status is decoded into the node's error. The caller closes the
// body.
func (s *Store) do(ctx context.Context, op, path, method, urlPath string, body []byte, hdr map[string]string, want int) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	return s.doReader(ctx, op, path, method, urlPath, rd, int64(len(body)), hdr, want)
}

// doReader is do with the body as a reader of n bytes.
func (s *Store) doReader(ctx context.Context, op, path, method, urlPath string, body io.Reader, n int64, hdr map[string]string, want int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.base+urlPath, body)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, path, err)
	}
	if body != nil {
		req.ContentLength = n
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, s.transportErr(ctx, op, path, err)
	}
	if resp.StatusCode != want {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, wire.MaxErrorBody))
		return nil, s.wrap(op, path, wire.DecodeError(resp.StatusCode, resp.Header.Get("Content-Encoding"), b))
	}
	return resp, nil
}

// wrap names the node in an error from it, keeping its Kind.
func (s *Store) wrap(op, path string, err error) error {
	if path == "" {
		path = s.o.Addr
	} else {
		path = s.o.Addr + " " + path
	}
	return cairn.E("remote "+op, cairn.KindOf(err), path, err)
}

// transportErr classifies a failure to get a response: Kind Canceled if
// ctx ended, else Unavailable. A TLS alert, or a peer whose certificate is
// not the node's (another CA, another name, revoked), comes from a peer
// nobody has authenticated: a stale address, anyone on the path. It never
// means that this client was removed (only an answer of the verified node
// says so: 403, Kind Permission); the caller tries another node.
func (s *Store) transportErr(ctx context.Context, op, path string, err error) error {
	if ctx.Err() != nil {
		return cairn.E(op, cairn.Canceled, path, ctx.Err())
	}
	var (
		oe      *net.OpError
		alert   tls.AlertError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		verify  *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &oe) && oe.Op == "remote error":
		err = fmt.Errorf("the peer refused the TLS handshake (not taken for a removal: it is not authenticated): %w", err)
	case cairn.KindOf(err) != cairn.Other || errors.As(err, &alert) || errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &verify):
		err = fmt.Errorf("the peer failed this client's checks of the node: %w", err)
	}
	return cairn.E("remote "+op, cairn.Unavailable, s.o.Addr, err)
}

// readBody reads a response body of at most max bytes.
func (s *Store) readBody(ctx context.Context, op, path string, resp *http.Response, max int64) ([]byte, error) {
	defer resp.Body.Close()
	if resp.ContentLength > max {
		return nil, s.wrap(op, path, cairn.E(op, cairn.Invalid, path, fmt.Errorf("reply of %d bytes exceeds %d", resp.ContentLength, max)))
	}
	n := resp.ContentLength
	if n < 0 {
		n = 512
	}
	b := bytes.NewBuffer(make([]byte, 0, n+1))
	if _, err := b.ReadFrom(io.LimitReader(resp.Body, max+1)); err != nil {
		if ctx.Err() != nil {
			return nil, cairn.E(op, cairn.Canceled, path, ctx.Err())
		}
		return nil, cairn.E("remote "+op, cairn.IO, s.o.Addr+" "+path, err)
	}
	if int64(b.Len()) > max {
		return nil, s.wrap(op, path, cairn.E(op, cairn.Invalid, path, fmt.Errorf("reply exceeds %d bytes", max)))
	}
	return b.Bytes(), nil
}

var (
	zstdBody   = map[string]string{"Content-Encoding": wire.Zstd, "Content-Type": wire.TypeIDs}
	objectBody = map[string]string{"Content-Type": wire.TypeObject}
	batchBody  = map[string]string{"Content-Type": wire.TypeObjects}
)

// Put stores the object on the node, sending its data only if the node
// lacks it: concurrent Puts of small objects travel together in put
// batches, each preceded by a has request, and a large object goes alone
// after a has request of its own (see put.go and Options.SendAlways). The
// node verifies the ID of what it receives (Kind Corrupt) and stores it
// durably before answering. When the node already has the object, nothing
// is sent and Put returns nil once it has checked the data against id
// itself (Kind Corrupt), since the node did not see it.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	path := id.String()
	if err := s.begin(ctx, "put", path); err != nil {
		return err
	}
	if len(data) > wire.MaxObject {
		return cairn.E("put", cairn.Invalid, path, fmt.Errorf("object of %d bytes exceeds %d", len(data), wire.MaxObject))
	}
	if s.o.PutBatchBytes > 0 && len(data) <= s.o.PutBatchBytes/4 {
		return s.putCoalesced(ctx, id, data)
	}
	return s.putAlone(ctx, id, data)
}

// Get fetches the object and checks it against id. Concurrent Gets travel
// together in get requests.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	if err := s.begin(ctx, "get", id.String()); err != nil {
		return nil, err
	}
	if s.o.GetBatch > 1 {
		return s.getCoalesced(ctx, id)
	}
	return s.getOne(ctx, id)
}

// getOne fetches one object in a request of its own.
func (s *Store) getOne(ctx context.Context, id cairn.ID) ([]byte, error) {
	path := id.String()
	resp, err := s.do(ctx, "get", path, http.MethodGet, wire.PathObject+path, nil, nil, http.StatusOK)
	if err != nil {
		return nil, err
	}
	data, err := s.readBody(ctx, "get", path, resp, wire.MaxObject)
	if err != nil {
		return nil, err
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return nil, s.wrap("get", path, errCorrupt(id))
	}
	return data, nil
}

// Has asks the node which of ids it lacks, in batches of Options.HasBatch
// with up to Options.HasInFlight requests in flight, and answers in order.
// It remembers (boundedly) what it found missing, so that a Put of one of
// those objects is sent without asking again.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := s.begin(ctx, "has", ""); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	if len(ids) <= s.coalesceHasBelow() {
		if err := s.hasCoalesced(ctx, ids, found); err != nil {
			return nil, err
		}
		if !s.o.SendAlways {
			s.missing.add(ids, found)
		}
		return found, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, s.o.HasInFlight)
	for lo := 0; lo < len(ids); lo += s.o.HasBatch {
		hi := min(lo+s.o.HasBatch, len(ids))
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.hasBatch(ctx, "has", "", ids[lo:hi], found[lo:hi]); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := store.CtxErr(ctx, "has", ""); err != nil {
		return nil, err
	}
	if !s.o.SendAlways {
		s.missing.add(ids, found)
	}
	return found, nil
}

// hasBatch sends one has request (for op, of path, in errors) and sets
// found[i] when the node has ids[i].
func (s *Store) hasBatch(ctx context.Context, op, path string, ids []cairn.ID, found []bool) error {
	resp, err := s.do(ctx, op, path, http.MethodPost, wire.PathHas, wire.EncodeIDs(ids), zstdBody, http.StatusOK)
	if err != nil {
		return err
	}
	b, err := s.readBody(ctx, op, path, resp, int64(len(ids))+4096)
	if err != nil {
		return err
	}
	missing, err := wire.DecodeBitmap(b, len(ids))
	if err != nil {
		return s.wrap(op, path, err)
	}
	for i, m := range missing {
		found[i] = !m
	}
	return nil
}

// Delete removes the object from the node (devices only).
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	path := id.String()
	if err := s.begin(ctx, "delete", path); err != nil {
		return err
	}
	resp, err := s.do(ctx, "delete", path, http.MethodDelete, wire.PathObject+path, nil, nil, http.StatusNoContent)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// List streams the node's listing, calling fn from the caller's goroutine
// as records arrive.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	if err := s.begin(ctx, "list", ""); err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := s.do(lctx, "list", "", http.MethodGet, wire.PathList, nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ce := resp.Header.Get("Content-Encoding"); ce != wire.Zstd {
		return s.wrap("list", "", cairn.E("list", cairn.Invalid, "", fmt.Errorf("list reply with Content-Encoding %q", ce)))
	}
	lr, err := wire.NewListReader(resp.Body)
	if err != nil {
		return s.wrap("list", "", err)
	}
	defer lr.Close()
	for {
		if err := store.CtxErr(ctx, "list", ""); err != nil {
			return err
		}
		id, size, err := lr.Next()
		if err == io.EOF {
			return store.CtxErr(ctx, "list", "")
		}
		if err != nil {
			if ctx.Err() != nil {
				return cairn.E("list", cairn.Canceled, "", ctx.Err())
			}
			return s.wrap("list", "", err)
		}
		if err := fn(id, size); err != nil {
			return err
		}
	}
}

// Stats asks the node for its store's usage.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if err := s.begin(ctx, "stats", ""); err != nil {
		return cairn.StoreUsage{}, err
	}
	resp, err := s.do(ctx, "stats", "", http.MethodGet, wire.PathStats, nil, nil, http.StatusOK)
	if err != nil {
		return cairn.StoreUsage{}, err
	}
	b, err := s.readBody(ctx, "stats", "", resp, 64<<10)
	if err != nil {
		return cairn.StoreUsage{}, err
	}
	var st wire.Stats
	if err := wire.DecodeJSON(b, &st); err != nil {
		return cairn.StoreUsage{}, s.wrap("stats", "", err)
	}
	return cairn.StoreUsage{Objects: st.Objects, Bytes: st.Bytes, Disk: st.Disk}, nil
}

// Close drops the connections. No method may be called after.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.cancel()
	s.tr.CloseIdleConnections()
	return nil
}

// Health asks the node's anonymous health endpoint; nil if it answered ok.
func (s *Store) Health(ctx context.Context) error {
	if err := s.begin(ctx, "health", ""); err != nil {
		return err
	}
	resp, err := s.do(ctx, "health", "", http.MethodGet, wire.PathHealth, nil, nil, http.StatusOK)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64))
	resp.Body.Close()
	return nil
}

// Wake asks the node, a wake proxy, to send Wake-on-LAN magic packets for
// node (wire.PathWake). The proxy reads the node's wake method from the
// realm's metadata; the reply says what it sent.
func (s *Store) Wake(ctx context.Context, node string) (wire.WakeReply, error) {
	if err := s.begin(ctx, "wake", node); err != nil {
		return wire.WakeReply{}, err
	}
	body, err := wire.EncodeJSON(wire.WakeRequest{V: wire.WakeVersion, Node: node})
	if err != nil {
		return wire.WakeReply{}, cairn.E("wake", cairn.Invalid, node, err)
	}
	resp, err := s.do(ctx, "wake", node, http.MethodPost, wire.PathWake, body,
		map[string]string{"Content-Type": wire.TypeJSON, "Content-Encoding": wire.Zstd}, http.StatusOK)
	if err != nil {
		return wire.WakeReply{}, err
	}
	b, err := s.readBody(ctx, "wake", node, resp, wire.MaxWake)
	if err != nil {
		return wire.WakeReply{}, err
	}
	var r wire.WakeReply
	if err := wire.DecodeJSON(b, &r); err != nil {
		return wire.WakeReply{}, s.wrap("wake", node, err)
	}
	return r, nil
}
