package meta_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
)

// offlineDevice is device B: its own Service over a cut proxy, with a
// local copy of volume home and an offline log.
type offlineDevice struct {
	s     *meta.Service
	v     *meta.Vol
	root  *meta.Entry
	proxy *etcdtest.CutProxy
	log   *meta.OfflineLog
	dir   string
}

func newOfflineDevice(t *testing.T, a *meta.Service) *offlineDevice {
	t.Helper()
	ctx := context.Background()
	p := etcdtest.NewCutProxy(t, a.Client().Endpoints()[0])
	cli, err := etcdtest.NewClient(p.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	s, err := meta.New(cli, meta.Options{LockTTL: 2 * time.Second, OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	v, err := s.Open(ctx, "home")
	if err != nil {
		t.Fatal(err)
	}
	root, err := v.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lc := meta.OpenLocalCopy(filepath.Join(dir, v.V.ID), v.V, nil)
	lc.BeginReplace()
	ents, rev, err := v.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lc.Replace(ents, rev)
	v.UseLocalCopy(lc)
	d := &offlineDevice{s: s, v: v, root: root, proxy: p, dir: dir}
	d.openLog(t)
	return d
}

func (d *offlineDevice) openLog(t *testing.T) {
	t.Helper()
	l, err := meta.OpenOfflineLog(context.Background(), meta.OfflineLogDir(d.dir, d.v.V.ID), meta.OfflineLogOptions{Device: "laptopB"})
	if err != nil {
		t.Fatal(err)
	}
	d.log = l
	d.v.UseOfflineLog(l)
	t.Cleanup(func() { l.Close() })
}

// goOffline cuts the link and waits until the Service says it is offline.
func (d *offlineDevice) goOffline(t *testing.T) {
	t.Helper()
	d.proxy.Cut()
	d.v.Get(context.Background(), meta.RootIno, "no such name") // fails: the Service finds it offline
	if _, off := d.s.Offline(); !off {
		t.Fatal("device B not offline after its link was cut")
	}
}

func (d *offlineDevice) goOnline(t *testing.T) {
	t.Helper()
	d.proxy.Restore()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, off := d.s.Offline(); !off {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("device B still offline 20 s after its link came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func manifest(m byte) cairn.ID {
	var id cairn.ID
	id[0] = m
	return id
}

// offCommit commits content m as name in dir on device B (offline).
func offCommit(t *testing.T, v *meta.Vol, dir *meta.Entry, name string, m byte) *meta.Entry {
	t.Helper()
	e, _, err := v.CommitVersion(context.Background(), dir, name, meta.Commit{Version: meta.Version{Manifest: manifest(m), Size: int64(m)}, Mode: 0o644})
	if err != nil {
		t.Fatalf("offline commit %s: %v", name, err)
	}
	return e
}

func mustGet(t *testing.T, v *meta.Vol, parent uint64, name string) *meta.Entry {
	t.Helper()
	e, err := v.Get(context.Background(), parent, name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return e
}

func absent(t *testing.T, v *meta.Vol, parent uint64, name string) {
	t.Helper()
	if e, err := v.Get(context.Background(), parent, name); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("%s: %+v, %v; want absent", name, e, err)
	}
}

func curManifest(e *meta.Entry) byte {
	if c := e.Current(); c != nil {
		return c.Manifest[0]
	}
	return 0
}

// TestOfflineWritesReplay: device B takes changes offline (each case of
// doc/offline.md's rules), device A changes some of the same things
// meanwhile, and B's replay lands what did not conflict as if made
// online and keeps both sides of what did.
func TestOfflineWritesReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sa, va, root := newVolRoot(t, 0)
	for i, n := range []string{"a", "b", "c", "d", "f", "g"} {
		commit(t, sa, va, root, n, 1, byte(10+i))
	}
	mk := func(parent *meta.Entry, name string) *meta.Entry {
		e, err := va.Create(ctx, parent, meta.Entry{Name: name, Type: meta.TypeDir, Mode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	dirDel, dirNE := mk(root, "dirDel"), mk(root, "dirNE")
	mk(root, "dirRR")
	b := newOfflineDevice(t, sa)
	b.goOffline(t)
	vb, rb := b.v, b.root

	// B, offline.
	start := time.Now()
	offCommit(t, vb, rb, "a", 100) // A edits it too: a content conflict
	offCommit(t, vb, rb, "b", 101) // lands
	if _, err := vb.Remove(ctx, rb, "c", "/c", false); err != nil {
		t.Fatal(err) // A edits it: the edit is kept
	}
	offCommit(t, vb, rb, "d", 103) // A removes it: the edit is kept
	offCommit(t, vb, rb, "n", 104) // a new file: lands
	offCommit(t, vb, rb, "same", 105)
	x, err := vb.Create(ctx, rb, meta.Entry{Name: "x", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	offCommit(t, vb, x, "y", 106)
	be := mustGet(t, vb, meta.RootIno, "b")
	be.Mode = 0o600
	if _, err := vb.Update(ctx, be); err != nil {
		t.Fatal(err)
	}
	rootB, err := vb.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rootB.Mode = 0o700
	if _, err := vb.Update(ctx, rootB); err != nil {
		t.Fatal(err)
	}
	if err := vb.Rename(ctx, rb, "dirRR", rb, "dirRR-B", "/dirRR-B"); err != nil {
		t.Fatal(err) // A renames it too: A's is kept
	}
	if err := vb.Rename(ctx, rb, "g", dirDel, "g", "/dirDel/g"); err != nil {
		t.Fatal(err) // A removes dirDel
	}
	if _, err := vb.Remove(ctx, rb, "dirNE", "/dirNE", false); err != nil {
		t.Fatal(err) // A adds an entry to it: kept
	}
	// An editor's save: a temporary file, then renamed over the file.
	offCommit(t, vb, rb, "f.tmp", 107)
	if err := vb.Rename(ctx, rb, "f.tmp", rb, "f", "/f"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("offline changes took %v: they waited for etcd", d)
	}
	// Offline, B sees its own changes.
	if e := mustGet(t, vb, meta.RootIno, "a"); curManifest(e) != 100 {
		t.Fatalf("offline read of a: %+v", e)
	}
	absent(t, vb, meta.RootIno, "c")
	absent(t, vb, meta.RootIno, "f.tmp")
	if e := mustGet(t, vb, meta.RootIno, "f"); curManifest(e) != 107 || len(e.Versions) != 2 {
		t.Fatalf("offline read of f after the save: %+v", e)
	}
	if e := mustGet(t, vb, x.Ino, "y"); curManifest(e) != 106 {
		t.Fatalf("offline read of x/y: %+v", e)
	}
	if _, err := vb.Remove(ctx, rb, "x", "/x", false); cairn.KindOf(err) != cairn.NotEmpty {
		t.Fatalf("offline rmdir of a non-empty directory: %v", err)
	}
	if _, err := vb.Create(ctx, rb, meta.Entry{Name: "n", Type: meta.TypeDir, Mode: 0o755}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("offline create of a taken name: %v", err)
	}
	if n := b.log.Len(); n != 15 {
		t.Fatalf("offline log holds %d changes, want 15", n)
	}

	// A, meanwhile.
	commit(t, sa, va, root, "a", 1, 200)
	commit(t, sa, va, root, "c", 1, 202)
	if _, err := va.Remove(ctx, root, "d", "/d", false); err != nil {
		t.Fatal(err)
	}
	commit(t, sa, va, root, "same", 1, 205)
	if err := va.Rename(ctx, root, "dirRR", root, "dirRR-A", "/dirRR-A"); err != nil {
		t.Fatal(err)
	}
	if _, err := va.Remove(ctx, root, "dirDel", "/dirDel", false); err != nil {
		t.Fatal(err)
	}
	commit(t, sa, va, dirNE, "added", 1, 206)

	b.goOnline(t)
	res, err := b.log.Replay(ctx, vb, nil)
	if err != nil {
		t.Fatalf("replay: %v (%+v)", err, res)
	}
	if b.log.Len() != 0 {
		t.Fatalf("%d changes left in the log after the replay", b.log.Len())
	}
	// What landed, as A sees it.
	get := func(parent uint64, name string) *meta.Entry { return mustGet(t, va, parent, name) }
	if e := get(meta.RootIno, "a"); curManifest(e) != 200 {
		t.Fatalf("a: the version made elsewhere keeps the name: %+v", e)
	}
	if e := get(meta.RootIno, "b"); curManifest(e) != 101 || e.Mode != 0o600 || len(e.Versions) != 2 {
		t.Fatalf("b: B's edit and chmod land as if online: %+v", e)
	}
	if e := get(meta.RootIno, "c"); curManifest(e) != 202 {
		t.Fatalf("c: edit vs delete keeps the edit: %+v", e)
	}
	if e := get(meta.RootIno, "d"); curManifest(e) != 103 {
		t.Fatalf("d: delete vs edit keeps the edit: %+v", e)
	}
	if e, err := va.Root(ctx); err != nil || e.Mode&0o777 != 0o700 {
		t.Fatalf("the root's chmod: %+v, %v", e, err)
	}
	if e := get(meta.RootIno, "n"); curManifest(e) != 104 {
		t.Fatalf("n: %+v", e)
	}
	if e := get(meta.RootIno, "same"); curManifest(e) != 205 {
		t.Fatalf("same: %+v", e)
	}
	if e := get(x.Ino, "y"); curManifest(e) != 106 || get(meta.RootIno, "x").Ino != x.Ino {
		t.Fatalf("x/y: %+v", e)
	}
	if e := get(meta.RootIno, "f"); curManifest(e) != 107 || len(e.Versions) != 2 {
		t.Fatalf("f after the editor's save: %+v", e)
	}
	absent(t, va, meta.RootIno, "f.tmp")
	absent(t, va, meta.RootIno, "dirRR-B")
	get(meta.RootIno, "dirRR-A")
	absent(t, va, meta.RootIno, "g")
	get(dirNE.Ino, "added")
	if e := get(meta.RootIno, "dirNE"); e.Ino != dirNE.Ino {
		t.Fatalf("dirNE: %+v", e)
	}
	// The conflicts, each with its copy where the rule keeps one.
	cs, err := va.Conflicts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]meta.Conflict{}
	for _, c := range cs {
		kinds[c.Kind+" "+c.Path] = c
	}
	want := map[string]byte{
		meta.ConflictContent + " /a":           100,
		meta.ConflictCreate + " /same":         105,
		meta.ConflictDeleteEdit + " /c":        0,
		meta.ConflictEditDelete + " /d":        0,
		meta.ConflictRenameRename + " /dirRR":  0,
		meta.ConflictRenameGone + " /dirDel/g": 0,
		meta.ConflictDeleteDir + " /dirNE":     0,
	}
	if len(cs) != len(want) {
		t.Errorf("%d conflicts, want %d: %+v", len(cs), len(want), cs)
	}
	for k, m := range want {
		c, ok := kinds[k]
		if !ok {
			t.Errorf("no conflict %q; have %+v", k, cs)
			continue
		}
		if m == 0 {
			continue
		}
		if !strings.HasPrefix(c.CopyName, c.Name+".conflict-laptopB-") || c.Copy != "/"+c.CopyName {
			t.Errorf("conflict %q: copy %q (%q)", k, c.CopyName, c.Copy)
			continue
		}
		if e := get(c.CopyParent, c.CopyName); curManifest(e) != m {
			t.Errorf("conflict %q: its copy holds %+v, want this device's version", k, e)
		}
	}
	if c, ok := kinds[meta.ConflictRenameGone+" /dirDel/g"]; ok {
		if e := get(meta.RootIno, c.CopyName); curManifest(e) != 15 {
			t.Errorf("g moved into a removed directory: %+v", e)
		}
	}
	// Resolving: mine takes the name (theirs stays in the history),
	// theirs sends the copy to the trash, both keeps both.
	if _, err := va.ResolveConflict(ctx, "/a", meta.KeepMine); err != nil {
		t.Fatal(err)
	}
	if e := get(meta.RootIno, "a"); curManifest(e) != 100 || e.Versions[len(e.Versions)-2].Manifest[0] != 200 {
		t.Fatalf("a kept mine: %+v", e)
	}
	sameCopy := kinds[meta.ConflictCreate+" /same"].CopyName
	if _, err := va.ResolveConflict(ctx, "/"+sameCopy, meta.KeepTheirs); err != nil {
		t.Fatal(err)
	}
	absent(t, va, meta.RootIno, sameCopy)
	if _, err := va.ResolveConflict(ctx, "/dirRR", meta.KeepMine); cairn.KindOf(err) != cairn.Invalid {
		t.Fatalf("mine of a rename not made: %v", err)
	}
	if _, err := va.ResolveConflict(ctx, "/c", meta.KeepBoth); err != nil {
		t.Fatal(err)
	}
	get(meta.RootIno, "c")
	if _, err := va.ResolveConflict(ctx, "/c", meta.KeepBoth); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("resolved twice: %v", err)
	}
	if cs, err := va.Conflicts(ctx); err != nil || len(cs) != len(want)-3 {
		t.Fatalf("after three resolutions: %d conflicts, %v", len(cs), err)
	}
	// Nothing left to do: a second replay changes nothing.
	res2, err := b.log.Replay(ctx, vb, nil)
	if err != nil || res2.Applied != 0 || len(res2.Conflicts) != 0 {
		t.Fatalf("second replay: %+v, %v", res2, err)
	}
}

// TestOfflineReplayAcksLost: a replay whose journal acks were lost (the
// device killed between the commits and the acks reaching the disk)
// applies nothing twice: the progress mark in etcd, written in each
// change's own transaction, skips what was made.
func TestOfflineReplayAcksLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sa, va, root := newVolRoot(t, 0)
	commit(t, sa, va, root, "a", 1, 1)
	b := newOfflineDevice(t, sa)
	b.goOffline(t)
	for i := 0; i < 5; i++ {
		offCommit(t, b.v, b.root, "a", byte(20+i))
	}
	if err := b.v.Rename(ctx, b.root, "a", b.root, "a2", "/a2"); err != nil {
		t.Fatal(err)
	}
	logDir := meta.OfflineLogDir(b.dir, b.v.V.ID)
	saved := t.TempDir()
	if err := copyDir(filepath.Join(logDir, "journal"), saved); err != nil {
		t.Fatal(err)
	}
	b.goOnline(t)
	res, err := b.log.Replay(ctx, b.v, nil)
	if err != nil || res.Applied != 6 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	// As if killed before the acks: the journal as it was before.
	b.log.Close()
	os.RemoveAll(filepath.Join(logDir, "journal"))
	if err := copyDir(saved, filepath.Join(logDir, "journal")); err != nil {
		t.Fatal(err)
	}
	b.openLog(t)
	if b.log.Len() != 6 {
		t.Fatalf("restored log holds %d", b.log.Len())
	}
	res, err = b.log.Replay(ctx, b.v, nil)
	if err != nil || res.Skipped != 6 || res.Applied != 0 {
		t.Fatalf("replay again: %+v, %v", res, err)
	}
	e := mustGet(t, va, meta.RootIno, "a2")
	if len(e.Versions) != 6 || curManifest(e) != 24 {
		t.Fatalf("a2 after two replays: %d versions, current %d", len(e.Versions), curManifest(e))
	}
	absent(t, va, meta.RootIno, "a")
	if cs, _ := va.Conflicts(ctx); len(cs) != 0 {
		t.Fatalf("conflicts: %+v", cs)
	}
}

func copyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func FuzzDecodeOfflineRecord(f *testing.F) {
	f.Add([]byte(`{"v":1,"op":"commit","name":"a","ino":5,"version":{"n":1,"manifest":"","size":1}}`))
	f.Add([]byte(`{"v":1,"op":"rename","name":"a","ino":5,"dst_name":"b"}`))
	f.Add([]byte(`{"v":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := meta.DecodeOfflineRecord(b)
		if err == nil && ((r.Name == "" && r.Ino != meta.RootIno) || r.Ino == 0) {
			t.Fatalf("decoded %+v", r)
		}
	})
}

func FuzzDecodeConflict(f *testing.F) {
	f.Add([]byte(`{"v":1,"id":"x","kind":"content","path":"/a"}`))
	f.Add([]byte(`{"v":0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := meta.DecodeConflict(b)
		if err == nil && (c.ID == "" || c.Path == "") {
			t.Fatalf("decoded %+v", c)
		}
	})
}

// TestOfflineReplayKillChild is the replay a kill loop kills: run by
// TestOfflineReplayKilled in a process of its own.
func TestOfflineReplayKillChild(t *testing.T) {
	arg := os.Getenv("CAIRN_TEST_REPLAY_CHILD")
	if arg == "" {
		t.Skip("run by TestOfflineReplayKilled")
	}
	endpoint, dir, _ := strings.Cut(arg, " ")
	cli, err := etcdtest.NewClient(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	s, err := meta.New(cli, meta.Options{LockTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Open(context.Background(), "home")
	if err != nil {
		t.Fatal(err)
	}
	l, err := meta.OpenOfflineLog(context.Background(), dir, meta.OfflineLogOptions{Device: "laptopB"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Replay(context.Background(), v, nil); err != nil {
		t.Fatal(err)
	}
}

// TestOfflineReplayKilled: a replay SIGKILLed at random points, again and
// again, then let finish, applies every change once: each file has
// exactly the versions made offline, each rename is made, no conflict.
// CAIRN_TEST_REPLAY_KILLS sets the number of kills (default 4; the
// issue's long form: 100).
func TestOfflineReplayKilled(t *testing.T) {
	if os.Getenv("CAIRN_TEST_REPLAY_CHILD") != "" {
		t.Skip("the child")
	}
	kills := 4
	if n, err := strconv.Atoi(os.Getenv("CAIRN_TEST_REPLAY_KILLS")); err == nil && n > 0 {
		kills = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sa, va, _ := newVolRoot(t, 0)
	b := newOfflineDevice(t, sa)
	b.goOffline(t)
	const edits = 4
	files := max(60, 15*kills) // enough changes for the replays to be killed midway
	for i := 0; i < files; i++ {
		name := fmt.Sprintf("f%02d", i)
		for j := 0; j <= edits; j++ {
			offCommit(t, b.v, b.root, name, byte(1+j))
		}
		if i%2 == 0 {
			if err := b.v.Rename(ctx, b.root, name, b.root, name+"-moved", "/"+name+"-moved"); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := b.log.Len()
	b.goOnline(t)
	b.log.Close()
	logDir := meta.OfflineLogDir(b.dir, b.v.V.ID)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	killed := 0
	for k := 0; k < kills; k++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOfflineReplayKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "CAIRN_TEST_REPLAY_CHILD="+sa.Client().Endpoints()[0]+" "+logDir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(100+rng.IntN(500)) * time.Millisecond)
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		err := cmd.Wait()
		if err == nil {
			break // it finished first
		}
		if strings.Contains(out.String(), "--- FAIL") {
			t.Fatalf("replay child failed:\n%s", out.String())
		}
		killed++
	}
	l, err := meta.OpenOfflineLog(ctx, logDir, meta.OfflineLogOptions{Device: "laptopB"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	left := l.Len()
	res, err := l.Replay(ctx, va, nil)
	if err != nil || l.Len() != 0 {
		t.Fatalf("final replay: %+v, %v; %d left", res, err, l.Len())
	}
	t.Logf("%d changes, %d kills, %d left for the last replay (%d skipped by the mark)", total, killed, left, res.Skipped)
	ents, err := va.ReadDir(ctx, meta.RootIno)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != files {
		t.Fatalf("%d entries in the root, want %d: %+v", len(ents), files, ents)
	}
	for i := 0; i < files; i++ {
		name := fmt.Sprintf("f%02d", i)
		if i%2 == 0 {
			name += "-moved"
		}
		e := mustGet(t, va, meta.RootIno, name)
		if len(e.Versions) != edits+1 || curManifest(e) != edits+1 {
			t.Fatalf("%s: %d versions, current %d; want %d, %d", name, len(e.Versions), curManifest(e), edits+1, edits+1)
		}
	}
	if cs, _ := va.Conflicts(ctx); len(cs) != 0 {
		t.Fatalf("conflicts: %+v", cs)
	}
}

// TestOfflineReplayTime measures (CAIRN_TEST_REPLAY_BENCH=N changes; not
// run otherwise) the time to take N offline changes (commits of new
// files, fsynced each) and to replay them once the link is back.
func TestOfflineReplayTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CAIRN_TEST_REPLAY_BENCH"))
	if n <= 0 {
		t.Skip("set CAIRN_TEST_REPLAY_BENCH=N to measure")
	}
	ctx := context.Background()
	sa, va, _ := newVolRoot(t, 0)
	b := newOfflineDevice(t, sa)
	b.goOffline(t)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		offCommit(t, b.v, b.root, fmt.Sprintf("f%05d", i), byte(1+i%200))
	}
	took := time.Since(t0)
	b.goOnline(t)
	t1 := time.Now()
	res, err := b.log.Replay(ctx, b.v, nil)
	if err != nil || res.Applied != n {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	replay := time.Since(t1)
	ents, err := va.ReadDir(ctx, meta.RootIno)
	if err != nil || len(ents) != n {
		t.Fatalf("%d entries, %v", len(ents), err)
	}
	t.Logf("%d offline changes: taken in %v (%v each, fsynced), replayed in %v (%.0f/s)", n, took, took/time.Duration(n), replay, float64(n)/replay.Seconds())
}

// TestOfflineLogTornRecord: a record torn by a crash mid-append (its
// frame cut short) is cut away at the next open and never applied; the
// records before it are replayed whole.
func TestOfflineLogTornRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sa, va, _ := newVolRoot(t, 0)
	b := newOfflineDevice(t, sa)
	b.goOffline(t)
	offCommit(t, b.v, b.root, "whole", 1)
	offCommit(t, b.v, b.root, "torn", 2)
	b.log.Close()
	segs, err := filepath.Glob(filepath.Join(meta.OfflineLogDir(b.dir, b.v.V.ID), "journal", "*.jnl"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v, %v", segs, err)
	}
	fi, err := os.Stat(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(segs[0], fi.Size()-7); err != nil {
		t.Fatal(err)
	}
	b.openLog(t)
	if n := b.log.Len(); n != 1 {
		t.Fatalf("%d records after the torn one was cut, want 1", n)
	}
	b.goOnline(t)
	res, err := b.log.Replay(ctx, b.v, nil)
	if err != nil || res.Applied != 1 || res.Bad != 0 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	if e := mustGet(t, va, meta.RootIno, "whole"); curManifest(e) != 1 {
		t.Fatalf("whole: %+v", e)
	}
	absent(t, va, meta.RootIno, "torn")
}
