package realm

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/node"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/surrogate"
)

// A benefactor's or surrogate's home holds its credentials (pki/node), its
// store (store/) and pki/registrar.json: where its registrars are and the
// last revocation list one of them sent. It has no realm.json, no keys and
// no metadata access.
const (
	registrarFile   = "registrar.json"
	standaloneStore = "store"
	registrarFormat = 1
)

// Versions of the realm's own small formats (doc/format.md): a standalone
// node's registrar state, a device's join payload, a sealed volume key.
const (
	RegistrarFormat     = registrarFormat
	DevicePayloadFormat = devicePayloadFormat
	SealedKeyFormat     = sealedKeyFormat
)

// RegistrarPath is the registrar state of a benefactor's or surrogate's
// home (format.md, "Registrar").
func RegistrarPath(home string) string { return filepath.Join(home, pkiDir, registrarFile) }

// registrarState is pki/registrar.json.
type registrarState struct {
	Format int `json:"format"`
	// Registrars are the addresses to report to, the last that answered
	// first; at join, the join endpoint's (the CA holder's node).
	Registrars []string `json:"registrars"`
	// Revoked is the last revocation list a registrar sent; absent until
	// one has answered (the node then refuses every request: fails
	// closed).
	Revoked *wire.Revocations `json:"revoked,omitempty"`
	// Updated is when Revoked was received.
	Updated time.Time `json:"updated,omitzero"`
}

func loadRegistrarState(home string) (*registrarState, error) {
	const op = "read registrar state"
	p := RegistrarPath(home)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return &registrarState{Format: registrarFormat}, nil
	}
	if err != nil {
		return nil, cairn.E(op, cairn.IO, p, err)
	}
	var s registrarState
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, p, err)
	}
	if s.Format != registrarFormat {
		return nil, cairn.E(op, cairn.Corrupt, p, fmt.Errorf("format %d, this cairn reads %d", s.Format, registrarFormat))
	}
	return &s, nil
}

func (s *registrarState) save(home string) error {
	b, _ := json.MarshalIndent(s, "", "  ")
	if err := durable.ReplaceFile(RegistrarPath(home), append(b, '\n'), 0o600); err != nil {
		return cairn.E("write registrar state", cairn.IO, RegistrarPath(home), err)
	}
	return nil
}

// StandaloneOptions configure ServeStandalone.
type StandaloneOptions struct {
	// Listen, Advertise and Lease as in ServeOptions. The node reports to
	// its registrar every Lease/3.
	Listen    string
	Advertise string
	Lease     time.Duration
	// Registrars, if set, are reported to instead of those in the home's
	// registrar state (at first the join endpoint's address).
	Registrars []string
	// Donation bounds, on a benefactor, the bytes its store may hold: a
	// put past it is refused with Kind Permission. 0: no bound but the
	// disk's. A surrogate refuses every put (it holds soft state only).
	Donation int64
	Logger   *slog.Logger
	// Ready, if set, is called once the node listens and has made its
	// first report, with its address and the registrar that took the
	// report ("" if none could be reached yet: it keeps trying).
	Ready func(addr, registrar string)
	// DrainTimeout and SleepBus as in ServeOptions: the node's power
	// states (its control socket, systemd-logind's inhibitor).
	DrainTimeout time.Duration
	SleepBus     string
	// Staging configures a surrogate's staging service (doc/surrogate.md),
	// served on the same listener under /surrogate/v1/. Ignored on a
	// benefactor.
	Staging StagingOptions
}

// StagingOptions configure a surrogate's staging service.
type StagingOptions struct {
	// Offer is the space offered to all clients together; 0: half the
	// free space of the home's file system when the node starts.
	Offer int64
	// Quota is the most one client is granted (0: a quarter of Offer).
	Quota int64
	// Lease is a client's registration lease (0: 1 h).
	Lease time.Duration
}

