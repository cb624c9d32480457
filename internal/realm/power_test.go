package realm

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/logind"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node/wire"
)

// A closed gate refuses new requests (Unavailable) and waits for those
// in flight, within its bound; opened again, it admits them.
func TestPowerGateDrains(t *testing.T) {
	entered, release := make(chan struct{}, 4), make(chan struct{})
	g := &gate{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})}
	srv := httptest.NewServer(g)
	defer srv.Close()
	get := func(path string) (int, error) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, wire.DecodeError(resp.StatusCode, resp.Header.Get("Content-Encoding"), b)
		}
		return resp.StatusCode, nil
	}
	inflight := make(chan error, 1)
	go func() { _, err := get("/block"); inflight <- err }()
	<-entered
	closed := make(chan int, 1)
	go func() { closed <- g.close(context.Background()) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, err := get("/")
		if code == http.StatusServiceUnavailable && errors.Is(err, cairn.ErrUnavailable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a new request to a closing gate: %d %v", code, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case n := <-closed:
		t.Fatalf("close returned (%d) while a request was in flight", n)
	default:
	}
	close(release)
	if n := <-closed; n != 0 {
		t.Fatalf("close after the drain: %d left", n)
	}
	if err := <-inflight; err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	// The bound: a request that does not finish is left behind.
	g.open()
	release = make(chan struct{})
	defer close(release)
	go func() { _, _ = get("/block") }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if n := g.close(ctx); n != 1 {
		t.Fatalf("close past its bound: %d left, want 1", n)
	}
	g.open()
	if _, err := get("/"); err != nil {
		t.Fatalf("an opened gate: %v", err)
	}
}

// The wake method's broadcast address, and no sleep read into a clock
// that did not stop (a real suspend cannot be made here).
func TestPowerWakeAndClock(t *testing.T) {
	prev := time.Now()
	if resumedFromSleep(prev, prev.Add(time.Hour), time.Second) {
		t.Fatal("no sleep read as one")
	}
	n := &net.IPNet{IP: net.IPv4(192, 0, 2, 7), Mask: net.CIDRMask(22, 32)}
	if b := broadcast(n); b.String() != "192.0.3.255" {
		t.Fatalf("broadcast of %v: %v", n, b)
	}
	if b := broadcast(&net.IPNet{IP: net.ParseIP("2001:db8::1"), Mask: net.CIDRMask(64, 128)}); b != nil {
		t.Fatalf("an IPv6 broadcast: %v", b)
	}
	if w := learnWake(context.Background(), "127.0.0.1:7461"); w != nil {
		t.Fatalf("loopback has a wake method: %+v", w)
	}
	// An address of an interface with a hardware address, if this
	// machine has one.
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		as, _ := ifc.Addrs()
		for _, a := range as {
			ipn, ok := a.(*net.IPNet)
			if !ok || len(ifc.HardwareAddr) == 0 || ifc.Flags&net.FlagLoopback != 0 || ipn.IP.To4() == nil {
				continue
			}
			w := learnWake(context.Background(), net.JoinHostPort(ipn.IP.String(), "7461"))
			if w == nil || w.MAC != ifc.HardwareAddr.String() || w.Broadcast != broadcast(ipn).String() {
				t.Fatalf("wake method of %v on %s (%v): %+v", ipn, ifc.Name, ifc.HardwareAddr, w)
			}
			return
		}
	}
	t.Log("no interface with a hardware address and an IPv4 address here")
}

// cairn node standby by hand (the control socket): the node refuses new
// chunk requests, records standby with since, not offline; resume makes it
// awake and serving again; a node stopped in standby stays standby.
func TestNodeStandbyByHand(t *testing.T) {
	ctx := context.Background()
	a, s := firstDevice(t)
	st := dialNode(t, a.Home, s.addr, "desk")
	if _, err := st.Has(ctx, []cairn.ID{{1}}); err != nil {
		t.Fatal(err)
	}
	rep, err := Control(ctx, a.Home, "standby")
	if err != nil || rep.State != meta.NodeStandby || rep.Node != "desk" {
		t.Fatalf("standby: %+v %v", rep, err)
	}
	rec := waitNode(t, a.Meta, "desk", meta.NodeStandby, time.Second)
	if rec.Standby != rep.Since {
		t.Fatalf("standby record %+v, reply %+v", rec, rep)
	}
	if _, err := st.Has(ctx, []cairn.ID{{1}}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("a chunk request to a node in standby: %v", err)
	}
	// Another standby changes nothing.
	if rep2, err := Control(ctx, a.Home, "standby"); err != nil || rep2.Since != rep.Since {
		t.Fatalf("standby again: %+v %v", rep2, err)
	}
	// Its ticks report nothing: it stays standby past two leases.
	time.Sleep(2 * regLease)
	if rec := waitNode(t, a.Meta, "desk", meta.NodeStandby, time.Second); rec.LastSeen != rep.Since {
		t.Fatalf("a node in standby reported: %+v", rec)
	}
	rep, err = Control(ctx, a.Home, "resume")
	if err != nil || rep.State != meta.NodeAwake {
		t.Fatalf("resume: %+v %v", rep, err)
	}
	if rec := waitNode(t, a.Meta, "desk", meta.NodeAwake, time.Second); rec.Standby != 0 {
		t.Fatalf("resumed record: %+v", rec)
	}
	if _, err := st.Has(ctx, []cairn.ID{{1}}); err != nil {
		t.Fatalf("a chunk request after resume: %v", err)
	}
	if _, err := Control(ctx, a.Home, "hibernate"); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Fatalf("unknown op: %v", err)
	}
	if _, err := Control(ctx, a.Home, "standby"); err != nil {
		t.Fatal(err)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	waitNode(t, a.Meta, "desk", meta.NodeStandby, time.Second)
	if _, err := Control(ctx, a.Home, "resume"); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("control with no node running: %v", err)
	}
}

