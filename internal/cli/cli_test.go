package cli_test

// End-to-end tests of the command line. Each command runs as a separate
// process (the test binary re-executed, see TestMain), exactly as a user runs
// it, so the embedded-etcd sharing between processes is exercised too.

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/netnstest"
)

func TestMain(m *testing.M) {
	etcdsvc.RunDaemonIfRequested()
	if os.Getenv("CAIRN_TEST_RUN_CLI") == "1" {
		os.Exit(cli.Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// realmT is one realm under test.
type realmT struct {
	t    *testing.T
	home string
	env  []string
	// net, if set, runs every command inside host's network namespace
	// (netns_test.go).
	net  *netnstest.Net
	host int
}

// command is the CLI with args, run where the realm's machine is.
func (r *realmT) command(args ...string) *exec.Cmd {
	if r.net != nil {
		return r.net.Command(r.host, os.Args[0], args...)
	}
	return exec.Command(os.Args[0], args...)
}

func newRealm(t *testing.T, initArgs ...string) *realmT {
	t.Helper()
	r := &realmT{t: t, home: filepath.Join(t.TempDir(), "realm")}
	r.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+r.home, "CAIRN_ETCD_LINGER=300ms", "CAIRN_PASSPHRASE=")
	t.Cleanup(func() { etcdsvc.StopDaemon(r.home) })
	if len(initArgs) == 0 {
		initArgs = []string{"--no-passphrase"}
	}
	r.ok(append([]string{"init"}, initArgs...)...)
	return r
}

type result struct {
	code           int
	stdout, stderr string
}

func (r *realmT) run(args ...string) result {
	return r.runEnv(nil, args...)
}

func (r *realmT) runEnv(extra []string, args ...string) result {
	r.t.Helper()
	cmd := r.command(args...)
	cmd.Env = append(append([]string{}, r.env...), extra...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		r.t.Fatalf("run %v: %v", args, err)
	}
	return result{code, out.String(), errb.String()}
}

func (r *realmT) ok(args ...string) string {
	r.t.Helper()
	res := r.run(args...)
	if res.code != 0 {
		r.t.Fatalf("cairn %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

func (r *realmT) fails(code int, args ...string) result {
	r.t.Helper()
	res := r.run(args...)
	if res.code != code {
		r.t.Fatalf("cairn %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), res.code, code, res.stdout, res.stderr)
	}
	return res
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

// makeTree builds a small tree with files of several sizes, a symlink, an
// empty file and an empty directory.
func makeTree(t *testing.T, dir string) {
	writeFile(t, filepath.Join(dir, "a.txt"), []byte("hello cairn\n"), 0o644)
	writeFile(t, filepath.Join(dir, "big.bin"), randBytes(3<<20), 0o600)
	writeFile(t, filepath.Join(dir, "sub", "text.txt"), bytes.Repeat([]byte("compressible line of text\n"), 20000), 0o640)
	writeFile(t, filepath.Join(dir, "sub", "empty"), nil, 0o644)
	writeFile(t, filepath.Join(dir, "sub", "deep", "x.bin"), randBytes(70000), 0o755)
	if err := os.Mkdir(filepath.Join(dir, "emptydir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(dir, "a.txt"), old, old)
}

// sameTree compares two local trees: names, types, content, modes, mtimes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	err := filepath.Walk(a, func(p string, ia os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		q := filepath.Join(b, rel)
		ib, err := os.Lstat(q)
		if err != nil {
			t.Errorf("%s missing in copy: %v", rel, err)
			return nil
		}
		if ia.Mode() != ib.Mode() {
			t.Errorf("%s: mode %v, copy %v", rel, ia.Mode(), ib.Mode())
		}
		switch {
		case ia.Mode().IsRegular():
			da, _ := os.ReadFile(p)
			db, _ := os.ReadFile(q)
			if !bytes.Equal(da, db) {
				t.Errorf("%s: content differs (%d vs %d bytes)", rel, len(da), len(db))
			}
			if !ia.ModTime().Equal(ib.ModTime()) {
				t.Errorf("%s: mtime %v, copy %v", rel, ia.ModTime(), ib.ModTime())
			}
		case ia.Mode()&os.ModeSymlink != 0:
			ta, _ := os.Readlink(p)
			tb, _ := os.Readlink(q)
			if ta != tb {
				t.Errorf("%s: link %q, copy %q", rel, ta, tb)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func putJSON(t *testing.T, r *realmT, args ...string) cli.PutSummary {
	t.Helper()
	out := r.ok(append([]string{"put", "--json"}, args...)...)
	var s cli.PutSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("put --json output: %v\n%s", err, out)
	}
	return s
}

func TestRoundTripAndVersions(t *testing.T) {
	r := newRealm(t)
	src := filepath.Join(t.TempDir(), "tree")
	makeTree(t, src)

	s := putJSON(t, r, src, "home:/backup")
	if s.Files != 5 || s.Symlinks != 1 || s.Failed != 0 || s.NewChunks == 0 {
		t.Fatalf("first put summary = %+v", s)
	}
	// ls and ls --json see the tree.
	ls := r.ok("ls", "home:/backup/tree")
	for _, want := range []string{"a.txt", "big.bin", "sub/", "emptydir/", "link"} {
		if !strings.Contains(ls, want+"\n") {
			t.Errorf("ls missing %q:\n%s", want, ls)
		}
	}
	var ents []map[string]any
	if err := json.Unmarshal([]byte(r.ok("ls", "--json", "home:/backup/tree/sub")), &ents); err != nil || len(ents) != 3 {
		t.Fatalf("ls --json = %v, %v", ents, err)
	}
	if got := r.ok("cat", "home:/backup/tree/a.txt"); got != "hello cairn\n" {
		t.Fatalf("cat = %q", got)
	}
	// get restores an identical tree.
	dst := filepath.Join(t.TempDir(), "restore")
	r.ok("get", "home:/backup/tree", dst)
	sameTree(t, src, dst)

	// An unchanged tree stores nothing new and reads no file.
	s2 := putJSON(t, r, src, "home:/backup")
	if s2.Skipped != 5 || s2.Files != 0 || s2.NewChunks != 0 || s2.NewBytes != 0 {
		t.Fatalf("second put = %+v, want 5 skipped and nothing new", s2)
	}
	// --force re-reads but dedup stores no new chunk.
	s3 := putJSON(t, r, "--force", src, "home:/backup")
	if s3.Files != 5 || s3.NewChunks != 0 {
		t.Fatalf("forced put = %+v, want 5 files and no new chunk", s3)
	}

	// A changed file gets version 2; restore brings version 1 back as 3.
	a := filepath.Join(src, "a.txt")
	writeFile(t, a, []byte("second version\n"), 0o644)
	putJSON(t, r, src, "home:/backup")
	if got := r.ok("cat", "home:/backup/tree/a.txt"); got != "second version\n" {
		t.Fatalf("cat after change = %q", got)
	}
	var vers []map[string]any
	json.Unmarshal([]byte(r.ok("versions", "--json", "home:/backup/tree/a.txt")), &vers)
	if len(vers) != 2 { // 1: first put (--force of the same content adds none), 2: changed
		t.Fatalf("versions = %v", vers)
	}
	if got := r.ok("cat", "--version", "1", "home:/backup/tree/a.txt"); got != "hello cairn\n" {
		t.Fatalf("cat --version 1 = %q", got)
	}
	r.ok("restore", "--version", "1", "home:/backup/tree/a.txt") // becomes version 3
	if got := r.ok("cat", "home:/backup/tree/a.txt"); got != "hello cairn\n" {
		t.Fatalf("cat after restore = %q", got)
	}
	r.fails(cli.ExitNotFound, "cat", "--version", "99", "home:/backup/tree/a.txt")

	// rm goes to the trash; restore --from-trash brings the subtree back.
	r.fails(cli.ExitError, "rm", "home:/backup/tree/sub")
	r.ok("rm", "-r", "home:/backup/tree/sub")
	r.fails(cli.ExitNotFound, "cat", "home:/backup/tree/sub/text.txt")
	if tr := r.ok("trash"); !strings.Contains(tr, "home:/backup/tree/sub") {
		t.Fatalf("trash listing = %q", tr)
	}
	r.ok("restore", "--from-trash", "home:/backup/tree/sub")
	if got := r.ok("cat", "home:/backup/tree/sub/deep/x.bin"); len(got) != 70000 {
		t.Fatalf("restored file has %d bytes", len(got))
	}

	// mv and mkdir.
	r.ok("mkdir", "-p", "home:/docs/2026")
	r.fails(cli.ExitExist, "mkdir", "home:/docs")
	r.ok("mv", "home:/backup/tree/a.txt", "home:/docs/2026")
	if got := r.ok("cat", "home:/docs/2026/a.txt"); got != "hello cairn\n" {
		t.Fatalf("cat after mv = %q", got)
	}
	r.fails(cli.ExitUsage, "mv", "home:/docs", "home:/docs/2026/inner")
	// mv over an existing file: the moved file is the next version of
	// the destination's history (versions follow the path), nothing
	// goes to the trash.
	save := filepath.Join(t.TempDir(), "a.txt.new")
	writeFile(t, save, []byte("saved over\n"), 0o600)
	r.ok("put", save, "home:/docs/2026")
	r.ok("mv", "home:/docs/2026/a.txt.new", "home:/docs/2026/a.txt")
	if got := r.ok("cat", "home:/docs/2026/a.txt"); got != "saved over\n" {
		t.Fatalf("cat after mv over a file = %q", got)
	}
	vers = nil
	json.Unmarshal([]byte(r.ok("versions", "--json", "home:/docs/2026/a.txt")), &vers)
	if len(vers) != 4 {
		t.Fatalf("versions after mv over a file = %v, want the 3 before and the moved one", vers)
	}
	if got := r.ok("cat", "--version", "2", "home:/docs/2026/a.txt"); got != "second version\n" {
		t.Fatalf("cat --version 2 after mv over a file = %q", got)
	}
	if tr := r.ok("trash"); strings.Contains(tr, "docs/2026/a.txt") {
		t.Fatalf("trash after mv over a file = %q", tr)
	}

	// stats, gc, fsck.
	var st map[string]any
	if err := json.Unmarshal([]byte(r.ok("stats", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	if st["files"].(float64) != 5 || st["dedup_ratio"].(float64) <= 1 {
		t.Fatalf("stats = %v", st)
	}
	r.ok("gc")
	r.ok("fsck", "--read-data")
	dst2 := filepath.Join(t.TempDir(), "after-gc")
	r.ok("get", "home:/backup/tree/big.bin", dst2)
	if a, b := mustRead(t, filepath.Join(src, "big.bin")), mustRead(t, dst2); !bytes.Equal(a, b) {
		t.Fatal("big.bin differs after gc")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGCFreesRemovedData(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--trash-ttl", "1ms", "--keep", "1")
	src := filepath.Join(t.TempDir(), "f.bin")
	writeFile(t, src, randBytes(1<<20), 0o644)
	putJSON(t, r, src, "home:/")
	writeFile(t, src, randBytes(1<<20), 0o644)
	putJSON(t, r, src, "home:/") // version 1 is dropped (keep 1)
	out := r.ok("gc", "--dry-run", "--json")
	var dry map[string]any
	json.Unmarshal([]byte(out), &dry)
	if dry["freed_bytes"].(float64) < 1<<20 {
		t.Fatalf("dry run frees %v, want ≥ 1 MiB", dry["freed_bytes"])
	}
	var rep map[string]any
	json.Unmarshal([]byte(r.ok("gc", "--json")), &rep)
	if rep["freed_bytes"].(float64) < 1<<20 {
		t.Fatalf("gc freed %v", rep["freed_bytes"])
	}
	r.ok("fsck", "--read-data")
	r.ok("rm", "home:/f.bin")
	time.Sleep(5 * time.Millisecond)
	json.Unmarshal([]byte(r.ok("gc", "--json")), &rep)
	if rep["trash_purged"].(float64) != 1 || rep["freed_bytes"].(float64) < 1<<20 {
		t.Fatalf("gc after rm = %v", rep)
	}
	var st map[string]any
	json.Unmarshal([]byte(r.ok("stats", "--json")), &st)
	if st["chunks"].(float64) != 0 {
		t.Fatalf("stats after everything was collected = %v", st)
	}
}

func TestBadInput(t *testing.T) {
	r := newRealm(t)
	src := filepath.Join(t.TempDir(), "f.bin")
	writeFile(t, src, randBytes(200<<10), 0o644)
	putJSON(t, r, src, "home:/")

	r.fails(cli.ExitNotFound, "ls", "nope:/")
	res := r.fails(cli.ExitUsage, "ls", "home:/a/../b")
	if !strings.Contains(res.stderr, `".."`) {
		t.Errorf("traversal error does not explain: %s", res.stderr)
	}
	r.fails(cli.ExitUsage, "put", src, "/not/cairn")
	r.fails(cli.ExitUsage, "get", "home:/f.bin")
	r.fails(cli.ExitUsage, "put", "--no-such-flag", src, "home:/")
	r.fails(cli.ExitNotFound, "cat", "home:/missing")
	r.fails(cli.ExitNotFound, "put", "/no/such/file", "home:/")
	r.fails(cli.ExitExist, "init", "--no-passphrase")
	if res2 := r.fails(cli.ExitError, "ls", "home:/f.bin/x"); res2.stderr == "" {
		t.Error("no message")
	}

	// etcd unreachable: a clear error, quickly.
	start := time.Now()
	res = r.runEnv([]string{"CAIRN_ETCD=127.0.0.1:1"}, "ls")
	if res.code != cli.ExitUnavailable || !strings.Contains(res.stderr, "127.0.0.1:1") {
		t.Fatalf("unreachable etcd: exit %d, stderr %s", res.code, res.stderr)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("unreachable etcd took %v to report", d)
	}
}

func TestWrongPassphrase(t *testing.T) {
	home := filepath.Join(t.TempDir(), "realm")
	r := &realmT{t: t, home: home}
	r.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+home, "CAIRN_ETCD_LINGER=300ms")
	t.Cleanup(func() { etcdsvc.StopDaemon(home) })
	if res := r.runEnv([]string{"CAIRN_PASSPHRASE=right one"}, "init"); res.code != 0 {
		t.Fatalf("init: %+v", res)
	}
	src := filepath.Join(t.TempDir(), "f")
	writeFile(t, src, []byte("secret"), 0o644)
	if res := r.runEnv([]string{"CAIRN_PASSPHRASE=right one"}, "put", src, "home:/"); res.code != 0 {
		t.Fatalf("put: %+v", res)
	}
	res := r.runEnv([]string{"CAIRN_PASSPHRASE=wrong"}, "cat", "home:/f")
	if res.code != cli.ExitPermission || !strings.Contains(res.stderr, "wrong passphrase") || res.stdout != "" {
		t.Fatalf("wrong passphrase: %+v", res)
	}
	// Listing needs no key, so no passphrase.
	if res := r.runEnv([]string{"CAIRN_PASSPHRASE=wrong"}, "ls"); res.code != 0 || res.stdout != "f\n" {
		t.Fatalf("ls with wrong passphrase: %+v", res)
	}
	// The keyring file holds no plaintext key material we can spot.
	kr := mustRead(t, filepath.Join(home, "keyring"))
	if !bytes.Contains(kr, []byte(`"protection": "passphrase"`)) {
		t.Fatalf("keyring not sealed: %s", kr)
	}
}

func TestTwoCommandsAtOnce(t *testing.T) {
	r := newRealm(t)
	dirs := []string{}
	for i := 0; i < 2; i++ {
		d := filepath.Join(t.TempDir(), fmt.Sprintf("d%d", i))
		for j := 0; j < 50; j++ {
			writeFile(t, filepath.Join(d, fmt.Sprintf("f%d", j)), randBytes(20000), 0o644)
		}
		dirs = append(dirs, d)
	}
	// Stop the daemon so both commands race to start it.
	etcdsvc.StopDaemon(r.home)
	errs := make(chan result, 2)
	for _, d := range dirs {
		go func(d string) { errs <- r.run("put", "-q", d, "home:/") }(d)
	}
	for i := 0; i < 2; i++ {
		if res := <-errs; res.code != 0 {
			t.Fatalf("concurrent put: %+v", res)
		}
	}
	for _, d := range []string{"d0", "d1"} {
		if out := r.ok("ls", "home:/"+d); strings.Count(out, "\n") != 50 {
			t.Fatalf("%s has %d entries", d, strings.Count(out, "\n"))
		}
	}
	r.ok("fsck", "--read-data")
}

// TestPutWhileGC runs garbage collections in other processes while a put
// writes many files, and rewrites files whose old versions gc collects:
// nothing committed may lose a chunk.
func TestPutWhileGC(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--keep", "1")
	src := filepath.Join(t.TempDir(), "many")
	for i := 0; i < 120; i++ {
		writeFile(t, filepath.Join(src, fmt.Sprintf("f%03d", i)), randBytes(40<<10), 0o644)
	}
	putJSON(t, r, src, "home:/") // version 1 of every file
	// Version 2 shares half of each file with version 1; gc runs meanwhile
	// and collects what only version 1 used.
	for i := 0; i < 120; i++ {
		p := filepath.Join(src, fmt.Sprintf("f%03d", i))
		b := mustRead(t, p)
		copy(b[20<<10:], randBytes(20<<10))
		writeFile(t, p, b, 0o644)
	}
	done := make(chan result, 1)
	go func() { done <- r.run("put", "-q", src, "home:/") }()
	gcs := 0
	for running := true; running; {
		select {
		case res := <-done:
			if res.code != 0 {
				t.Fatalf("put during gc: %+v", res)
			}
			running = false
		default:
			if res := r.run("gc"); res.code != 0 && res.code != cli.ExitConflict {
				t.Fatalf("gc during put: %+v", res)
			}
			gcs++
		}
	}
	t.Logf("%d garbage collections ran during the put", gcs)
	r.ok("gc")
	r.ok("fsck", "--read-data")
	for i := 0; i < 120; i += 17 {
		name := fmt.Sprintf("f%03d", i)
		if got := r.ok("cat", "home:/many/"+name); got != string(mustRead(t, filepath.Join(src, name))) {
			t.Fatalf("%s differs after put during gc; versions: %s", name, r.ok("versions", "home:/many/"+name))
		}
	}
}

// TestDamagedStore damages the local store on disk, as a failing disk would,
// and checks that reads and fsck name the damage and exit 5, that fsck
// names the damaged file, and that the other file still reads.
func TestDamagedStore(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	good, bad := randBytes(100<<10), randBytes(1<<20)
	writeFile(t, filepath.Join(src, "good.bin"), good, 0o644)
	putJSON(t, r, filepath.Join(src, "good.bin"), "home:/")
	writeFile(t, filepath.Join(src, "bad.bin"), bad, 0o644)
	putJSON(t, r, filepath.Join(src, "bad.bin"), "home:/")
	// The newest pack holds bad.bin's chunks: flip bytes in its middle.
	packs, _ := filepath.Glob(filepath.Join(r.home, "store", "packs", "*.pack"))
	if len(packs) == 0 {
		t.Fatal("no pack files found")
	}
	var newest string
	var newestTime time.Time
	for _, p := range packs {
		if st, err := os.Stat(p); err == nil && st.Size() > 500<<10 && st.ModTime().After(newestTime) {
			newest, newestTime = p, st.ModTime()
		}
	}
	if newest == "" {
		t.Fatalf("no pack large enough among %v", packs)
	}
	f, err := os.OpenFile(newest, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	buf := make([]byte, 64)
	off := st.Size() / 2
	f.ReadAt(buf, off)
	for i := range buf {
		buf[i] ^= 0x5a
	}
	f.WriteAt(buf, off)
	f.Close()

	res := r.fails(cli.ExitDamaged, "cat", "home:/bad.bin")
	if !strings.Contains(res.stderr, "corrupt") || !strings.Contains(res.stderr, "bad.bin") {
		t.Errorf("cat of a damaged file says: %s", res.stderr)
	}
	if got := r.ok("cat", "home:/good.bin"); got != string(good) {
		t.Error("undamaged file changed")
	}
	res = r.fails(cli.ExitDamaged, "fsck", "--read-data")
	if !strings.Contains(res.stdout, "DAMAGED home:/bad.bin") || strings.Contains(res.stdout, "good.bin") {
		t.Errorf("fsck output:\n%s", res.stdout)
	}
	// get refuses to write the damaged file and leaves no partial file.
	dst := filepath.Join(t.TempDir(), "out.bin")
	r.fails(cli.ExitDamaged, "get", "home:/bad.bin", dst)
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("get left %s behind: %v", dst, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".cairn-get-*")); len(left) > 0 {
		t.Errorf("get left temporary files: %v", left)
	}
}