// StagingDir is where a surrogate keeps its clients' staged chunks: soft
// state, deleted whenever the node starts.
func StagingDir(home string) string { return filepath.Join(home, stagingDir) }

const stagingDir = "staged"

// ServeStandalone runs the node of a benefactor's or surrogate's home until
// ctx ends. It serves the home's store (made on first run) to the realm's
// devices over the chunk service (internal/node), and reports every
// lease/3 to a registrar, a device's node that writes its registry record
// on its behalf (the node has no metadata access): the first registrar
// that answers, trying the others the registrars name when one does not.
// A registrar's reply carries the realm's revocation list, which the node
// applies to its clients and keeps in the home; until it has one, it
// refuses every request (503). When ctx ends it tells its registrar it is
// leaving (it shows offline at once) and returns nil. It fails with
// Permission once a registrar refuses it: the node was removed.
func ServeStandalone(ctx context.Context, home string, o StandaloneOptions) error {
	const op = "node serve"
	if o.Lease == 0 {
		o.Lease = DefaultLease
	}
	if o.Lease < wire.MinLease || o.Lease > wire.MaxLease {
		return cairn.E(op, cairn.Invalid, "", fmt.Errorf("lease %v outside [%v, %v]", o.Lease, wire.MinLease, wire.MaxLease))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	log := o.Logger
	creds, err := pki.LoadCredentials(CredentialsDir(home))
	if err != nil {
		return err
	}
	name := creds.Identity.Name
	if !creds.Identity.HasRole(pki.Benefactor, pki.Surrogate) {
		return cairn.E(op, cairn.Invalid, name, errors.New("a device serves its node with its realm ('cairn node serve' where realm.json is)"))
	}
	state, err := loadRegistrarState(home)
	if err != nil {
		return err
	}
	configured := state.Registrars
	if len(o.Registrars) > 0 {
		configured = o.Registrars
	}
	for _, a := range configured {
		if err = wire.CheckAddr(a); err != nil {
			return cairn.E(op, cairn.Invalid, a, fmt.Errorf("registrar address: %w", err))
		}
	}
	if len(configured) == 0 {
		return cairn.E(op, cairn.Invalid, RegistrarPath(home), errors.New("no registrar known: pass --registrar ADDR (a device's node address)"))
	}
	rev := &learnedRevocations{}
	if state.Revoked != nil {
		rev.set(*state.Revoked)
	}

	storeDir := filepath.Join(home, standaloneStore)
	// The chunk service checks every ID it is given before Put.
	st, err := localstore.Open(ctx, storeDir, localstore.Options{Logger: log, TrustIDs: true})
	if err != nil {
		return err
	}
	defer st.Close()
	m := &meteredStore{Store: metrics.Default().WrapStore("local", st)}
	g := &guardedStore{Store: m, role: creds.Identity.Role, donation: o.Donation}
	if o.Donation < 0 {
		return cairn.E(op, cairn.Invalid, name, fmt.Errorf("donation %d below 0", o.Donation))
	}
	if u, serr := st.Stats(ctx); serr == nil {
		g.used.Store(u.Disk)
	}

	ln, addr, err := listen(op, o.Listen, o.Advertise)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err = wire.CheckAddr(addr); err != nil {
		return cairn.E(op, cairn.Invalid, addr, err)
	}
	tlsConf, err := node.ServerTLS(creds)
	if err != nil {
		return err
	}
	srv, err := node.NewServer(node.Config{Store: g, Realm: creds.Identity.Realm, Revocations: rev, Logger: log}, tlsConf)
	if err != nil {
		return err
	}
	var handler http.Handler = srv.Handler
	if creds.Identity.Role == pki.Surrogate {
		sur, serr := newStaging(home, creds.Identity.Realm, rev, o.Staging, log)
		if serr != nil {
			return serr
		}
		defer sur.Close()
		chunks := handler
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, surrogate.PathPrefix) {
				sur.ServeHTTP(w, r)
				return
			}
			chunks.ServeHTTP(w, r)
		})
	}
	chunkGate := &gate{h: handler}
	srv.Handler = chunkGate
	hb, err := newHeartbeat(home, creds, rev, state, configured, o.Lease, log)
	if err != nil {
		return err
	}
	defer hb.close()

	report := func() wire.Report {
		rep := wire.Report{Addr: addr, Served: m.served.Load(), Rate: m.rate(time.Now()), Lease: int64(o.Lease), Donated: o.Donation}
		var fs unix.Statfs_t
		if serr := unix.Statfs(storeDir, &fs); serr == nil {
			rep.Capacity = int64(fs.Blocks) * fs.Bsize
			rep.Free = int64(fs.Bavail) * fs.Bsize
		}
		if u, serr := st.Stats(ctx); serr == nil {
			rep.Used = u.Disk
			g.used.Store(u.Disk) // objects put again are counted once
		}
		return rep
	}

	wake := learnWake(ctx, addr)
	awakeReport := func() wire.Report {
		rep := report()
		if wake != nil {
			rep.MAC, rep.Broadcast = wake.MAC, wake.Broadcast
		}
		return rep
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	asleep, since := false, time.Now()
	stop := func(cause error) error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		// In standby the registrar ended the lease already: the record
		// stays standby.
		if cause == nil && !asleep {
			rep := report()
			rep.Leaving = true
			if _, rerr := hb.round(dctx, rep); rerr != nil {
				log.Warn("tell the registrar this node leaves", "err", rerr)
			}
		}
		_ = srv.Shutdown(dctx)
		return cause
	}

	reg, err := hb.round(ctx, awakeReport())
	switch {
	case ctx.Err() != nil:
		return stop(nil)
	case errors.Is(err, cairn.ErrPermission):
		return stop(removed(name, err))
	case err != nil:
		log.Warn("no registrar reached: this node serves, and keeps trying", "node", name, "err", err)
	}
	log.Info("node serving", "node", name, "role", creds.Identity.Role, "addr", addr, "registrar", reg)
	if o.Ready != nil {
		o.Ready(addr, reg)
	}
	// Power (doc/power.md): the control socket (cairn node standby /
	// resume) and logind's PrepareForSleep, as on a device; the standby
	// is recorded by a registrar (a report with standby).
	quit := make(chan struct{})
	defer close(quit)
	powerReqs := make(chan powerReq)
	if closeControl, cerr := serveControl(home, powerReqs, quit); cerr != nil {
		log.Warn("node control socket: 'cairn node standby' and 'resume' cannot reach this node", "err", cerr)
	} else {
		defer closeControl()
	}
	if sleepW := watchSleep(ctx, log, o.SleepBus, powerReqs, quit); sleepW != nil {
		defer sleepW.Close()
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	standby := func() ControlReply {
		rep := ControlReply{Node: name}
		if asleep {
			rep.State, rep.Since = meta.NodeStandby, since.UnixNano()
			return rep
		}
		dctx, cancel := context.WithTimeout(ctx, o.DrainTimeout)
		rep.Unfinished = chunkGate.close(dctx)
		cancel()
		if rep.Unfinished > 0 {
			log.Warn("standby: chunk-service requests still in flight after the drain bound", "node", name, "requests", rep.Unfinished, "bound", o.DrainTimeout)
		}
		wake = learnWake(ctx, addr)
		r := awakeReport()
		r.Standby = true
		if _, serr := hb.round(ctx, r); serr != nil {
			chunkGate.open()
			rep.Error = "standby not recorded: " + serr.Error()
			log.Warn("standby not recorded", "node", name, "err", serr)
			return rep
		}
		asleep, since = true, time.Now()
		rep.State, rep.Since, rep.Wake = meta.NodeStandby, since.UnixNano(), wake
		log.Info("node in standby", "node", name, "wake", wake)
		return rep
	}
	resume := func() ControlReply {
		rep := ControlReply{Node: name}
		if !asleep {
			rep.State, rep.Since = meta.NodeAwake, since.UnixNano()
			return rep
		}
		wake = learnWake(ctx, addr)
		if _, rerr := hb.round(ctx, awakeReport()); rerr != nil {
			rep.Error = "resume: " + rerr.Error()
			log.Warn("resume: report", "node", name, "err", rerr)
			return rep
		}
		asleep, since = false, time.Now()
		chunkGate.open()
		rep.State, rep.Since = meta.NodeAwake, since.UnixNano()
		log.Info("node awake again", "node", name)
		return rep
	}
	tick := time.NewTicker(o.Lease / 3)
	defer tick.Stop()
	lastTick := time.Now()
	for {
		select {
		case <-ctx.Done():
			return stop(nil)
		case err := <-served:
			return stop(cairn.E(op, cairn.IO, addr, err))
		case pr := <-powerReqs:
			do := resume
			if pr.standby {
				do = standby
			}
			pr.reply <- do()
		case now := <-tick.C:
			slept := resumedFromSleep(lastTick, now, o.Lease)
			lastTick = now
			if asleep {
				// In standby nothing is reported; a machine that slept
				// and woke without telling (no logind) resumes here.
				if slept {
					log.Info("the machine slept and woke: resuming", "node", name)
					resume()
				}
				continue
			}
			_, err := hb.round(ctx, report())
			switch {
			case ctx.Err() != nil:
				return stop(nil)
			case errors.Is(err, cairn.ErrPermission):
				return stop(removed(name, err))
			case err != nil:
				log.Warn("node report", "node", name, "err", err)
			}
		}
	}
}

