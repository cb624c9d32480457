// Package netnstest builds several "hosts" on this machine for integration
// tests: each host is a network namespace with one interface and its own
// address on a private subnet (10.213.0.0/24) that exists only inside those
// namespaces. Nothing is configured in the root namespace and no host has a
// route anywhere else, so a test can address only its own hosts (and each
// host's own loopback).
//
// The link between hosts is emulated in the test process itself: each host's
// interface is a TUN device whose other end is held by the test, which
// forwards every IPv4 packet to the host it is addressed to after the
// host's uplink has carried it (Rate), a propagation delay (Delay) and an
// optional random loss (Loss). This is what `tc qdisc add dev IF root netem
// delay D rate R loss L` on each host's interface would do; it is done in Go
// because netem is not in every kernel (it is not in this project's test
// machines' kernel: CONFIG_NET_SCH_NETEM is unset), while TUN is.
//
// Delay is ONE-WAY, per host uplink, as with netem on each host's
// interface: a packet from A to B is delayed by A's link, the answer by B's
// link, so a round trip between two hosts takes 2×Delay plus the time the
// packets take on the wire at Rate. For a 30 ms round trip use
// Delay: 15 * time.Millisecond. Go's timers add about 1 ms per hop: on the
// project's test machine (2 cores), Delay 15ms and Rate "1.5mbit" give a TCP
// echo round trip of 32.5 ms, and 200 KB take 1.14 s (1.46 Mbit/s on the
// wire, headers included), also with both cores busy.
//
// Each host has a stable MAC (Host.MAC; no frame carries it, the TUN
// link is IP only), and a datagram to Subnet's broadcast address
// (Broadcast) reaches every other host: enough for Wake-on-LAN (package
// sleeprig puts hosts to sleep and wakes them with magic packets).
//
// The test process must stay alive while the hosts talk: it is the wire.
// Everything New makes is removed at t.Cleanup, even when the test fails;
// CleanupStale removes what a killed test process left behind.
package netnstest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package makes:
// "cairn-<pid>-<n>-<host>", where pid is the creating process.
const Prefix = "cairn-"

// Dev is the name of each host's interface inside its namespace.
const Dev = "cairn0"

// Subnet is the private subnet the hosts' addresses are on; host i has
// address 10.213.0.(i+1). It exists only inside the test's namespaces.
var Subnet = netip.MustParsePrefix("10.213.0.0/24")

// Broadcast is Subnet's broadcast address: a packet a host sends there
// reaches every other host (as on a LAN), through each one's link.
var Broadcast = netip.MustParseAddr("10.213.0.255")

// DefaultLimit is the number of packets a host's link queues before it drops
// (netem's default limit).
const DefaultLimit = 1000

// Options describe the hosts and the emulated link each one has.
type Options struct {
	Hosts int // number of hosts, 1 to 250
	// Delay is the one-way propagation delay of each host's uplink; the
	// round trip between two hosts is 2×Delay (plus time on the wire).
	Delay time.Duration
	// Rate is each host's uplink rate in tc's syntax: "1.5mbit", "512kbit",
	// "100kbps" (bytes), a bare number is bits per second. Empty: unlimited.
	Rate string
	// Loss is the percentage (0 to 100) of packets each uplink drops at
	// random, like netem's "loss". Dropped packets still count in the
	// sender's TxBytes: they were sent.
	Loss float64
	// Limit is the number of packets a host's link holds (queued for the
	// rate or in flight for the delay) before it drops new ones;
	// 0 means DefaultLimit.
	Limit int
}

// Host is one emulated machine.
type Host struct {
	NS   string     // network namespace name (under /run/netns)
	Addr netip.Addr // its address on Subnet
	// MAC is the host's hardware address, stable across runs: host i has
	// 02:ca:13:00:00:(i+1) (locally administered). The interface is a TUN
	// device, which carries IP packets and has no hardware address of its
	// own, so no frame carries the MAC: it is the name a Wake-on-LAN
	// magic packet gives the host (see package sleeprig).
	MAC net.HardwareAddr
}

// Net is a set of hosts joined by emulated links.
type Net struct {
	Hosts []Host

	t      testing.TB
	opts   Options
	rate   float64 // bits per second; 0: unlimited
	byAddr map[netip.Addr]int
	links  []*link
	stop   chan struct{}
	wg     sync.WaitGroup
}

var seq atomic.Int64

