package cli_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/netnstest"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store/remotestore"
)

// nodePort is where every host's node listens; the first device's metadata
// gateway is on the next port.
const nodePort = 7461

// netHome is a cairn home whose commands run on host of n.
func netHome(t *testing.T, n *netnstest.Net, host int, name string) *realmT {
	r := &realmT{t: t, home: filepath.Join(t.TempDir(), name), net: n, host: host}
	r.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+r.home, "CAIRN_ETCD_LINGER=300ms", "CAIRN_PASSPHRASE=")
	t.Cleanup(func() { etcdsvc.StopDaemon(r.home) })
	return r
}

// netStore opens a remote store on the node at addr, dialing from inside
// host, with TLS configuration conf.
func netStore(t *testing.T, n *netnstest.Net, host int, addr string, conf *tls.Config) *remotestore.Store {
	t.Helper()
	st, err := remotestore.New(remotestore.Options{Addr: addr, TLS: conf,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(host, network, addr, 10*time.Second)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// clientTLS is the TLS configuration of a node of home dialing the node
// named peer.
func clientTLS(t *testing.T, home, peer string) *tls.Config {
	t.Helper()
	c, err := pki.LoadCredentials(realm.CredentialsDir(home))
	if err != nil {
		t.Fatal(err)
	}
	return credsTLS(t, c, pki.RequireNode(peer))
}

func credsTLS(t *testing.T, c *pki.Credentials, peer func(pki.NodeIdentity) error) *tls.Config {
	t.Helper()
	conf, err := pki.ClientTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: peer})
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

// h2Probe connects from host to addr as a gRPC client of the metadata
// gateway does (TLS 1.3, h2), sends the HTTP/2 connection preface and
// reads the server's first frame. It returns nil if the server answered
// with a SETTINGS frame (etcd's first), else the error. In TLS 1.3 the client's
// handshake completes before the server has checked the client's
// certificate, so a refusal arrives as an alert on that first read.
func h2Probe(n *netnstest.Net, host int, addr string, conf *tls.Config) error {
	c, err := n.Dial(host, "tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, conf)
	if err := tc.Handshake(); err != nil {
		return err
	}
	if _, err := tc.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		return err
	}
	var hdr [9]byte // a frame header
	if _, err := io.ReadFull(tc, hdr[:]); err != nil {
		return err
	}
	if hdr[3] != 0x4 {
		return fmt.Errorf("first frame of type %#x, want SETTINGS (0x4)", hdr[3])
	}
	return nil
}

// refusedTLS reports whether err is the server's TLS alert.
func refusedTLS(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// Three hosts in network namespaces over a 1.5 Mbit/s link with a 30 ms
// round trip (internal/netnstest), each running the real CLI with its own
// home: d1 (the realm's embedded etcd, its node and metadata gateway), d2
// and d3 joined through it, each serving its node. A file d2 writes stays
// on d2 and d3 reads it from d2's node over the link (the interfaces' byte
// counters show where it went); a killed node shows offline within its
// lease; no certificate, another CA's, a removed device's and a
// surrogate's are refused by d1's node and by its metadata gateway, where
// a device's certificate is admitted.
func TestAcrossHosts(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	n := netnstest.New(t, netnstest.Options{Hosts: 3, Delay: 15 * time.Millisecond, Rate: "1.5mbit"})
	step := func(what string) { t.Logf("%6.2fs %s", time.Since(start).Seconds(), what) }

	const lease = 3 * time.Second // of every node
	d1 := netHome(t, n, 0, "d1")
	d1.ok("init", "--no-passphrase", "--name", "d1")
	d1Addr, gwAddr := n.HostPort(0, nodePort), n.HostPort(0, nodePort+1)
	if s := d1.serveOn(d1Addr, lease.String()); s.addr != d1Addr || !strings.Contains(s.line, "metadata gateway on "+gwAddr) {
		t.Fatalf("d1 serves: %q, want its node on %s and its gateway on %s", s.line, d1Addr, gwAddr)
	}
	devs := []*realmT{d1}
	servers := map[string]*server{}
	for i, name := range []string{"d2", "d3"} {
		tok := strings.TrimSpace(d1.ok("invite", "--role", "device", "--name", name))
		d := netHome(t, n, i+1, name)
		if out := d.ok("join", tok, "--no-passphrase"); !strings.Contains(out, "as device "+name) {
			t.Fatalf("join %s: %s", name, out)
		}
		addr := n.HostPort(i+1, nodePort)
		if servers[name] = d.serveOn(addr, lease.String()); servers[name].addr != addr {
			t.Fatalf("%s serves on %s, want %s", name, servers[name].addr, addr)
		}
		devs = append(devs, d)
	}
	d2, d3 := devs[1], devs[2]
	for host, name := range []string{"d1", "d2", "d3"} {
		if d := d1.waitState(name, "awake", 10*time.Second); d["addr"] != n.HostPort(host, nodePort) {
			t.Fatalf("%s in devices: %v", name, d)
		}
	}
	step("three devices online")

	// 1. A file written on d2 stays in d2's store; d3 reads it from d2's
	// node over the link.
	const size = 200_000
	data := randBytes(size)
	src := filepath.Join(t.TempDir(), "f.bin")
	writeFile(t, src, data, 0o644)
	tx1, rx0 := n.TxBytes(1), n.RxBytes(0)
	t0 := time.Now()
	if s := putJSON(t, d2, src, "home:/"); s.Files != 1 || s.NewChunks == 0 {
		t.Fatalf("put on d2: %+v", s)
	}
	putTook, putTx, putRx0 := time.Since(t0), n.TxBytes(1)-tx1, n.RxBytes(0)-rx0
	if putTx > size/2 || putRx0 > size/2 {
		t.Fatalf("put on d2 sent %d bytes, d1 received %d: the data should stay on d2", putTx, putRx0)
	}
	tx1, rx2 := n.TxBytes(1), n.RxBytes(2)
	t0 = time.Now()
	got := d3.ok("cat", "home:/f.bin")
	catTook, catTx1, catRx2 := time.Since(t0), n.TxBytes(1)-tx1, n.RxBytes(2)-rx2
	if !bytes.Equal([]byte(got), data) {
		t.Fatalf("d3 read %d bytes, not the %d d2 wrote", len(got), size)
	}
	if catTx1 < size || catRx2 < size {
		t.Fatalf("cat on d3: d2 sent %d bytes, d3 received %d: want at least the file (%d)", catTx1, catRx2, size)
	}
	step("d2 wrote 200 KB, d3 read it from d2's node")
	t.Logf("put on d2 %v (d2 sent %d B, d1 received %d B); cat on d3 %v (d2 sent %d B, d3 received %d B)",
		putTook.Round(time.Millisecond), putTx, putRx0, catTook.Round(time.Millisecond), catTx1, catRx2)

	// 2. A killed node shows offline within its lease: every `devices`
	// that starts later than the lease (and a second's margin: etcd
	// expires leases on a 500 ms tick) after the kill shows it offline.
	killed := time.Now()
	if err := servers["d2"].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var lastOnline time.Duration
	for {
		asked := time.Since(killed)
		d := d1.devices()["d2"]
		if d["state"] == "offline" {
			t.Logf("killed node d2 offline after %v to %v (lease %v)", lastOnline.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), lease)
			break
		}
		if asked > lease+time.Second {
			t.Fatalf("d2 killed %v ago (lease %v): %v", asked.Round(time.Millisecond), lease, d)
		}
		lastOnline = asked
		time.Sleep(100 * time.Millisecond)
	}
	step("killed d2 offline")

	// A chunk that d1's node holds, for the refusals below; d1's own
	// certificate fetches it from host 2 (the positive control).
	small := filepath.Join(t.TempDir(), "d1.txt")
	writeFile(t, small, []byte("written on d1\n"), 0o644)
	putJSON(t, d1, small, "home:/")
	own := netStore(t, n, 2, d1Addr, clientTLS(t, d1.home, "d1"))
	var chunk cairn.ID
	if err := own.List(ctx, func(id cairn.ID, _ int64) error { chunk = id; return nil }); err != nil || chunk.IsZero() {
		t.Fatalf("d1 lists its node: %v (chunk %v)", err, chunk)
	}
	if _, err := own.Get(ctx, chunk); err != nil {
		t.Fatalf("d1 gets a chunk of its node from host 2: %v", err)
	}
	// A device's certificate passes the gateway probe: it is a gateway.
	if err := h2Probe(n, 1, gwAddr, clientTLS(t, d2.home, "d1")); err != nil {
		t.Fatalf("d2's certificate at d1's metadata gateway: %v", err)
	}

	// 3. A removed device: d1's node refuses d3's certificate, also on
	// its open connection, and d3 reads no metadata. (Its own node stops:
	// checked at the end, meanwhile the rest goes on.)
	d3st := netStore(t, n, 2, d1Addr, clientTLS(t, d3.home, "d1"))
	if _, err := d3st.Get(ctx, chunk); err != nil {
		t.Fatalf("d3 gets d1's chunk before its removal: %v", err)
	}
	d1.ok("node", "remove", "d3")
	removed := time.Now()
	for {
		_, err := d3st.Get(ctx, chunk)
		if errors.Is(err, cairn.ErrPermission) {
			break
		}
		if time.Since(removed) > 5*time.Second {
			t.Fatalf("removed d3 still gets d1's chunk: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := netStore(t, n, 2, d1Addr, clientTLS(t, d3.home, "d1")).Get(ctx, chunk); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("removed d3, new connection: %v", err)
	}
	if err := h2Probe(n, 2, gwAddr, clientTLS(t, d3.home, "d1")); !refusedTLS(err) {
		t.Fatalf("removed d3 at d1's metadata gateway: %v, want a TLS refusal", err)
	}
	if res := d3.fails(cli.ExitPermission, "ls", "home:/"); !strings.Contains(res.stderr, "refused") {
		t.Fatalf("ls on removed d3: %s", res.stderr)
	}
	step("removed d3 refused")

	// No certificate, or another CA's: refused by d1's node and by its
	// metadata gateway.
	anon := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{pki.ALPN}, InsecureSkipVerify: true}
	if _, err := netStore(t, n, 1, d1Addr, anon).Get(ctx, chunk); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("anonymous get from d1's node: %v", err)
	}
	if err := h2Probe(n, 1, gwAddr, anon); !refusedTLS(err) {
		t.Fatalf("anonymous client at d1's metadata gateway: %v, want a TLS refusal", err)
	}
	c2, err := pki.LoadCredentials(realm.CredentialsDir(d2.home))
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.CreateCA(t.TempDir(), c2.Identity.Realm)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := other.NewCredentials(c2.Identity, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forgedTLS := credsTLS(t, forged, nil)
	forgedTLS.VerifyConnection = nil // it cannot verify the realm's servers, and does not try
	// Refused at the handshake: a TLS alert, which a client cannot tell
	// from a stranger's, so it reads as "unavailable", never "removed".
	if _, err := netStore(t, n, 1, d1Addr, forgedTLS).Get(ctx, chunk); !errors.Is(err, cairn.ErrUnavailable) || !strings.Contains(err.Error(), "refused the TLS handshake") {
		t.Fatalf("another CA's certificate, get from d1's node: %v", err)
	}
	if err := h2Probe(n, 1, gwAddr, forgedTLS); !refusedTLS(err) {
		t.Fatalf("another CA's certificate at d1's metadata gateway: %v, want a TLS refusal", err)
	}
	step("anonymous and another CA refused")

	// 4. A surrogate on host 2: its certificate opens neither the metadata
	// nor another node's chunks.
	tok := strings.TrimSpace(d1.ok("invite", "--role", "surrogate", "--name", "s1"))
	s1 := netHome(t, n, 2, "s1")
	if out := s1.ok("join", tok); !strings.Contains(out, "as surrogate s1") {
		t.Fatalf("surrogate join: %s", out)
	}
	if err := h2Probe(n, 2, gwAddr, clientTLS(t, s1.home, "d1")); !refusedTLS(err) {
		t.Fatalf("surrogate at d1's metadata gateway: %v, want a TLS refusal", err)
	}
	if _, err := netStore(t, n, 2, d1Addr, clientTLS(t, s1.home, "d1")).Get(ctx, chunk); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("surrogate gets d1's chunk: %v", err)
	}
	step("surrogate refused")

	// The removed d3's node has stopped by now, or stops soon.
	s3 := servers["d3"]
	select {
	case err := <-s3.done:
		s3.done <- err
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != cli.ExitPermission {
			t.Fatalf("removed d3's node serve ended with %v\n%s%s", err, s3.out, s3.errb)
		}
	case <-time.After(15*time.Second - time.Since(removed)):
		s3.cmd.Process.Kill()
		s3.done <- <-s3.done
		t.Fatalf("removed d3's node still serves 15 s after its removal:\n%s%s", s3.out, s3.errb)
	}
	step("removed d3's node stopped")
	t.Logf("removed d3's node stopped %v after its removal (lease %v): %s", time.Since(removed).Round(time.Millisecond), lease, strings.TrimSpace(s3.errb.String()))
}
