// Package metagw is the metadata gateway: a TLS 1.3 front, authenticated
// both ways by the realm's CA, for the etcd that holds a realm's metadata
// (DESIGN decisions 2 and 9). The realm's devices reach etcd through it;
// nothing else does.
//
// The gateway terminates TLS and pipes the decrypted bytes, untouched, to an
// upstream etcd client endpoint over plain TCP (the embedded etcd's loopback
// address): etcd's plain listener speaks gRPC over cleartext HTTP/2, so the
// gateway needs to understand nothing above TLS. Which peers get through is
// decided at the handshake and kept decided for the connection's life:
//
//   - the client must present a certificate of the realm CA (pki.ServerTLS
//     with RequireClientCert) that names a node of the realm;
//   - its role must be device (pki.RequireRole): a benefactor's or a
//     surrogate's certificate, which lives on a machine cairn does not trust,
//     opens no metadata;
//   - it must not be revoked, at the handshake and afterwards: every live
//     connection's certificate is checked again every RecheckInterval, and a
//     connection whose peer has been revoked (or whose revocation check
//     fails: it fails closed) is cut.
//
// What it defends against is in doc/threat-model.md ("Transport, joining
// and revocation", Metadata gateway).
package metagw

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/pki"
)

// Config configures a Gateway. Durations and limits left zero take their
// defaults.
type Config struct {
	// Credentials the gateway presents: those of the device that runs it.
	// Their realm is the realm whose devices are admitted. Required.
	Credentials *pki.Credentials
	// Revocations is consulted at every handshake and, for every live
	// connection, every RecheckInterval. Required (pki.NoRevocations{}
	// revokes nothing).
	Revocations pki.Revocations

	// Upstream lists etcd client endpoints ("host:port", plain TCP, or
	// "unix:///path", a socket), tried in order for each admitted
	// connection. Required unless Dial is set.
	Upstream []string
	// Dial, if set, connects to etcd instead of dialing Upstream.
	Dial func(ctx context.Context) (net.Conn, error)

	// Logger receives refusals (who, why), cut connections and failures.
	// Nil discards.
	Logger *slog.Logger

	// HandshakeTimeout bounds a connection's TLS handshake. Default 10 s.
	HandshakeTimeout time.Duration
	// DialTimeout bounds connecting to the upstream. Default 3 s.
	DialTimeout time.Duration
	// RecheckInterval is how often each live connection's certificate is
	// checked against Revocations. Default pki.RecheckInterval (1 s).
	RecheckInterval time.Duration
	// MaxConns caps the connections open at once, handshaking or admitted;
	// one more is closed at once. Default 1024.
	MaxConns int
	// MaxHandshakes caps the connections still in their handshake (anyone
	// can open those), so that unauthenticated peers cannot take every
	// slot of MaxConns. Default 64.
	MaxHandshakes int
}

func (c Config) withDefaults() (Config, error) {
	const op = "metadata gateway config"
	if c.Credentials == nil || c.Credentials.Leaf == nil || c.Credentials.CA == nil || c.Credentials.Key == nil {
		return c, cairn.E(op, cairn.Invalid, "", errors.New("no credentials"))
	}
	if c.Revocations == nil {
		return c, cairn.E(op, cairn.Invalid, "", errors.New("no revocation list (pki.NoRevocations{} revokes nothing)"))
	}
	if c.Dial == nil {
		if len(c.Upstream) == 0 {
			return c, cairn.E(op, cairn.Invalid, "", errors.New("no upstream etcd endpoint"))
		}
		for _, u := range c.Upstream {
			if strings.HasPrefix(u, "unix:///") {
				continue
			}
			if _, _, err := net.SplitHostPort(u); err != nil {
				return c, cairn.E(op, cairn.Invalid, u, fmt.Errorf("upstream: want host:port or unix:///path: %w", err))
			}
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 3 * time.Second
	}
	if c.RecheckInterval <= 0 {
		c.RecheckInterval = pki.RecheckInterval
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = 64
	}
	c.MaxHandshakes = min(c.MaxHandshakes, c.MaxConns)
	return c, nil
}

// Gateway is the metadata gateway. Make one with New, run it with Serve.
type Gateway struct {
	cfg   Config
	realm string
	tls   *tls.Config
	log   *slog.Logger

	conns      atomic.Int64 // open connections, over all Serve calls
	handshakes atomic.Int64 // of which still handshaking
	limitLog   atomic.Int64 // unix nanoseconds of the last "limit" log line
}

// New checks cfg and returns a gateway. Errors have Kind Invalid.
func New(cfg Config) (*Gateway, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	conf, err := pki.ServerTLS(cfg.Credentials, pki.TLSOptions{
		// The handshake refuses what is revoked; a list that cannot be
		// read lets it through and handle closes the connection before
		// etcd, so a device tells "removed" (a TLS refusal: Permission)
		// from "the gateway cannot check anyone now" (Unavailable).
		Revocations:       definiteRevocations{cfg.Revocations},
		RequireClientCert: true,
		Peer:              pki.RequireRole(pki.Device),
	})
	if err != nil {
		return nil, err
	}
	return &Gateway{cfg: cfg, realm: cfg.Credentials.Identity.Realm, tls: conf, log: cfg.Logger}, nil
}

// Serve accepts connections on ln until ctx ends, then closes ln and every
// connection it accepted, waits for their goroutines and returns nil. It
// returns early, with Kind IO, if ln fails (other than by running out of
// file descriptors, which it waits out). Serve closes ln in every case. A
// Gateway may serve several listeners at once; MaxConns and MaxHandshakes
// count over all of them.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{g: g, live: map[*conn]struct{}{}}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() { s.recheck(ctx) })

	var err error
	backoff := time.Duration(0)
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil {
				break
			}
			if !retryable(aerr) {
				err = cairn.E("metadata gateway", cairn.IO, ln.Addr().String(), aerr)
				break
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			g.log.Warn("metadata gateway: accept", "err", aerr, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue // Accept fails at once if ctx ended
		}
		backoff = 0
		if !g.reserve(c) {
			continue
		}
		wg.Go(func() { s.handle(ctx, c) })
	}
	cancel()
	ln.Close()
	s.closeAll()
	wg.Wait()
	return err
}