// New builds opts.Hosts hosts and the links between them; everything is
// removed at t.Cleanup. It skips the test when this process may not make
// network namespaces or TUN devices (not root, no CAP_NET_ADMIN, no ip(8)).
func New(t testing.TB, opts Options) *Net {
	t.Helper()
	if opts.Hosts < 1 || opts.Hosts > 250 {
		t.Fatalf("netnstest: %d hosts: want 1 to 250", opts.Hosts)
	}
	rate, err := ParseRate(opts.Rate)
	if err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	if opts.Loss < 0 || opts.Loss > 100 {
		t.Fatalf("netnstest: loss %v%%: want 0 to 100", opts.Loss)
	}
	if opts.Delay < 0 {
		t.Fatalf("netnstest: negative delay %v", opts.Delay)
	}
	if opts.Limit <= 0 {
		opts.Limit = DefaultLimit
	}
	if os.Geteuid() != 0 {
		t.Skip("netnstest: needs root to make network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("netnstest: ip(8) not found (Debian package iproute2)")
	}
	_ = CleanupStale()

	n := &Net{t: t, opts: opts, rate: rate, byAddr: map[netip.Addr]int{}, stop: make(chan struct{})}
	id := seq.Add(1)
	// Cleanups run last-in first-out: the namespaces go after the links.
	var made []string
	t.Cleanup(func() {
		for _, ns := range made {
			if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
				t.Errorf("netnstest: delete namespace %s: %v: %s", ns, err, out)
			}
		}
	})
	t.Cleanup(n.closeLinks)

	for i := range opts.Hosts {
		ns := fmt.Sprintf("%s%d-%d-%d", Prefix, os.Getpid(), id, i)
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			if i == 0 {
				t.Skipf("netnstest: `ip netns add` refused (no CAP_NET_ADMIN?): %v: %s", err, bytes.TrimSpace(out))
			}
			t.Fatalf("netnstest: ip netns add %s: %v: %s", ns, err, out)
		}
		made = append(made, ns)
		addr := hostAddr(i)
		n.Hosts = append(n.Hosts, Host{NS: ns, Addr: addr, MAC: hostMAC(i)})
		n.byAddr[addr] = i

		// No IPv6: a TUN device would otherwise send router solicitations
		// and MLD reports, which would show in the byte counters.
		if err := inNS(ns, disableIPv6); err != nil {
			t.Fatalf("netnstest: %s: %v", ns, err)
		}
		f, err := openTUN(ns, Dev)
		if err != nil {
			if i == 0 && (errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EPERM)) {
				t.Skipf("netnstest: cannot make a TUN device: %v", err)
			}
			t.Fatalf("netnstest: %v", err)
		}
		n.links = append(n.links, &link{n: n, host: i, f: f, q: make(chan packet, opts.Limit)})
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		run(t, "ip", "-n", ns, "addr", "add", netip.PrefixFrom(addr, Subnet.Bits()).String(), "brd", Broadcast.String(), "dev", Dev)
		run(t, "ip", "-n", ns, "link", "set", Dev, "up")
	}
	for _, l := range n.links {
		n.wg.Add(2)
		go l.read()
		go l.deliver()
	}
	return n
}

func hostAddr(i int) netip.Addr {
	a := Subnet.Addr().As4()
	a[3] = byte(i + 1)
	return netip.AddrFrom4(a)
}

func hostMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0xca, 0x13, 0x00, 0x00, byte(i + 1)}
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("netnstest: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// NS is host's namespace name.
func (n *Net) NS(host int) string { return n.Hosts[host].NS }

// Addr is host's address.
func (n *Net) Addr(host int) netip.Addr { return n.Hosts[host].Addr }

// HostPort is "addr:port" for host.
func (n *Net) HostPort(host, port int) string {
	return netip.AddrPortFrom(n.Hosts[host].Addr, uint16(port)).String()
}

// Command returns a command that runs name inside host's namespace (through
// `ip netns exec`, which execs name in place), with this process's
// environment unless cmd.Env is set. The program is killed if this process
// dies (SysProcAttr.Pdeathsig), since the hosts' link dies with it anyway.
func (n *Net) Command(host int, name string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Hosts[host].NS, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// Do runs fn on an OS thread that is inside host's namespace. Sockets made
// in fn belong to that namespace and keep belonging to it afterwards, from
// any goroutine; fn must not start goroutines that make sockets.
func (n *Net) Do(host int, fn func() error) error {
	return inNS(n.Hosts[host].NS, fn)
}

// Listen listens on addr (e.g. "10.213.0.1:0" or ":7000") inside host's
// namespace.
func (n *Net) Listen(host int, network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(host, func() (err error) { l, err = net.Listen(network, addr); return err })
	return l, err
}

// Dial connects from inside host's namespace.
func (n *Net) Dial(host int, network, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Do(host, func() (err error) { c, err = net.DialTimeout(network, addr, timeout); return err })
	return c, err
}

// TxBytes is the number of bytes host's interface has sent (IP packets,
// as counted by the kernel inside the namespace).
func (n *Net) TxBytes(host int) uint64 { return n.stats(host).Tx.Bytes }

// RxBytes is the number of bytes host's interface has received.
func (n *Net) RxBytes(host int) uint64 { return n.stats(host).Rx.Bytes }

type linkStats struct {
	Rx struct {
		Bytes   uint64 `json:"bytes"`
		Packets uint64 `json:"packets"`
	} `json:"rx"`
	Tx struct {
		Bytes   uint64 `json:"bytes"`
		Packets uint64 `json:"packets"`
	} `json:"tx"`
}

func (n *Net) stats(host int) linkStats {
	n.t.Helper()
	out, err := exec.Command("ip", "-n", n.Hosts[host].NS, "-s", "-j", "link", "show", "dev", Dev).Output()
	if err != nil {
		n.t.Fatalf("netnstest: link stats of host %d: %v", host, err)
	}
	var v []struct {
		Stats64 linkStats `json:"stats64"`
	}
	if err := json.Unmarshal(out, &v); err != nil || len(v) != 1 {
		n.t.Fatalf("netnstest: link stats of host %d: %v: %s", host, err, out)
	}
	return v[0].Stats64
}

// CleanupStale deletes namespaces named with Prefix whose creating process
// is no longer running (left behind by a killed test). It never touches a
// namespace of a live process.
func CleanupStale() error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("ip netns list: %w", err)
	}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], Prefix) {
			continue
		}
		ns := f[0]
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(ns, Prefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() || alive(pid) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %v: %s", ns, err, bytes.TrimSpace(out)))
		}
	}
	return errors.Join(errs...)
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// ParseRate reads a rate in tc's syntax and returns bits per second
// (0 for ""): bit, kbit, mbit, gbit, tbit (powers of 1000), kibit, mibit,
// gibit, tibit (powers of 1024), bps, kbps, mbps, gbps, tbps (bytes per
// second) and kibps, mibps, gibps, tibps; a bare number is bits per second.
func ParseRate(s string) (float64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return 0, nil
	}
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], s[i:]
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("rate %q: want a positive number and a unit like 1.5mbit", s)
	}
	mult := map[string]float64{
		"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
		"kibit": 1 << 10, "mibit": 1 << 20, "gibit": 1 << 30, "tibit": 1 << 40,
		"bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
		"kibps": 8 << 10, "mibps": 8 << 20, "gibps": 8 << 30, "tibps": 8 << 40,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("rate %q: unknown unit %q", s, unit)
	}
	return v * mult, nil
}

