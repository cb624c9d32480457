package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/journal"
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

// checkFiles checks that every file of want that is in cairn's dir (a
// directory put made) reads back byte-identical from the stores, past
// every cache (one 'get --no-cache' of dir), and that cairn's dir holds
// no other file; it returns how many of want are there.
func checkFiles(t *testing.T, r *realmT, dir string, want map[string][]byte) int {
	t.Helper()
	return len(committedFiles(t, r, dir, want))
}

// committedFiles is checkFiles returning the paths (dir/name) of the files
// committed.
func committedFiles(t *testing.T, r *realmT, dir string, want map[string][]byte) []string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "got")
	r.ok("get", "-q", "--no-cache", dir, out)
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, de := range ents {
		b, ok := want[de.Name()]
		if !ok {
			t.Fatalf("%s/%s: not a file put", dir, de.Name())
		}
		if got := mustRead(t, filepath.Join(out, de.Name())); !bytes.Equal(got, b) {
			t.Fatalf("%s/%s reads back %d bytes that differ from the %d put", dir, de.Name(), len(got), len(b))
		}
		paths = append(paths, dir+"/"+de.Name())
	}
	return paths
}

// TestQueueDrainerKilled queues files with four put --background runs
// (four queue directories, drained one after another), starts the drainer
// as its own process and kills it (SIGKILL, by PID) while its uploads are
// in flight, then again at random moments in later runs: after each kill
// every file is either committed and reads back byte-identical from the
// bucket (past every cache), or not visible at all and still queued:
// nothing is committed before its data is stored, nothing queued is lost.
// (A kill between a batch's commits and its ack in the put's journal
// leaves files both committed and queued: the next drainer finds them
// committed.)
// A last drainer finishes the queue; every file reads back, fsck
// --read-data is clean, and a gc afterwards loses nothing.
func TestQueueDrainerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads ~33 MiB to MinIO")
	}
	r, m := minioRealm(t)
	const puts = 4
	want := make([]map[string][]byte, puts)
	total := 0
	for p := range puts {
		src := filepath.Join(t.TempDir(), fmt.Sprintf("p%d", p))
		want[p] = map[string][]byte{}
		for i := range 4 {
			n := []int{100, 5000, 3 << 20, 5<<20 + 3}[i]
			b := randBytes(n)
			want[p][fmt.Sprintf("f%d", i)] = b
			writeFile(t, filepath.Join(src, fmt.Sprintf("f%d", i)), b, 0o644)
			total++
		}
		sum := putJSON(t, r, "--background", src, "home:/")
		if sum.Queued != 4 || sum.Files != 4 {
			t.Fatalf("put --background queued %d of 4 files: %+v", sum.Queued, sum)
		}
	}
	// committedAll checks every file and returns the paths committed.
	committedAll := func() []string {
		var paths []string
		for p := range puts {
			paths = append(paths, committedFiles(t, r, fmt.Sprintf("home:/p%d", p), want[p])...)
		}
		return paths
	}
	checkAll := func() int { return len(committedAll()) }
	if ql := queueLs(t, r); ql.Files != total {
		t.Fatalf("queue ls shows %d files, want %d: %+v", ql.Files, total, ql)
	}
	if n := checkAll(); n != 0 {
		t.Fatalf("%d files committed before any upload", n)
	}
	marker := bucketObjects(t, m)
	if marker > 1 { // the realm's marker
		t.Fatalf("the bucket holds %d objects before the drainer ran", marker)
	}

	rng := mrand.New(mrand.NewPCG(2, uint64(time.Now().UnixNano())))
	kills := 0
	for round := 0; round < 6; round++ {
		cmd := r.command("queue", "run", "-q")
		cmd.Env = r.env
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if round == 0 {
			// Uploads are in flight once the first objects show in
			// the bucket.
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
		} else {
			// A random moment of the drain.
			select {
			case <-exited:
				cmd = nil
			case <-time.After(time.Duration(rng.IntN(1500)) * time.Millisecond):
			}
		}
		if cmd != nil {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			err := <-exited
			if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				// It finished just before the signal.
				if err != nil {
					t.Fatalf("round %d: the drainer failed: %v\n%s", round, err, errb.String())
				}
			} else {
				kills++
			}
		}
		ql := queueLs(t, r)
		committed := committedAll()
		seen := map[string]bool{}
		for _, p := range committed {
			seen[p] = true
		}
		both := 0
		for _, it := range ql.Pending {
			if seen[it.Path] {
				both++
			}
			seen[it.Path] = true
		}
		t.Logf("round %d: %d objects in the bucket, %d files committed, %d queued (%d of them both)",
			round, bucketObjects(t, m), len(committed), ql.Files, both)
		if len(seen) != total {
			t.Fatalf("round %d: %d files committed or queued, want all %d (%d committed, %d queued)", round, len(seen), total, len(committed), ql.Files)
		}
		if round == 0 && ql.Files == 0 {
			t.Fatalf("the drainer finished before it was killed: nothing was in flight\n%s", errb.String())
		}
		if ql.Files == 0 {
			break
		}
	}
	if kills == 0 {
		t.Fatal("the drainer was never killed")
	}
	var ds cli.DrainSummary
	if err := json.Unmarshal([]byte(r.ok("queue", "run", "--json")), &ds); err != nil {
		t.Fatal(err)
	}
	if ds.Failed != 0 {
		t.Fatalf("last drainer: %+v", ds)
	}
	t.Logf("last drainer: %+v", ds)
	if ql := queueLs(t, r); ql.Files != 0 || len(ql.Pending) != 0 {
		t.Fatalf("queue not empty after queue run: %+v", ql)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.home, "queue")); len(ents) > 2 { // drain.lock, drain.log
		t.Errorf("queue directory keeps %d entries after draining", len(ents))
	}
	if n := checkAll(); n != total {
		t.Fatalf("%d of %d files committed", n, total)
	}
	r.ok("fsck", "--read-data")
	r.ok("gc")
	if n := checkAll(); n != total {
		t.Fatalf("after gc: %d of %d files readable", n, total)
	}
	for p := range puts {
		if out := r.ok("versions", fmt.Sprintf("home:/p%d/f3", p)); strings.Count(out, "\n") < 1 {
			t.Fatalf("versions: %q", out)
		}
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

// TestQueuePutKilled kills put --background (SIGKILL, by PID) while it
// queues: the files it queued before are drained and read back
// byte-identical, the others are absent, nothing else is committed; the
// put run again queues the rest.
func TestQueuePutKilled(t *testing.T) {
	r := newRealm(t, "--no-passphrase")
	base := t.TempDir()
	r.ok("store", "add", "a", "file://"+filepath.Join(base, "a"))
	r.ok("policy", "set", "home:/", "copies:1@a")
	r.env = append(r.env, cli.EnvNoAutoDrain+"=1")
	src := filepath.Join(t.TempDir(), "src")
	want := map[string][]byte{}
	for i := range 300 {
		b := randBytes(20 << 10)
		if i%50 == 49 {
			b = randBytes(2 << 20)
		}
		want[fmt.Sprintf("f%03d", i)] = b
		writeFile(t, filepath.Join(src, fmt.Sprintf("f%03d", i)), b, 0o644)
	}
	cmd := r.command("put", "--background", "-q", "--workers", "2", src, "home:/")
	cmd.Env = r.env
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Kill it once some files are queued.
	queued := func() int {
		m, _ := filepath.Glob(filepath.Join(r.home, "queue", "*", "journal"))
		n := 0
		for _, p := range m {
			recs, _ := journal.Read(p)
			n += len(recs)
		}
		return n
	}
	deadline := time.Now().Add(60 * time.Second)
	for queued() < 10 {
		select {
		case err := <-exited:
			t.Fatalf("put exited (%v) before it was killed\n%s", err, errb.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing queued after 60s\n%s", errb.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	ql := queueLs(t, r)
	if ql.Files == 0 || ql.Files == len(want) {
		t.Fatalf("%d of %d files queued when put was killed", ql.Files, len(want))
	}
	if n := checkFiles(t, r, "home:/src", want); n != 0 {
		t.Fatalf("%d files committed by a killed put --background", n)
	}
	r.ok("queue", "run", "-q")
	if n := checkFiles(t, r, "home:/src", want); n != ql.Files {
		t.Fatalf("%d files committed, %d were queued", n, ql.Files)
	}
	r.ok("fsck", "--read-data")
	r.ok("put", "--background", "-q", src, "home:/")
	r.ok("queue", "run", "-q")
	if n := checkFiles(t, r, "home:/src", want); n != len(want) {
		t.Fatalf("%d of %d files committed after the put ran again", n, len(want))
	}
}

// TestQueueConflict: a file committed by another put between the queueing
// and the drain of a background put keeps the newer content (by mtime)
// current, and the queued content is committed beside it under a
// conflict name; a file queued twice by this device is committed in order
// without a conflict; a queued file newer than what was committed
// meanwhile becomes current, the other kept as a version.
func TestQueueConflict(t *testing.T) {
	r := newRealm(t, "--no-passphrase")
	r.ok("store", "add", "a", "file://"+filepath.Join(t.TempDir(), "a"))
	r.ok("policy", "set", "home:/", "copies:1@a")
	r.env = append(r.env, cli.EnvNoAutoDrain+"=1")
	src := filepath.Join(t.TempDir(), "src")
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	put := func(name, content string, mtime time.Time, args ...string) {
		t.Helper()
		p := filepath.Join(src, name)
		writeFile(t, p, []byte(content), 0o644)
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		r.ok(append(append([]string{"put", "-q"}, args...), p, "home:/")...)
	}
	put("x", "x queued, older", t0, "--background")
	put("x", "x put meanwhile, newer", t0.Add(time.Hour))
	put("y", "y first", t0, "--background")
	put("y", "y second", t0.Add(time.Minute), "--background")
	put("z", "z queued, newer", t0.Add(time.Hour), "--background")
	put("z", "z put meanwhile, older", t0)
	res := r.run("queue", "run", "-q")
	if res.code != 0 {
		t.Fatalf("queue run: exit %d: %s", res.code, res.stderr)
	}
	if !strings.Contains(res.stderr, "home:/x: a newer version was committed") {
		t.Errorf("queue run does not report the conflict:\n%s", res.stderr)
	}
	for path, want := range map[string]string{"home:/x": "x put meanwhile, newer", "home:/y": "y second", "home:/z": "z queued, newer"} {
		if got := r.ok("cat", path); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	var names []string
	for _, l := range strings.Split(r.ok("ls", "home:/"), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			names = append(names, f[len(f)-1])
		}
	}
	var conflicts []string
	for _, n := range names {
		if strings.Contains(n, ".queued-conflict-") {
			conflicts = append(conflicts, n)
		}
	}
	if len(conflicts) != 1 || !strings.HasPrefix(conflicts[0], "x.queued-conflict-") {
		t.Fatalf("conflict copies %v, want one of x (ls: %v)", conflicts, names)
	}
	if got := r.ok("cat", "home:/"+conflicts[0]); got != "x queued, older" {
		t.Errorf("conflict copy = %q", got)
	}
	var vers []struct {
		N       int  `json:"n"`
		Current bool `json:"current"`
	}
	if err := json.Unmarshal([]byte(r.ok("versions", "--json", "home:/z")), &vers); err != nil {
		t.Fatal(err)
	}
	if len(vers) != 2 || !vers[1].Current {
		t.Errorf("z has versions %+v, want the one put meanwhile and the queued one, current", vers)
	}
}

// TestQueueStuckAndDrop: a queued file whose name became a directory is
// committed beside it under a conflict name; one whose directory's path
// became a file stays queued (queue run exits 1 naming it) until 'queue
// drop' removes it; drop refuses a path that is not queued.
func TestQueueStuckAndDrop(t *testing.T) {
	r := newRealm(t, "--no-passphrase")
	r.env = append(r.env, cli.EnvNoAutoDrain+"=1")
	src := t.TempDir()
	writeFile(t, filepath.Join(src, "d", "f"), []byte("in d\n"), 0o644)
	writeFile(t, filepath.Join(src, "g"), []byte("g's content\n"), 0o644)
	writeFile(t, filepath.Join(src, "other", "d"), []byte("d is a file now\n"), 0o644)
	r.ok("put", "-q", "--background", filepath.Join(src, "d"), filepath.Join(src, "g"), "home:/")
	r.ok("rm", "-r", "home:/d")
	r.ok("put", "-q", filepath.Join(src, "other", "d"), "home:/")
	r.ok("mkdir", "home:/g")
	res := r.fails(cli.ExitError, "queue", "run", "-q")
	if !strings.Contains(res.stderr, "home:/d/f") || !strings.Contains(res.stderr, "left in the queue") {
		t.Errorf("queue run does not name the stuck file:\n%s", res.stderr)
	}
	out := r.ok("ls", "home:/")
	var conflict string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[len(f)-1], "g.queued-conflict-") {
			conflict = f[len(f)-1]
		}
	}
	if conflict == "" {
		t.Fatalf("no conflict copy of g:\n%s", out)
	}
	if got := r.ok("cat", "home:/"+conflict); got != "g's content\n" {
		t.Errorf("%s = %q", conflict, got)
	}
	if ql := queueLs(t, r); ql.Files != 1 || ql.Pending[0].Path != "home:/d/f" {
		t.Fatalf("queue: %+v, want home:/d/f", ql)
	}
	r.fails(cli.ExitNotFound, "queue", "drop", "home:/nope")
	r.fails(cli.ExitUsage, "queue", "drop")
	if out := r.ok("queue", "drop", "home:/d/f"); !strings.Contains(out, "dropped home:/d/f") {
		t.Errorf("queue drop: %q", out)
	}
	if ql := queueLs(t, r); ql.Files != 0 {
		t.Fatalf("queue after drop: %+v", ql)
	}
	r.ok("queue", "run", "-q")
	if got := r.ok("cat", "home:/d"); got != "d is a file now\n" {
		t.Errorf("home:/d = %q", got)
	}
	r.ok("fsck", "--read-data")
}