// retryable reports whether an Accept error is worth waiting out.
func retryable(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// reserve takes a connection slot and a handshake slot for c, or closes it.
func (g *Gateway) reserve(c net.Conn) bool {
	why := ""
	if g.conns.Add(1) > int64(g.cfg.MaxConns) {
		why = "connection limit reached"
	} else if g.handshakes.Add(1) > int64(g.cfg.MaxHandshakes) {
		g.handshakes.Add(-1)
		why = "handshake limit reached"
	}
	if why == "" {
		return true
	}
	g.conns.Add(-1)
	c.Close()
	// A flood must not flood the log: one line per second at most.
	now := time.Now().UnixNano()
	if last := g.limitLog.Load(); now-last >= int64(time.Second) && g.limitLog.CompareAndSwap(last, now) {
		g.log.Warn("metadata gateway: refused", "remote", c.RemoteAddr().String(), "err", why,
			"max_conns", g.cfg.MaxConns, "max_handshakes", g.cfg.MaxHandshakes)
	}
	return false
}

// session is the state of one Serve call.
type session struct {
	g *Gateway

	mu     sync.Mutex
	live   map[*conn]struct{}
	closed bool
}

// conn is an admitted connection.
type conn struct {
	raw    net.Conn // the accepted connection, under tc
	tc     *tls.Conn
	up     net.Conn
	id     pki.NodeIdentity
	leaf   *x509.Certificate
	remote string

	once sync.Once
}

// cut closes both sides at once, without a TLS close_notify (which could
// wait on a peer that does not read).
func (c *conn) cut() {
	c.once.Do(func() {
		c.raw.Close()
		c.up.Close()
	})
}

// close ends the connection politely.
func (c *conn) close() {
	c.once.Do(func() {
		c.tc.Close() // bounded: crypto/tls gives close_notify 5 s
		c.up.Close()
	})
}

// handle runs one accepted connection: handshake, upstream, pipe.
func (s *session) handle(ctx context.Context, raw net.Conn) {
	g := s.g
	defer g.conns.Add(-1)
	remote := raw.RemoteAddr().String()

	tc := tls.Server(raw, g.tls)
	hctx, cancel := context.WithTimeout(ctx, g.cfg.HandshakeTimeout)
	_ = raw.SetDeadline(time.Now().Add(g.cfg.HandshakeTimeout))
	err := tc.HandshakeContext(hctx)
	cancel()
	g.handshakes.Add(-1)
	if err != nil {
		g.refused(remote, tc, err)
		raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})
	cs := tc.ConnectionState()
	id, leaf, err := pki.PeerIdentity(&cs)
	if err != nil { // cannot happen after ServerTLS admitted the peer
		g.log.Warn("metadata gateway: refused", "remote", remote, "err", err)
		raw.Close()
		return
	}
	if err = g.stillAdmitted(leaf, time.Now()); err != nil {
		// Fails closed: the revocation list cannot be read (a revoked
		// certificate was refused in the handshake).
		g.log.Warn("metadata gateway: closed after the handshake: the revocation list cannot be checked", "node", id.Name, "remote", remote, "err", err)
		raw.Close()
		return
	}

	up, err := g.dialUpstream(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.log.Warn("metadata gateway: upstream etcd unreachable", "node", id.Name, "remote", remote, "err", err)
		}
		raw.Close()
		return
	}
	c := &conn{raw: raw, tc: tc, up: up, id: id, leaf: leaf, remote: remote}
	if !s.add(c) {
		c.cut()
		return
	}
	defer s.remove(c)
	g.log.Debug("metadata gateway: connected", "node", id.Name, "remote", remote)

	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, tc); done <- struct{}{} }()
	go func() { _, _ = io.Copy(tc, up); done <- struct{}{} }()
	// gRPC has no use for a half-closed connection: when either side
	// ends, so does the other.
	<-done
	c.close()
	<-done
	g.log.Debug("metadata gateway: disconnected", "node", id.Name, "remote", remote)
}

