package mount_test

// Real programs on the mount (issue 4, item 4): git, tar, go build,
// sqlite3 and an editor's save pattern, each run as a separate process
// against a mounted volume and checked against what it does on local disk.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
)

// needProgram returns the path of program name, installed by Debian
// package pkg. Without it the test is skipped, except under CI (CI set),
// where scripts/test-deps.sh installs it and its absence is a failure.
func needProgram(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s is not installed (Debian package %s; scripts/test-deps.sh installs it): %v", name, pkg, err)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// progEnv is a small, fixed environment for the programs: no user
// configuration (HOME is a fresh directory), C locale, UTC.
func progEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + t.TempDir(),
		"LC_ALL=C",
		"TZ=UTC",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=Cairn Test", "GIT_AUTHOR_EMAIL=test@cairn.invalid",
		"GIT_COMMITTER_NAME=Cairn Test", "GIT_COMMITTER_EMAIL=test@cairn.invalid",
	}
	return append(env, extra...)
}

// run runs a program in dir with env and returns its standard output; a
// failure (or a run longer than two minutes) fails the test with the
// program's output.
//
// The program is started through /bin/sh, which changes to dir and execs
// it: this test process serves the mount, and a child it forks must not
// touch the mount before its exec (a chdir into it, or the exec of a
// binary on it). Go forks with vfork, and until the child execs, the
// forking thread holds its P: a garbage collection then cannot stop the
// world, no goroutine answers the kernel, and the child waits forever
// (bazil/fuse issue 264, golang/go issue 21014). It happened here, and a
// loop of exec.Command(script on the mount).Run() with runtime.GC in
// another goroutine hangs within seconds: the child sits in execve ->
// fuse_send_open, the forking thread in clone, a GC worker in "stopping
// the world", and the go-fuse goroutine that has read the OPEN is
// runnable without a P. (Not the kernel: the serving process never calls
// execve itself.) The child holds a copy of the /dev/fuse descriptor, so
// killing the test leaves it stuck, unkillable, until the connection is
// aborted (echo 1 > /sys/fs/fuse/connections/N/abort, fusectl mounted).
func run(t *testing.T, dir string, env []string, stdin string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if dir == "" {
		dir = "/"
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", `cd "$0" && exec "$@"`, dir, name}, args...)...)
	cmd.Dir, cmd.Env = "/", env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	t.Logf("%.2fs %s %s", time.Since(t0).Seconds(), name, strings.Join(args, " "))
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), dir, err, out.String(), errb.String())
	}
	return out.String()
}

// treeFile is one entry of a directory tree as compareTrees sees it.
type treeFile struct {
	mode   fs.FileMode
	size   int64
	mtime  time.Time
	target string // symlinks
	data   []byte // regular files
}

