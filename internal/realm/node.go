package realm

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metagw"
	"cairn.dev/cairn/internal/node"
	"cairn.dev/cairn/internal/pki"
)

// DefaultLease is how long a node that stops reporting stays online in the
// registry: its heartbeat lease.
const DefaultLease = 10 * time.Second

// ServeOptions configure Serve.
type ServeOptions struct {
	// Listen is the address of the chunk service (host:port; port 0 picks
	// one). Required.
	Listen string
	// Advertise is the address recorded in the registry and put in join
	// tokens. Default: Listen's actual address, with the host name in
	// place of an unspecified host.
	Advertise string
	// Lease is the heartbeat lease (default DefaultLease, at least 1 s);
	// the node reports its figures every Lease/3.
	Lease time.Duration
	// GatewayListen is where the metadata gateway listens (the realm's
	// embedded etcd over mutual TLS, for the other devices), on the device
	// that runs that etcd. Default: Listen's host, port+1 (port 0 if
	// Listen's is 0). NoGateway turns it off.
	GatewayListen string
	NoGateway     bool
	// Ready, if set, is called once the node listens and is registered,
	// with the address it advertises and whether it serves joins.
	Ready func(addr string, join bool)
	// DrainTimeout bounds how long a node announcing standby waits for
	// the chunk-service requests in flight (default DefaultDrainTimeout).
	DrainTimeout time.Duration
	// SleepBus is the D-Bus address where the node looks for
	// systemd-logind, to take its sleep inhibitor and announce standby
	// before the machine sleeps (default: the system bus; "none": do not
	// look). Without a bus or a logind the node logs it once and serves.
	SleepBus string
	// AlwaysOn marks this device always-on in its record at its first
	// registration (meta.NodeRecord.AlwaysOn); false leaves the mark as
	// it is (cairn node set-always-on).
	AlwaysOn bool
	// Maint schedules the background work (gc, repair, scrub) of the
	// realm's awake stores while this node is awake and idle (maint.go;
	// Every 0: none).
	Maint MaintOptions
	// ReclaimEvery is how often the node reclaims, while awake, the
	// versions offloaded while it slept (doc/director.md, "Offload and
	// reclaim"); it also reclaims once it registers and on each resume.
	// Default DefaultReclaimEvery; negative: never.
	ReclaimEvery time.Duration
}

