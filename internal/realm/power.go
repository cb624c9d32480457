package realm

// The node daemon's power states (doc/power.md): a device's node that
// announces standby (`cairn node standby`, or systemd-logind's
// PrepareForSleep) stops taking chunk-service requests, waits for those in
// flight (a bound: DrainTimeout), records the standby with its wake method
// and ends its lease cleanly; on resume it registers again, awake.

import (
	"bufio"
	"context"
	"encoding/json"
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
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/logind"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// DefaultDrainTimeout is how long a node that announces standby waits for
// the chunk-service requests in flight.
const DefaultDrainTimeout = 10 * time.Second

// gate admits the chunk service's requests while open and counts those in
// flight; closed, it refuses new ones (Unavailable: the peer reads
// another copy) so that the ones in flight can finish.
type gate struct {
	h http.Handler

	mu     sync.Mutex
	closed bool
	n      int
	idle   chan struct{} // closed when n drops to 0 while closed
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		body := wire.EncodeError(cairn.E("node", cairn.Unavailable, "", errors.New("this node is going to sleep (standby)")))
		hd := w.Header()
		hd.Set("Content-Type", wire.TypeJSON)
		hd.Set("Content-Encoding", wire.Zstd)
		hd.Set("Content-Length", strconv.Itoa(len(body)))
		hd.Set("Connection", "close")
		w.WriteHeader(wire.Status(cairn.Unavailable))
		_, _ = w.Write(body)
		return
	}
	g.n++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.n--
		if g.n == 0 && g.idle != nil {
			close(g.idle)
			g.idle = nil
		}
		g.mu.Unlock()
	}()
	g.h.ServeHTTP(w, r)
}

// close refuses new requests and waits until those in flight are done or
// ctx ends; it returns how many were still in flight then.
func (g *gate) close(ctx context.Context) int {
	g.mu.Lock()
	g.closed = true
	if g.n == 0 {
		g.mu.Unlock()
		return 0
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return 0
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.n
	}
}

// inFlight is how many requests are being served.
func (g *gate) inFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// open admits requests again.
func (g *gate) open() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

