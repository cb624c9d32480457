package sleeprig

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/netnstest"
	"cairn.dev/cairn/internal/wol"
)

// helperEnv makes the test binary (re-executed inside a host's namespace,
// as netnstest's tests do) a device instead of running the tests: it listens
// on TCP at the address the variable holds, prints "listening", and greets
// every connection with "hello from PID\n". The greeting needs the process
// to run: a stopped process's kernel still completes a TCP handshake on its
// listening socket, but writes nothing.
const helperEnv = "CAIRN_SLEEPRIG_HELPER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		helper(addr)
		return
	}
	os.Exit(m.Run())
}

func helper(addr string) {
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
		fmt.Fprintf(c, "hello from %d\n", os.Getpid())
		c.Close()
	}
}

// startDevice runs the helper in host, serving on port; it is killed and
// reaped at cleanup (registered before any later cleanup, so after them).
func startDevice(t *testing.T, r *Rig, cleanup func(func()), host, port int) *exec.Cmd {
	t.Helper()
	cmd := r.Command(host, os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+r.HostPort(host, port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ready <- sc.Scan() && sc.Text() == "listening"
		io.Copy(io.Discard, out)
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("device in host %d did not start: %s", host, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("device in host %d did not start: %s", host, stderr.String())
	}
	return cmd
}

// greet dials host's device from host from and reads its greeting.
func greet(r *Rig, from, host, port int, timeout time.Duration) (string, error) {
	c, err := r.Dial(from, "tcp", r.HostPort(host, port), timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func state(t *testing.T, pid int) byte {
	t.Helper()
	s, err := ProcState(pid)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sendFrom sends payload in one UDP datagram from host to addr.
func sendFrom(t *testing.T, r *Rig, host int, addr string, payload []byte) {
	t.Helper()
	err := r.Do(host, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
	if err != nil {
		t.Fatalf("send from host %d to %s: %v", host, addr, err)
	}
}

// waitEvents waits until the agent has received n datagrams in all.
func waitEvents(t *testing.T, r *Rig, n int) []Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ev := r.Events()
		if len(ev) >= n {
			return ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent received %d datagrams, want %d: %+v", len(ev), n, ev)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Host 0 (a laptop) talks to host 1 (a desktop) through the LAN whose
// always-on host 2 runs the wake agent. The desktop sleeps: its process is
// stopped and a dial times out; magic packets that are malformed or name
// another MAC wake nothing; a real magic packet, to the broadcast address
// and then to the agent, wakes it after the resume time.
func TestSleepWake(t *testing.T) {
	const port, resume = 7000, 2 * time.Second
	r := New(t, Options{
		Net:        netnstest.Options{Hosts: 3, Delay: 2 * time.Millisecond, Rate: "56mbit"},
		Proxy:      2,
		ResumeTime: resume,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dev := startDevice(t, r, t.Cleanup, 1, port)
	pid := dev.Process.Pid
	r.Attach(1, dev.Process)
	want := fmt.Sprintf("hello from %d", pid)
	if got, err := greet(r, 0, 1, port, 10*time.Second); err != nil || got != want {
		t.Fatalf("awake device: %q, %v", got, err)
	}
	if err := r.Sleep(ctx, 2); err == nil {
		t.Fatal("the proxy was put to sleep")
	}

	for round, to := range []string{r.BroadcastAddr().String(), r.AgentAddr().String()} {
		if err := r.Sleep(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if s := state(t, pid); s != 'T' {
			t.Fatalf("round %d: asleep device's process in state %c, want T (stopped)", round, s)
		}
		if !r.Asleep(1) || r.Asleep(0) {
			t.Fatalf("round %d: asleep: host 0 %v, host 1 %v", round, r.Asleep(0), r.Asleep(1))
		}
		start := time.Now()
		_, err := r.Dial(0, "tcp", r.HostPort(1, port), time.Second)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("round %d: dial to the asleep device: %v; want a timeout (no answer at all)", round, err)
		}
		t.Logf("round %d: dial to the asleep device: %v after %v", round, err, time.Since(start).Round(time.Millisecond))

		// Nothing that is not a magic packet for host 1 wakes it.
		seen := len(r.Events())
		good, err := wol.Encode(r.MAC(1), nil)
		if err != nil {
			t.Fatal(err)
		}
		badRep := bytes.Clone(good)
		badRep[len(badRep)-1] ^= 1
		sendFrom(t, r, 0, to, good[:wol.Len-1])
		sendFrom(t, r, 0, to, badRep)
		sendFrom(t, r, 0, to, []byte("wake up"))
		if err := r.Do(0, func() error {
			return wol.Send(ctx, net.HardwareAddr{0x02, 0xca, 0x13, 0, 0, 0x77}, to)
		}); err != nil {
			t.Fatal(err)
		}
		if err := r.Do(0, func() error { return wol.Send(ctx, r.MAC(0), to) }); err != nil {
			t.Fatal(err)
		}
		ev := waitEvents(t, r, seen+5)[seen:]
		var outcomes []Outcome
		for _, e := range ev {
			outcomes = append(outcomes, e.Outcome)
			if e.From.Addr() != r.Addr(0) {
				t.Errorf("event from %v, want host 0 (%v)", e.From, r.Addr(0))
			}
		}
		if wantOut := []Outcome{Malformed, Malformed, Malformed, Unknown, Awake}; !slices.Equal(outcomes, wantOut) {
			t.Fatalf("round %d: outcomes %q, want %q (events %+v)", round, outcomes, wantOut, ev)
		}
		if !strings.Contains(ev[1].Err.Error(), "repetition 16 of the MAC") {
			t.Fatalf("round %d: malformed packet's error: %v", round, ev[1].Err)
		}
		if s := state(t, pid); s != 'T' || !r.Asleep(1) {
			t.Fatalf("round %d: after packets that wake nothing, the process is in state %c (asleep %v)", round, s, r.Asleep(1))
		}

		// The real thing.
		sent := time.Now()
		if err := r.Do(0, func() error { return wol.Send(ctx, r.MAC(1), to) }); err != nil {
			t.Fatal(err)
		}
		wakes, err := r.WaitAwake(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		woke := time.Since(sent)
		if wakes != round+1 {
			t.Fatalf("round %d: the agent has woken host 1 %d times", round, wakes)
		}
		ev = waitEvents(t, r, seen+6)[seen+5:]
		if ev[0].Outcome != Scheduled || ev[0].Host != 1 || ev[0].MAC.String() != r.MAC(1).String() {
			t.Fatalf("round %d: magic packet for host 1: %+v", round, ev[0])
		}
		if s := state(t, pid); s == 'T' {
			t.Fatalf("round %d: woken device's process still stopped", round)
		}
		var got string
		deadline := time.Now().Add(30 * time.Second)
		for {
			if got, err = greet(r, 0, 1, port, 5*time.Second); err == nil || time.Now().After(deadline) {
				break
			}
		}
		answered := time.Since(sent)
		if err != nil || got != want {
			t.Fatalf("round %d: woken device: %q, %v", round, got, err)
		}
		t.Logf("round %d (magic packet to %s): awake %v after the packet, answering %v after it (resume time %v)",
			round, to, woke.Round(time.Millisecond), answered.Round(time.Millisecond), resume)
		if woke < resume || answered > resume+30*time.Second {
			t.Fatalf("round %d: woke %v and answered %v after the magic packet: want at least the resume time %v, and not much more", round, woke, answered, resume)
		}
	}

	// A wake by hand, and a magic packet to a host that is awake.
	if err := r.Sleep(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Wake(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, err := greet(r, 0, 1, port, 10*time.Second); err != nil || got != want {
		t.Fatalf("device woken by hand: %q, %v", got, err)
	}
}

// A host left asleep, with a wake pending, when its test ends: cleanup
// resumes its process (never left stopped) and removes the namespaces.
func TestCleanupWakes(t *testing.T) {
	var (
		dev      *exec.Cmd
		made     []string
		pending  bool
		cleanups []func()
	)
	defer func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}()
	t.Run("rig", func(t *testing.T) {
		r := New(t, Options{Net: netnstest.Options{Hosts: 2}, ResumeTime: time.Hour})
		for _, h := range r.Hosts {
			made = append(made, h.NS)
		}
		// The device outlives the subtest, so that what the rig's
		// cleanup did to it can be seen.
		dev = startDevice(t, r, func(f func()) { cleanups = append(cleanups, f) }, 1, 7000)
		r.Attach(1, dev.Process)
		ctx := context.Background()
		if err := r.Sleep(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := r.Do(0, func() error { return wol.Send(ctx, r.MAC(1), r.BroadcastAddr().String()) }); err != nil {
			t.Fatal(err)
		}
		// A second packet while the wake is pending changes nothing.
		if err := r.Do(0, func() error { return wol.Send(ctx, r.MAC(1), r.AgentAddr().String()) }); err != nil {
			t.Fatal(err)
		}
		ev := waitEvents(t, r, 2)
		pending = ev[0].Outcome == Scheduled && ev[1].Outcome == Pending
		if !pending {
			t.Fatalf("events %+v: want a wake scheduled, then pending", ev)
		}
	})
	if dev == nil {
		t.Skip("no rig was made (skipped)")
	}
	if !pending {
		t.Fatal("the magic packets did not schedule a wake")
	}
	if s := state(t, dev.Process.Pid); s == 'T' {
		t.Fatal("the device's process is left stopped after the rig's cleanup")
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range made {
		if strings.Contains(string(out), ns) {
			t.Errorf("namespace %s left after cleanup", ns)
		}
	}
}

func TestProcState(t *testing.T) {
	if s, err := ProcState(os.Getpid()); err != nil || (s != 'R' && s != 'S') {
		t.Fatalf("this process: state %c, %v", s, err)
	}
	if _, err := ProcState(1 << 30); err == nil {
		t.Fatal("state of a process that does not exist")
	}
}
