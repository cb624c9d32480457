package mount_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/mount"
)

// TestStatusPendingFromClose: in write-back mode a file counts as pending
// from the moment its close(2) returns, though its commit is queued only
// at the kernel's release, which comes later (here: held); it stays
// pending until its version is in the metadata, and the status socket
// reports what Status does. A socket left by a process that is gone is
// removed by Running.
func TestStatusPendingFromClose(t *testing.T) {
	f := newFixture(t, mount.Options{Mode: mount.WriteBack})
	ctx := context.Background()
	run, err := os.MkdirTemp("", "cst") // short: a socket's path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	sock := mount.StatusSocket(run, "v", os.Getpid())
	if err := f.m.ServeStatus(sock); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("status socket: %v, %v (want mode 0600)", fi, err)
	}
	// A stale socket: a file nobody listens on, named for a dead pid.
	stale := mount.StatusSocket(run, "old", 1<<22+12345)
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	query := func() mount.Status {
		t.Helper()
		all, err := mount.Running(ctx, run)
		if err != nil || len(all) != 1 {
			t.Fatalf("Running: %v, %v (want this mount only)", all, err)
		}
		return all[0]
	}
	st := query()
	if st.Pending != 0 || st.Mountpoint != f.mnt || st.Volume != "v" || st.Mode != "write-back" || st.PID != os.Getpid() {
		t.Fatalf("idle status %+v", st)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale socket is still there: %v", err)
	}
	if _, err := mount.QueryStatus(ctx, stale); !errors.Is(err, cairn.ErrNotFound) {
		t.Errorf("QueryStatus of a missing socket: %v, want NotFound", err)
	}

	holdQueue := mount.HoldQueue(f.m)
	defer holdQueue()
	holdRelease := mount.HoldRelease(f.m)
	defer holdRelease()
	data := randBytes(100 << 10)
	fd, err := os.Create(f.path("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.Write(data); err != nil {
		fd.Close()
		t.Fatal(err)
	}
	if err := fd.Close(); err != nil {
		t.Fatal(err)
	}
	// The close has returned; the release is held: the file is pending.
	if st := query(); st.Closed != 1 || st.Pending < 1 {
		t.Fatalf("right after the close: %+v, want the file closed and pending", st)
	}
	holdRelease()
	deadline := time.Now().Add(time.Minute)
	for st := query(); st.Queued != 1; st = query() {
		if st.Pending < 1 {
			t.Fatalf("after the release, before the commit: %+v, want pending", st)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the commit was not queued after the release: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e, err := f.vol.Meta.Lookup(ctx, []string{"a"}); err == nil && e.Current() != nil {
		t.Fatalf("a version is in the metadata while the queue is held")
	}
	done := query().CommitsDone
	holdQueue()
	for st := query(); st.Pending > 0; st = query() {
		if time.Now().After(deadline) {
			t.Fatalf("still pending after a minute: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Nothing pending: the version is in the metadata.
	if got := f.cat("a"); !bytes.Equal(got, data) {
		t.Fatalf("after the status said idle, the metadata's version has %d bytes, want %d", len(got), len(data))
	}
	if st := query(); st.CommitsDone != done+1 || st.CommitsFailed != 0 {
		t.Errorf("commits done %d (was %d), failed %d", st.CommitsDone, done, st.CommitsFailed)
	}
	// A namespace change not yet written counts as pending (the root's
	// listing read first: the mount then knows its names, and makes a
	// new one without asking the metadata).
	if _, err := os.ReadDir(f.mnt); err != nil {
		t.Fatal(err)
	}
	holdWB := mount.HoldWriteBack(f.m)
	if err := os.Mkdir(f.path("d"), 0o755); err != nil {
		holdWB()
		t.Fatal(err)
	}
	if st := query(); st.Namespace < 1 || st.Pending < 1 {
		holdWB()
		t.Fatalf("with a mkdir not yet written: %+v", st)
	}
	holdWB()
	for st := query(); st.Pending > 0; st = query() {
		if time.Now().After(deadline) {
			t.Fatalf("still pending after a minute: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := f.entry("d"); !e.IsDir() {
		t.Fatalf("d in the metadata: %+v", e)
	}
	// The socket goes at the unmount.
	f.mountAgain(mount.Options{Mode: mount.WriteBack})
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the status socket is still there after the unmount: %v", err)
	}
}