// Serve runs this device's node until ctx ends: it serves the local store
// over HTTP/2 and mutual TLS 1.3 (internal/node), the join exchange if
// this device holds the realm CA, and the registrar of benefactors and
// surrogates (registrar.go); it registers in the node registry with a
// lease kept alive, and reports capacity, free space, use and serving rate.
// When ctx ends it deregisters (the node shows offline at once) and
// returns nil. It fails with Permission if the node has been removed.
//
// Its power state (power.go, doc/power.md): asked through its control
// socket (`cairn node standby`) or by systemd-logind's PrepareForSleep
// (it holds a delay inhibitor of sleep), it drains its chunk service,
// records standby with its wake method and ends its lease; it is awake
// again on `cairn node resume`, PrepareForSleep(false), or its first tick
// after the machine slept.
func (r *Realm) Serve(ctx context.Context, o ServeOptions) error {
	const op = "node serve"
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.Lease < time.Second {
		return cairn.E(op, cairn.Invalid, "", fmt.Errorf("lease %v below 1s", o.Lease))
	}
	creds, err := r.Credentials(ctx)
	if err != nil {
		return err
	}
	if creds.Identity.Role != pki.Device {
		return cairn.E(op, cairn.Permission, creds.Identity.Name, fmt.Errorf("a %s has no realm of its own: it serves with ServeStandalone and registers through a device", creds.Identity.Role))
	}
	if st, nerr := r.Meta.Node(ctx, creds.Identity.Name); nerr == nil && st.Removed != 0 {
		return cairn.E(op, cairn.Permission, creds.Identity.Name, errors.New("this node was removed from the realm (join again with a new invitation)"))
	}
	st, err := r.Store(ctx)
	if err != nil {
		return err
	}
	m := &meteredStore{Store: st}
	rev, err := r.Meta.WatchRevocations(ctx)
	if err != nil {
		return err
	}
	defer rev.Close()

	ln, addr, err := listen(op, o.Listen, o.Advertise)
	if err != nil {
		return err
	}
	defer ln.Close()

	var gw *metagw.Gateway
	var gln net.Listener
	gwAddr := ""
	if !o.NoGateway && r.servesGateway() {
		if gw, err = r.gateway(ctx, creds); err != nil {
			return err
		}
		gl, what := o.GatewayListen, "metadata gateway"
		if gl == "" {
			gl, what = nextPort(o.Listen), "metadata gateway (by default on the node's port + 1; choose its address with --gateway-listen, or --no-gateway)"
		}
		if gln, err = net.Listen("tcp", gl); err != nil {
			return cairn.E(op, cairn.Unavailable, gl, fmt.Errorf("%s: %w", what, err))
		}
		defer gln.Close()
		gwAddr = advertised(gln.Addr().(*net.TCPAddr))
		if o.Advertise != "" {
			if h, _, serr := net.SplitHostPort(o.Advertise); serr == nil {
				_, p, _ := net.SplitHostPort(gwAddr)
				gwAddr = net.JoinHostPort(h, p)
			}
		}
	}

	var join http.Handler
	if ca, lerr := pki.LoadCA(CADir(r.Home)); lerr == nil {
		tokens, oerr := pki.OpenTokenList(TokensPath(r.Home))
		if oerr != nil {
			return oerr
		}
		auth := &pki.Authority{CA: ca, Tokens: registeringTokens{TokenStore: tokens, meta: r.Meta, log: r.log}, Addr: addr, Logger: r.log,
			Issued: func(ctx context.Context, id pki.NodeIdentity, cert *x509.Certificate) error {
				return r.Meta.AddNodeSerial(ctx, id.Name, cert.SerialNumber.Text(16))
			}}
		join = auth.JoinHandler()
	} else if !errors.Is(lerr, cairn.ErrNotFound) {
		return lerr
	}
	// The chunk service checks rev on every request; the handshake refuses
	// only what rev says is revoked, so that a peer can tell a removal
	// from a list that cannot be trusted for the moment (503).
	tlsConf, err := node.ServerTLS(creds)
	if err != nil {
		return err
	}
	registrar := newRegistrar(r.Meta, addr, r.log)
	defer registrar.close()
	// Where the metadata service is, as this node knows it: realm.json's
	// cached gateways, then each record it sees (the watch below). Other
	// devices ask when they have lost every gateway, often because the
	// service is asleep or unreachable: the answer must not wait on it.
	var knownGWs atomic.Pointer[[]string]
	if len(r.Config.Gateway) > 0 {
		gws := slices.Clone(r.Config.Gateway)
		knownGWs.Store(&gws)
	}
	metaService := func(ctx context.Context) ([]string, error) {
		if gws := knownGWs.Load(); gws != nil {
			return *gws, nil
		}
		ctx, cancel := context.WithTimeout(ctx, metaServiceAskBound)
		defer cancel()
		return r.metaServiceGateways(ctx)
	}
	srv, err := node.NewServer(node.Config{Store: m, Realm: r.Config.RealmID, Revocations: rev, Join: join, Registrar: registrar, MetaService: metaService, Waker: waker{m: r.Meta}, Logger: r.log}, tlsConf)
	if err != nil {
		return err
	}
	chunkGate := &gate{h: srv.Handler}
	srv.Handler = chunkGate

	name := creds.Identity.Name
	storeDir := filepath.Join(r.Home, r.Config.StorePath)
	report := func() meta.NodeRecord {
		rec := meta.NodeRecord{Name: name, Role: string(creds.Identity.Role), Addr: addr, Gateway: gwAddr, Served: m.served.Load(), Rate: m.rate(time.Now())}
		var fs unix.Statfs_t
		if serr := unix.Statfs(storeDir, &fs); serr == nil {
			rec.Capacity = int64(fs.Blocks) * fs.Bsize
			rec.Free = int64(fs.Bavail) * fs.Bsize
		}
		if ss, ok := st.(cairn.StoreStats); ok {
			if u, serr := ss.Stats(ctx); serr == nil {
				rec.Used = u.Disk
			}
		}
		return rec
	}
	wake := learnWake(ctx, addr)
	// --always-on marks the record at the first registration only: a
	// later one (a resume, a lost lease) keeps the mark as it is, so
	// that 'node set-always-on --off' holds until the next start.
	markAlwaysOn := o.AlwaysOn
	awakeReport := func() meta.NodeRecord {
		rec := report()
		rec.Wake, rec.AlwaysOn = wake, markAlwaysOn
		markAlwaysOn = false
		return rec
	}
	// Where a member of the realm's etcd hosted here takes its peers. This
	// comes before the registration: the restart below must be over
	// before the node reads awake and devices use its gateway.
	credDir := CredentialsDir(r.Home)
	if gw != nil {
		if werr := etcdsvc.WritePeerFile(r.Home, filepath.Join(credDir, pki.NodeCertFile), filepath.Join(credDir, pki.NodeKeyFile)); werr != nil {
			return werr
		}
		// A daemon started before the node first served has no peer
		// listener: restart it now, once, rather than at a move or a
		// standby's handoff, when other devices' writes are in flight
		// through this gateway (one failed with EOF in
		// TestStandbyHandsMetaAway when the restart came at the move).
		if perr := r.EnableMetaPeers(ctx); perr != nil {
			r.log.Warn("the embedded etcd cannot take peers yet: 'cairn meta move' will restart it", "err", perr)
		}
	}
	reg, err := r.Meta.Register(ctx, awakeReport(), o.Lease)
	if err != nil {
		return err
	}
	// Power: the control socket (cairn node standby / resume) and
	// logind's PrepareForSleep send their requests to the loop below.
	quit := make(chan struct{})
	defer close(quit)
	powerReqs := make(chan powerReq)
	if closeControl, cerr := serveControl(r.Home, powerReqs, quit); cerr != nil {
		r.log.Warn("node control socket: 'cairn node standby' and 'resume' cannot reach this node", "err", cerr)
	} else {
		defer closeControl()
	}
	if sleepW := r.watchSleep(ctx, o.SleepBus, powerReqs, quit); sleepW != nil {
		defer sleepW.Close()
	}
	// Where the other devices find the metadata service.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	if gw != nil || (len(r.Config.Gateway) > 0 && len(r.opts.Etcd) == 0) {
		// A realm on its embedded etcd: the member may move here.
		peerAddr, perr := r.servePeerGateway(pctx, creds, rev, o.Listen, o.Advertise)
		if perr != nil {
			return perr
		}
		if perr := r.Meta.SetMetaPeer(ctx, name, peerAddr); perr != nil {
			return perr
		}
		if gw != nil {
			if perr := r.Meta.SetMetaMember(ctx, meta.MetaMember{Node: name, Gateway: gwAddr, Peer: peerAddr}); perr != nil {
				return perr
			}
		} else {
			go r.hostJoinedMember(pctx, creds, name, peerAddr)
		}
	}
	go r.Meta.WatchMetaService(pctx, func(rec *meta.MetaServiceRecord) {
		if gws := rec.Gateways(); len(gws) > 0 {
			knownGWs.Store(&gws)
		}
	})
	// The member hosted here may move away (cairn meta move, in this
	// process or another): the connection follows it, and the loop stops
	// advertising this device's gateway.
	movedAway := make(chan struct{}, 1)
	if gw != nil {
		go r.followMovedMember(pctx, name, func([]string) {
			select {
			case movedAway <- struct{}{}:
			default:
			}
		})
	}
	served := make(chan error, 2)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	closeGateway := func() {}
	if gw != nil {
		gctx, gcancel := context.WithCancel(ctx)
		defer gcancel()
		closeGateway = gcancel
		go func() {
			if err := gw.Serve(gctx, gln); err != nil {
				served <- fmt.Errorf("metadata gateway: %w", err)
			}
		}()
	}
	r.log.Info("node serving", "node", name, "addr", addr, "join", join != nil, "gateway", gwAddr)
	if o.Ready != nil {
		o.Ready(addr, join != nil)
	}

	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	// Reclaim what was offloaded while this node slept: now, on each
	// resume, and every ReclaimEvery while awake (offload.go).
	reclaimKick := make(chan struct{}, 1)
	var sleeping atomic.Bool
	if o.ReclaimEvery >= 0 {
		if o.ReclaimEvery == 0 {
			o.ReclaimEvery = DefaultReclaimEvery
		}
		reclaimKick <- struct{}{}
		reclaimDone := make(chan struct{})
		rctx, rcancel := context.WithCancel(ctx)
		defer func() { rcancel(); <-reclaimDone }()
		go func() {
			defer close(reclaimDone)
			r.reclaimLoop(rctx, name, o.ReclaimEvery, reclaimKick, &sleeping)
		}()
	}
	kickReclaim := func() {
		select {
		case reclaimKick <- struct{}{}:
		default:
		}
	}
	asleep, since := false, time.Now()
	// The background-work schedule runs while the node is awake and
	// idle: no chunk request in flight, none served since its last look.
	lastServed := int64(-1)
	go r.maintLoop(pctx, o.Maint, func() bool {
		n := m.served.Load()
		idle := n == lastServed && chunkGate.inFlight() == 0
		lastServed = n
		return !sleeping.Load() && idle
	})
	stop := func(cause error) error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// In standby the lease is over already: the record stays standby.
		if !asleep {
			if err := reg.Close(dctx); err != nil && cause == nil {
				r.log.Warn("deregister", "err", err)
			}
		}
		_ = srv.Shutdown(dctx)
		return cause
	}
	standby := func() ControlReply {
		rep := ControlReply{Node: name}
		if asleep {
			rep.State, rep.Since = meta.NodeStandby, since.UnixNano()
			return rep
		}
		// Reads of the replica sets this device is the primary of go
		// to an awake replica: the roles move first (no data moves).
		if hs, herr := r.handPrimaries(ctx, name); herr != nil {
			r.log.Warn("standby: primary roles not handed over", "node", name, "err", herr)
			rep.PrimariesError = herr.Error()
		} else {
			rep.Primaries = hs
		}
		// The metadata service stays awake: the member hosted here goes
		// to an awake device first.
		if gwAddr != "" && r.servesGateway() {
			rep.MetaMovedTo, rep.MetaSleeps = r.handMetaAway(ctx, name)
			if rep.MetaMovedTo != "" {
				gwAddr = ""
				closeGateway() // its member is removed: nothing to relay
			}
		}
		if st, nerr := r.Meta.Node(ctx, name); nerr == nil && st.AlwaysOn {
			rep.AlwaysOn = true
			r.log.Warn("standby of a device marked always-on: the realm counts on it being awake (cairn node set-always-on --off)", "node", name)
		}
		registrar.pause()
		dctx, cancel := context.WithTimeout(ctx, o.DrainTimeout)
		rep.Unfinished = chunkGate.close(dctx)
		cancel()
		if rep.Unfinished > 0 {
			r.log.Warn("standby: chunk-service requests still in flight after the drain bound", "node", name, "requests", rep.Unfinished, "bound", o.DrainTimeout)
		}
		wake = learnWake(ctx, addr)
		at, serr := reg.Standby(ctx, wake)
		if serr != nil {
			chunkGate.open()
			registrar.resume()
			rep.Error = serr.Error()
			r.log.Warn("standby not recorded", "node", name, "err", serr)
			return rep
		}
		asleep, since = true, at
		sleeping.Store(true)
		rep.State, rep.Since, rep.Wake = meta.NodeStandby, at.UnixNano(), wake
		r.log.Info("node in standby", "node", name, "wake", wake)
		return rep
	}
	resume := func() ControlReply {
		rep := ControlReply{Node: name}
		if !asleep {
			rep.State, rep.Since = meta.NodeAwake, since.UnixNano()
			return rep
		}
		wake = learnWake(ctx, addr)
		nreg, rerr := r.Meta.Register(ctx, awakeReport(), o.Lease)
		if rerr != nil {
			rep.Error = rerr.Error()
			r.log.Warn("resume: register again", "node", name, "err", rerr)
			return rep
		}
		reg, asleep, since = nreg, false, time.Now()
		sleeping.Store(false)
		kickReclaim()
		chunkGate.open()
		registrar.resume()
		rep.State, rep.Since = meta.NodeAwake, since.UnixNano()
		r.log.Info("node awake again", "node", name)
		return rep
	}
	tick := time.NewTicker(o.Lease / 3)
	defer tick.Stop()
	lastTick := time.Now()
	for {
		lost := reg.Lost()
		if asleep {
			lost = nil // the standby ended the heartbeat
		}
		select {
		case <-ctx.Done():
			return stop(nil)
		case err := <-served:
			return stop(cairn.E(op, cairn.IO, addr, err))
		case <-movedAway:
			gwAddr = "" // its member is gone: not a gateway any more
			go r.closeGatewayOnceGone(pctx, closeGateway)
		case pr := <-powerReqs:
			rep := resume
			if pr.standby {
				rep = standby
			}
			pr.reply <- rep()
		case <-lost:
			if ctx.Err() != nil {
				return stop(nil)
			}
			// The lease lapsed (etcd unreachable for longer than the
			// lease, or restarted): register again.
			r.log.Warn("node lease lost: registering again", "node", name)
			nreg, err := r.Meta.Register(ctx, awakeReport(), o.Lease)
			if err != nil {
				if errors.Is(err, cairn.ErrPermission) {
					return stop(err)
				}
				r.log.Warn("register again", "err", err)
				select {
				case <-ctx.Done():
					return stop(nil)
				case <-time.After(o.Lease / 3):
				}
				continue
			}
			reg = nreg
		case now := <-tick.C:
			slept := resumedFromSleep(lastTick, now, o.Lease)
			lastTick = now
			if asleep {
				// In standby nothing is reported; a machine that slept
				// and woke without telling (no logind) resumes here.
				if slept {
					r.log.Info("the machine slept and woke: resuming", "node", name)
					resume()
				}
				continue
			}
			// The revocation list this node watches names it: removed.
			// Its report may never tell: a device reaching the metadata
			// through a gateway is cut off there within a second, and
			// its reports then only time out.
			if revoked, err := rev.Revoked(creds.Leaf); err == nil && revoked {
				return stop(cairn.E(op, cairn.Permission, name, errors.New("this node was removed from the realm (its certificate is revoked)")))
			}
			if err := reg.Update(ctx, report()); err != nil {
				if errors.Is(err, cairn.ErrPermission) || errors.Is(err, cairn.ErrNotFound) {
					return stop(err)
				}
				r.log.Warn("node report", "err", err)
			}
		}
	}
}

