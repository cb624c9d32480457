package netnstest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary a server inside a namespace instead of
// running the tests: "echo ADDR" echoes every connection; "sink ADDR" reads
// each connection to EOF and answers with the byte count (8 bytes, big
// endian). Either prints "listening" once it listens.
const helperEnv = "CAIRN_NETNSTEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		helper(h)
		return
	}
	os.Exit(m.Run())
}

func helper(spec string) {
	mode, addr, _ := strings.Cut(spec, " ")
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			switch mode {
			case "echo":
				io.Copy(c, c)
			case "sink":
				n, _ := io.Copy(io.Discard, c)
				binary.Write(c, binary.BigEndian, n)
			}
		}()
	}
}

// startHelper runs this test binary as a helper server in host.
func startHelper(t *testing.T, n *Net, host int, mode, addr string) {
	t.Helper()
	cmd := n.Command(host, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode+" "+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ready <- sc.Scan() && sc.Text() == "listening"
		io.Copy(io.Discard, out)
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("helper %s in host %d did not start: %s", mode, host, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("helper %s in host %d did not start: %s", mode, host, stderr.String())
	}
}

func namespaces(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// Three hosts over a 1.5 Mbit/s link with a 30 ms round trip: they reach
// each other, the round trip and the rate are the configured ones, the
// byte counters see the traffic, and nothing is left afterwards.
func TestHosts(t *testing.T) {
	var made []string
	ok := t.Run("net", func(t *testing.T) {
		n := New(t, Options{Hosts: 3, Delay: 15 * time.Millisecond, Rate: "1.5mbit"})
		for _, h := range n.Hosts {
			made = append(made, h.NS)
		}
		if len(n.Hosts) != 3 || n.Addr(0).String() != "10.213.0.1" || n.Addr(2).String() != "10.213.0.3" {
			t.Fatalf("hosts: %+v", n.Hosts)
		}
		for i, h := range n.Hosts {
			if !strings.HasPrefix(h.NS, fmt.Sprintf("%s%d-", Prefix, os.Getpid())) || !slices.Contains(namespaces(t), h.NS) {
				t.Fatalf("host %d: namespace %q", i, h.NS)
			}
		}

		// Only the subnet is reachable: no default route, nothing else.
		out, err := n.Command(1, "ip", "-4", "route", "show").Output()
		if err != nil {
			t.Fatal(err)
		}
		if routes := strings.TrimSpace(string(out)); !strings.HasPrefix(routes, "10.213.0.0/24 dev "+Dev) || strings.Contains(routes, "\n") {
			t.Fatalf("host 1 routes:\n%s", out)
		}
		// No IPv6 (it would chatter and show in the counters).
		if out, oerr := n.Command(1, "ip", "-6", "addr", "show").Output(); oerr != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Fatalf("host 1 IPv6 addresses (%v):\n%s", oerr, out)
		}
		// And the root namespace has no address on it.
		if out, oerr := exec.Command("ip", "-4", "addr", "show").Output(); oerr != nil || strings.Contains(string(out), "10.213.") {
			t.Fatalf("root namespace addresses (%v):\n%s", oerr, out)
		}

		startHelper(t, n, 0, "echo", n.HostPort(0, 7000))
		startHelper(t, n, 0, "sink", n.HostPort(0, 7001))

		// Echo from host 1 and host 2 to host 0; measure the round trip.
		for _, from := range []int{1, 2} {
			c, derr := n.Dial(from, "tcp", n.HostPort(0, 7000), 5*time.Second)
			if derr != nil {
				t.Fatalf("dial from host %d: %v", from, derr)
			}
			if la := c.LocalAddr().(*net.TCPAddr); la.IP.String() != n.Addr(from).String() {
				t.Fatalf("local address %v, want host %d's %v", la, from, n.Addr(from))
			}
			var rtts []time.Duration
			buf := make([]byte, 16)
			for i := range 10 {
				msg := fmt.Appendf(nil, "ping %d", i)
				start := time.Now()
				if _, werr := c.Write(msg); werr != nil {
					t.Fatal(werr)
				}
				if _, rerr := io.ReadFull(c, buf[:len(msg)]); rerr != nil {
					t.Fatal(rerr)
				}
				rtts = append(rtts, time.Since(start))
				if !bytes.Equal(buf[:len(msg)], msg) {
					t.Fatalf("echo: %q, want %q", buf[:len(msg)], msg)
				}
			}
			slices.Sort(rtts)
			t.Logf("host %d -> host 0: round trip min %v median %v max %v", from, rtts[0], rtts[5], rtts[9])
			if rtts[0] < 25*time.Millisecond || rtts[5] > 100*time.Millisecond {
				t.Fatalf("round trip min %v median %v: want about 30 ms", rtts[0], rtts[5])
			}
			c.Close()
		}
		time.Sleep(200 * time.Millisecond) // let the closes finish before counting

		// 200 KB from host 1 to host 0 at 1.5 Mbit/s: at least ~1.07 s.
		tx1, rx0, tx2, rx2 := n.TxBytes(1), n.RxBytes(0), n.TxBytes(2), n.RxBytes(2)
		const size = 200_000
		c, err := n.Dial(1, "tcp", n.HostPort(0, 7001), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite()
		var got int64
		if err := binary.Read(c, binary.BigEndian, &got); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		dtx1, drx0 := n.TxBytes(1)-tx1, n.RxBytes(0)-rx0
		dtx2, drx2 := n.TxBytes(2)-tx2, n.RxBytes(2)-rx2
		t.Logf("200 KB host 1 -> host 0 in %v (%.2f Mbit/s of payload); host 1 sent %d bytes, host 0 received %d; host 2 sent %d, received %d",
			took, float64(size)*8/took.Seconds()/1e6, dtx1, drx0, dtx2, drx2)
		if got != size {
			t.Fatalf("sink got %d bytes, want %d", got, size)
		}
		if took < 1000*time.Millisecond || took > 10*time.Second {
			t.Fatalf("200 KB took %v at 1.5 Mbit/s: want about 1.1 s", took)
		}
		if dtx1 < size || drx0 < size || dtx1 > size*12/10 {
			t.Fatalf("counters: host 1 sent %d, host 0 received %d: want ≥ %d (and headers only above)", dtx1, drx0, size)
		}
		if dtx2 != 0 || drx2 != 0 {
			t.Fatalf("host 2 sent %d and received %d bytes of traffic between hosts 0 and 1", dtx2, drx2)
		}
	})
	if !ok {
		return
	}
	if len(made) == 0 {
		t.Skip("no hosts were made (skipped)")
	}
	left := namespaces(t)
	for _, ns := range made {
		if slices.Contains(left, ns) {
			t.Errorf("namespace %s left after cleanup", ns)
		}
	}
}

// With 100% loss nothing arrives; without a rate or delay, hosts talk fast.
func TestLossAndUnlimited(t *testing.T) {
	lossy := New(t, Options{Hosts: 2, Loss: 100})
	l, err := lossy.Listen(0, "tcp", lossy.HostPort(0, 7000))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if c, derr := lossy.Dial(1, "tcp", lossy.HostPort(0, 7000), 300*time.Millisecond); derr == nil {
		c.Close()
		t.Fatal("dial over a link that loses everything succeeded")
	}
	if tx := lossy.TxBytes(1); tx == 0 {
		t.Fatal("host 1 sent nothing: the SYNs should count")
	}
	if rx := lossy.RxBytes(0); rx != 0 {
		t.Fatalf("host 0 received %d bytes over a link that loses everything", rx)
	}

	fast := New(t, Options{Hosts: 2})
	l2, err := fast.Listen(0, "tcp", ":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	go func() {
		c, aerr := l2.Accept()
		if aerr == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c, err := fast.Dial(1, "tcp", fast.HostPort(0, 7000), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("1 MiB over an unlimited link took %v", took)
	}
}

// CleanupStale removes namespaces of dead processes and keeps those of live
// ones.
func TestCleanupStale(t *testing.T) {
	n := New(t, Options{Hosts: 1}) // skips when namespaces cannot be made
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	stale := fmt.Sprintf("%s%d-stale-0", Prefix, dead.Process.Pid)
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", stale).Run() })
	if err := CleanupStale(); err != nil {
		t.Fatal(err)
	}
	left := namespaces(t)
	if slices.Contains(left, stale) {
		t.Fatalf("%s (pid %d is dead) was not removed", stale, dead.Process.Pid)
	}
	if !slices.Contains(left, n.NS(0)) {
		t.Fatalf("%s of this live process was removed", n.NS(0))
	}
}

// A datagram to Broadcast reaches every other host, and only a datagram to
// a host's address reaches that host; hosts have stable MACs.
func TestBroadcast(t *testing.T) {
	n := New(t, Options{Hosts: 3, Delay: time.Millisecond})
	for i, h := range n.Hosts {
		if want := fmt.Sprintf("02:ca:13:00:00:%02x", i+1); h.MAC.String() != want {
			t.Errorf("host %d: MAC %v, want %s", i, h.MAC, want)
		}
	}
	var conns []net.PacketConn
	for i := range n.Hosts {
		var c net.PacketConn
		if err := n.Do(i, func() (err error) { c, err = net.ListenPacket("udp4", ":7009"); return err }); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	send := func(from int, to string, msg string) {
		t.Helper()
		err := n.Do(from, func() error {
			c, err := net.Dial("udp4", to)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(msg))
			return err
		})
		if err != nil {
			t.Fatalf("send from host %d to %s: %v", from, to, err)
		}
	}
	recv := func(host int, wait time.Duration) string {
		t.Helper()
		conns[host].SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 100)
		k, _, err := conns[host].ReadFrom(buf)
		if err != nil {
			return ""
		}
		return string(buf[:k])
	}
	send(0, netip.AddrPortFrom(Broadcast, 7009).String(), "to all")
	for _, h := range []int{1, 2} {
		if got := recv(h, 10*time.Second); got != "to all" {
			t.Fatalf("host %d received %q from the broadcast", h, got)
		}
	}
	send(0, n.HostPort(2, 7009), "to 2")
	if got := recv(2, 10*time.Second); got != "to 2" {
		t.Fatalf("host 2 received %q", got)
	}
	if got := recv(1, 300*time.Millisecond); got != "" {
		t.Fatalf("host 1 received %q, sent to host 2", got)
	}
}

func TestParseRate(t *testing.T) {
	for s, want := range map[string]float64{
		"": 0, "1.5mbit": 1.5e6, "512kbit": 512e3, "100kbps": 800e3, "1mibit": 1 << 20, "9600": 9600, "2Mbit": 2e6,
	} {
		if got, err := ParseRate(s); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"fast", "1.5parsec", "-1mbit", "0mbit"} {
		if _, err := ParseRate(s); err == nil {
			t.Errorf("ParseRate(%q) succeeded", s)
		}
	}
}