// readTree reads every entry under root (not root itself), skipping the
// names in skip (at any depth).
func readTree(t *testing.T, root string, skip ...string) map[string]treeFile {
	t.Helper()
	out := map[string]treeFile{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if slices.Contains(skip, d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		tf := treeFile{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if tf.target, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if tf.data, err = os.ReadFile(p); err != nil {
				return err
			}
		}
		out[rel] = tf
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

// compareTrees fails the test for every difference between the trees at
// want (local disk) and got (the mount): names, types, permission bits,
// sizes, bytes, symlink targets, and with mtimes, modification times.
func compareTrees(t *testing.T, want, got string, mtimes bool, skip ...string) int {
	t.Helper()
	w, g := readTree(t, want, skip...), readTree(t, got, skip...)
	bad := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for name, wf := range w {
		gf, ok := g[name]
		switch {
		case !ok:
			fail("%s: missing on the mount", name)
		case gf.mode != wf.mode:
			fail("%s: mode %v on the mount, %v on local disk", name, gf.mode, wf.mode)
		case wf.mode.IsRegular() && gf.size != wf.size:
			fail("%s: size %d on the mount, %d on local disk", name, gf.size, wf.size)
		case !bytes.Equal(gf.data, wf.data):
			fail("%s: content differs (%d bytes on the mount, %d on local disk)", name, len(gf.data), len(wf.data))
		case gf.target != wf.target:
			fail("%s: symlink to %q on the mount, %q on local disk", name, gf.target, wf.target)
		case mtimes && !wf.mode.IsDir() && !gf.mtime.Equal(wf.mtime):
			fail("%s: mtime %v on the mount, %v on local disk", name, gf.mtime, wf.mtime)
		}
	}
	for name := range g {
		if _, ok := w[name]; !ok {
			fail("%s: on the mount only", name)
		}
	}
	if bad > 20 {
		t.Errorf("... %d differences in all", bad)
	}
	if len(w) == 0 {
		t.Fatalf("%s is empty: nothing compared", want)
	}
	return len(w)
}

// sourceLike returns n bytes of text that looks like source code
// (compressible, with long repeated runs, as real trees have).
func sourceLike(r *rand.Rand, n int) []byte {
	words := []string{"func", "return", "if", "err", "nil", "for", "range", "package", "import", "var", "x", "y", "ctx", "context.Context", "string", "int64", "{", "}", "(", ")", ":=", "=", "//", "the", "a", "file", "mount"}
	var b bytes.Buffer
	for b.Len() < n {
		for i := r.IntN(12); i > 0; i-- {
			b.WriteString(words[r.IntN(len(words))])
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d\n", r.IntN(100000))
	}
	return b.Bytes()[:n]
}

// makeGitRepo makes a repository on local disk with files in nested
// directories (an executable and a symlink among them) and commits
// commits of them, each adding, changing, removing and renaming files.
func makeGitRepo(t *testing.T, env []string, files, commits int) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	r := rand.New(rand.NewPCG(4, 4))
	run(t, "", env, "", "git", "init", "-q", "-b", "main", src)
	var names []string
	write := func(name string, size int) {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, sourceLike(r, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	newName := func(i int) string {
		return fmt.Sprintf("pkg%02d/sub%d/file%04d.go", r.IntN(20), r.IntN(3), i)
	}
	for i := 0; i < files; i++ {
		name := newName(i)
		size := 200 + r.IntN(4000)
		if i%50 == 0 {
			size = 64 << 10 // a few larger files, several chunks each
		}
		write(name, size)
		names = append(names, name)
	}
	if err := os.WriteFile(filepath.Join(src, "build.sh"), []byte("#!/bin/sh\necho built\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("pkg00", filepath.Join(src, "current")); err != nil {
		t.Fatal(err)
	}
	for c := 1; c <= commits; c++ {
		if c > 1 {
			for i := 0; i < 20; i++ { // change
				write(names[r.IntN(len(names))], 200+r.IntN(4000))
			}
			for i := 0; i < 10; i++ { // add
				name := newName(files + c*100 + i)
				write(name, 200+r.IntN(4000))
				names = append(names, name)
			}
			for i := 0; i < 5; i++ { // remove
				k := r.IntN(len(names))
				os.Remove(filepath.Join(src, names[k]))
				names = slices.Delete(names, k, k+1)
			}
			for i := 0; i < 3; i++ { // rename
				k := r.IntN(len(names))
				to := newName(files + c*100 + 50 + i)
				os.MkdirAll(filepath.Dir(filepath.Join(src, to)), 0o755)
				if err := os.Rename(filepath.Join(src, names[k]), filepath.Join(src, to)); err != nil {
					t.Fatal(err)
				}
				names[k] = to
			}
		}
		run(t, src, env, "", "git", "add", "-A")
		date := fmt.Sprintf("GIT_AUTHOR_DATE=2025-01-%02dT12:00:00Z", c)
		run(t, src, append(env, date, "GIT_COMMITTER_"+date[len("GIT_AUTHOR_"):]), "", "git", "commit", "-q", "-m", fmt.Sprintf("commit %d", c))
	}
	// Packed, as repositories are once they have some history.
	run(t, src, env, "", "git", "gc", "-q")
	return src
}

// TestProgramGit: git clone of a local repository (a few hundred files,
// several commits) into the mount; the work tree equals the source's,
// git status is clean, git log is the source's, git fsck finds nothing;
// a commit made on the mount, a gc, and a remount keep it so.
// programModes are the modes the programs' tests run in: blocking (the
// default) and write-back, whose pending creates and attribute changes
// the programs must not see (and another device must see afterwards).
var programModes = []struct {
	name string
	o    mount.Options
}{{"blocking", mount.Options{}}, {"write-back", mount.Options{Mode: mount.WriteBack}}}

// seenElsewhere checks that another device (a blocking mount of f's
// volume) sees rel as it is at want, once f's queued commits are done.
func (f *fixture) seenElsewhere(want, rel string, mtimes bool, skip ...string) {
	f.t.Helper()
	f.syncDir("") // the changes pending in write-back mode
	f.waitPending(time.Minute)
	d := f.device(mount.Options{}, meta.Options{})
	compareTrees(f.t, want, d.path(rel), mtimes, skip...)
}

func TestProgramGit(t *testing.T) {
	for _, mode := range programModes {
		t.Run(mode.name, func(t *testing.T) { testProgramGit(t, mode.o) })
	}
}

func testProgramGit(t *testing.T, o mount.Options) {
	needProgram(t, "git", "git")
	f := newFixture(t, o)
	env := progEnv(t)
	src := makeGitRepo(t, env, 300, 5)
	dst := f.path("clone")
	before := f.rpcs.snapshot()
	run(t, f.mnt, env, "", "git", "clone", "-q", src, dst)
	f.logRequests("git clone", before, 300)

	n := compareTrees(t, src, dst, false, ".git")
	if n < 300 {
		t.Fatalf("compared %d entries, want the repository's 300 files and their directories", n)
	}
	// Not checked here: git diff-files (stat data unchanged since the
	// checkout). git records a file's stat data with fstat before its
	// close, and the commit at close sets the entry's ctime to the commit
	// time, so a file whose close crosses a second boundary lists (NFS
	// does the same; git status re-reads such a file and finds it clean).
	if st := run(t, dst, env, "", "git", "status", "--porcelain", "--untracked-files=all"); st != "" {
		t.Fatalf("git status after clone is not clean:\n%s", st)
	}
	logFmt := []string{"log", "--format=%H %an %ad %s", "--date=iso-strict", "main"}
	want := run(t, src, env, "", "git", logFmt...)
	if got := run(t, dst, env, "", "git", logFmt...); got != want || strings.Count(got, "\n") != 5 {
		t.Fatalf("git log on the mount:\n%s\nin the source:\n%s", got, want)
	}
	run(t, dst, env, "", "git", "fsck", "--full", "--strict", "--no-progress")
	f.seenElsewhere(src, "clone", false, ".git")

	// Work on the mount: change, add, commit; then gc (repacks, removes
	// loose objects, renames over its lock files) and check again.
	if err := os.WriteFile(filepath.Join(dst, "build.sh"), []byte("#!/bin/sh\necho built on the mount\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "NEW"), []byte("new file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := run(t, dst, env, "", "git", "status", "--porcelain"); st != " M build.sh\n?? NEW\n" {
		t.Fatalf("git status after two edits:\n%s", st)
	}
	run(t, dst, env, "", "git", "add", "-A")
	run(t, dst, env, "", "git", "commit", "-q", "-m", "on the mount")
	run(t, dst, env, "", "git", "gc", "-q")
	if st := run(t, dst, env, "", "git", "status", "--porcelain", "--untracked-files=all"); st != "" {
		t.Fatalf("git status after commit and gc is not clean:\n%s", st)
	}
	head := run(t, dst, env, "", "git", "log", "-1", "--format=%s")

	// git status refreshed the index: every file's stat data as the
	// mount shows it now. A remount shows the same (diff-files does not
	// refresh: it lists every file whose inode, size, mtime or ctime
	// differ from the index).
	f.mountAgain(o)
	if df := run(t, dst, env, "", "git", "diff-files", "--name-only"); df != "" {
		t.Fatalf("git diff-files after remount (stat data not kept):\n%s", df)
	}
	if st := run(t, dst, env, "", "git", "status", "--porcelain", "--untracked-files=all"); st != "" {
		t.Fatalf("git status after remount is not clean:\n%s", st)
	}
	if got := run(t, dst, env, "", "git", "log", "-1", "--format=%s"); got != head || head != "on the mount\n" {
		t.Fatalf("last commit after remount %q, before %q", got, head)
	}
	if got := run(t, dst, env, "", "git", "rev-list", "--count", "HEAD"); got != "6\n" {
		t.Fatalf("commits after remount: %s", got)
	}
	run(t, dst, env, "", "git", "fsck", "--full", "--strict", "--no-progress")
}

// tarSource makes a tarball of a real source tree (Go's own net package,
// in every Go installation, so no network) plus what such trees also
// hold: a symlink, an executable, an empty file and directory, and a file
// with an old mtime.
func tarSource(t *testing.T, env []string) string {
	t.Helper()
	extra := filepath.Join(t.TempDir(), "extra")
	for _, d := range []string{"extra/empty-dir", "extra/bin"} {
		if err := os.MkdirAll(filepath.Join(extra, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(extra, "extra/bin/run.sh"), []byte("#!/bin/sh\nexit 0\n"), 0o755))
	must(os.WriteFile(filepath.Join(extra, "extra/empty"), nil, 0o600))
	old := filepath.Join(extra, "extra/old.txt")
	must(os.WriteFile(old, []byte("written long ago\n"), 0o444))
	when := time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC)
	must(os.Chtimes(old, when, when))
	must(os.Symlink("bin/run.sh", filepath.Join(extra, "extra/run")))
	big := make([]byte, 3<<20) // several chunks, incompressible
	rand.NewChaCha8([32]byte{1}).Read(big)
	must(os.WriteFile(filepath.Join(extra, "extra/big.bin"), big, 0o644))

	tarball := filepath.Join(t.TempDir(), "src.tar")
	goroot := filepath.Join(runtime.GOROOT(), "src")
	if _, err := os.Stat(filepath.Join(goroot, "net", "net.go")); err != nil {
		t.Fatalf("Go's source tree is not installed: %v", err)
	}
	run(t, "", env, "", "tar", "-cf", tarball, "-C", goroot, "net", "-C", extra, "extra")
	return tarball
}

// TestProgramTar: tar x of a source tree into the mount gives the same
// tree, byte for byte, with the same modes and mtimes, as on local disk.
func TestProgramTar(t *testing.T) {
	for _, mode := range programModes {
		t.Run(mode.name, func(t *testing.T) { testProgramTar(t, mode.o) })
	}
}

func testProgramTar(t *testing.T, o mount.Options) {
	needProgram(t, "tar", "tar")
	f := newFixture(t, o)
	env := progEnv(t)
	tarball := tarSource(t, env)
	local := t.TempDir()
	run(t, local, env, "", "tar", "-xf", tarball)
	if err := os.Mkdir(f.path("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	before := f.rpcs.snapshot()
	run(t, f.path("x"), env, "", "tar", "-xf", tarball)
	f.logRequests("tar -xf", before, countFiles(t, local))
	if n := compareTrees(t, local, f.path("x"), true); n < 400 {
		t.Fatalf("compared %d entries, want Go's net package (400+ files)", n)
	}
	// tar's own check: every member compared with what is on the mount.
	if out := run(t, f.path("x"), env, "", "tar", "--compare", "-f", tarball); out != "" {
		t.Fatalf("tar --compare on the mount:\n%s", out)
	}
	f.seenElsewhere(local, "x", true)
	// And after a remount.
	f.mountAgain(o)
	compareTrees(t, local, f.path("x"), true)
}

// TestProgramGoBuild: go build of a small module (two packages, no
// dependencies) whose sources, go command work directory and output are on
// the mount; the binary runs from the mount. The build cache stays on
// local disk: a cold one compiles the runtime and fmt (10-15 s here), so
// it is kept between runs under the user's cache directory.
func TestProgramGoBuild(t *testing.T) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = needProgram(t, "go", "golang-go")
	}
	f := newFixture(t, mount.Options{})
	cacheRoot, err := os.UserCacheDir()
	if err != nil {
		cacheRoot = os.TempDir()
	}
	gocache := filepath.Join(cacheRoot, "cairn-test", "gocache-mount")
	if merr := os.MkdirAll(gocache, 0o755); merr != nil {
		t.Fatal(merr)
	}
	mod := f.path("hello")
	work := f.path("gowork") // the go command's $WORK: objects, link output
	for _, d := range []string{mod + "/greet", work} {
		if merr := os.MkdirAll(d, 0o755); merr != nil {
			t.Fatal(merr)
		}
	}
	// A value new in every run: the packages compile from the mount every
	// time instead of coming from the build cache.
	stamp := fmt.Sprint(time.Now().UnixNano())
	files := map[string]string{
		"go.mod": "module example.com/hello\n\ngo 1.21\n",
		"greet/greet.go": `package greet

import "strings"

// Stamp is new in every test run.
const Stamp = "` + stamp + `"

func Hello(name string) string { return "hello, " + strings.ToUpper(name) }
`,
		"main.go": `package main

import (
	"fmt"
	"os"

	"example.com/hello/greet"
)

func main() {
	fmt.Println(greet.Hello(os.Args[1]), greet.Stamp)
}
`,
	}
	for name, text := range files {
		if werr := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); werr != nil {
			t.Fatal(werr)
		}
	}
	env := progEnv(t, "GOCACHE="+gocache, "GOPATH="+t.TempDir(), "GOTMPDIR="+work,
		"GOFLAGS=", "GOPROXY=off", "GOTOOLCHAIN=local", "CGO_ENABLED=0", "GOWORK=off")
	run(t, mod, env, "", goBin, "build", "-o", "hello", ".")
	got := run(t, mod, env, "", filepath.Join(mod, "hello"), "mount")
	if want := "hello, MOUNT " + stamp + "\n"; got != want {
		t.Fatalf("the binary built on the mount printed %q, want %q", got, want)
	}
	fi, err := os.Stat(filepath.Join(mod, "hello"))
	if err != nil || fi.Mode().Perm()&0o100 == 0 || fi.Size() < 1<<20 {
		t.Fatalf("built binary: %v, %v", fi, err)
	}
	// go vet reads the sources again (and writes its own files to $WORK).
	run(t, mod, env, "", goBin, "vet", "./...")
	// The go command removed its work directory.
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("the go command left %d entries in its work directory on the mount", len(left))
	}
}

// sqliteCheck is what the queries of TestProgramSQLite must print.
type sqliteCheck struct{ rows, sumN, distinctK, lenV int }

// TestProgramSQLite: a database written by the sqlite3 CLI (rollback
// journal, many transactions in several processes, one rolled back, an
// update, a delete, a vacuum) reads back right, passes integrity_check,
// and is all there after unmount and remount; so is one in WAL mode.
func TestProgramSQLite(t *testing.T) {
	needProgram(t, "sqlite3", "sqlite3")
	f := newFixture(t, mount.Options{})
	env := progEnv(t)
	dir := f.path("db")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const perTx, txs = 500, 10
	batch := func(first int) string {
		var b strings.Builder
		for i := first; i < first+txs; i++ {
			fmt.Fprintf(&b, "BEGIN;\nWITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < %d)\n"+
				"INSERT INTO t(k, v, n) SELECT 'key-' || (x + %d), printf('%%0200d', x * 7919 + %d), x FROM c;\nCOMMIT;\n", perTx, i*perTx, i)
		}
		return b.String()
	}
	schema := "PRAGMA journal_mode=DELETE;\nCREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT UNIQUE, v TEXT, n INTEGER);\nCREATE INDEX t_n ON t(n);\n"
	run(t, dir, env, schema+batch(0), "sqlite3", "-bail", "test.db")
	if _, err := os.Stat(filepath.Join(dir, "test.db-journal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the rollback journal is still there after the last commit: %v", err)
	}
	more := batch(txs) +
		"BEGIN; INSERT INTO t(k, v, n) VALUES ('rolled-back', 'x', 1000000); ROLLBACK;\n" +
		"BEGIN; UPDATE t SET n = n + 1 WHERE n % 100 = 0; DELETE FROM t WHERE k LIKE 'key-%77'; COMMIT;\n" +
		"VACUUM;\n"
	run(t, dir, env, more, "sqlite3", "-bail", "test.db")

	// Expected: 20 transactions of rows n = 1..500; n%100 == 0 bumped by
	// one; rows whose key ends in 77 deleted.
	var want sqliteCheck
	for i := 0; i < 2*txs; i++ {
		for x := 1; x <= perTx; x++ {
			if strings.HasSuffix(fmt.Sprint(x+i*perTx), "77") {
				continue
			}
			n := x
			if n%100 == 0 {
				n++
			}
			want.rows++
			want.sumN += n
			want.distinctK++
			want.lenV += 200
		}
	}
	query := "SELECT count(*), sum(n), count(DISTINCT k), sum(length(v)) FROM t WHERE k LIKE 'key-%';\n" +
		"SELECT count(*) FROM t WHERE k = 'rolled-back';\n" +
		"SELECT v FROM t WHERE k = 'key-4321';\n" +
		"PRAGMA integrity_check;\n"
	wantOut := fmt.Sprintf("%d|%d|%d|%d\n0\n%0200d\nok\n", want.rows, want.sumN, want.distinctK, want.lenV, (4321-8*perTx)*7919+8)
	if got := run(t, dir, env, query, "sqlite3", "-bail", "test.db"); got != wantOut {
		t.Fatalf("queries on the mount printed\n%s\nwant\n%s", got, wantOut)
	}
	// Write-ahead logging: the -wal file, and the -shm index that every
	// sqlite3 process maps shared.
	walBatch := "BEGIN; WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000) INSERT INTO w(n) SELECT x FROM c; COMMIT;\n"
	if got := run(t, dir, env, "PRAGMA journal_mode=WAL;\nCREATE TABLE w(n INTEGER);\n"+walBatch+walBatch, "sqlite3", "-bail", "wal.db"); got != "wal\n" {
		t.Fatalf("journal_mode=WAL printed %q", got)
	}
	walQuery := "SELECT count(*), sum(n) FROM w;\nPRAGMA integrity_check;\n"
	if got := run(t, dir, env, walBatch+walQuery, "sqlite3", "-bail", "wal.db"); got != "3000|1501500\nok\n" {
		t.Fatalf("WAL database: %q", got)
	}

	f.mountAgain(mount.Options{})
	if got := run(t, dir, env, query, "sqlite3", "-bail", "test.db"); got != wantOut {
		t.Fatalf("queries after remount printed\n%s\nwant\n%s", got, wantOut)
	}
	if got := run(t, dir, env, walQuery, "sqlite3", "-bail", "wal.db"); got != "3000|1501500\nok\n" {
		t.Fatalf("WAL database after remount: %q", got)
	}
	// The same file through the file layer, as another device reads it.
	db := f.cat("db/test.db")
	if !bytes.HasPrefix(db, []byte("SQLite format 3\x00")) || len(db)%4096 != 0 {
		t.Fatalf("the committed database: %d bytes, header %q", len(db), db[:min(16, len(db))])
	}
}

// saveByRename is an editor's save: the new content goes to a temporary
// file in the same directory, which is synced, given the original's mode,
// and renamed over the original; then the directory is synced.
func saveByRename(path string, content []byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, werr := tmp.Write(content); werr != nil {
		return werr
	}
	if cerr := tmp.Chmod(fi.Mode().Perm()); cerr != nil {
		return cerr
	}
	if serr := tmp.Sync(); serr != nil {
		return serr
	}
	if cerr := tmp.Close(); cerr != nil {
		return cerr
	}
	if rerr := os.Rename(tmp.Name(), path); rerr != nil {
		return rerr
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// TestProgramEditorSave: the write-temporary, fsync, rename-over save of
// editors, in Go and by sed -i, vim and ed when installed. The saved file
// has the new content and the old mode, on the mount and in the metadata;
// a reader that opened the old file keeps reading it.
func TestProgramEditorSave(t *testing.T) {
	f := newFixture(t, mount.Options{})
	env := progEnv(t)
	p := f.path("notes.txt")
	if err := os.WriteFile(p, []byte("first line\nsecond line\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	ino := func() uint64 {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Nlink != 1 {
			t.Fatalf("nlink %d", st.Nlink)
		}
		return st.Ino
	}
	// check verifies the content and mode after a save, and that the save
	// made a new file (renamed over the old) or wrote the old one in place.
	last := ino()
	check := func(who, want string, renamed bool) {
		t.Helper()
		if got := string(f.readMount("notes.txt")); got != want {
			t.Fatalf("after %s's save, the mount reads %q, want %q", who, got, want)
		}
		if got := string(f.cat("notes.txt")); got != want {
			t.Fatalf("after %s's save, the metadata's version is %q, want %q", who, got, want)
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
			t.Fatalf("after %s's save: mode %v, %v", who, fi.Mode(), err)
		}
		ents, err := os.ReadDir(f.mnt)
		if err != nil || len(ents) != 1 || ents[0].Name() != "notes.txt" {
			t.Fatalf("after %s's save the directory holds %v, %v (a temporary file left?)", who, ents, err)
		}
		now := ino()
		if renamed == (now == last) {
			t.Fatalf("after %s's save the inode is %d, before %d: want a new file %v", who, now, last, renamed)
		}
		if e := f.entry("notes.txt"); e.Ino != now {
			t.Fatalf("after %s's save the metadata's inode is %d, stat's %d", who, e.Ino, now)
		}
		last = now
	}

	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := saveByRename(p, []byte("first line\nsecond line, edited\n")); err != nil {
		t.Fatalf("save by rename: %v", err)
	}
	check("Go", "first line\nsecond line, edited\n", true)
	if b := make([]byte, 64); true {
		k, _ := old.ReadAt(b, 0)
		if string(b[:k]) != "first line\nsecond line\n" {
			t.Fatalf("a descriptor opened before the save reads %q", b[:k])
		}
	}
	old.Close()

	// GNU sed -i: a temporary file in the same directory, renamed over.
	run(t, f.mnt, env, "", needProgram(t, "sed", "sed"), "-i", "s/first/1st/", "notes.txt")
	check("sed -i", "1st line\nsecond line, edited\n", true)

	if _, err := exec.LookPath("vim"); err == nil {
		// vim with backupcopy=no renames the original to a backup, writes
		// a new file, fsyncs and chmods it, then removes the backup
		// (backupskip cleared: by default it skips files under /tmp).
		run(t, f.mnt, env, "", "vim", "-es", "-u", "NONE", "-i", "NONE", "-n",
			"-c", "set backupcopy=no writebackup nobackup backupskip= fsync", "-c", "%s/second/2nd/", "-c", "wq", "notes.txt")
		check("vim", "1st line\n2nd line, edited\n", true)
	} else {
		t.Log("vim not installed: its save not tried")
	}
	if _, err := exec.LookPath("ed"); err == nil {
		// ed writes in place: truncate and write.
		run(t, f.mnt, env, ",s/line/LINE/\nw\nq\n", "ed", "-s", "notes.txt")
		check("ed", "1st LINE\n2nd LINE, edited\n", false)
	} else {
		t.Log("ed not installed: its save not tried")
	}
}
