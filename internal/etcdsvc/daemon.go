package etcdsvc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// RunDaemonIfRequested serves a realm's embedded etcd and exits the process
// if this process was started by Connect as a server (EnvDaemon is set);
// otherwise it returns at once and does nothing. Call it first thing in
// main, and in TestMain of test packages that use Connect, before flags are
// parsed or anything is printed.
//
// Exit status: 0 after an idle shutdown, a signal (SIGTERM, SIGINT), or when
// another server already holds the realm (a lost start race); 1 when etcd
// cannot start or fails while serving.
func RunDaemonIfRequested() {
	home := os.Getenv(EnvDaemon)
	if home == "" {
		return
	}
	os.Unsetenv(EnvDaemon) // not for anything this process might start
	linger := DefaultLinger
	if v := os.Getenv(EnvLinger); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			fmt.Fprintf(os.Stderr, "cairn etcd server: bad %s=%q, using %v\n", EnvLinger, v, linger)
		} else {
			linger = d
		}
	}
	os.Exit(runDaemon(home, linger, os.Stderr))
}

// runDaemon is the server's life: see Connect for the protocol.
func runDaemon(home string, linger time.Duration, log io.Writer) int {
	logf := func(format string, args ...any) {
		fmt.Fprintf(log, "%s cairn etcd server[%d]: %s\n",
			time.Now().Format(time.RFC3339Nano), os.Getpid(), fmt.Sprintf(format, args...))
	}
	dir := filepath.Join(home, "etcd")
	if err := makePrivateDir(dir); err != nil {
		logf("%v", err)
		return 1
	}
	slock, err := os.OpenFile(filepath.Join(dir, serverLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer slock.Close()
	if ok, terr := tryLock(slock, syscall.LOCK_EX); terr != nil {
		logf("lock %s: %v", slock.Name(), terr)
		return 1
	} else if !ok {
		return 0 // another server holds the realm: it will serve our client
	}
	// For StopDaemon, which must find a server that has not published its
	// endpoint yet.
	if terr := slock.Truncate(0); terr == nil {
		slock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	// Whatever endpoint file exists was left by a server that died.
	os.Remove(filepath.Join(dir, endpointName))

	clients, err := os.OpenFile(filepath.Join(dir, clientsLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		logf("%v", err)
		return 1
	}
	defer clients.Close()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	// The socket lives in $home/etcd (0700, above): only this user's
	// processes reach the server.
	peer, err := readPeerFile(dir)
	if err != nil {
		cancel()
		logf("%v", err)
		return 1
	}
	srv, err := StartEmbedded(ctx, filepath.Join(dir, dataName), Options{Log: log, Socket: filepath.Join(dir, socketName), Peer: peer})
	cancel()
	if err != nil {
		logf("%v", err)
		return 1
	}
	ep := endpoint{addr: srv.Endpoint(), member: srv.MemberID(), pid: os.Getpid()}
	if err := writeEndpoint(dir, ep); err != nil {
		logf("publish endpoint: %v", err)
		srv.Close()
		return 1
	}
	logf("serving %s on %s (etcd started in %v), linger %v", dir, ep.addr, srv.StartTime().Round(time.Millisecond), linger)

	// Shutdown order matters: unpublish, stop etcd, release server.lock, and
	// only then clients.lock (by the deferred Close), so a client that
	// arrives meanwhile waits for its shared lock and then starts a new
	// server that finds the data dir free.
	shutdown := func(why string) {
		os.Remove(filepath.Join(dir, endpointName))
		srv.Close()
		slock.Truncate(0) // our pid, for StopDaemon, goes with the lock
		slock.Close()
		logf("stopped: %s", why)
	}

	interval := min(500*time.Millisecond, max(linger/4, 20*time.Millisecond))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastActive := time.Now()
	for {
		select {
		case s := <-sigs:
			shutdown(s.String())
			return 0
		case <-srv.Done():
			shutdown("etcd stopped unexpectedly")
			return 1
		case <-tick.C:
			ok, err := tryLock(clients, syscall.LOCK_EX)
			if err != nil {
				logf("lock %s: %v", clients.Name(), err)
				continue
			}
			if !ok { // some client holds it shared
				lastActive = time.Now()
				continue
			}
			// Conn.Close touches clients.lock: a client that came and went
			// between two ticks still counts.
			if fi, err := clients.Stat(); err == nil && fi.ModTime().After(lastActive) {
				lastActive = fi.ModTime()
			}
			if time.Since(lastActive) >= linger {
				shutdown(fmt.Sprintf("idle for %v", linger))
				return 0 // clients.lock released by the deferred Close
			}
			if err := unlock(clients); err != nil {
				logf("unlock %s: %v", clients.Name(), err)
			}
		}
	}
}

// StopDaemon stops the server of the realm at home, if one runs, and waits
// until it is gone (its data dir free, its endpoint file removed, its
// process exited): SIGTERM,
// then SIGKILL after 10 s. Its clients' requests fail from then on; the next
// Connect starts a new server. For tests and tools that remove a realm or
// need a cold start.
func StopDaemon(home string) error {
	const op = "stop etcd server"
	dir := filepath.Join(home, "etcd")
	slock, err := os.OpenFile(filepath.Join(dir, serverLockName), os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil // never started
	}
	if err != nil {
		return cairn.E(op, cairn.IO, home, err)
	}
	defer slock.Close()
	const limit = 10 * time.Second
	t0 := time.Now()
	var signaled, killed, last int
	for {
		ok, err := tryLock(slock, syscall.LOCK_EX)
		if err != nil {
			return cairn.E(op, cairn.IO, home, err)
		}
		if ok { // no server (any more)
			// An endpoint file now is a killed server's: clear it while no
			// server can publish.
			os.Remove(filepath.Join(dir, endpointName))
			unlock(slock)
			// The process itself may take a moment more to exit.
			for last != 0 && pidAlive(last) && time.Since(t0) < limit {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}
		// The holder wrote its pid right after locking; a server that just
		// took the lock may not have yet: retry.
		b := make([]byte, 32)
		n, _ := slock.ReadAt(b, 0)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
		switch {
		case err != nil || pid <= 0 || !pidAlive(pid):
			pid = 0
		case time.Since(t0) > limit && killed != pid:
			syscall.Kill(pid, syscall.SIGKILL)
			killed = pid
		case signaled != pid:
			syscall.Kill(pid, syscall.SIGTERM)
			signaled = pid
		}
		if pid != 0 {
			last = pid
		}
		if time.Since(t0) > limit+5*time.Second {
			return cairn.E(op, cairn.Unavailable, home, fmt.Errorf("server pid %d does not stop", last))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
