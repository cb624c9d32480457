package etcdsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// ConnectExternal connects to an external etcd cluster at endpoints
// ("host:port" or "http://host:port") and checks that it answers a quorum
// read within opts.DialTimeout. Errors, which name the endpoints: Kind
// Invalid for an empty list; Kind Unavailable when no endpoint accepts a
// connection (reported at once) or the cluster does not answer in time (no
// quorum, a hung member); Kind Canceled when ctx ends first.
func ConnectExternal(ctx context.Context, endpoints []string, opts ConnectOptions) (*Conn, error) {
	const op = "connect etcd"
	opts.fill()
	names := strings.Join(endpoints, ",")
	if len(endpoints) == 0 {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("no endpoints"))
	}
	fail := func(err error) (*Conn, error) {
		if ctx.Err() != nil {
			return nil, cairn.E(op, cairn.Canceled, names, ctx.Err())
		}
		return nil, cairn.E(op, cairn.Unavailable, names, err)
	}
	hctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	// gRPC would retry refused connections until the deadline; a TCP probe
	// tells "nothing listens" at once.
	if err := anyReachable(hctx, endpoints); err != nil {
		return fail(err)
	}
	cli, err := newClient(endpoints, opts)
	if err != nil {
		return fail(err)
	}
	// A linearizable read needs a leader and a quorum: the same things
	// every metadata operation needs.
	if _, err := cli.Get(hctx, "health"); err != nil {
		cli.Close()
		if hctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer to a quorum read within %v: %w", opts.DialTimeout, err)
		}
		return fail(err)
	}
	return &Conn{cli: cli, endpoints: append([]string(nil), endpoints...)}, nil
}

// anyReachable returns nil as soon as one endpoint accepts a TCP
// connection, or the errors of all of them.
func anyReachable(ctx context.Context, endpoints []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(endpoints))
	ok := make(chan struct{}, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		wg.Go(func() {
			addr := ep
			if j := strings.Index(addr, "://"); j >= 0 {
				addr = addr[j+3:]
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				errs[i] = err
				return
			}
			c.Close()
			ok <- struct{}{}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-ok:
		return nil
	case <-done:
		select {
		case <-ok:
			return nil
		default:
		}
		msgs := make([]string, len(errs))
		for i, err := range errs {
			msgs[i] = err.Error()
		}
		return errors.New(strings.Join(msgs, "; "))
	}
}
