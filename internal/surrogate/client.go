package surrogate

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/crypto/nacl/box"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// Client talks to one surrogate. It is safe for concurrent use.
type Client struct {
	addr string
	hc   *http.Client
	tr   *http.Transport

	mu   sync.Mutex
	peer string // the surrogate's node name, from its verified certificate
}

// NewClient returns a client of the surrogate at addr (host:port) over
// HTTP/2 and tlsConf: a device's pki.ClientTLS that should require the
// peer to be a surrogate (pki.RequireRole(pki.Surrogate)).
func NewClient(addr string, tlsConf *tls.Config) (*Client, error) {
	if err := wire.CheckAddr(addr); err != nil {
		return nil, cairn.E("surrogate client", cairn.Invalid, addr, err)
	}
	if tlsConf == nil {
		return nil, cairn.E("surrogate client", cairn.Invalid, addr, errors.New("no TLS configuration"))
	}
	tr := wire.NewTransport(tlsConf)
	return &Client{addr: addr, hc: &http.Client{Transport: tr}, tr: tr}, nil
}

// ClientTLS is the TLS configuration of a device's client of a surrogate:
// its realm credentials, and a peer that must be a surrogate of the realm.
func ClientTLS(creds *pki.Credentials, rev pki.Revocations) (*tls.Config, error) {
	return pki.ClientTLS(creds, pki.TLSOptions{Revocations: rev, Peer: pki.RequireRole(pki.Surrogate)})
}

// Addr is the surrogate's address.
func (c *Client) Addr() string { return c.addr }

// Name is the surrogate's node name, as its certificate says ("" before
// the first answer).
func (c *Client) Name() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peer
}

// Close closes idle connections.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// do sends one request and returns the reply body of a 2xx answer, or the
// error the surrogate sent.
func (c *Client) do(ctx context.Context, op, method, path string, body []byte, hdr http.Header, max int64) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+c.addr+path, rd)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, c.addr, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, cairn.E(op, cairn.Canceled, c.addr, ctx.Err())
		}
		return nil, cairn.E(op, cairn.Unavailable, c.addr, err)
	}
	defer resp.Body.Close()
	// The handshake verified the certificate (pki.ClientTLS): its
	// identity can be read.
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		if id, perr := pki.IdentityOf(resp.TLS.PeerCertificates[0]); perr == nil {
			c.mu.Lock()
			c.peer = id.Name
			c.mu.Unlock()
		}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, cairn.E(op, cairn.Unavailable, c.addr, err)
	}
	if resp.StatusCode/100 != 2 {
		err := wire.DecodeError(resp.StatusCode, resp.Header.Get("Content-Encoding"), b)
		return nil, cairn.E(op, cairn.KindOf(err), c.addr, err)
	}
	if int64(len(b)) > max {
		return nil, cairn.E(op, cairn.Corrupt, c.addr, fmt.Errorf("reply exceeds %d bytes", max))
	}
	return b, nil
}

// Info asks what the surrogate offers (no session needed).
func (c *Client) Info(ctx context.Context) (Info, error) {
	const op = "surrogate info"
	b, err := c.do(ctx, op, http.MethodGet, PathInfo, nil, nil, MaxReply)
	if err != nil {
		return Info{}, err
	}
	in, err := DecodeInfo(b)
	if err != nil {
		return Info{}, cairn.E(op, cairn.Corrupt, c.addr, err)
	}
	return in, nil
}

// Session is one registration with a surrogate. It is safe for concurrent
// use.
type Session struct {
	c      *Client
	id     ClientID
	key    [KeySize]byte
	quota  int64
	offset time.Duration // the surrogate's clock minus ours

	mu      sync.Mutex
	expires time.Time // by our clock
}

// Register starts a session: a new X25519 key pair, whose public half the
// surrogate seals the session key to. want, if > 0, is the most quota the
// session asks for.
func (c *Client) Register(ctx context.Context, want int64) (*Session, error) {
	const op = "surrogate register"
	pub, priv, err := box.GenerateKey(rand.Reader)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, c.addr, err)
	}
	body, _ := json.Marshal(RegisterRequest{Format: Version, Key: pub[:], Want: want})
	sent := time.Now()
	b, err := c.do(ctx, op, http.MethodPost, PathRegister, body, http.Header{"Content-Type": {wire.TypeJSON}}, MaxReply)
	if err != nil {
		return nil, err
	}
	got := time.Now()
	r, err := DecodeRegisterReply(b)
	if err != nil {
		return nil, cairn.E(op, cairn.Corrupt, c.addr, err)
	}
	key, ok := box.OpenAnonymous(nil, r.Sealed, pub, priv)
	if !ok || len(key) != KeySize {
		return nil, cairn.E(op, cairn.Corrupt, c.addr, errors.New("the sealed session key does not open with this session's key"))
	}
	s := &Session{c: c, quota: r.Quota}
	s.id, _ = ParseClientID(r.Client)
	copy(s.key[:], key)
	mid := sent.Add(got.Sub(sent) / 2)
	s.offset = r.Now.Sub(mid)
	// The lease runs from when the request was sent, by our clock: never
	// later than the surrogate's end.
	s.expires = sent.Add(time.Duration(r.Lease) * time.Millisecond)
	return s, nil
}

