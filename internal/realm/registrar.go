package realm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// registrar keeps benefactors and surrogates in the node registry on their
// behalf (node.Registrar): they have no metadata access, so each reports
// to a device's node every lease/3 (ServeStandalone), and the device holds
// the node's lease for it. Every device's node is a registrar.
//
// The first report of a node registers it (meta.Register: a lease of the
// node's own length, kept alive by this device, holding alive/<name>);
// later ones rewrite its record (Registration.Update). A node that sends
// no report for a whole lease has its lease revoked here: it shows
// offline. A report with Leaving ends the lease at once. The node's name
// and role are those of its certificate, never of the report.
type registrar struct {
	meta *meta.Service
	self string // this node's advertised address: first in every reply
	log  *slog.Logger

	mu     sync.Mutex
	held   map[string]*held
	closed bool

	// The registrars and the revocation list of the replies, read at most
	// once per cacheFor: every node reports every lease/3.
	cacheMu  sync.Mutex
	cachedAt time.Time
	cached   wire.RegisterReply
}

// cacheFor is how long a reply's registrar list and revocation list are
// reused: a removal reaches the nodes at their next report after it.
const cacheFor = time.Second

// held is the registration this registrar holds for one node.
type held struct {
	mu    sync.Mutex // serializes the reports of one node
	name  string
	reg   *meta.Registration
	lease time.Duration
	last  time.Time // of the last report
	timer *time.Timer
	dead  bool // expired or closed: a new report makes a new held
}

var _ node.Registrar = (*registrar)(nil)

func newRegistrar(m *meta.Service, self string, log *slog.Logger) *registrar {
	return &registrar{meta: m, self: self, log: log, held: map[string]*held{}}
}

// Register implements node.Registrar.
func (g *registrar) Register(ctx context.Context, peer pki.NodeIdentity, rep wire.Report) (wire.RegisterReply, error) {
	const op = "register node"
	if !peer.HasRole(pki.Benefactor, pki.Surrogate) {
		return wire.RegisterReply{}, cairn.E(op, cairn.Permission, peer.Name, fmt.Errorf("a %s registers in the metadata itself", peer.Role))
	}
	if err := rep.Check(); err != nil {
		return wire.RegisterReply{}, err
	}
	lease := time.Duration(rep.Lease)
	rec := meta.NodeRecord{Name: peer.Name, Role: string(peer.Role), Addr: rep.Addr, Capacity: rep.Capacity, Free: rep.Free,
		Used: rep.Used, Served: rep.Served, Rate: rep.Rate, Donated: rep.Donated}
	var wake *meta.WakeInfo
	if rep.MAC != "" {
		wake = &meta.WakeInfo{MAC: rep.MAC, Broadcast: rep.Broadcast}
		rec.Wake = wake
	}
	h, err := g.lock(peer.Name)
	if err != nil {
		return wire.RegisterReply{}, err
	}
	defer h.mu.Unlock()
	if rep.Standby {
		// The node goes to sleep: record its standby and end its lease
		// (Registration.Standby), taking the lease over first if another
		// device held it, so that it reads as standby at once.
		if h.reg == nil {
			if h.reg, err = g.meta.Register(ctx, rec, lease); err != nil {
				g.drop(h)
				return wire.RegisterReply{}, err
			}
		}
		_, serr := h.reg.Standby(ctx, wake)
		if serr == nil {
			h.reg = nil // the standby ended the lease
			g.log.Info("node in standby", "node", peer.Name, "role", peer.Role)
		}
		g.drop(h)
		if serr != nil {
			return wire.RegisterReply{}, serr
		}
		return g.reply(ctx, lease)
	}
	if rep.Leaving {
		if h.reg == nil {
			// Another device holds the node's lease (or none does):
			// take it over and end it, so the node is offline at once.
			if h.reg, err = g.meta.Register(ctx, rec, lease); err != nil {
				g.drop(h)
				return wire.RegisterReply{}, err
			}
		}
		g.drop(h)
		return g.reply(ctx, lease)
	}
	if h.reg != nil {
		select {
		case <-h.reg.Lost():
			// The lease lapsed (etcd unreachable for longer): register again.
			h.reg = nil
		default:
		}
	}
	if h.reg != nil && h.lease != lease {
		// The node restarted with another lease.
		g.end(h)
	}
	if h.reg != nil {
		err := h.reg.Update(ctx, rec)
		switch {
		case err == nil:
		case errors.Is(err, cairn.ErrNotFound):
			// Its record is gone: register it again below.
			g.end(h)
		default:
			if errors.Is(err, cairn.ErrPermission) {
				g.drop(h)
			}
			return wire.RegisterReply{}, err
		}
	}
	if h.reg == nil {
		reg, err := g.meta.Register(ctx, rec, lease)
		if err != nil {
			g.drop(h)
			return wire.RegisterReply{}, err
		}
		h.reg, h.lease = reg, lease
		g.log.Info("node registered", "node", peer.Name, "role", peer.Role, "addr", rep.Addr, "lease", lease)
	}
	h.last = time.Now()
	h.timer.Reset(lease)
	return g.reply(ctx, lease)
}

