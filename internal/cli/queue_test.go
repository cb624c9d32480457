package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/store/cloudtest"
)

func queueLs(t *testing.T, r *realmT) cli.QueueList {
	t.Helper()
	out := r.ok("queue", "ls", "--json")
	var ql cli.QueueList
	if err := json.Unmarshal([]byte(out), &ql); err != nil {
		t.Fatalf("queue ls --json: %v\n%s", err, out)
	}
	return ql
}

// minioRealm is a realm whose volume home keeps its data in one MinIO
// bucket (copies:1@m), with no background drainer started by itself.
func minioRealm(t *testing.T) (*realmT, *cloudtest.MinIO) {
	m := cloudtest.StartMinIO(t)
	r := newRealm(t, "--no-passphrase", "--trash-ttl", "1ms")
	r.env = append(r.env, "AWS_ACCESS_KEY_ID="+m.AccessKey, "AWS_SECRET_ACCESS_KEY="+m.SecretKey,
		"AWS_EC2_METADATA_DISABLED=true", cli.EnvNoAutoDrain+"=1")
	r.ok("store", "add", "m", fmt.Sprintf("s3://%s/cairn?endpoint=%s&insecure=1", m.Bucket, m.Endpoint))
	r.ok("policy", "set", "home:/", "copies:1@m")
	stopDrainer(t, r)
	return r, m
}

// stopDrainer makes the test's cleanup kill a background drainer still
// running (a test that failed while one ran), by its PID.
func stopDrainer(t *testing.T, r *realmT) {
	t.Cleanup(func() {
		res := r.runEnv([]string{cli.EnvNoAutoDrain + "=1"}, "queue", "ls", "--json")
		var ql cli.QueueList
		if json.Unmarshal([]byte(res.stdout), &ql) == nil && ql.Draining && ql.PID > 0 {
			t.Logf("killing the background drainer, pid %d", ql.PID)
			_ = syscall.Kill(ql.PID, syscall.SIGKILL)
		}
	})
}

// bucketObjects counts the objects in m's bucket.
func bucketObjects(t *testing.T, m *cloudtest.MinIO) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for o := range m.Client(t).ListObjects(ctx, m.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list %s: %v", m.Bucket, o.Err)
		}
		n++
	}
	return n
}

// checkFiles checks that every file of want reads back byte-identical
// from the stores (past every cache) if committed, or else is absent;
// it returns how many are committed.
func checkFiles(t *testing.T, r *realmT, dir string, want map[string][]byte) int {
	t.Helper()
	committed := 0
	for name, b := range want {
		res := r.run("cat", "--no-cache", dir+"/"+name)
		switch res.code {
		case 0:
			if res.stdout != string(b) {
				t.Fatalf("%s reads back %d bytes that differ from the %d put", name, len(res.stdout), len(b))
			}
			committed++
		case cli.ExitNotFound:
		default:
			t.Fatalf("cat %s: exit %d: %s", name, res.code, res.stderr)
		}
	}
	return committed
}

