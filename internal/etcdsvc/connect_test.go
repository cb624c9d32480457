package etcdsvc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// envTestClient, set to a realm home, makes the test binary act as a cairn
// command instead of running tests: see clientMain.
const envTestClient = "ETCDSVC_TEST_CLIENT"

func TestMain(m *testing.M) {
	RunDaemonIfRequested()
	if home := os.Getenv(envTestClient); home != "" {
		os.Exit(clientMain(home))
	}
	os.Exit(m.Run())
}

// clientMain is a short-lived cairn command: Connect, write keys under its
// own prefix, read them back, print "ok <server addr> <server pid>", Close.
func clientMain(home string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := Connect(ctx, home, testOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	prefix := fmt.Sprintf("/child/%d/", os.Getpid())
	for i := range 20 {
		if _, perr := conn.Client().Put(ctx, fmt.Sprintf("%s%02d", prefix, i), "x"); perr != nil {
			fmt.Fprintln(os.Stderr, perr)
			return 1
		}
	}
	r, err := conn.Client().Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 20 {
		fmt.Fprintln(os.Stderr, "read back:", err, r)
		return 1
	}
	fmt.Printf("ok %s %d\n", conn.Endpoints()[0], daemonPID(home))
	return 0
}

// testOpts leave a server start time for a -race test binary on two busy
// cores; a cairn binary starts one in well under a second.
var testOpts = ConnectOptions{StartTimeout: 30 * time.Second}

// setLinger makes daemons started by this test (in this process or its
// children) exit soon after their last client.
func setLinger(t *testing.T, d time.Duration) {
	t.Setenv(EnvLinger, d.String())
}

// daemonPID returns the PID in home's endpoint file, or 0.
func daemonPID(home string) int {
	ep, err := readEndpoint(filepath.Join(home, "etcd"))
	if err != nil {
		return 0
	}
	return ep.pid
}

// waitDaemonGone waits until the server of home has shut down: endpoint
// file gone, process gone, server.lock free. If it does not within limit
// the test fails and the daemon (pid, started by this test) is killed.
func waitDaemonGone(t *testing.T, home string, pid int, limit time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	dir := filepath.Join(home, "etcd")
	for {
		_, err := os.Stat(filepath.Join(dir, endpointName))
		gone := errors.Is(err, os.ErrNotExist) && !pidAlive(pid) && serverLockFree(t, dir)
		if gone {
			return time.Since(t0)
		}
		if time.Since(t0) > limit {
			if pidAlive(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("daemon %d still there after %v (endpoint file: %v)", pid, limit, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func serverLockFree(t *testing.T, dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, serverLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ok, err := tryLock(f, syscall.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// cleanupDaemon makes sure no daemon of home outlives the test, and fails
// the test if a daemon (this test binary, maybe built with -race) reported
// a data race in its log.
func cleanupDaemon(t *testing.T, home string) {
	t.Cleanup(func() {
		if pid := daemonPID(home); pid != 0 {
			waitDaemonGone(t, home, pid, 10*time.Second)
		}
		log, _ := os.ReadFile(filepath.Join(home, "etcd", logName))
		if bytes.Contains(log, []byte("DATA RACE")) || bytes.Contains(log, []byte("panic:")) {
			t.Errorf("server log:\n%s", log)
		}
	})
}

func connect(t *testing.T, home string) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := Connect(ctx, home, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// Three cairn commands start at the same instant on a realm with no server:
// all succeed, on one server, which exits after the linger once they are
// gone.
func TestConnectConcurrentProcesses(t *testing.T) {
	home := t.TempDir()
	setLinger(t, 300*time.Millisecond)
	cleanupDaemon(t, home)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	outs := make([]bytes.Buffer, n)
	errs := make([]bytes.Buffer, n)
	cmds := make([]*exec.Cmd, n)
	for i := range n {
		cmds[i] = exec.Command(exe)
		cmds[i].Env = append(os.Environ(), envTestClient+"="+home)
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], &errs[i]
	}
	t0 := time.Now()
	for _, c := range cmds {
		if serr := c.Start(); serr != nil {
			t.Fatal(serr)
		}
	}
	servers := map[string]bool{}
	var pid int
	for i, c := range cmds {
		if werr := c.Wait(); werr != nil {
			t.Errorf("client %d: %v\nstderr: %s", i, werr, errs[i].String())
			continue
		}
		f := strings.Fields(outs[i].String())
		if len(f) != 3 || f[0] != "ok" {
			t.Errorf("client %d printed %q", i, outs[i].String())
			continue
		}
		servers[f[1]+" pid "+f[2]] = true
		fmt.Sscan(f[2], &pid)
		if errs[i].Len() > 0 {
			t.Errorf("client %d wrote to stderr: %q", i, errs[i].String())
		}
	}
	t.Logf("%d concurrent cold clients done in %v", n, time.Since(t0))
	if len(servers) != 1 || pid == 0 {
		t.Fatalf("clients used servers %v, want 1", servers)
	}

	// The data is all there, seen by a later client (which may or may not
	// find the daemon still lingering).
	conn := connect(t, home)
	if p := daemonPID(home); p != pid {
		// The first one lingered out already (slow clients, -race).
		for t0 := time.Now(); pidAlive(pid); time.Sleep(10 * time.Millisecond) {
			if time.Since(t0) > 10*time.Second {
				t.Errorf("replaced daemon %d still alive", pid)
				break
			}
		}
	}
	r, err := conn.Client().Get(context.Background(), "/child/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 20*n {
		t.Fatalf("count: %v %v, want %d", r, err, 20*n)
	}
	pid = daemonPID(home)
	conn.Close()
	d := waitDaemonGone(t, home, pid, 10*time.Second)
	t.Logf("daemon gone %v after the last client", d)
	if d < 200*time.Millisecond {
		t.Errorf("daemon exited %v after the last client, before the 300ms linger", d)
	}
	log, _ := os.ReadFile(filepath.Join(home, "etcd", logName))
	if !strings.Contains(string(log), "stopped: idle") {
		t.Errorf("server log lacks the idle stop:\n%s", log)
	}
}

// A client arriving while the daemon lingers reuses it; a client arriving
// after it left starts a new one; the data survives both.
func TestConnectLingerReuse(t *testing.T) {
	home := t.TempDir()
	setLinger(t, time.Second)
	cleanupDaemon(t, home)
	ctx := context.Background()

	t0 := time.Now()
	conn := connect(t, home)
	t.Logf("cold Connect (starts the daemon): %v", time.Since(t0))
	pid := daemonPID(home)
	if _, err := conn.Client().Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	time.Sleep(300 * time.Millisecond) // within the linger
	t0 = time.Now()
	conn = connect(t, home)
	t.Logf("warm Connect (lingering daemon): %v", time.Since(t0))
	if p := daemonPID(home); p != pid {
		t.Fatalf("warm Connect: daemon %d, want the lingering %d", p, pid)
	}
	r, err := conn.Client().Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatal(r, err)
	}
	// Holding the connection beyond the linger keeps the daemon.
	time.Sleep(1500 * time.Millisecond)
	if !pidAlive(pid) || daemonPID(home) != pid {
		t.Fatal("daemon left while a client was connected")
	}
	if _, perr := conn.Client().Put(ctx, "k", "v2"); perr != nil {
		t.Fatal(perr)
	}
	conn.Close()
	d := waitDaemonGone(t, home, pid, 10*time.Second)
	if d < 800*time.Millisecond {
		t.Errorf("daemon left %v after the last client, linger is 1s", d)
	}

	conn = connect(t, home)
	defer conn.Close()
	if p := daemonPID(home); p == pid || p == 0 {
		t.Fatalf("after the daemon left: pid %d (old %d)", p, pid)
	}
	r, err = conn.Client().Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
		t.Fatal(r, err)
	}
}

// kill -9 of the daemon leaves a stale endpoint file; the next Connect
// starts a new daemon, and no acknowledged write is lost.
func TestConnectAfterDaemonKilled(t *testing.T) {
	home := t.TempDir()
	setLinger(t, 200*time.Millisecond)
	cleanupDaemon(t, home)
	ctx := context.Background()

	conn := connect(t, home)
	for i := range 50 {
		if _, err := conn.Client().Put(ctx, fmt.Sprintf("k%02d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	pid := daemonPID(home)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for pidAlive(pid) { // our child: reaped by Connect's goroutine
		time.Sleep(5 * time.Millisecond)
	}
	if daemonPID(home) != pid {
		t.Fatal("expected the killed daemon's endpoint file to remain")
	}

	// conn still holds its shared lock: a new client must not wait for it.
	t0 := time.Now()
	conn2 := connect(t, home)
	t.Logf("Connect after kill -9: %v", time.Since(t0))
	p2 := daemonPID(home)
	if p2 == pid || p2 == 0 {
		t.Fatalf("new daemon pid %d, killed %d", p2, pid)
	}
	r, err := conn2.Client().Get(ctx, "k", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 50 {
		t.Fatalf("after restart: %v %v, want 50 keys", r, err)
	}
	conn.Close()
	conn2.Close()
	waitDaemonGone(t, home, p2, 10*time.Second)
}

// A client that arrives while the server is shutting down (it holds
// clients.lock exclusively) waits, then starts a new server.
func TestConnectWaitsForShutdown(t *testing.T) {
	home := t.TempDir()
	setLinger(t, 200*time.Millisecond)
	cleanupDaemon(t, home)
	dir := filepath.Join(home, "etcd")
	if err := makePrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	// Play a server in shutdown: clients.lock held exclusively.
	f, err := os.OpenFile(filepath.Join(dir, clientsLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if ok, terr := tryLock(f, syscall.LOCK_EX); !ok || terr != nil {
		t.Fatal(ok, terr)
	}
	done := make(chan error, 1)
	go func() {
		conn, cerr := Connect(context.Background(), home, testOpts)
		if cerr == nil {
			conn.Close()
		}
		done <- cerr
	}()
	select {
	case err2 := <-done:
		t.Fatalf("Connect returned while clients.lock was held exclusively: %v", err2)
	case <-time.After(300 * time.Millisecond):
	}
	if _, serr := os.Stat(filepath.Join(dir, endpointName)); serr == nil {
		t.Fatal("a server was started while the old one was shutting down")
	}
	f.Close()
	if err2 := <-done; err2 != nil {
		t.Fatal(err2)
	}

	// And a Connect whose limit ends first reports Unavailable.
	f, _ = os.OpenFile(filepath.Join(dir, clientsLockName), os.O_RDWR, 0o600)
	defer f.Close()
	for {
		if ok, _ := tryLock(f, syscall.LOCK_EX); ok {
			break
		}
		time.Sleep(10 * time.Millisecond) // the daemon may still hold it
	}
	_, err = Connect(context.Background(), home, ConnectOptions{StartTimeout: 200 * time.Millisecond})
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Connect blocked past StartTimeout: %v, want Unavailable", err)
	}
}

// Many clients come and go while daemons keep shutting down (a 1 ms
// linger): every Connect succeeds and no write is lost.
func TestConnectChurn(t *testing.T) {
	home := t.TempDir()
	setLinger(t, time.Millisecond)
	cleanupDaemon(t, home)
	const workers, rounds = 3, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	pids := sync.Map{}
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				conn, err := Connect(ctx, home, testOpts)
				if err != nil {
					cancel()
					errs <- fmt.Errorf("worker %d round %d: %w", w, i, err)
					return
				}
				pids.Store(daemonPID(home), true)
				_, err = conn.Client().Put(ctx, fmt.Sprintf("/w%d/%d", w, i), "x")
				conn.Close()
				cancel()
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d put: %w", w, i, err)
					return
				}
				time.Sleep(time.Duration(w*40) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n := 0
	pids.Range(func(_, _ any) bool { n++; return true })
	t.Logf("%d connects served by %d daemons", workers*rounds, n)
	conn := connect(t, home)
	defer conn.Close()
	r, err := conn.Client().Get(context.Background(), "/w", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != workers*rounds {
		t.Fatalf("count %v %v, want %d", r, err, workers*rounds)
	}
}

// A server that cannot start makes Connect fail at once (not after
// StartTimeout) with Unavailable, naming the log and quoting it.
func TestConnectServerFails(t *testing.T) {
	home := t.TempDir()
	setLinger(t, 200*time.Millisecond)
	dir := filepath.Join(home, "etcd")
	if err := makePrivateDir(dir); err != nil {
		t.Fatal(err)
	}
	// A file where the data dir belongs.
	if err := os.WriteFile(filepath.Join(dir, dataName), []byte("not a dir"), 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	_, err := Connect(context.Background(), home, ConnectOptions{StartTimeout: time.Minute})
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("got %v, want Unavailable", err)
	}
	t.Logf("failed after %v", time.Since(t0))
	msg := err.Error()
	// Reported from the server's exit, not by running out of time.
	if !strings.Contains(msg, "etcd server failed") {
		t.Errorf("not reported from the server's exit: %s", msg)
	}
	if !strings.Contains(msg, filepath.Join(dir, logName)) || !strings.Contains(msg, "not a directory") {
		t.Errorf("error does not name the log and the cause: %s", msg)
	}
	t.Logf("%v", err)
}

func TestConnectPrivateFiles(t *testing.T) {
	home := t.TempDir()
	setLinger(t, 200*time.Millisecond)
	cleanupDaemon(t, home)
	conn := connect(t, home)
	defer conn.Close()
	dir := filepath.Join(home, "etcd")
	for _, p := range []string{dir, filepath.Join(dir, dataName)} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want 0700", p, fi.Mode(), err)
		}
	}
	for _, name := range []string{endpointName, clientsLockName, serverLockName, logName} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want 0600", name, fi.Mode(), err)
		}
	}
	if want := "unix://" + filepath.Join(dir, socketName); conn.Endpoints()[0] != want {
		t.Errorf("endpoint %s, want the socket %s", conn.Endpoints()[0], want)
	}
}

// A realm home too deep for a unix socket path is refused at once, saying
// why, before anything is made there.
func TestConnectLongHome(t *testing.T) {
	home := filepath.Join(t.TempDir(), strings.Repeat("x", maxSocketPath))
	_, err := Connect(context.Background(), home, testOpts)
	if !errors.Is(err, cairn.ErrInvalid) || !strings.Contains(err.Error(), "shorter path") {
		t.Fatalf("long home: %v, want Invalid", err)
	}
	if _, err := os.Stat(home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("home made anyway: %v", err)
	}
}

func TestEndpointFile(t *testing.T) {
	dir := t.TempDir()
	// Format 2 (a socket) and format 1 (a loopback port, an older server's).
	for _, addr := range []string{"unix:///home/u/.cairn/etcd/sock", "127.0.0.1:2379"} {
		want := endpoint{addr: addr, member: 0x8e9e05c52164694d, pid: 1234}
		if err := writeEndpoint(dir, want); err != nil {
			t.Fatal(err)
		}
		got, err := readEndpoint(dir)
		if err != nil || got != want {
			t.Fatalf("got %+v %v, want %+v", got, err, want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:1 1", "127.0.0.1 1 1", "127.0.0.1:1 zz 1", "127.0.0.1:1 1 -3", "a b c d", "unix://sock 1 1"} {
		os.WriteFile(filepath.Join(dir, endpointName), []byte(bad), 0o600)
		if _, err := readEndpoint(dir); err == nil {
			t.Errorf("readEndpoint accepted %q", bad)
		}
	}
}

func TestStopDaemon(t *testing.T) {
	home := t.TempDir()
	if err := StopDaemon(home); err != nil {
		t.Fatalf("StopDaemon of a realm that never ran a server: %v", err)
	}
	setLinger(t, time.Minute) // only StopDaemon ends this one
	cleanupDaemon(t, home)
	ctx := context.Background()
	conn := connect(t, home)
	defer conn.Close()
	if _, err := conn.Client().Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	pid := daemonPID(home)
	t0 := time.Now()
	if err := StopDaemon(home); err != nil {
		t.Fatal(err)
	}
	t.Logf("StopDaemon with a client connected: %v", time.Since(t0))
	if pidAlive(pid) || daemonPID(home) != 0 || !serverLockFree(t, filepath.Join(home, "etcd")) {
		t.Fatal("server still there after StopDaemon")
	}
	// The next Connect starts a new server on the same data.
	conn2 := connect(t, home)
	defer conn2.Close()
	r, err := conn2.Client().Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatal(r, err)
	}
	// A killed server's endpoint file is cleared too.
	pid = daemonPID(home)
	syscall.Kill(pid, syscall.SIGKILL)
	for pidAlive(pid) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := StopDaemon(home); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(home, "etcd", endpointName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale endpoint file after StopDaemon: %v", err)
	}
}