// closeGatewayOnceGone calls closeGateway, which closes this node's
// metadata gateway, once the member it relays is gone (its endpoint
// refuses: the move removed it and stopped its daemon), so that devices
// that still know the gateway are refused at once and ask where the
// service is now, instead of being admitted and cut. Not before: until
// the member is removed, requests in flight through the gateway carry on
// (the move waits metaDrain for the devices to follow its record).
func (r *Realm) closeGatewayOnceGone(ctx context.Context, closeGateway func()) {
	eps := r.conn.Endpoints()
	if len(eps) == 0 {
		closeGateway()
		return
	}
	for {
		c, err := etcdsvc.DialEndpoint(ctx, eps[0], time.Second)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Info("the member this device hosted is gone: its metadata gateway closes")
				closeGateway()
			}
			return
		}
		c.Close()
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// metaServiceAskBound bounds a node's look in the metadata for where the
// metadata service is, when it knows nothing of it yet.
const metaServiceAskBound = 2 * time.Second

// advertised turns a listener's address into one others can dial: an
// unspecified host (":7461", "0.0.0.0") becomes this machine's host name.
// listen opens a node's listener and returns the address it advertises:
// advertise, else the listener's (see advertised).
func listen(op, addr, advertise string) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", cairn.E(op, cairn.Unavailable, addr, fmt.Errorf("chunk service: %w", err))
	}
	if advertise == "" {
		advertise = advertised(ln.Addr().(*net.TCPAddr))
	}
	return ln, advertise, nil
}

