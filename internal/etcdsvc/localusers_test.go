package etcdsvc

// Another account of the same machine must not reach the realm's embedded
// etcd: the test runs a stock etcd client as nobody against every address
// the server process listens on.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// envTestProbe, set to addresses separated by spaces, makes the test binary
// try to list every key at each (see probeMain) instead of running tests.
const envTestProbe = "ETCDSVC_TEST_PROBE"

func init() {
	// Before TestMain: a probe needs nothing else of the test binary.
	if addrs := os.Getenv(envTestProbe); addrs != "" {
		os.Exit(probeMain(os.Stdout, strings.Fields(addrs)))
	}
}

// probeMain tries to list the keys at each address with a stock client and
// prints, per address, "LISTED addr n" or "REFUSED addr: error".
func probeMain(w io.Writer, addrs []string) int {
	fmt.Fprintf(w, "uid %d\n", os.Getuid())
	for _, a := range addrs {
		ep := a
		if strings.HasPrefix(a, "/") {
			ep = "unix://" + a
		}
		n, err := listAll(ep)
		if err != nil {
			fmt.Fprintf(w, "REFUSED %s: %v\n", a, err)
		} else {
			fmt.Fprintf(w, "LISTED %s %d\n", a, n)
		}
	}
	return 0
}

func listAll(ep string) (int, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(resp.Count), nil
}

// listeners returns every address process pid listens on: TCP as
// "ip:port", unix sockets by path.
func listeners(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var out []string
	for _, file := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fl := strings.Fields(sc.Text())
			if len(fl) < 10 || fl[3] != "0A" || !inodes[fl[9]] { // 0A: LISTEN
				continue
			}
			out = append(out, hexAddr(t, fl[1]))
		}
		f.Close()
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path; flag 0x10000 is
		// __SO_ACCEPTCON, a listening socket.
		fl := strings.Fields(sc.Text())
		if len(fl) < 8 || !inodes[fl[6]] {
			continue
		}
		if flags, err := strconv.ParseUint(fl[3], 16, 32); err == nil && flags&0x10000 != 0 && strings.HasPrefix(fl[7], "/") {
			out = append(out, fl[7])
		}
	}
	return out
}

// hexAddr turns /proc/net/tcp's "0100007F:0929" into "127.0.0.1:2345".
func hexAddr(t *testing.T, s string) string {
	h, p, _ := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	var ip net.IP
	for i := 0; i+8 <= len(h); i += 8 { // 32-bit words, little-endian
		w, err := strconv.ParseUint(h[i:i+8], 16, 32)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		ip = append(ip, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

// asNobody runs this test binary as nobody (uid and gid 65534) with the
// probe of addrs, and returns its output.
func asNobody(t *testing.T, addrs []string) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a probe as another user")
	}
	// The test binary lives in a private build directory: copy it where
	// nobody may run it.
	bin, err := os.MkdirTemp("", "etcdsvc-probe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(bin, "probe")
	if err := os.WriteFile(probe, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(probe)
	cmd.Dir = "/"
	cmd.Env = []string{envTestProbe + "=" + strings.Join(addrs, " "), "HOME=/nonexistent", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe as nobody: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "uid 65534\n") {
		t.Fatalf("probe did not run as nobody:\n%s", out)
	}
	return string(out)
}

// TestOtherUserCannotReachRealm: the daemon every cairn command of a realm
// talks to (Connect) is reached by its owner, and by nobody else: a stock
// etcd client run as another user lists no key at any address the server
// listens on, even with the realm's home directory open to all (0755).
func TestOtherUserCannotReachRealm(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a probe as another user")
	}
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	setLinger(t, 200*time.Millisecond)
	cleanupDaemon(t, home)
	conn := connect(t, home)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conn.Client().Put(ctx, "/cairn/v1/secret", "wrapped key"); err != nil {
		t.Fatal(err)
	}
	pid := daemonPID(home)
	if pid == 0 {
		t.Fatal("no daemon")
	}
	addrs := listeners(t, pid)
	if len(addrs) == 0 {
		t.Fatalf("daemon %d listens nowhere", pid)
	}
	t.Logf("daemon %d listens on %v", pid, addrs)

	// The owner, with the same stock client, lists the key through the
	// address Connect uses.
	var owner strings.Builder
	probeMain(&owner, []string{strings.TrimPrefix(conn.Endpoints()[0], "unix://")})
	if !strings.Contains(owner.String(), "LISTED ") {
		t.Fatalf("owner cannot list: %s", owner.String())
	}

	out := asNobody(t, addrs)
	t.Logf("as nobody:\n%s", out)
	if strings.Contains(out, "LISTED ") {
		t.Errorf("another user listed the realm's keys")
	}
	for _, a := range addrs {
		if !strings.Contains(out, "REFUSED "+a+":") {
			t.Errorf("%s: not tried", a)
		}
	}
}
