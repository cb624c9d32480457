// Package sleeprig is the test rig for devices that sleep (issue 16 item
// 4): hosts in network namespaces (package netnstest) whose "device" can be
// put to sleep and woken by a real Wake-on-LAN magic packet.
//
// A host sleeps as a machine does, as far as the others can tell: Sleep
// stops the processes the test attached to it (SIGSTOP, by PID, only those
// processes) and takes its interface down, so that every packet sent to it
// is dropped, with no answer (not even a TCP reset: a dial times out).
// Wake brings the interface up and resumes the processes (SIGCONT).
//
// A wake agent runs in the proxy host's namespace (Options.Proxy): it
// listens on UDP (port 9 unless Options.Port says otherwise) for magic
// packets sent to the LAN's broadcast address (netnstest.Broadcast) or to
// the proxy's own address, and when one names the MAC of a sleeping host
// (netnstest.Host.MAC), it wakes that host after Options.ResumeTime, the
// time a real machine takes to resume. Anything else (not a magic packet,
// a MAC no host has, a host that is awake) wakes nothing; every datagram
// the agent receives is recorded (Events), so a test can also assert that
// no magic packet was sent. The agent runs in the test process, like the
// links: it is a goroutine whose socket lives in the proxy's namespace.
//
// The links keep netnstest's emulation (rate, one-way delay, loss per host
// uplink), done in Go by the test process rather than with tc netem, which
// this project's test kernels do not have (CONFIG_NET_SCH_NETEM unset); see
// package netnstest.
//
// Everything is undone at t.Cleanup, also when the test fails: pending
// wakes are dropped, every host still asleep has its link brought up and
// its processes resumed (a stopped process is never left behind), then
// netnstest removes the namespaces. Processes attached with Attach are
// signalled through their pidfd (os.Process), so a PID reused after the
// process was reaped is never signalled.
//
// Typical use (the package's tests do this):
//
//	r := sleeprig.New(t, sleeprig.Options{
//		Net:        netnstest.Options{Hosts: 3, Delay: 2 * time.Millisecond, Rate: "56mbit"},
//		Proxy:      2,
//		ResumeTime: 5 * time.Second,
//	})
//	cmd := r.Command(1, "cairn", "node", "serve", ...) // the device
//	cmd.Start(); t.Cleanup(...kill and wait...)
//	r.Attach(1, cmd.Process)
//	r.Sleep(ctx, 1)                      // host 1 is asleep
//	r.Do(0, func() error {               // host 0 sends a magic packet
//		return wol.Send(ctx, r.Hosts[1].MAC, r.BroadcastAddr().String())
//	})
//	r.WaitAwake(ctx, 1)                  // ResumeTime later, host 1 runs again
package sleeprig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/netnstest"
	"cairn.dev/cairn/internal/wol"
)

// DefaultResumeTime is Options.ResumeTime when it is zero.
const DefaultResumeTime = 2 * time.Second

// Options describe the rig.
type Options struct {
	Net netnstest.Options // the hosts and their links
	// Proxy is the host whose namespace the wake agent listens in. It
	// cannot be put to sleep (it is the always-on machine of the LAN).
	Proxy int
	// ResumeTime is how long a host takes to wake after the agent received
	// a magic packet for it; 0 means DefaultResumeTime.
	ResumeTime time.Duration
	// Port is the UDP port the agent listens on; 0 means wol.Port (9).
	Port int
}

// Outcome is what the agent did with one datagram.
type Outcome string

// The outcomes of a datagram.
const (
	Malformed Outcome = "malformed"      // not a magic packet: nothing woken
	Unknown   Outcome = "unknown MAC"    // no host has the MAC: nothing woken
	Awake     Outcome = "awake"          // the host is awake: nothing to do
	Pending   Outcome = "already waking" // a wake of the host is already scheduled
	Scheduled Outcome = "wake scheduled" // the host wakes ResumeTime after At
	Held      Outcome = "held asleep"    // the test holds the host asleep (Hold): a wake that never comes
)

// Event is one datagram the agent received.
type Event struct {
	At      time.Time        // when the agent received it
	From    netip.AddrPort   // its sender
	Size    int              // its length in bytes
	MAC     net.HardwareAddr // the MAC it names; nil if Malformed
	Host    int              // the host with that MAC; -1 if none
	Outcome Outcome
	Err     error // for Malformed: what is wrong with it (from wol.Parse)
}

// Rig is a netnstest.Net whose hosts can sleep, with a wake agent.
type Rig struct {
	*netnstest.Net

	t      testing.TB
	opts   Options
	agent  net.PacketConn
	done   chan struct{} // closed when the agent's goroutine ends
	mu     sync.Mutex
	closed bool
	hosts  []*hostState
	events []Event
}

