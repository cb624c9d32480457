// Package cloudtest starts real cloud object-store servers for tests, each
// on a free port of 127.0.0.1 with its own temporary data, and stops them
// (by their own PID) when the test ends:
//
//   - StartMinIO: MinIO, for S3 (s3store)
//   - StartFakeGCS: fake-gcs-server, for Google Cloud Storage (gcsstore)
//   - StartAzurite: Azurite, for Azure Blob (azstore)
//
// The servers are test tools, never linked into cairn: scripts/test-deps.sh
// installs them under CacheDir, one directory per name and version. A test
// whose server is missing is skipped, saying so, unless
// CAIRN_REQUIRE_CLOUD_SERVERS=1 (scripts/test.sh sets it), when it fails:
// in CI nothing is skipped silently.
package cloudtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Versions of the servers; scripts/test-deps.sh installs the same ones.
const (
	MinIOVersion   = "v0.0.0-20260212201848-7aac2a2c5b7c"
	FakeGCSVersion = "v1.56.1"
	AzuriteVersion = "3.37.0"
)

// EnvRequire, when "1", makes a missing server fail the test instead of
// skipping it.
const EnvRequire = "CAIRN_REQUIRE_CLOUD_SERVERS"

const installHint = "run scripts/test-deps.sh to install it"

// CacheDir is where scripts/test-deps.sh installs the servers:
// ${XDG_CACHE_HOME:-$HOME/.cache}/cairn-test.
func CacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "cairn-test")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "cairn-test")
	}
	return filepath.Join(home, ".cache", "cairn-test")
}

// binary returns the path of an installed server, or skips (fails under
// EnvRequire) if it is not there. dir is relative to CacheDir; an install
// is complete when dir holds .installed, written last by test-deps.sh.
func binary(t testing.TB, what, dir, rel string) string {
	t.Helper()
	d := filepath.Join(CacheDir(), dir)
	p := filepath.Join(d, rel)
	_, err1 := os.Stat(filepath.Join(d, ".installed"))
	_, err2 := os.Stat(p)
	if err := errors.Join(err1, err2); err != nil {
		msg := fmt.Sprintf("%s is not installed in %s (%v): %s", what, d, err, installHint)
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%s; %s=1 requires it", msg, EnvRequire)
		}
		t.Skip(msg)
	}
	return p
}

// FreePort returns a port of 127.0.0.1 that nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// randHex returns n random bytes as hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Server is a running server process.
type Server struct {
	Name string // for messages: "MinIO", ...
	Addr string // 127.0.0.1:PORT

	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when the process has exited
	once sync.Once

	// What Restart runs again.
	bin   string
	env   []string
	args  []string
	ready func(ctx context.Context, addr string) error
}

// syncBuffer is the server's output, kept (up to a bound) for failures.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() < 1<<20 {
		s.b.Write(p)
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.b.String()
	if len(out) > 4000 {
		out = "..." + out[len(out)-4000:]
	}
	return out
}

// start runs argv with env and waits until ready(addr) succeeds, retrying
// on another port if the process dies early (the port was taken). args
// makes the arguments for a port.
func start(t testing.TB, name, bin string, env []string, args func(port int) []string, ready func(ctx context.Context, addr string) error) *Server {
	t.Helper()
	var lastErr error
	for range 3 {
		port := FreePort(t)
		s := &Server{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", port), log: &syncBuffer{},
			bin: bin, env: env, args: args(port), ready: ready}
		if err := s.run(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(s.Stop)
		t0 := time.Now()
		err := s.waitReady(ready, 60*time.Second)
		if err == nil {
			t.Logf("%s ready at %s in %v", name, s.Addr, time.Since(t0).Round(time.Millisecond))
			return s
		}
		lastErr = err
		s.Stop()
		if !s.exitedEarly(err) {
			break
		}
	}
	t.Fatalf("%v", lastErr)
	return nil
}

// run starts the process.
func (s *Server) run() error {
	s.done = make(chan struct{})
	s.once = sync.Once{}
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	// The server dies with the test binary, even if it is killed.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	cmd, done := s.cmd, s.done
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// Restart starts a server that Stop stopped again, on the same address
// and with the same data directory (MinIO, Azurite; fake-gcs-server only
// when started OnDisk, else it comes back empty), and waits until it is
// ready. Not to be called while the server runs, nor concurrently with
// Stop.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	select {
	case <-s.done:
	default:
		t.Fatalf("restart %s: it is running", s.Name)
	}
	if err := s.run(); err != nil {
		t.Fatalf("restart %s: %v", s.Name, err)
	}
	t0 := time.Now()
	if err := s.waitReady(s.ready, 60*time.Second); err != nil {
		t.Fatalf("restart %s: %v", s.Name, err)
	}
	t.Logf("%s ready again at %s in %v", s.Name, s.Addr, time.Since(t0).Round(time.Millisecond))
}

var errExited = errors.New("exited")

func (s *Server) exitedEarly(err error) bool { return errors.Is(err, errExited) }

func (s *Server) waitReady(ready func(ctx context.Context, addr string) error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("%s %w before it was ready (%v)\n%s", s.Name, errExited, s.cmd.ProcessState, s.log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = ready(ctx, s.Addr)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready at %s after %v: %v\n%s", s.Name, s.Addr, limit, err, s.log)
}

// Stop stops the server: SIGTERM, then SIGKILL after 5 s. It is called by
// the test's cleanup; a test calls it itself to see how a store behaves
// when its server is gone.
func (s *Server) Stop() {
	s.once.Do(func() {
		select {
		case <-s.done:
			return
		default:
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// Log returns the tail of the server's output.
func (s *Server) Log() string { return s.log.String() }

// httpReady is a ready check: a GET of path answers with one of codes.
func httpReady(path string, codes ...int) func(ctx context.Context, addr string) error {
	return func(ctx context.Context, addr string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		for _, c := range codes {
			if resp.StatusCode == c {
				return nil
			}
		}
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
}

// baseEnv is the environment of a server: PATH, and HOME set to a
// temporary directory so that nothing is written to the user's.
func baseEnv(t testing.TB) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "LANG=C"}
}

// bucketName returns a fresh bucket name with a recognizable prefix.
func bucketName() string { return "cairn-test-" + randHex(4) }