// fakeLogind is an org.freedesktop.login1.Manager: Inhibit hands out the
// write end of a pipe and keeps the read end, to see when it is closed.
type fakeLogind struct {
	mu    sync.Mutex
	calls [][4]string
	reads []*os.File
	write []*os.File
}

func (f *fakeLogind) Inhibit(what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, dbus.MakeFailedError(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, [4]string{what, who, why, mode})
	f.reads, f.write = append(f.reads, r), append(f.write, w)
	return dbus.UnixFD(w.Fd()), nil
}

func (f *fakeLogind) state() (int, *os.File, *os.File) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.calls)
	if n == 0 {
		return 0, nil, nil
	}
	return n, f.reads[n-1], f.write[n-1]
}

// privateBus starts a dbus-daemon of its own and returns its address.
func privateBus(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("no dbus-daemon")
	}
	cmd := exec.Command(bin, "--session", "--nofork", "--nopidfile", "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon's address: %v", err)
	}
	return strings.TrimSpace(line)
}

// countingHandler counts the log records whose message contains sub.
type countingHandler struct {
	slog.Handler
	sub string
	mu  *sync.Mutex
	n   *int
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.mu.Lock()
		*h.n++
		h.mu.Unlock()
	}
	return nil
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }

// The node takes logind's delay inhibitor of sleep; PrepareForSleep(true)
// records standby and closes the inhibitor's fd; PrepareForSleep(false)
// takes it again and makes the node awake. A real dbus-daemon carries the
// calls, the fd and the signals; logind is the test's.
func TestPowerLogindSleep(t *testing.T) {
	addr := privateBus(t)
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fake := &fakeLogind{}
	if err := conn.Export(fake, logind.Path, logind.Manager); err != nil {
		t.Fatal(err)
	}
	if r, err := conn.RequestName(logind.Service, dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("RequestName: %v %v", r, err)
	}
	ctx := context.Background()
	var mu sync.Mutex
	var noBus int
	log := slog.New(countingHandler{Handler: slog.DiscardHandler, sub: "no systemd-logind", mu: &mu, n: &noBus})
	a, err := Init(ctx, t.TempDir(), Options{Etcd: etcdtest.New(t).Endpoints(), NoPassphrase: true, NodeName: "desk", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	s := run(t, func(ctx context.Context, ready func(string)) error {
		return a.Serve(ctx, ServeOptions{Listen: "127.0.0.1:0", Lease: regLease, SleepBus: addr, Ready: func(a string, _ bool) { ready(a) }})
	})
	n, rd, wr := fake.state()
	if n != 1 || fake.calls[0] != [4]string{"sleep", "cairn", "announce standby to the realm and finish its transfers", "delay"} {
		t.Fatalf("inhibitor not taken as it should be: %d %v", n, fake.calls)
	}
	wr.Close() // the node holds the only other copy now (Ready came after the reply)
	_ = rd.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := rd.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the inhibitor fd before a sleep: %v", err)
	}
	waitNode(t, a.Meta, "desk", meta.NodeAwake, 5*time.Second)

	if err := conn.Emit(logind.Path, logind.Manager+".PrepareForSleep", true); err != nil {
		t.Fatal(err)
	}
	rec := waitNode(t, a.Meta, "desk", meta.NodeStandby, 20*time.Second)
	if rec.Standby == 0 {
		t.Fatalf("standby record: %+v", rec)
	}
	_ = rd.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := rd.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the inhibitor fd after PrepareForSleep(true): %v (want EOF: closed)", err)
	}

	if err := conn.Emit(logind.Path, logind.Manager+".PrepareForSleep", false); err != nil {
		t.Fatal(err)
	}
	if rec := waitNode(t, a.Meta, "desk", meta.NodeAwake, 20*time.Second); rec.Standby != 0 {
		t.Fatalf("resumed record: %+v", rec)
	}
	if n, _, _ := fake.state(); n != 2 {
		t.Fatalf("inhibitor taken %d times after a resume, want 2", n)
	}
	mu.Lock()
	if noBus != 0 {
		t.Errorf("logged %d times that logind is absent", noBus)
	}
	mu.Unlock()
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}

	// Without a logind on the bus (or without a bus): logged once, served.
	conn.ReleaseName(logind.Service)
	for _, bus := range []string{addr, "unix:path=" + t.TempDir() + "/none"} {
		s := run(t, func(ctx context.Context, ready func(string)) error {
			return a.Serve(ctx, ServeOptions{Listen: "127.0.0.1:0", Lease: regLease, SleepBus: bus, Ready: func(a string, _ bool) { ready(a) }})
		})
		waitNode(t, a.Meta, "desk", meta.NodeAwake, 5*time.Second)
		if err := s.stop(); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if noBus != 2 {
		t.Errorf("two nodes without logind logged its absence %d times, want once each", noBus)
	}
}