// learnWake finds how this machine can be woken: the hardware address and
// IPv4 broadcast address of the interface that carries addr's host (a
// host name is resolved). nil if no such interface has a hardware address
// (loopback, a tunnel, an address of another machine).
func learnWake(ctx context.Context, addr string) *meta.WakeInfo {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		as, lerr := net.DefaultResolver.LookupIPAddr(lctx, host)
		if lerr != nil {
			return nil
		}
		for _, a := range as {
			ips = append(ips, a.IP)
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	for _, ifc := range ifs {
		if len(ifc.HardwareAddr) == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		as, aerr := ifc.Addrs()
		if aerr != nil {
			continue
		}
		for _, a := range as {
			n, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			for _, ip := range ips {
				if !n.IP.Equal(ip) {
					continue
				}
				w := &meta.WakeInfo{MAC: ifc.HardwareAddr.String()}
				if b := broadcast(n); b != nil {
					w.Broadcast = b.String()
				}
				return w
			}
		}
	}
	return nil
}

// broadcast is an IPv4 network's broadcast address (nil for IPv6).
func broadcast(n *net.IPNet) net.IP {
	ip4 := n.IP.To4()
	if ip4 == nil || len(n.Mask) != net.IPv4len {
		return nil
	}
	b := make(net.IP, net.IPv4len)
	for i := range b {
		b[i] = ip4[i] | ^n.Mask[i]
	}
	return b
}

// resumedFromSleep says whether the machine slept between two readings
// of the clock: Go's monotonic clock stops while the machine is
// suspended, the wall clock does not. A gap of more than slack between
// the two counts (an NTP step smaller than that does not).
func resumedFromSleep(prev, now time.Time, slack time.Duration) bool {
	return now.Round(0).Sub(prev.Round(0))-now.Sub(prev) > slack
}

// ---- node control socket ----

// ControlVersion is the version of the node control socket's requests
// and replies (doc/power.md).
const ControlVersion = 1

// ControlPath is where a device's running node listens for control
// requests (`cairn node standby`, `cairn node resume`).
func ControlPath(home string) string { return filepath.Join(home, "run", "node.sock") }

// ControlRequest is one request on the control socket.
type ControlRequest struct {
	V  int    `json:"v"`
	Op string `json:"op"` // "standby" or "resume"
}

// ControlReply answers a ControlRequest.
type ControlReply struct {
	V     int    `json:"v"`
	Node  string `json:"node,omitempty"`
	State string `json:"state,omitempty"` // meta.NodeAwake or meta.NodeStandby
	// Since is when the node entered State (unix ns).
	Since int64          `json:"since,omitempty"`
	Wake  *meta.WakeInfo `json:"wake,omitempty"`
	// Unfinished is how many chunk-service requests were still in flight
	// when the standby's drain bound ran out.
	Unfinished int `json:"unfinished,omitempty"`
	// MetaMovedTo names the device to which the standby handed the
	// realm's metadata service (the embedded etcd member this device
	// hosted); MetaSleeps, if set, says why no device took it: the
	// metadata service sleeps with this one.
	MetaMovedTo string `json:"meta_moved_to,omitempty"`
	MetaSleeps  string `json:"meta_sleeps,omitempty"`
	// Primaries says, for each copies replica set this device was the
	// primary of, the replica the standby handed the role to or why it
	// kept it; PrimariesError why the handoff failed (the roles stay).
	Primaries      []PrimaryHandoff `json:"primaries,omitempty"`
	PrimariesError string           `json:"primaries_error,omitempty"`
	// AlwaysOn says the node that went to standby is marked always-on.
	AlwaysOn bool   `json:"always_on,omitempty"`
	Error    string `json:"error,omitempty"`
}

// Control asks the node running in home to go to standby or resume (op),
// through its control socket. Unavailable if no node runs there.
func Control(ctx context.Context, home, op string) (ControlReply, error) {
	const what = "node control"
	p := ControlPath(home)
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", p)
	if err != nil {
		return ControlReply{}, cairn.E(what, cairn.Unavailable, p, fmt.Errorf("no node runs here ('cairn node serve'): %w", err))
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	b, _ := json.Marshal(ControlRequest{V: ControlVersion, Op: op})
	if _, err = c.Write(append(b, '\n')); err != nil {
		return ControlReply{}, cairn.E(what, cairn.IO, p, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return ControlReply{}, cairn.E(what, cairn.IO, p, err)
	}
	var rep ControlReply
	if err = json.Unmarshal(line, &rep); err != nil {
		return ControlReply{}, cairn.E(what, cairn.Corrupt, p, err)
	}
	if rep.Error != "" {
		return rep, cairn.E(what, cairn.Other, p, errors.New(rep.Error))
	}
	return rep, nil
}

// powerReq asks the node's loop to change its power state.
type powerReq struct {
	standby bool
	reply   chan ControlReply // buffered
}

// serveControl listens on home's control socket and hands its requests
// to reqs until the returned function is called; quit closed means
// nobody takes them any more. A socket left by a node that died is
// replaced; one that answers belongs to a running node: an error.
func serveControl(home string, reqs chan<- powerReq, quit <-chan struct{}) (func(), error) {
	const op = "node control"
	p := ControlPath(home)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, p, err)
	}
	if c, err := net.Dial("unix", p); err == nil {
		c.Close()
		return nil, cairn.E(op, cairn.Exist, p, errors.New("another node of this home is running"))
	}
	_ = os.Remove(p)
	ln, err := net.Listen("unix", p)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, p, err)
	}
	if err = os.Chmod(p, 0o600); err != nil {
		ln.Close()
		return nil, cairn.E(op, cairn.IO, p, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, aerr := ln.Accept()
			if aerr != nil {
				return
			}
			go handleControl(c, reqs, quit)
		}
	}()
	return func() {
		ln.Close() // removes the socket file too
		<-done
	}, nil
}

func handleControl(c net.Conn, reqs chan<- powerReq, quit <-chan struct{}) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(&limitedConn{c, 1 << 10})
	line, err := rd.ReadBytes('\n')
	rep := ControlReply{V: ControlVersion}
	var req ControlRequest
	switch {
	case err != nil:
		rep.Error = "no request line: " + err.Error()
	case json.Unmarshal(line, &req) != nil:
		rep.Error = "malformed request"
	case req.V != ControlVersion:
		rep.Error = fmt.Sprintf("request of version %d: this node speaks version %d", req.V, ControlVersion)
	case req.Op != "standby" && req.Op != "resume":
		rep.Error = fmt.Sprintf("unknown op %q", req.Op)
	default:
		pr := powerReq{standby: req.Op == "standby", reply: make(chan ControlReply, 1)}
		select {
		case reqs <- pr:
			select {
			case rep = <-pr.reply:
			case <-quit:
				rep.Error = "the node is stopping"
			}
		case <-quit:
			rep.Error = "the node is stopping"
		}
	}
	rep.V = ControlVersion
	b, _ := json.Marshal(rep)
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.Write(append(b, '\n'))
}

// limitedConn reads at most n bytes of a connection.
type limitedConn struct {
	c net.Conn
	n int
}