// refused logs a failed handshake: who (the verified identity, or the name
// an unverified certificate claims) and why. A connection that was never
// TLS, or was closed before presenting anything (a reachability probe, a
// port scan), is logged at debug level only.
func (g *Gateway) refused(remote string, tc *tls.Conn, err error) {
	attrs := []any{"remote", remote, "err", err}
	var cve *tls.CertificateVerificationError
	var alert *net.OpError
	switch peers := tc.ConnectionState().PeerCertificates; {
	case errors.As(err, &alert) && alert.Op == "remote error":
		// A TLS alert from the client: it does not trust this gateway
		// (another realm's device, or one expecting another node).
		g.log.Warn("metadata gateway: the client refused the gateway", attrs...)
		return
	case errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0:
		// Not of the realm CA (or expired): nothing in it is vouched for.
		leaf := cve.UnverifiedCertificates[0]
		attrs = append(attrs, "claimed_name", leaf.Subject.CommonName, "issuer", leaf.Issuer.CommonName)
	case len(peers) > 0:
		// Chains to the realm CA, refused by identity, role or revocation.
		if id, ierr := pki.IdentityOf(peers[0]); ierr == nil {
			attrs = append(attrs, "node", id.Name, "role", string(id.Role))
		} else {
			attrs = append(attrs, "claimed_name", peers[0].Subject.CommonName)
		}
		attrs = append(attrs, "serial", peers[0].SerialNumber.Text(16))
	case errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.As(err, new(tls.RecordHeaderError)):
		g.log.Debug("metadata gateway: dropped before authentication", attrs...)
		return
	}
	g.log.Warn("metadata gateway: refused", attrs...)
}

// dialUpstream connects to the first upstream that answers.
func (g *Gateway) dialUpstream(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.DialTimeout)
	defer cancel()
	if g.cfg.Dial != nil {
		return g.cfg.Dial(ctx)
	}
	var errs []error
	for _, u := range g.cfg.Upstream {
		c, err := etcdsvc.DialEndpoint(ctx, u, 0)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (s *session) add(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.live[c] = struct{}{}
	return true
}

func (s *session) remove(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.live, c)
}

// closeAll cuts every live connection and refuses new ones.
func (s *session) closeAll() {
	s.mu.Lock()
	s.closed = true
	live := make([]*conn, 0, len(s.live))
	for c := range s.live {
		live = append(live, c)
	}
	s.mu.Unlock()
	for _, c := range live {
		c.cut()
	}
}

// recheck checks every live connection's certificate again, every
// RecheckInterval, until ctx ends.
func (s *session) recheck(ctx context.Context) {
	t := time.NewTicker(s.g.cfg.RecheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		live := make([]*conn, 0, len(s.live))
		for c := range s.live {
			live = append(live, c)
		}
		s.mu.Unlock()
		now := time.Now()
		for _, c := range live {
			err := s.g.stillAdmitted(c.leaf, now)
			if err == nil {
				continue
			}
			s.g.log.Warn("metadata gateway: connection cut", "node", c.id.Name, "role", string(c.id.Role),
				"serial", c.leaf.SerialNumber.Text(16), "remote", c.remote, "err", err)
			c.cut()
		}
	}
}

// stillAdmitted checks an admitted peer's certificate again: not expired,
// of this realm, not revoked (a failing revocation check refuses).
// definiteRevocations answers the handshake: revoked or not, and not
// revoked when the list cannot be read (handle then closes the connection).
type definiteRevocations struct{ rev pki.Revocations }

func (d definiteRevocations) Revoked(c *x509.Certificate) (bool, error) {
	revoked, err := d.rev.Revoked(c)
	return revoked && err == nil, nil
}

func (g *Gateway) stillAdmitted(leaf *x509.Certificate, now time.Time) error {
	if now.After(leaf.NotAfter) {
		return cairn.E("admit", cairn.Permission, leaf.Subject.CommonName, errors.New("certificate expired"))
	}
	_, err := pki.Admit(g.realm, leaf, g.cfg.Revocations)
	return err
}
