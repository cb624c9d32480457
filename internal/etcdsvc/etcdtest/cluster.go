package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/version"
)

// etcdbinPkg is the tiny main that runs etcdmain.Main from the etcd module
// version in go.mod (Debian's etcd is 3.4, too old).
const etcdbinPkg = "cairn.dev/cairn/internal/etcdsvc/etcdtest/etcdbin"

// Raft timing of test clusters: short, so a lost leader is replaced in well
// under a second, but loose enough for -race on two busy cores.
const (
	heartbeatMs = 50
	electionMs  = 500
)

// RealCluster is a running multi-member etcd cluster, one process per member,
// started by Cluster.
type RealCluster struct {
	t       testing.TB
	bin     string
	dir     string
	members []*member
}

type member struct {
	name      string
	clientURL string
	args      []string
	logPath   string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been reaped
}

// Cluster starts an n-member etcd cluster of separate processes listening on
// 127.0.0.1 (free ports), and stops it at t.Cleanup. The etcd binary is built
// once per etcd version into the user's cache (see Binary). Members log
// errors to member-<i>.log in a test temporary directory.
func Cluster(t testing.TB, n int) *RealCluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: cluster of %d members", n)
	}
	bin := Binary(t)
	var lastErr error
	// A free port picked here may be taken by a parallel test before the
	// member binds it; such a start fails and is retried with new ports.
	for range 3 {
		c := &RealCluster{t: t, bin: bin, dir: t.TempDir()}
		if lastErr = c.start(n); lastErr == nil {
			t.Cleanup(c.stopAll)
			return c
		}
		c.stopAll()
	}
	t.Fatalf("etcdtest: start %d-member cluster: %v", n, lastErr)
	return nil
}

func (c *RealCluster) start(n int) error {
	ports, err := freePorts(2 * n)
	if err != nil {
		return err
	}
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	token := fmt.Sprintf("cairn-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	for i := range n {
		curl := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		purl := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			clientURL: curl,
			logPath:   filepath.Join(c.dir, fmt.Sprintf("member-%d.log", i)),
			args: []string{
				"--name", fmt.Sprintf("m%d", i),
				"--data-dir", filepath.Join(c.dir, fmt.Sprintf("m%d.etcd", i)),
				"--listen-client-urls", curl,
				"--advertise-client-urls", curl,
				"--listen-peer-urls", purl,
				"--initial-advertise-peer-urls", purl,
				"--initial-cluster", strings.Join(initial, ","),
				"--initial-cluster-state", "new",
				"--initial-cluster-token", token,
				"--heartbeat-interval", fmt.Sprint(heartbeatMs),
				"--election-timeout", fmt.Sprint(electionMs),
				"--log-level", "error",
				"--unsafe-no-fsync", // a kill -9 keeps the page cache; tests need no power-loss safety
			},
		}
		c.members = append(c.members, m)
		if err := c.spawn(m); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range c.members {
		if err := c.waitReady(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

func (c *RealCluster) spawn(m *member) error {
	logf, err := os.OpenFile(m.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies, so do its members.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	return nil
}

// waitReady waits until member i answers and knows a leader.
func (c *RealCluster) waitReady(ctx context.Context, i int) error {
	m := c.members[i]
	m.mu.Lock()
	exited := m.exited
	m.mu.Unlock()
	cli, err := NewClient(m.clientURL)
	if err != nil {
		return err
	}
	defer cli.Close()
	var lastErr error
	for {
		select {
		case <-exited:
			return fmt.Errorf("member %s exited during start; log %s: %s", m.name, m.logPath, readTail(m.logPath))
		default:
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, m.clientURL)
		cancel()
		if err == nil && st.Leader != 0 {
			return nil
		}
		if err == nil {
			err = errors.New("no leader yet")
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("member %s not ready: %v; log %s", m.name, lastErr, m.logPath)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Endpoints returns the members' client URLs, in member order.
func (c *RealCluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL)
	}
	return eps
}

// PID returns the process ID of member i, or 0 if it is not running.
func (c *RealCluster) PID(i int) int {
	m := c.members[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	select {
	case <-m.exited:
		return 0
	default:
		return m.cmd.Process.Pid
	}
}

// KillMember kills member i with SIGKILL and waits until it is gone. Its data
// dir stays, for RestartMember.
func (c *RealCluster) KillMember(i int) {
	c.t.Helper()
	m := c.members[i]
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		c.t.Fatalf("etcdtest: member %d is not running", i)
	}
	cmd.Process.Kill() // by PID, our own child
	<-exited
}

// RestartMember starts member i again on its old ports and data dir and
// waits until it has rejoined (answers and knows a leader).
func (c *RealCluster) RestartMember(i int) {
	c.t.Helper()
	m := c.members[i]
	if c.PID(i) != 0 {
		c.t.Fatalf("etcdtest: member %d is running", i)
	}
	if err := c.spawn(m); err != nil {
		c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.waitReady(ctx, i); err != nil {
		c.t.Fatalf("etcdtest: restart member %d: %v", i, err)
	}
}

func (c *RealCluster) stopAll() {
	for _, m := range c.members {
		m.mu.Lock()
		cmd, exited := m.cmd, m.exited
		m.cmd = nil
		m.mu.Unlock()
		if cmd != nil {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// Binary returns the path of an etcd server binary of the etcd version this
// module links (version.Version), building it on first use into
// $XDG_CACHE_HOME/cairn-test/etcd-v<version>/etcd (or ~/.cache/...). Test
// processes that race to build it serialize on a flock in that directory,
// so it is built once. A first build takes about a minute.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := binary()
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return bin
}

var binOnce struct {
	sync.Mutex
	path string
}

func binary() (string, error) {
	binOnce.Lock()
	defer binOnce.Unlock()
	if binOnce.path != "" {
		return binOnce.path, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "cairn-test", "etcd-v"+version.Version)
	bin := filepath.Join(dir, "etcd")
	if err = os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return "", err
	}
	defer lock.Close() // releases the flock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err != nil {
		goTool, err := exec.LookPath("go")
		if err != nil {
			return "", fmt.Errorf("building etcd needs the go command: %w", err)
		}
		tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
		cmd := exec.Command(goTool, "build", "-trimpath", "-o", tmp, etcdbinPkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("go build %s: %v\n%s", etcdbinPkg, err, out)
		}
		if err := os.Rename(tmp, bin); err != nil {
			return "", err
		}
	}
	binOnce.path = bin
	return bin, nil
}