// lock returns the node's held registration, locked, making one if there
// is none.
func (g *registrar) lock(name string) (*held, error) {
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return nil, cairn.E("register node", cairn.Unavailable, name, errors.New("this registrar is stopping: report to another device"))
		}
		h := g.held[name]
		if h == nil {
			h = &held{name: name}
			h.timer = time.AfterFunc(time.Hour, func() { g.expire(h) })
			h.timer.Stop()
			g.held[name] = h
		}
		g.mu.Unlock()
		h.mu.Lock()
		if !h.dead {
			return h, nil
		}
		h.mu.Unlock()
		g.mu.Lock()
		if g.held[name] == h {
			delete(g.held, name)
		}
		g.mu.Unlock()
	}
}

// end revokes h's lease, if it holds one (h.mu held).
func (g *registrar) end(h *held) {
	if h.reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.reg.Close(ctx); err != nil {
		g.log.Warn("end a node's lease", "node", h.name, "err", err)
	}
	h.reg = nil
}

// drop ends h for good (h.mu held): its lease, its timer, its entry.
func (g *registrar) drop(h *held) {
	g.end(h)
	h.timer.Stop()
	h.dead = true
	g.mu.Lock()
	if g.held[h.name] == h {
		delete(g.held, h.name)
	}
	g.mu.Unlock()
}

// expire runs when a node has sent no report for its lease: its lease is
// revoked, so it shows offline.
func (g *registrar) expire(h *held) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dead {
		return
	}
	if wait := h.lease - time.Since(h.last); wait > 0 {
		h.timer.Reset(wait) // a report came in meanwhile
		return
	}
	g.log.Info("node stopped reporting: offline", "node", h.name, "lease", h.lease)
	g.drop(h)
}

// close ends every lease held here: those nodes show offline until they
// report to another device (at their next report, lease/3 away).
func (g *registrar) close() {
	g.mu.Lock()
	g.closed = true
	hs := make([]*held, 0, len(g.held))
	for _, h := range g.held {
		hs = append(hs, h)
	}
	g.mu.Unlock()
	for _, h := range hs {
		h.mu.Lock()
		if !h.dead {
			g.drop(h)
		}
		h.mu.Unlock()
	}
}

// pause ends every lease held here and refuses reports until resume (the
// node goes to sleep): those nodes report to another device.
func (g *registrar) pause() { g.close() }

// resume takes reports again after pause.
func (g *registrar) resume() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

// reply builds the answer to a report: the lease, the online devices'
// addresses (this one first), and the realm's revocation list.
func (g *registrar) reply(ctx context.Context, lease time.Duration) (wire.RegisterReply, error) {
	g.cacheMu.Lock()
	defer g.cacheMu.Unlock()
	if g.cachedAt.IsZero() || time.Since(g.cachedAt) >= cacheFor {
		regs := []string{g.self}
		nodes, err := g.meta.Nodes(ctx)
		if err != nil {
			return wire.RegisterReply{}, err
		}
		for _, n := range nodes {
			if n.Role == string(pki.Device) && n.State == meta.NodeOnline && n.Addr != "" && n.Addr != g.self && len(regs) < wire.MaxRegistrars {
				if wire.CheckAddr(n.Addr) == nil {
					regs = append(regs, n.Addr)
				}
			}
		}
		rev, err := readRevocations(ctx, g.meta)
		if err != nil {
			return wire.RegisterReply{}, err
		}
		if len(rev.Names) > wire.MaxRevoked || len(rev.Serials) > wire.MaxRevoked {
			return wire.RegisterReply{}, cairn.E("register node", cairn.Other, "", fmt.Errorf("the revocation list (%d names, %d serials) exceeds what a reply carries (%d)", len(rev.Names), len(rev.Serials), wire.MaxRevoked))
		}
		g.cached, g.cachedAt = wire.RegisterReply{Registrars: regs, Revoked: rev}, time.Now()
	}
	r := g.cached
	r.Lease = int64(lease)
	return r, nil
}

// readRevocations reads the realm's whole revocation list from the
// metadata (meta.RevocationList).
func readRevocations(ctx context.Context, m *meta.Service) (wire.Revocations, error) {
	names, serials, _, err := m.RevocationList(ctx)
	if err != nil {
		return wire.Revocations{}, err
	}
	return wire.Revocations{Names: names, Serials: serials}, nil
}
