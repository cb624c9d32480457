package etcdsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"

	"cairn.dev/cairn/internal/cairn"
)

// ConnectExternal connects to an external etcd cluster at endpoints
// ("host:port" or "http://host:port"; with opts.TLS, "host:port" or
// "https://host:port") and checks that it answers a quorum read within
// opts.DialTimeout. Errors, which name the endpoints: Kind Invalid for an
// empty list or an endpoint whose scheme contradicts opts.TLS; Kind
// Permission when, over TLS, the server refused this client's certificate
// or this client refused the server's (reported at once, not after
// DialTimeout); Kind Unavailable when no endpoint accepts a connection
// (reported at once) or the cluster does not answer in time (no quorum, a
// hung member); Kind Canceled when ctx ends first.
func ConnectExternal(ctx context.Context, endpoints []string, opts ConnectOptions) (*Conn, error) {
	const op = "connect etcd"
	opts.fill()
	names := strings.Join(endpoints, ",")
	if len(endpoints) == 0 {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("no endpoints"))
	}
	if opts.TLS != nil {
		for _, ep := range endpoints {
			if i := strings.Index(ep, "://"); i >= 0 && !strings.EqualFold(ep[:i], "https") {
				return nil, cairn.E(op, cairn.Invalid, ep, errors.New("with TLS, want host:port or https://host:port"))
			}
		}
	}
	fail := func(kind cairn.Kind, err error) (*Conn, error) {
		if ctx.Err() != nil {
			return nil, cairn.E(op, cairn.Canceled, names, ctx.Err())
		}
		return nil, cairn.E(op, kind, names, err)
	}
	hctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	// gRPC would retry refused connections, and refused certificates,
	// until the deadline; a probe tells "nothing listens" and "not
	// admitted" at once.
	if refused, err := anyReachable(hctx, endpoints, opts.TLS); err != nil {
		if refused {
			return fail(cairn.Permission, err)
		}
		return fail(cairn.Unavailable, err)
	}
	cli, err := newClient(endpoints, opts, opts.TLS)
	if err != nil {
		return fail(cairn.Unavailable, err)
	}
	// A linearizable read needs a leader and a quorum: the same things
	// every metadata operation needs.
	if _, err := cli.Get(hctx, "health"); err != nil {
		cli.Close()
		if hctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer to a quorum read within %v: %w", opts.DialTimeout, err)
		}
		return fail(cairn.Unavailable, err)
	}
	return &Conn{cli: cli, endpoints: append([]string(nil), endpoints...)}, nil
}

// ConnectLazy returns a Conn to endpoints without reaching them first:
// its requests fail (after their own timeouts) while nothing answers, and
// work once something does. For a device that works offline: its
// metadata Service answers from local copies and probes the service.
func ConnectLazy(endpoints []string, opts ConnectOptions) (*Conn, error) {
	opts.fill()
	if len(endpoints) == 0 {
		return nil, cairn.E("connect etcd", cairn.Invalid, "", errors.New("no endpoints"))
	}
	cli, err := newClient(endpoints, opts, opts.TLS)
	if err != nil {
		return nil, cairn.E("connect etcd", cairn.Unavailable, strings.Join(endpoints, ","), err)
	}
	return &Conn{cli: cli, endpoints: append([]string(nil), endpoints...)}, nil
}

// anyReachable returns nil as soon as one endpoint passes probe, or the
// errors of all of them, and whether any of those was a TLS refusal.
func anyReachable(ctx context.Context, endpoints []string, tlsConf *tls.Config) (refused bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(endpoints))
	ok := make(chan struct{}, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() {
			if err := probe(ctx, ep, tlsConf); err != nil {
				errs[i] = err
				return
			}
			ok <- struct{}{}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-ok:
		return false, nil
	case <-done:
		select {
		case <-ok:
			return false, nil
		default:
		}
		msgs := make([]string, len(errs))
		for i, err := range errs {
			msgs[i] = err.Error()
			var r refusal
			refused = refused || errors.As(err, &r)
		}
		return refused, errors.New(strings.Join(msgs, "; "))
	}
}

// h2Preface is what an HTTP/2 client, gRPC's included, sends first: the
// connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + "\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// refusal is a TLS handshake that failed because one side would not accept
// the other's certificate.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// probe checks that ep accepts a TCP connection and, with tlsConf, that it
// admits this client. In TLS 1.3 a client finishes its handshake before
// the server has checked the client's certificate, so a refusal arrives
// only as an alert on the first read: probe sends the HTTP/2 preface and
// waits for the server's first bytes (etcd answers with its SETTINGS) or
// the alert.
func probe(ctx context.Context, ep string, tlsConf *tls.Config) error {
	addr := ep
	network := "tcp"
	if p, ok := strings.CutPrefix(addr, "unix://"); ok && tlsConf == nil {
		addr, network = p, "unix" // a local etcd on a socket (never with TLS, refused earlier)
	} else if j := strings.Index(addr, "://"); j >= 0 {
		addr = addr[j+3:]
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if tlsConf == nil {
		return nil
	}
	// The handshake honours ctx; the read needs these.
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	// As gRPC does: the host as server name, and h2 offered.
	conf := tlsConf.Clone()
	if conf.ServerName == "" {
		conf.ServerName, _, _ = net.SplitHostPort(addr)
	}
	if !slices.Contains(conf.NextProtos, "h2") {
		conf.NextProtos = append(slices.Clip(conf.NextProtos), "h2")
	}
	tc := tls.Client(c, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		return tlsFailure(addr, "TLS handshake", err)
	}
	if _, err := io.WriteString(tc, h2Preface); err != nil {
		return tlsFailure(addr, "TLS write", err)
	}
	var b [1]byte
	if _, err := tc.Read(b[:]); err != nil {
		return tlsFailure(addr, "TLS read", err)
	}
	return nil
}

// tlsFailure tells a refusal from a network failure.
func tlsFailure(addr, stage string, err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		// A TLS alert: the server did not accept this client.
		return refusal{fmt.Errorf("%s: the server refused this client: %w", addr, err)}
	}
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, new(tls.RecordHeaderError)) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: %s: %w", addr, stage, err)
	}
	// The handshake failed here: the server's certificate did not pass
	// this client's checks (tlsConf's verification).
	return refusal{fmt.Errorf("%s: the server's certificate was refused: %w", addr, err)}
}