// ID is the session's client ID.
func (s *Session) ID() ClientID { return s.id }

// Quota is the bytes the surrogate granted.
func (s *Session) Quota() int64 { return s.quota }

// Expires is when the lease ends unless renewed (this machine's clock).
func (s *Session) Expires() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expires
}

// headers authenticates one request: time by the surrogate's clock, a new
// nonce, the MAC.
func (s *Session) headers(method, path string, body []byte) (http.Header, error) {
	var n Nonce
	if _, err := rand.Read(n[:]); err != nil {
		return nil, err
	}
	ms := time.Now().Add(s.offset).UnixMilli()
	return http.Header{
		HeaderClient: {s.id.String()},
		HeaderTime:   {strconv.FormatInt(ms, 10)},
		HeaderNonce:  {hex.EncodeToString(n[:])},
		HeaderMAC:    {hex.EncodeToString(MAC(&s.key, method, path, s.id, ms, n, body))},
	}, nil
}

func (s *Session) do(ctx context.Context, op, method, path string, body []byte, max int64) ([]byte, error) {
	h, err := s.headers(method, path, body)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, s.c.addr, err)
	}
	return s.c.do(ctx, op, method, path, body, h, max)
}

// Renew extends the lease.
func (s *Session) Renew(ctx context.Context) (time.Time, error) {
	const op = "surrogate renew"
	sent := time.Now()
	b, err := s.do(ctx, op, http.MethodPost, PathRenew, nil, MaxReply)
	if err != nil {
		return time.Time{}, err
	}
	r, err := DecodeLeaseReply(b)
	if err != nil {
		return time.Time{}, cairn.E(op, cairn.Corrupt, s.c.addr, err)
	}
	s.mu.Lock()
	s.expires = sent.Add(time.Duration(r.Lease) * time.Millisecond)
	exp := s.expires
	s.mu.Unlock()
	return exp, nil
}

// Deregister ends the session: the surrogate deletes its chunks.
func (s *Session) Deregister(ctx context.Context) error {
	_, err := s.do(ctx, "surrogate deregister", http.MethodPost, PathDeregister, nil, MaxReply)
	return err
}

// Stage sends chunks (already encrypted, named by the BLAKE3 hash of their
// bytes) in batches of at most MaxStageBytes and MaxStageObjects. Each
// batch is kept whole or not at all; it stops at the first refusal (Kind
// Permission: the quota; Corrupt: a chunk that does not hash to its ID).
func (s *Session) Stage(ctx context.Context, objs []Object) (UsageReply, error) {
	const op = "surrogate stage"
	var last UsageReply
	var body []byte
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		b, err := s.do(ctx, op, http.MethodPost, PathStage, body, MaxReply)
		if err != nil {
			return err
		}
		if last, err = DecodeUsageReply(b); err != nil {
			return cairn.E(op, cairn.Corrupt, s.c.addr, err)
		}
		body, n = body[:0], 0
		return nil
	}
	for _, o := range objs {
		if len(o.Data) > MaxChunk {
			return last, cairn.E(op, cairn.Invalid, o.ID.String(), fmt.Errorf("chunk of %d bytes exceeds %d", len(o.Data), MaxChunk))
		}
		if n == MaxStageObjects || len(body)+wire.ObjectHeader+len(o.Data) > MaxStageBytes {
			if err := flush(); err != nil {
				return last, err
			}
		}
		body = AppendObject(body, o.ID, o.Data)
		n++
	}
	return last, flush()
}

// Unstage deletes chunks from the surrogate (absent ones are no error).
func (s *Session) Unstage(ctx context.Context, ids []cairn.ID) (UsageReply, error) {
	const op = "surrogate unstage"
	var last UsageReply
	for len(ids) > 0 {
		k := min(len(ids), MaxUnstageIDs)
		b, err := s.do(ctx, op, http.MethodPost, PathUnstage, EncodeIDs(ids[:k]), MaxReply)
		if err != nil {
			return last, err
		}
		if last, err = DecodeUsageReply(b); err != nil {
			return last, cairn.E(op, cairn.Corrupt, s.c.addr, err)
		}
		ids = ids[k:]
	}
	return last, nil
}

// Get reads a staged chunk and checks that its bytes hash to id: a
// corrupted or substituted chunk fails with Kind Corrupt (the caller's
// decode then checks the AEAD tag with the chunk key the surrogate never
// saw). Not staged: Kind NotFound.
func (s *Session) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	const op = "surrogate get"
	b, err := s.do(ctx, op, http.MethodGet, PathChunk+id.String(), nil, MaxChunk)
	if err != nil {
		return nil, err
	}
	if cairn.ID(blake3.Sum256(b)) != id {
		return nil, cairn.E(op, cairn.Corrupt, id.String(), fmt.Errorf("the surrogate at %s answered bytes that do not hash to the chunk's ID", s.c.addr))
	}
	return b, nil
}