type hostState struct {
	procs  []*os.Process
	asleep bool
	held   bool        // Hold: magic packets for it wake nothing
	timer  *time.Timer // a scheduled wake; nil if none
	woken  int         // wakes done by the agent
	err    error       // the last wake by the agent that failed
}

// New builds the hosts (netnstest.New, which skips the test without root)
// and starts the wake agent in the proxy's namespace. Everything is undone
// at t.Cleanup.
func New(t testing.TB, opts Options) *Rig {
	t.Helper()
	if opts.ResumeTime == 0 {
		opts.ResumeTime = DefaultResumeTime
	}
	if opts.ResumeTime < 0 {
		t.Fatalf("sleeprig: negative resume time %v", opts.ResumeTime)
	}
	if opts.Port == 0 {
		opts.Port = wol.Port
	}
	if opts.Port < 0 || opts.Port > 65535 {
		t.Fatalf("sleeprig: port %d", opts.Port)
	}
	if opts.Proxy < 0 || opts.Proxy >= opts.Net.Hosts {
		t.Fatalf("sleeprig: proxy host %d of %d", opts.Proxy, opts.Net.Hosts)
	}
	n := netnstest.New(t, opts.Net)
	r := &Rig{Net: n, t: t, opts: opts, done: make(chan struct{})}
	for range n.Hosts {
		r.hosts = append(r.hosts, &hostState{})
	}
	err := n.Do(opts.Proxy, func() (err error) {
		// Any address: datagrams to the broadcast address and to the
		// proxy's own both arrive.
		r.agent, err = net.ListenPacket("udp4", ":"+strconv.Itoa(opts.Port))
		return err
	})
	if err != nil {
		t.Fatalf("sleeprig: wake agent in host %d: %v", opts.Proxy, err)
	}
	t.Cleanup(r.cleanup)
	go r.listen()
	return r
}

// ResumeTime is the time a host takes to wake after a magic packet.
func (r *Rig) ResumeTime() time.Duration { return r.opts.ResumeTime }

// Proxy is the host the wake agent runs in.
func (r *Rig) Proxy() int { return r.opts.Proxy }

// AgentAddr is the wake agent's address: the proxy's address and the
// agent's port.
func (r *Rig) AgentAddr() netip.AddrPort {
	return netip.AddrPortFrom(r.Addr(r.opts.Proxy), uint16(r.opts.Port))
}

// BroadcastAddr is the LAN's broadcast address with the agent's port, where
// a device's wake proxy sends magic packets.
func (r *Rig) BroadcastAddr() netip.AddrPort {
	return netip.AddrPortFrom(netnstest.Broadcast, uint16(r.opts.Port))
}

// MAC is host's MAC (r.Hosts[host].MAC).
func (r *Rig) MAC(host int) net.HardwareAddr { return r.Hosts[host].MAC }

// Attach makes p one of host's device processes: Sleep stops it, Wake
// resumes it. p must be a process the test started (in host's namespace,
// e.g. with r.Command) and must stay unreaped (not Waited) while attached:
// the test kills and waits for it in its own cleanup.
func (r *Rig) Attach(host int, p *os.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts[host].procs = append(r.hosts[host].procs, p)
}

// Asleep says whether host is asleep (a scheduled wake not done yet counts
// as asleep).
func (r *Rig) Asleep(host int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hosts[host].asleep
}

// Events is a copy of what the agent received so far, oldest first.
func (r *Rig) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Sleep puts host to sleep: it stops host's attached processes (SIGSTOP,
// and waits until /proc shows each stopped), then takes host's interface
// down. It fails for the proxy and for a host already asleep.
func (r *Rig) Sleep(ctx context.Context, host int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("sleeprig: closed")
	}
	if host == r.opts.Proxy {
		return fmt.Errorf("sleeprig: host %d is the wake agent's proxy: it never sleeps", host)
	}
	h := r.hosts[host]
	if h.asleep {
		return fmt.Errorf("sleeprig: host %d is already asleep", host)
	}
	h.asleep = true // from here on, cleanup wakes it, whatever fails
	for _, p := range h.procs {
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return fmt.Errorf("sleeprig: stop process %d of host %d: %w", p.Pid, host, err)
		}
	}
	for _, p := range h.procs {
		if err := waitState(ctx, p.Pid, true); err != nil {
			return fmt.Errorf("sleeprig: host %d: %w", host, err)
		}
	}
	return r.setLink(ctx, host, "down")
}

// Wake wakes host now: it brings host's interface up and resumes its
// processes (SIGCONT, and waits until /proc shows each running). A
// scheduled wake of host is dropped. Waking a host that is awake does
// nothing.
func (r *Rig) Wake(ctx context.Context, host int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.wake(ctx, host)
}