func (l *limitedConn) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("request too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.c.Read(p)
	l.n -= n
	return n, err
}

// watchSleep connects to systemd-logind on bus (see ServeOptions.SleepBus),
// takes its delay inhibitor of sleep and turns its PrepareForSleep signals
// into power requests: true announces standby, then releases the
// inhibitor so the machine may sleep; false takes it again, then resumes.
// Without a bus or a logind it logs once and returns nil: the node serves
// all the same (a sleep then reads as offline until it resumes).
func (r *Realm) watchSleep(ctx context.Context, bus string, reqs chan<- powerReq, quit <-chan struct{}) *logind.Watcher {
	return watchSleep(ctx, r.log, bus, reqs, quit)
}

// watchSleep is Realm.watchSleep for any node, logging to log.
func watchSleep(ctx context.Context, log *slog.Logger, bus string, reqs chan<- powerReq, quit <-chan struct{}) *logind.Watcher {
	if bus == "none" {
		return nil
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := logind.Open(octx, bus, "announce standby to the realm and finish its transfers")
	if err == nil {
		err = w.Take(octx)
		if err != nil {
			w.Close()
		}
	}
	if err != nil {
		log.Info("no systemd-logind sleep inhibitor: a suspend will not be announced (cairn node standby announces one by hand)", "err", err)
		return nil
	}
	log.Info("sleep inhibitor taken: a suspend is announced as standby")
	ask := func(standby bool) bool {
		pr := powerReq{standby: standby, reply: make(chan ControlReply, 1)}
		select {
		case reqs <- pr:
		case <-quit:
			return false
		}
		select {
		case rep := <-pr.reply:
			if rep.Error != "" {
				log.Warn("power state change for logind", "standby", standby, "err", rep.Error)
			}
			return true
		case <-quit:
			return false
		}
	}
	go func() {
		for sleep := range w.Sleep() {
			if sleep {
				ok := ask(true)
				// Whatever the standby's outcome, the machine sleeps: let it.
				if rerr := w.Release(); rerr != nil {
					log.Warn("release the sleep inhibitor", "err", rerr)
				}
				if !ok {
					return
				}
				continue
			}
			tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if terr := w.Take(tctx); terr != nil {
				log.Warn("take the sleep inhibitor again after a resume", "err", terr)
			}
			tcancel()
			if !ask(false) {
				return
			}
		}
	}()
	return w
}

// handMetaAway moves the realm's embedded etcd member, hosted by this
// device (self), to an awake device before this one sleeps (MoveMeta):
// it tries the awake devices with a node address, those marked always-on
// first, each group by name (metaHeirs). It returns the device that took
// it, or why none did: the metadata service then sleeps with this device,
// which it logs.
func (r *Realm) handMetaAway(ctx context.Context, self string) (to, sleeps string) {
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		sleeps = "cannot list the devices: " + err.Error()
		r.log.Warn("standby: the metadata service sleeps with this device", "node", self, "why", sleeps)
		return "", sleeps
	}
	cands := metaHeirs(nodes, self)
	if len(cands) == 0 {
		sleeps = "no other device is awake to take it"
	}
	var errs []error
	for _, c := range cands {
		r.log.Info("standby: handing the metadata service to an awake device", "node", self, "to", c)
		err := r.MoveMeta(ctx, c, MoveMetaOptions{Timeout: time.Minute, Progress: func(step string) {
			r.log.Info("standby: metadata move", "step", step)
		}})
		if err == nil {
			r.log.Info("standby: the metadata service moved", "node", self, "to", c)
			return c, ""
		}
		errs = append(errs, fmt.Errorf("%s: %w", c, err))
		if !r.servesGateway() {
			// Too far to try another: the member left already.
			break
		}
	}
	if len(errs) > 0 {
		sleeps = "no awake device took it: " + errors.Join(errs...).Error()
	}
	r.log.Warn("standby: the metadata service sleeps with this device", "node", self, "why", sleeps)
	return "", sleeps
}

// metaHeirs lists the devices that may take the metadata service from
// self before it sleeps: the awake devices with a node address but self,
// those marked always-on first (they will not sleep next), each group by
// name.
func metaHeirs(nodes []meta.NodeStatus, self string) []string {
	var on, others []string
	for _, n := range nodes {
		if n.Name == self || n.Role != string(pki.Device) || n.State != meta.NodeAwake || n.Addr == "" {
			continue
		}
		if n.AlwaysOn {
			on = append(on, n.Name)
		} else {
			others = append(others, n.Name)
		}
	}
	slices.Sort(on)
	slices.Sort(others)
	return append(on, others...)
}
