package mount

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
)

// StatusVersion is the version of the status socket's requests and
// replies (doc/format.md, "Mount status socket").
const StatusVersion = 1

// Status is what a running mount reports about itself: where it is, and
// the work it has accepted and not finished. Pending is 0 once every
// file closed on it is committed (its version visible in the metadata)
// and every namespace change is written.
type Status = apitypes.MountStatus

// statusRequest is what a client sends: one JSON line.
type statusRequest struct {
	V  int    `json:"v"`
	Op string `json:"op"`
}

// Status returns the mount's status now.
func (m *Mount) Status() Status {
	s := Status{V: StatusVersion, PID: os.Getpid(), Mountpoint: m.dir, Volume: m.vol.Name(), Mode: m.mode.String()}
	// In the order work moves through them, so that a file moving on
	// while they are read is counted at least once: the close's mark goes
	// only after its commit is queued (Release), a queued commit only
	// once its version is in the metadata (queue.finish).
	s.Closed = int(m.closed.Load())
	if m.mode == WriteBack {
		s.Closed += int(m.releasing.Load())
	}
	s.Queued = m.queue.len() + int(m.saving.Load())
	if m.wb != nil {
		m.wb.mu.Lock()
		s.Namespace = len(m.wb.items)
		m.wb.mu.Unlock()
	}
	s.Pending = s.Closed + s.Queued + s.Namespace
	s.CommitsDone, s.CommitsFailed = m.commitsDone.Load(), m.commitsFailed.Load()
	s.Offline = m.offlineStatus()
	return s
}

// markClosed counts c as closed with writes not yet queued (write-back
// mode, at a writer's FLUSH), once.
func (m *Mount) markClosed(c *content) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed && (c.dirty || c.ptw || c.attrs.any()) {
		c.closed = true
		m.closed.Add(1)
	}
}

// unmarkClosed undoes markClosed once the last writer's release has
// queued c's commit (or found nothing to save).
func (m *Mount) unmarkClosed(c *content) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.closed = false
		m.closed.Add(-1)
	}
}

// countCommit counts a finished commit (Status).
func (m *Mount) countCommit(err error) {
	if err == nil {
		m.commitsDone.Add(1)
	} else {
		m.commitsFailed.Add(1)
	}
}

// StatusSocket is the name of the status socket of a mount of volume by
// process pid, in runDir ($CAIRN_HOME/run).
func StatusSocket(runDir, volume string, pid int) string {
	return filepath.Join(runDir, fmt.Sprintf("mount-%s-%d.sock", volume, pid))
}

// ServeStatus answers status requests on a unix socket at path (mode
// 0600, its directory made 0700) until the mount has finished (Wait),
// when it removes it. A socket left at path by a process that is gone is
// replaced.
func (m *Mount) ServeStatus(path string) error {
	const op = "mount status"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return cairn.E(op, cairn.IO, filepath.Dir(path), err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return cairn.E(op, cairn.IO, path, err)
	}
	// Made 0600 from the start: no moment where another user may connect.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return cairn.E(op, cairn.IO, path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	m.statusMu.Lock()
	m.statusLn = append(m.statusLn, ln)
	m.statusMu.Unlock()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed at the end of Wait
			}
			go m.answerStatus(conn)
		}
	}()
	return nil
}

func (m *Mount) answerStatus(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io1k{conn}).ReadBytes('\n')
	if err != nil {
		return
	}
	var req statusRequest
	reply := Status{V: StatusVersion}
	switch err := json.Unmarshal(line, &req); {
	case err != nil:
		reply.Error = "malformed request: " + err.Error()
	case req.V != StatusVersion:
		reply.Error = fmt.Sprintf("request version %d; this mount answers version %d", req.V, StatusVersion)
	case req.Op != "status":
		reply.Error = fmt.Sprintf("unknown op %q", req.Op)
	default:
		reply = m.Status()
	}
	b, _ := json.Marshal(reply)
	conn.Write(append(b, '\n'))
}

// io1k caps what a request may send at 1 KiB.
type io1k struct{ c net.Conn }

func (r io1k) Read(p []byte) (int, error) {
	if len(p) > 1024 {
		p = p[:1024]
	}
	return r.c.Read(p)
}

// stopStatus closes the status sockets (removing their files).
func (m *Mount) stopStatus() {
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	for _, ln := range m.statusLn {
		ln.Close()
	}
	m.statusLn = nil
}

// QueryStatus asks the mount serving the status socket at path for its
// status. A socket nobody listens on gives Kind NotFound.
func QueryStatus(ctx context.Context, path string) (*Status, error) {
	const op = "mount status"
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, cairn.E(op, cairn.NotFound, path, errors.New("no mount answers on this socket"))
		}
		return nil, cairn.E(op, cairn.IO, path, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	b, _ := json.Marshal(statusRequest{V: StatusVersion, Op: "status"})
	if _, err = conn.Write(append(b, '\n')); err != nil {
		return nil, cairn.E(op, cairn.IO, path, err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return nil, cairn.E(op, cairn.IO, path, fmt.Errorf("reading the reply: %w", err))
	}
	var s Status
	if err = json.Unmarshal(line, &s); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, path, fmt.Errorf("malformed reply: %w", err))
	}
	if s.Error != "" {
		return nil, cairn.E(op, cairn.Invalid, path, errors.New(s.Error))
	}
	if s.V != StatusVersion {
		return nil, cairn.E(op, cairn.Invalid, path, fmt.Errorf("reply version %d; this program reads version %d", s.V, StatusVersion))
	}
	return &s, nil
}

// Running returns the status of every mount with a status socket in
// runDir, by mount point. A socket nobody listens on (its mount was
// killed) is removed.
func Running(ctx context.Context, runDir string) ([]Status, error) {
	socks, err := filepath.Glob(filepath.Join(runDir, "mount-*.sock"))
	if err != nil {
		return nil, cairn.E("mount status", cairn.Invalid, runDir, err)
	}
	var out []Status
	for _, p := range socks {
		s, err := QueryStatus(ctx, p)
		if errors.Is(err, cairn.ErrNotFound) {
			if !pidAlive(p) {
				os.Remove(p) // stale: its process is gone
			}
			continue
		}
		if err != nil {
			return out, err
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Mountpoint < out[j].Mountpoint })
	return out, nil
}

// pidAlive reports whether the process named by a status socket's file
// name (mount-<volume>-<pid>.sock) may still run: a socket is removed
// only when it does not.
func pidAlive(sock string) bool {
	base := strings.TrimSuffix(filepath.Base(sock), ".sock")
	i := strings.LastIndexByte(base, '-')
	pid, err := strconv.Atoi(base[i+1:])
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