// wake is Wake with r.mu held.
func (r *Rig) wake(ctx context.Context, host int) error {
	h := r.hosts[host]
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	if !h.asleep {
		return nil
	}
	err := r.setLink(ctx, host, "up")
	for _, p := range h.procs {
		if serr := p.Signal(syscall.SIGCONT); serr != nil {
			err = errors.Join(err, fmt.Errorf("sleeprig: resume process %d of host %d: %w", p.Pid, host, serr))
			continue
		}
		if werr := waitState(ctx, p.Pid, false); werr != nil {
			err = errors.Join(err, fmt.Errorf("sleeprig: host %d: %w", host, werr))
		}
	}
	if err == nil {
		h.asleep = false
	}
	return err
}

// WaitAwake waits until host is awake (the agent's wake is done) and
// returns how many wakes the agent has done for host so far. It fails if
// the agent's last wake of host failed, or when ctx ends first.
func (r *Rig) WaitAwake(ctx context.Context, host int) (wakes int, err error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		h := r.hosts[host]
		asleep, woken, werr := h.asleep, h.woken, h.err
		r.mu.Unlock()
		if werr != nil {
			return woken, werr
		}
		if !asleep {
			return woken, nil
		}
		select {
		case <-ctx.Done():
			return woken, fmt.Errorf("sleeprig: host %d still asleep: %w", host, ctx.Err())
		case <-tick.C:
		}
	}
}

func (r *Rig) setLink(ctx context.Context, host int, state string) error {
	out, err := exec.CommandContext(ctx, "ip", "-n", r.NS(host), "link", "set", netnstest.Dev, state).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sleeprig: link of host %d %s: %v: %s", host, state, err, bytes.TrimSpace(out))
	}
	return nil
}

// listen is the wake agent: it reads datagrams until the socket is closed.
func (r *Rig) listen() {
	defer close(r.done)
	buf := make([]byte, 65536)
	for {
		k, from, err := r.agent.ReadFrom(buf)
		if err != nil {
			return // closed at cleanup
		}
		ev := Event{At: time.Now(), Size: k, Host: -1}
		if ua, ok := from.(*net.UDPAddr); ok {
			ev.From = ua.AddrPort()
		}
		p, err := wol.Parse(buf[:k])
		r.mu.Lock()
		switch {
		case err != nil:
			ev.Outcome, ev.Err = Malformed, err
		default:
			ev.MAC = p.MAC
			ev.Host = slices.IndexFunc(r.Hosts, func(h netnstest.Host) bool { return bytes.Equal(h.MAC, p.MAC) })
			switch h := r.host(ev.Host); {
			case h == nil:
				ev.Outcome = Unknown
			case !h.asleep:
				ev.Outcome = Awake
			case h.held:
				ev.Outcome = Held
			case h.timer != nil:
				ev.Outcome = Pending
			case !r.closed:
				ev.Outcome = Scheduled
				host := ev.Host
				h.timer = time.AfterFunc(r.opts.ResumeTime, func() { r.agentWake(host) })
			}
		}
		r.events = append(r.events, ev)
		r.mu.Unlock()
	}
}

func (r *Rig) host(i int) *hostState {
	if i < 0 {
		return nil
	}
	return r.hosts[i]
}

// agentWake is the agent's wake of host, ResumeTime after the magic packet.
func (r *Rig) agentWake(host int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.hosts[host]
	if r.closed || h.timer == nil {
		return // dropped by Wake or by cleanup
	}
	h.timer = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.wake(ctx, host); err != nil {
		h.err = err
		return
	}
	h.woken++
}

// Hold makes the agent ignore magic packets for host while hold is set (a
// machine whose Wake-on-LAN does not work): they are recorded with Outcome
// Held and wake nothing. Wake and cleanup still wake it.
func (r *Rig) Hold(host int, hold bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hosts[host].held = hold
}

// cleanup stops the agent and wakes every host still asleep.
func (r *Rig) cleanup() {
	r.agent.Close()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, h := range r.hosts {
		if h.timer != nil {
			h.timer.Stop()
			h.timer = nil
		}
		if err := r.wake(ctx, i); err != nil && !errors.Is(err, os.ErrProcessDone) {
			r.t.Errorf("sleeprig: cleanup: %v", err)
		}
	}
}

// ProcState is the state letter of process pid in /proc/PID/stat:
// 'R' running, 'S' sleeping (waiting for an event), 'T' stopped by a
// signal, 'Z' zombie...
func ProcState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	return b[i+2], nil
}

// waitState polls until pid is stopped ('T') or, with stopped false, no
// longer stopped; a process that is gone is an error.
func waitState(ctx context.Context, pid int, stopped bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		s, err := ProcState(pid)
		if err != nil {
			return fmt.Errorf("process %d: %w", pid, err)
		}
		if s == 'Z' || s == 'X' {
			return fmt.Errorf("process %d: %w (state %c)", pid, os.ErrProcessDone, s)
		}
		if (s == 'T') == stopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d: state %c after SIGSTOP/SIGCONT: %w", pid, s, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