// inNS runs fn on a locked OS thread moved into namespace ns, then moves
// the thread back. If it cannot move back, the thread stays locked and
// dies with the goroutine, so no other goroutine runs in ns by mistake.
func inNS(ns string, fn func() error) error {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("setns back from %s: %w", ns, err))
			return // still locked: the thread exits with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// disableIPv6 turns IPv6 off in the calling thread's network namespace
// (/proc/sys/net shows the namespace of the thread that opens it).
func disableIPv6() error {
	for _, k := range []string{"all", "default"} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1\n"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// openTUN makes TUN device name inside namespace ns and returns its
// non-blocking file (read: packets the host sends; write: packets it gets).
func openTUN(ns, name string) (*os.File, error) {
	var f *os.File
	err := inNS(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("TUNSETIFF %s in %s: %w", name, ns, err)
		}
		f = os.NewFile(uintptr(fd), "tun:"+ns)
		return nil
	})
	return f, err
}

// packet is one IP packet on its way to host to (toAll: to every host
// but the sender), due at at.
type packet struct {
	data []byte
	to   int
	at   time.Time
}

// toAll is packet.to for a packet to Broadcast.
const toAll = -1

// link is one host's uplink: read takes what the host sends and schedules
// it; deliver hands it to its destination when due. Due times only grow
// (FIFO, constant delay), so one queue per uplink is enough.
type link struct {
	n    *Net
	host int
	f    *os.File
	q    chan packet
}

func (l *link) read() {
	defer l.n.wg.Done()
	defer close(l.q)
	n := l.n
	buf := make([]byte, 65536)
	var busy time.Time // when the uplink has sent everything queued
	for {
		k, err := l.f.Read(buf)
		if err != nil {
			return // closed at cleanup
		}
		now := time.Now()
		p := buf[:k]
		if k < 20 || p[0]>>4 != 4 {
			continue // IPv4 only
		}
		dst := netip.AddrFrom4([4]byte(p[16:20]))
		to, ok := n.byAddr[dst]
		if dst == Broadcast || dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			to, ok = toAll, true
		}
		if !ok {
			continue // not one of our hosts: nowhere to go
		}
		if n.opts.Loss > 0 && rand.Float64()*100 < n.opts.Loss {
			continue
		}
		start := busy
		if now.After(start) {
			start = now
		}
		done := start
		if n.rate > 0 {
			done = start.Add(time.Duration(float64(k) * 8 / n.rate * float64(time.Second)))
		}
		select {
		case l.q <- packet{data: bytes.Clone(p), to: to, at: done.Add(n.opts.Delay)}:
			busy = done
		default: // queue full: tail drop, the link stays as busy as it was
		}
	}
}

func (l *link) deliver() {
	defer l.n.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for p := range l.q {
		if d := time.Until(p.at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-l.n.stop:
				for range l.q {
				}
				return
			}
		}
		// Write errors: the host is gone, its link is down or its queue is
		// full; a lost packet.
		if p.to != toAll {
			l.n.links[p.to].f.Write(p.data)
			continue
		}
		for _, o := range l.n.links {
			if o != l {
				o.f.Write(p.data)
			}
		}
	}
}

// closeLinks stops the forwarding and closes the TUN devices' files.
func (n *Net) closeLinks() {
	close(n.stop)
	for _, l := range n.links {
		l.f.Close()
	}
	n.wg.Wait()
}