// newStaging starts a surrogate's staging service over the home's staging
// directory (wiped: soft state).
func newStaging(home, realmID string, rev pki.Revocations, o StagingOptions, log *slog.Logger) (*surrogate.Server, error) {
	dir := StagingDir(home)
	if o.Offer < 0 || o.Quota < 0 || o.Lease < 0 {
		return nil, cairn.E("node serve", cairn.Invalid, dir, fmt.Errorf("offer %d, quota %d, lease %v: none may be negative", o.Offer, o.Quota, o.Lease))
	}
	if o.Offer == 0 {
		// Measured before the wipe counts what a former run left as free.
		_ = os.RemoveAll(dir)
		var fs unix.Statfs_t
		if err := unix.Statfs(home, &fs); err != nil {
			return nil, cairn.E("node serve", cairn.IO, home, err)
		}
		o.Offer = int64(fs.Bavail) * fs.Bsize / 2
		if o.Offer <= 0 {
			return nil, cairn.E("node serve", cairn.Unavailable, home, errors.New("no free space to offer"))
		}
	}
	srv, err := surrogate.NewServer(surrogate.Config{Dir: dir, Offer: o.Offer, Quota: o.Quota, Lease: o.Lease, Realm: realmID, Revocations: rev, Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("surrogate staging service", "dir", dir, "offer", o.Offer, "lease", o.Lease)
	return srv, nil
}

func removed(name string, err error) error {
	return cairn.E("node serve", cairn.Permission, name, fmt.Errorf("the realm refuses this node: it was removed (join again with a new invitation): %w", err))
}

// learnedRevocations is a standalone node's revocation list: the one its
// registrar sent last (kept in the home, so a restart has it). Until it has
// one it answers with an error: every client is refused (fails closed).
// While no registrar can be reached it keeps the last list it had.
type learnedRevocations struct {
	mu   sync.RWMutex
	list *wire.Revocations
}

var _ pki.Revocations = (*learnedRevocations)(nil)

func (l *learnedRevocations) set(r wire.Revocations) {
	l.mu.Lock()
	l.list = &r
	l.mu.Unlock()
}

// Revoked implements pki.Revocations, with the rules of meta.Revocations.
func (l *learnedRevocations) Revoked(cert *x509.Certificate) (bool, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.list == nil {
		return true, cairn.E("revocations", cairn.Unavailable, "", errors.New("no revocation list from a registrar yet"))
	}
	if _, ok := l.list.Serials[cert.SerialNumber.Text(16)]; ok {
		return true, nil
	}
	if at, ok := l.list.Names[cert.Subject.CommonName]; ok && !cert.NotBefore.Add(pki.Backdate).After(at) {
		return true, nil
	}
	return false, nil
}

// heartbeat sends a standalone node's reports to its registrars, over
// HTTP/2 and mutual TLS 1.3: a registrar must be a device of the realm not
// revoked by the last list (before the node has a list, any device of its
// CA: the first answer brings it).
type heartbeat struct {
	home       string
	rev        *learnedRevocations
	leaf       *x509.Certificate // this node's certificate
	tr         *http.Transport
	client     *http.Client
	timeout    time.Duration
	configured []string
	log        *slog.Logger

	state *registrarState // as last saved
	order []string        // addresses to try, the last that answered first
}

func newHeartbeat(home string, creds *pki.Credentials, rev *learnedRevocations, state *registrarState, configured []string, lease time.Duration, log *slog.Logger) (*heartbeat, error) {
	tlsConf, err := pki.ClientTLS(creds, pki.TLSOptions{Revocations: node.HandshakeRevocations(rev), Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		return nil, err
	}
	tr := wire.NewTransport(tlsConf)
	return &heartbeat{
		home: home, rev: rev, leaf: creds.Leaf, tr: tr, client: &http.Client{Transport: tr},
		timeout: max(lease/2, 2*time.Second), configured: configured, log: log,
		state: state, order: dedup(configured),
	}, nil
}

func (h *heartbeat) close() { h.tr.CloseIdleConnections() }

func dedup(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, a := range l {
			if a != "" && !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// round sends rep to the registrars in turn until one takes it, and
// returns that one's address. Kind Permission if a registrar refused this
// node in an answer (403 over a connection this node verified) or its
// revocation list names this node: it was removed; Unavailable if none
// took the report (an error from one registrar moves on to the next).
func (h *heartbeat) round(ctx context.Context, rep wire.Report) (string, error) {
	var errs []error
	for _, a := range h.order {
		actx, cancel := context.WithTimeout(ctx, h.timeout)
		reply, err := h.report(actx, a, rep)
		cancel()
		if err == nil {
			h.learn(a, reply)
			// The list a verified registrar sent names this node:
			// removed (its own revocation watch).
			if revoked, rerr := h.rev.Revoked(h.leaf); rerr == nil && revoked {
				return "", cairn.E("node report", cairn.Permission, a, errors.New("the realm's revocation list names this node's certificate"))
			}
			return a, nil
		}
		if ctx.Err() != nil {
			return "", cairn.E("node report", cairn.Canceled, a, ctx.Err())
		}
		if errors.Is(err, cairn.ErrPermission) {
			return "", err
		}
		h.log.Debug("registrar did not take the report", "registrar", a, "err", err)
		errs = append(errs, err)
	}
	return "", cairn.E("node report", cairn.Unavailable, "", fmt.Errorf("no registrar took the report: %w", errors.Join(errs...)))
}

// learn applies a registrar's reply: its revocation list, and the
// registrars to try next time (the one that answered first), both kept in
// the home.
func (h *heartbeat) learn(from string, r wire.RegisterReply) {
	h.rev.set(r.Revoked)
	h.order = dedup([]string{from}, r.Registrars, h.configured)
	if len(h.order) > wire.MaxRegistrars {
		h.order = h.order[:wire.MaxRegistrars]
	}
	old := h.state
	if old.Revoked != nil && slices.Equal(old.Registrars, h.order) && sameRevocations(*old.Revoked, r.Revoked) {
		return
	}
	ns := &registrarState{Format: registrarFormat, Registrars: h.order, Revoked: &r.Revoked, Updated: time.Now().UTC()}
	if err := ns.save(h.home); err != nil {
		h.log.Warn("keep the registrar state", "err", err)
		return
	}
	h.state = ns
}

func sameRevocations(a, b wire.Revocations) bool {
	eq := func(x, y time.Time) bool { return x.Equal(y) }
	return maps.EqualFunc(a.Names, b.Names, eq) && maps.EqualFunc(a.Serials, b.Serials, eq)
}

// report sends one report to the registrar at addr.
func (h *heartbeat) report(ctx context.Context, addr string, rep wire.Report) (wire.RegisterReply, error) {
	const op = "node report"
	body := wire.EncodeReport(rep)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+wire.PathRegister, bytes.NewReader(body))
	if err != nil {
		return wire.RegisterReply{}, cairn.E(op, cairn.Invalid, addr, err)
	}
	req.Header.Set("Content-Type", wire.TypeJSON)
	req.Header.Set("Content-Encoding", wire.Zstd)
	resp, err := h.client.Do(req)
	if err != nil {
		return wire.RegisterReply{}, h.transportErr(ctx, addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxRegisterReply+1))
	if err != nil {
		return wire.RegisterReply{}, cairn.E(op, cairn.Unavailable, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		err = wire.DecodeError(resp.StatusCode, resp.Header.Get("Content-Encoding"), b)
		return wire.RegisterReply{}, cairn.E(op, cairn.KindOf(err), addr, err)
	}
	r, err := wire.DecodeRegisterReply(b)
	if err != nil {
		// A broken registrar: try another.
		return wire.RegisterReply{}, cairn.E(op, cairn.Unavailable, addr, err)
	}
	return r, nil
}

// transportErr classifies a failure to get a reply: always Unavailable
// (try another registrar). A TLS alert is no refusal of this node: before
// the handshake ends nobody is authenticated, and anyone on the path, or a
// stranger at a stale address, can send one. Registrars finish the
// handshake with a revoked node and refuse it with a 403 (node.ServerTLS),
// which report turns into Kind Permission.
func (h *heartbeat) transportErr(ctx context.Context, addr string, err error) error {
	const op = "node report"
	if ctx.Err() != nil {
		return cairn.E(op, cairn.Unavailable, addr, ctx.Err())
	}
	var verify *tls.CertificateVerificationError
	if cairn.KindOf(err) == cairn.Permission || errors.As(err, &verify) {
		return cairn.E(op, cairn.Unavailable, addr, fmt.Errorf("not a registrar of this realm: %w", err))
	}
	return cairn.E(op, cairn.Unavailable, addr, err)
}

// guardedStore is what a standalone node serves: a surrogate takes no
// writes (DESIGN: writes go to the real stores, never to a surrogate), a
// benefactor none past its donation. Both refusals are Kind Permission
// (403 to the device).
type guardedStore struct {
	cairn.Store
	role     pki.Role
	donation int64        // 0: no bound
	used     atomic.Int64 // the store's bytes as last measured, plus puts since
}

func (g *guardedStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	if g.role == pki.Surrogate {
		return cairn.E("put", cairn.Permission, id.String(), errors.New("a surrogate takes no writes: it holds staged copies only; write to a device, benefactor or store"))
	}
	n := int64(len(data))
	if g.donation > 0 {
		if used := g.used.Add(n); used > g.donation {
			g.used.Add(-n)
			return cairn.E("put", cairn.Permission, id.String(), fmt.Errorf("the benefactor's donation of %d bytes is used up (%d used)", g.donation, used-n))
		}
	} else {
		g.used.Add(n)
	}
	if err := g.Store.Put(ctx, id, data); err != nil {
		g.used.Add(-n)
		return err
	}
	return nil
}

// Stats passes on to the store (the chunk service's stats request).
func (g *guardedStore) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	if ss, ok := g.Store.(cairn.StoreStats); ok {
		return ss.Stats(ctx)
	}
	return cairn.StoreUsage{}, cairn.E("stats", cairn.Other, "", errors.New("the store keeps no statistics"))
}
