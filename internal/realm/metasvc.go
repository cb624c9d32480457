package realm

// Finding the metadata service (DESIGN decision 13). The realm records
// where its metadata service is (meta.MetaServiceRecord, at metasvc); a
// device that reaches it through gateways caches that list in realm.json
// (Config.Gateway) each time it opens the realm, together with the chunk
// service addresses of the realm's devices (Config.Nodes). It tries
// every cached gateway; one that has lost them all asks those devices'
// node services for the current list (GET wire.PathMetaService): the
// metadata service may have moved while this device was away.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// connectGateways connects through the gateways of cfg, else through those
// that the devices of cfg.Nodes report. A gateway is taken if its
// certificate is one of the realm CA's, of role device: the metadata
// service may move to any device (cairn meta move), and a benefactor's or
// surrogate's certificate is refused. It returns the gateways it connected
// through.
//
// A metadata service that is restarting or moving (its daemon restarted
// to take peers, its member handed away: cairn meta move, a standby)
// leaves its gateways without an upstream for a few seconds, and the
// devices may not know the new gateways yet: an Unavailable connection is
// tried again, for wait at most (0: DefaultMetaWait; negative: once).
func connectGateways(ctx context.Context, home string, cfg Config, wait time.Duration) (*etcdsvc.Conn, []string, error) {
	if wait == 0 {
		wait = DefaultMetaWait
	}
	t0 := time.Now()
	for {
		conn, gws, err, askErr := connectGateways1(ctx, home, cfg)
		if err == nil || cairn.KindOf(err) != cairn.Unavailable {
			return conn, gws, err
		}
		if time.Since(t0) >= wait {
			return nil, nil, metaUnavailable(time.Since(t0), cfg, err, askErr)
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// DefaultMetaWait is how long opening a realm tries an unavailable
// metadata service again (through gateways), by default: Options.MetaWait.
const DefaultMetaWait = 15 * time.Second

// metaUnavailable is connectGateways' error once it gives up: it says once
// that the metadata service is unavailable, which gateways were tried for
// how long, which devices were asked where it is now, and why each
// failed; the causes below name etcd connections, which a user need not
// know, and each named its endpoints again.
func metaUnavailable(waited time.Duration, cfg Config, err, askErr error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "the metadata service is unavailable: tried %s for %v", plural(len(cfg.Gateway), "gateway"), waited.Round(100*time.Millisecond))
	if len(cfg.Gateway) > 0 {
		fmt.Fprintf(&b, " (%s): %s", strings.Join(cfg.Gateway, ", "), bareCause(err))
	}
	if askErr != nil {
		fmt.Fprintf(&b, "; asked %s where it is now (%s): %s", plural(len(cfg.Nodes), "device"), strings.Join(cfg.Nodes, ", "), bareCause(askErr))
	}
	return &cairn.Error{Op: "reach the metadata service", Kind: cairn.Unavailable, Err: errors.New(b.String())}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// bareCause is err without the operations and paths of the cairn errors
// that wrap it; of errors joined, each is given with its path.
func bareCause(err error) string {
	for {
		ce, ok := err.(*cairn.Error)
		if !ok || ce.Err == nil {
			break
		}
		err = ce.Err
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return err.Error()
	}
	var parts []string
	for _, e := range j.Unwrap() {
		if ce, ok := e.(*cairn.Error); ok && ce.Path != "" && ce.Err != nil {
			cause := ce.Err
			if ue, ok := cause.(*url.Error); ok {
				cause = ue.Err // "Get URL: ...": the path names it already
			}
			parts = append(parts, ce.Path+": "+bareCause(cause))
		} else {
			parts = append(parts, bareCause(e))
		}
	}
	return strings.Join(parts, "; ")
}

// connectGateways1 tries once. askErr is why no device told where the
// metadata service is, if one was asked and none did.
func connectGateways1(ctx context.Context, home string, cfg Config) (conn *etcdsvc.Conn, gws []string, err, askErr error) {
	creds, err := pki.LoadCredentials(CredentialsDir(home))
	if err != nil {
		return nil, nil, err, nil
	}
	// The realm's revocation list lives behind the gateway; the gateway
	// checks this device against it, and a revoked device that poses as
	// a gateway gets nothing it could not read before its removal.
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		return nil, nil, err, nil
	}
	conn, err = etcdsvc.ConnectExternal(ctx, cfg.Gateway, etcdsvc.ConnectOptions{TLS: tlsConf})
	if err == nil || cairn.KindOf(err) != cairn.Unavailable || len(cfg.Nodes) == 0 {
		return conn, cfg.Gateway, err, nil
	}
	gws, askErr = askMetaService(ctx, creds, cfg.Nodes)
	if askErr != nil {
		return nil, nil, err, askErr
	}
	if slices.Equal(gws, cfg.Gateway) {
		return nil, nil, err, errors.New("they know no other gateway")
	}
	conn, err = etcdsvc.ConnectExternal(ctx, gws, etcdsvc.ConnectOptions{TLS: tlsConf})
	if err != nil {
		return nil, nil, err, nil
	}
	return conn, gws, nil, nil
}

// askMetaService asks the node services at addrs, all at once, where the
// metadata service is, and returns the first answer.
func askMetaService(ctx context.Context, creds *pki.Credentials, addrs []string) ([]string, error) {
	const op = "find metadata service"
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		return nil, err
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		TLSClientConfig:        tlsConf,
		Protocols:              &protos,
		DialContext:            (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
		TLSHandshakeTimeout:    3 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		gws []string
		err error
	}
	answers := make(chan answer, len(addrs))
	for _, addr := range addrs {
		go func() {
			gws, err := askOne(ctx, client, addr)
			answers <- answer{gws, err}
		}()
	}
	var errs []error
	for range addrs {
		a := <-answers
		if a.err == nil {
			return a.gws, nil
		}
		errs = append(errs, a.err)
	}
	return nil, cairn.E(op, cairn.Unavailable, "", errors.Join(errs...))
}

func askOne(ctx context.Context, client *http.Client, addr string) ([]string, error) {
	const op = "find metadata service"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+wire.PathMetaService, nil)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, addr, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, cairn.E(op, cairn.Unavailable, addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxJSON+1))
	if err != nil {
		return nil, cairn.E(op, cairn.Unavailable, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		err = wire.DecodeError(resp.StatusCode, resp.Header.Get("Content-Encoding"), b)
		return nil, cairn.E(op, cairn.KindOf(err), addr, err)
	}
	var gws []string
	if err := wire.DecodeJSON(b, &gws); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, addr, err)
	}
	if len(gws) == 0 {
		return nil, cairn.E(op, cairn.Unavailable, addr, errors.New("it knows no gateway"))
	}
	return gws, nil
}