// TestQueueDrainerKilled queues files with put --background, starts the
// drainer as its own process and kills it (SIGKILL, by PID) while its
// uploads are in flight: every file is then either committed and reads
// back byte-identical from the bucket, or not visible at all (nothing is
// committed before its data is stored). A second drainer finishes the
// queue; every file reads back, fsck --read-data is clean, and a gc
// afterwards loses nothing.
func TestQueueDrainerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads ~33 MiB to MinIO")
	}
	r, m := minioRealm(t)
	src := filepath.Join(t.TempDir(), "src")
	want := map[string][]byte{}
	for i := range 16 {
		n := []int{100, 5000, 3 << 20, 5<<20 + 3}[i%4]
		want[fmt.Sprintf("f%02d", i)] = randBytes(n)
	}
	for name, b := range want {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	sum := putJSON(t, r, "--background", src, "home:/")
	if sum.Queued != int64(len(want)) || sum.Files != int64(len(want)) {
		t.Fatalf("put --background queued %d of %d files: %+v", sum.Queued, len(want), sum)
	}
	if ql := queueLs(t, r); ql.Files != len(want) {
		t.Fatalf("queue ls shows %d files, want %d: %+v", ql.Files, len(want), ql)
	}
	if n := checkFiles(t, r, "home:/src", want); n != 0 {
		t.Fatalf("%d files committed before any upload", n)
	}
	if n := bucketObjects(t, m); n > 1 { // the realm's marker
		t.Fatalf("the bucket holds %d objects before the drainer ran", n)
	}
	marker := bucketObjects(t, m)

	cmd := r.command("queue", "run", "-q")
	cmd.Env = r.env
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Uploads are in flight once the first objects show in the bucket.
	deadline := time.Now().Add(60 * time.Second)
	for bucketObjects(t, m) <= marker {
		select {
		case err := <-exited:
			t.Fatalf("the drainer exited (%v) before any object was uploaded\n%s", err, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no upload after 60s\n%s", errb.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	ql := queueLs(t, r)
	if ql.Files == 0 {
		t.Fatalf("the drainer finished before it was killed: nothing was in flight\n%s", errb.String())
	}
	committed := checkFiles(t, r, "home:/src", want)
	t.Logf("killed with %d objects in the bucket, %d files committed, %d queued", bucketObjects(t, m), committed, ql.Files)
	if committed+ql.Files != len(want) {
		t.Fatalf("%d committed + %d queued != %d files", committed, ql.Files, len(want))
	}

	var ds cli.DrainSummary
	if err := json.Unmarshal([]byte(r.ok("queue", "run", "--json")), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Committed+ds.Already != int64(ql.Files) || ds.Failed != 0 {
		t.Fatalf("second drainer: %+v, want %d files", ds, ql.Files)
	}
	t.Logf("second drainer: %+v", ds)
	if ql := queueLs(t, r); ql.Files != 0 || len(ql.Pending) != 0 {
		t.Fatalf("queue not empty after queue run: %+v", ql)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.home, "queue")); len(ents) > 2 { // drain.lock, drain.log
		t.Errorf("queue directory keeps %d entries after draining", len(ents))
	}
	if n := checkFiles(t, r, "home:/src", want); n != len(want) {
		t.Fatalf("%d of %d files committed", n, len(want))
	}
	r.ok("fsck", "--read-data")
	r.ok("gc")
	if n := checkFiles(t, r, "home:/src", want); n != len(want) {
		t.Fatalf("after gc: %d of %d files readable", n, len(want))
	}
	if out := r.ok("versions", "home:/src/f03"); strings.Count(out, "\n") < 1 {
		t.Fatalf("versions: %q", out)
	}
}

// TestQueueStoreDown: with the bucket's server stopped, put --background
// returns and commits nothing; queue run fails, saying the store is
// unreachable (exit 6), and still commits nothing; a gc meanwhile loses
// nothing queued; a background drainer retries while the store is down,
// and once the server is back it drains the queue (a gc running beside
// it) and every file reads back.
func TestQueueStoreDown(t *testing.T) {
	r, m := minioRealm(t)
	src := filepath.Join(t.TempDir(), "src")
	want := map[string][]byte{"a": randBytes(700 << 10), "b": []byte("small\n"), "c": randBytes(40 << 10)}
	for name, b := range want {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	m.Stop()
	sum := putJSON(t, r, "--background", src, "home:/")
	if sum.Queued != 3 {
		t.Fatalf("put --background with the store down: %+v", sum)
	}
	if n := checkFiles(t, r, "home:/src", want); n != 0 {
		t.Fatalf("%d files committed while their store is down", n)
	}
	res := r.run("queue", "run", "-q")
	if res.code != cli.ExitUnavailable {
		t.Fatalf("queue run with the store down: exit %d: %s", res.code, res.stderr)
	}
	if n := checkFiles(t, r, "home:/src", want); n != 0 {
		t.Fatalf("%d files committed while their store is down", n)
	}
	if ql := queueLs(t, r); ql.Files != 3 {
		t.Fatalf("queue after a failed drain: %+v", ql)
	}
	// gc sweeps this device's store: the spool is not in it.
	r.ok("gc")
	// A command starts a background drainer, which retries while the
	// store is down and drains the queue once it is back.
	r.runEnv([]string{cli.EnvNoAutoDrain + "=0"}, "queue", "ls")
	logPath := filepath.Join(r.home, "queue", "drain.log")
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "retrying in") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background drainer did not retry:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := checkFiles(t, r, "home:/src", want); n != 0 {
		t.Fatalf("%d files committed while their store is down", n)
	}
	m.Restart(t)
	r.ok("gc") // the bucket too, while the drainer may be uploading
	waitQueueEmpty(t, r)
	if n := checkFiles(t, r, "home:/src", want); n != 3 {
		t.Fatalf("%d of 3 files committed after the store came back", n)
	}
	r.ok("fsck", "--read-data")
}

// TestQueueAutoDrain: without CAIRN_NO_AUTODRAIN, put --background starts
// a drainer of its own that commits the files; a queue left by a killed
// put is finished by the drainer that a later command starts. A gc while
// files wait loses nothing.
func TestQueueAutoDrain(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--trash-ttl", "1ms")
	base := t.TempDir()
	r.ok("store", "add", "a", "file://"+filepath.Join(base, "a"))
	r.ok("store", "add", "b", "file://"+filepath.Join(base, "b"))
	r.ok("policy", "set", "home:/", "copies:2@a,b")
	stopDrainer(t, r)
	src := filepath.Join(t.TempDir(), "src")
	want := map[string][]byte{"x": randBytes(300 << 10), "y": []byte("why\n")}
	for name, b := range want {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	// Queued without a drainer; a gc of every store; then any command
	// (here ls) starts the drainer.
	r.runEnv([]string{cli.EnvNoAutoDrain + "=1"}, "put", "--background", src, "home:/")
	r.ok("gc")
	r.ok("ls", "home:/")
	waitQueueEmpty(t, r)
	if n := checkFiles(t, r, "home:/src", want); n != len(want) {
		t.Fatalf("%d of %d files committed by the background drainer", n, len(want))
	}
	// put --background starts its own drainer.
	want["x"] = randBytes(200 << 10)
	writeFile(t, filepath.Join(src, "x"), want["x"], 0o644)
	r.ok("put", "--background", src, "home:/")
	waitQueueEmpty(t, r)
	if n := checkFiles(t, r, "home:/src", want); n != len(want) {
		t.Fatalf("%d of %d files committed by put's drainer", n, len(want))
	}
	r.ok("fsck", "--read-data")
}

// waitQueueEmpty waits until the queue is empty and no drainer runs.
func waitQueueEmpty(t *testing.T, r *realmT) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		res := r.runEnv([]string{cli.EnvNoAutoDrain + "=1"}, "queue", "ls", "--json")
		var ql cli.QueueList
		if err := json.Unmarshal([]byte(res.stdout), &ql); err != nil {
			t.Fatalf("queue ls --json: %v\n%s", err, res.stdout)
		}
		if ql.Files == 0 && !ql.Draining {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.home, "queue", "drain.log"))
			t.Fatalf("queue not drained after 60s: %+v\ndrain.log:\n%s", ql, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