// nextPort is addr with its port plus one (port 0 stays 0).
func nextPort(addr string) string {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	n, err := strconv.Atoi(p)
	if err != nil || n == 0 || n == 65535 {
		return net.JoinHostPort(h, "0")
	}
	return net.JoinHostPort(h, strconv.Itoa(n+1))
}

func advertised(a *net.TCPAddr) string {
	if a.IP == nil || a.IP.IsUnspecified() {
		h, err := os.Hostname()
		if err != nil {
			h = "localhost"
		}
		return net.JoinHostPort(h, fmt.Sprint(a.Port))
	}
	return a.String()
}

// meteredStore counts the bytes the node serves and derives its serving
// rate: a moving average of the bytes per second of the report intervals
// in which it served anything (an idle node keeps its last rate: it says
// how fast the node can serve, not how busy it is).
type meteredStore struct {
	cairn.Store
	served atomic.Int64

	mu       sync.Mutex
	lastAt   time.Time
	lastSeen int64
	avg      float64
}

func (m *meteredStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	b, err := m.Store.Get(ctx, id)
	if err == nil {
		m.served.Add(int64(len(b)))
	}
	return b, err
}

func (m *meteredStore) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if ss, ok := m.Store.(cairn.StoreStats); ok {
		return ss.Stats(ctx)
	}
	return cairn.StoreUsage{}, cairn.E("stats", cairn.Other, "", errors.New("the store keeps no statistics"))
}

