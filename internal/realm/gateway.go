package realm

import (
	"context"
	"errors"
	"net"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metagw"
	"cairn.dev/cairn/internal/pki"
)

// servesGateway reports whether this device can serve the metadata
// gateway: it runs the realm's embedded etcd (a realm on an external
// cluster gives devices that cluster's endpoints; a device that itself
// reaches the metadata through a gateway does not relay it, nor does one
// whose member moved away while it ran: redirectMeta).
func (r *Realm) servesGateway() bool {
	return len(r.Config.Etcd) == 0 && len(r.Config.Gateway) == 0 && len(r.opts.Etcd) == 0 &&
		(r.conn == nil || !r.conn.Redirected())
}

// gateway makes the metadata gateway of this device: the realm's etcd,
// relayed to the devices that present a realm certificate of role device,
// not revoked (internal/metagw). It holds this process's connection to the
// embedded etcd, which keeps the daemon up while it serves, and dials the
// daemon's current address for each device.
func (r *Realm) gateway(ctx context.Context, creds *pki.Credentials) (*metagw.Gateway, error) {
	if !r.servesGateway() {
		return nil, cairn.E("metadata gateway", cairn.Invalid, "", errors.New("only the device running the realm's embedded etcd serves the metadata gateway"))
	}
	rev, err := r.revocations(ctx)
	if err != nil {
		return nil, err
	}
	return metagw.New(metagw.Config{
		Credentials: creds,
		Revocations: rev,
		Dial: func(ctx context.Context) (net.Conn, error) {
			eps := r.conn.Endpoints()
			if len(eps) == 0 {
				return nil, errors.New("no etcd endpoint")
			}
			return etcdsvc.DialEndpoint(ctx, eps[0], 3*time.Second)
		},
		Logger: r.log,
	})
}

// gateway1 is the address of this device's metadata gateway, from its
// registry record (it must be serving: 'cairn node serve').
func (r *Realm) gateway1(ctx context.Context) (string, error) {
	self := r.nodeName(ctx)
	st, err := r.Meta.Node(ctx, self)
	if err != nil && !errors.Is(err, cairn.ErrNotFound) {
		return "", err
	}
	if err != nil || st.Gateway == "" || st.State != meta.NodeOnline {
		return "", cairn.E("invite", cairn.Unavailable, self, errors.New("this device serves no metadata gateway: run 'cairn node serve' here first"))
	}
	return st.Gateway, nil
}