// metaServiceGateways is where the realm's metadata service is, for the
// node service's answer to other devices: the recorded gateways, else
// (a realm whose record is not written yet) the gateways of the node
// registry's online devices.
func (r *Realm) metaServiceGateways(ctx context.Context) ([]string, error) {
	rec, err := r.Meta.MetaService(ctx)
	if err == nil && len(rec.Gateways()) > 0 {
		return rec.Gateways(), nil
	}
	if err != nil && !errors.Is(err, cairn.ErrNotFound) {
		return nil, err
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var gws []string
	for _, n := range nodes {
		if n.Gateway != "" && n.State == meta.NodeOnline {
			gws = append(gws, n.Gateway)
		}
	}
	if len(gws) == 0 {
		return nil, cairn.E("metadata service", cairn.NotFound, "", errors.New("the realm records no metadata gateway"))
	}
	return gws, nil
}

// learnMetaService refreshes what realm.json caches of where the metadata
// service is: the recorded gateways, and the chunk service addresses of
// the realm's devices, this one's included (whom to ask if every gateway
// is lost). It
// rewrites the file only when something changed. Only for a device that
// reaches the metadata through gateways.
func (r *Realm) learnMetaService(ctx context.Context) error {
	if len(r.Config.Gateway) == 0 || len(r.opts.Etcd) > 0 {
		return nil
	}
	cfg := r.Config
	if rec, err := r.Meta.MetaService(ctx); err == nil {
		if gws := rec.Gateways(); len(gws) > 0 {
			cfg.Gateway = gws
			cfg.GatewayNode = ""
		}
	} else if !errors.Is(err, cairn.ErrNotFound) {
		return err
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return err
	}
	// This device's own node is asked too: while it runs it follows the
	// record (followMetaService).
	var addrs []string
	for _, n := range nodes {
		if n.Role == string(pki.Device) && n.Addr != "" && n.State != meta.NodeRemoved {
			addrs = append(addrs, n.Addr)
		}
	}
	cfg.Nodes = addrs
	r.Config = cfg
	// Compared with the file, not with r.Config: connect may have found
	// the gateways through another device already.
	saved, err := readConfig(r.Home)
	if err != nil {
		return err
	}
	if slices.Equal(cfg.Gateway, saved.Gateway) && slices.Equal(cfg.Nodes, saved.Nodes) && cfg.GatewayNode == saved.GatewayNode {
		return nil
	}
	saved.Gateway, saved.Nodes, saved.GatewayNode = cfg.Gateway, cfg.Nodes, cfg.GatewayNode
	return saveConfig(r.Home, saved)
}

func saveConfig(home string, cfg Config) error {
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return cairn.E("save realm config", cairn.Other, configPath(home), err)
	}
	return durable.ReplaceFile(configPath(home), b, 0o600)
}