// rate returns the serving rate at now, in bytes per second.
func (m *meteredStore) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.served.Load()
	if !m.lastAt.IsZero() {
		if dt := now.Sub(m.lastAt).Seconds(); dt > 0 && n > m.lastSeen {
			cur := float64(n-m.lastSeen) / dt
			if m.avg == 0 {
				m.avg = cur
			} else {
				m.avg = 0.7*m.avg + 0.3*cur
			}
		}
	}
	m.lastAt, m.lastSeen = now, n
	return m.avg
}

// registeringTokens records, in the node registry, every node that redeems
// a join token (a benefactor or surrogate has no metadata access of its
// own: the device that admits it records it).
type registeringTokens struct {
	pki.TokenStore
	meta *meta.Service
	log  *slog.Logger
}

func (t registeringTokens) Redeem(ctx context.Context, id, usedBy string, now time.Time) (pki.TokenRecord, error) {
	// A joiner that proposes its own name must not take a member's: its
	// certificate would carry that node's identity. The name is claimed
	// (one transaction: of two joiners asking for it, one gets it) before
	// the token is used, so the joiner can try again with another name;
	// the claim is undone if the token cannot be used.
	tok, err := t.TokenStore.Get(ctx, id)
	if err != nil {
		return pki.TokenRecord{}, err
	}
	undo, err := t.meta.ClaimNode(ctx, meta.NodeRecord{Name: usedBy, Role: string(tok.Role), Registered: now.UnixNano()})
	if err != nil {
		if errors.Is(err, cairn.ErrExist) {
			return pki.TokenRecord{}, cairn.E("join", cairn.Exist, usedBy, fmt.Errorf("%w: join with another --name", err))
		}
		return pki.TokenRecord{}, err
	}
	rec, err := t.TokenStore.Redeem(ctx, id, usedBy, now)
	if err != nil {
		if uerr := undo(context.WithoutCancel(ctx)); uerr != nil {
			t.log.Warn("join: give back a claimed name", "node", usedBy, "err", uerr)
		}
		return rec, err
	}
	return rec, nil
}