// followMetaService keeps this process's connection on the realm's
// metadata gateways as they change (cairn meta move records the new ones
// before the old member goes): the client's endpoints follow the record,
// and requests go to the new gateways without failing. Only for a device
// that reaches the metadata through gateways; stopped by Close.
func (r *Realm) followMetaService() {
	if len(r.Config.Gateway) == 0 || len(r.opts.Etcd) > 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopFollow = cancel
	cli := r.conn.Client()
	go r.Meta.WatchMetaService(ctx, func(rec *meta.MetaServiceRecord) {
		if gws := rec.Gateways(); len(gws) > 0 && !slices.Equal(gws, cli.Endpoints()) {
			r.log.Info("metadata service moved", "gateways", gws)
			cli.SetEndpoints(gws...)
		}
	})
}

// redirectMeta sends this process's connection to the member of the
// realm's etcd that this device hosted to the gateways gws instead: the
// member moved away (cairn meta move, or a standby's handoff) and its
// server stops. Requests, watches and leases carry on through gws, as on
// any device that reaches the metadata through gateways.
func (r *Realm) redirectMeta(gws []string) error {
	creds, err := pki.LoadCredentials(CredentialsDir(r.Home))
	if err != nil {
		return err
	}
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		return err
	}
	return r.conn.Redirect(gws, tlsConf)
}

// followMovedMember is followMetaService for the node of the device that
// hosts the realm's embedded etcd (self): once the realm's record of its
// metadata service no longer names self (the member moved away, perhaps
// by a 'cairn meta move' in another process), this process's connection
// follows the recorded gateways (redirectMeta), now and at each later
// change, and moved is told them. Until ctx ends.
func (r *Realm) followMovedMember(ctx context.Context, self string, moved func(gws []string)) {
	r.Meta.WatchMetaService(ctx, func(rec *meta.MetaServiceRecord) {
		gws := rec.Gateways()
		if len(gws) == 0 || slices.ContainsFunc(rec.Members, func(m meta.MetaMember) bool { return m.Node == self }) {
			return
		}
		if err := r.redirectMeta(gws); err != nil {
			r.log.Warn("follow the metadata service that moved away", "gateways", gws, "err", err)
			return
		}
		r.log.Info("metadata service moved away from this device: following it", "gateways", gws)
		moved(gws)
	})
}
