package meta_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
)

// TestLocalCopySaveReload: a copy made from a snapshot and kept by a
// watch is saved, reloaded whole with its revision, and a torn or
// corrupted file is set aside, never served in part.
func TestLocalCopySaveReload(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, v, root := newVolRoot(t, 3)
	d, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, v, d, "f", 7, 1)
	path := filepath.Join(t.TempDir(), "copy")
	lc := meta.OpenLocalCopy(path, v.V, nil)
	if lc.Usable() {
		t.Fatal("an empty copy is usable")
	}
	w, err := v.WatchEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	lc.BeginReplace()
	ents, rev, err := v.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lc.Replace(ents, rev)
	// A change after the snapshot, through the watch.
	g := commit(t, s, v, d, "g", 9, 2)
	ev := nextChanges(t, w)
	lc.Apply(ev)
	if err := lc.Save(ctx); err != nil {
		t.Fatal(err)
	}

	re := meta.OpenLocalCopy(path, v.V, nil)
	st := re.State()
	if !st.Complete || st.Rev < g.Rev || st.Entries != 4 || st.Saved.IsZero() {
		t.Fatalf("reloaded state %+v (want complete, rev >= %d, 4 entries)", st, g.Rev)
	}
	got, err := re.Get(d.Ino, "g")
	if err != nil || got.Current().Size != 9 || got.Rev != g.Rev {
		t.Fatalf("reloaded g = %+v, %v", got, err)
	}
	if l := re.ReadDir(d.Ino); len(l) != 2 || l[0].Name != "f" || l[1].Name != "g" {
		t.Fatalf("reloaded listing %+v", l)
	}
	if _, err := re.Get(d.Ino, "nope"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("absent name: %v", err)
	}

	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"torn":    good[:len(good)-10],
		"flipped": flip(good, len(good)/2),
		"empty":   {},
	} {
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		c := meta.OpenLocalCopy(path, v.V, nil)
		if c.Usable() || c.State().Entries != 0 {
			t.Fatalf("%s copy served: %+v", name, c.State())
		}
		if _, err := os.Stat(path + ".bad"); err != nil {
			t.Fatalf("%s copy not set aside: %v", name, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s copy still in place: %v", name, err)
		}
	}
	// Another volume's copy is not this one's.
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	other := v.V
	other.ID = "someother"
	if c := meta.OpenLocalCopy(path, other, nil); c.Usable() {
		t.Fatal("another volume's copy served")
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x40
	return c
}

// FuzzDecodeLocalCopy: any input decodes to a whole copy or an error,
// never a panic; what decodes has only names and types a record from etcd
// could have.
func FuzzDecodeLocalCopy(f *testing.F) {
	f.Add(meta.EncodeLocalCopyForTest(meta.Volume{Name: "home", ID: "v1"}, 5, []meta.Entry{
		{Name: "", Parent: 0, Ino: meta.RootIno, Type: meta.TypeDir, Mode: 0o755},
		{Name: "a", Parent: meta.RootIno, Ino: 7, Type: meta.TypeFile, Mode: 0o644, Versions: []meta.Version{{N: 1, Size: 3}}},
	}))
	f.Add([]byte(`{"volume":{"id":"v"},"rev":1,"entries":[{"name":"a","parent":1,"type":"f"}]}`))
	f.Add([]byte("cairnlc\x00\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// The body too, behind a good header and checksum.
		if lf, err := meta.DecodeLocalCopy(meta.WrapLocalCopyBodyForTest(b)); err == nil {
			for _, e := range lf.Entries {
				if e.Parent != 0 && (e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00")) {
					t.Fatalf("decoded a name no path can hold: %q", e.Name)
				}
			}
		}
		if _, err := meta.DecodeLocalCopy(b); err == nil {
			// Only what the encoder made (with its checksum) decodes.
			if len(b) < 52 {
				t.Fatalf("%d bytes decoded", len(b))
			}
		}
	})
}

// TestOfflineSwitch: with etcd stopped (SIGSTOP of its process), reads of
// a volume with a local copy are answered from it, after the first at
// once; writes are refused at once with ErrOfflineWrites; once etcd
// answers again the Service is online and reads see a change made
// meanwhile.
func TestOfflineSwitch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := etcdtest.Cluster(t, 1)
	cli, err := etcdtest.NewClient(c.Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s, err := meta.New(cli, meta.Options{LockTTL: 2 * time.Second, OpTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, meta.Volume{Name: "home", KeepVersions: 3}, 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	v, err := s.Open(ctx, "home")
	if err != nil {
		t.Fatal(err)
	}
	root, err := v.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, v, root, "a", 5, 1)
	lc := meta.OpenLocalCopy(filepath.Join(t.TempDir(), "copy"), v.V, nil)
	lc.BeginReplace()
	ents, rev, err := v.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lc.Replace(ents, rev)
	v.UseLocalCopy(lc)

	pid := c.PID(0)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()

	// The first read waits for etcd (OpTimeout), then answers from the copy.
	e, err := v.Get(ctx, meta.RootIno, "a")
	if err != nil || e.Current().Size != 5 {
		t.Fatalf("offline get = %+v, %v", e, err)
	}
	if _, off := s.Offline(); !off {
		t.Fatal("not offline after etcd did not answer")
	}
	start := time.Now()
	l, err := v.ReadDir(ctx, meta.RootIno)
	if err != nil || len(l) != 1 || l[0].Name != "a" {
		t.Fatalf("offline listing %+v, %v", l, err)
	}
	if _, err := v.Get(ctx, meta.RootIno, "b"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("offline get of an absent name: %v", err)
	}
	_, err = v.Create(ctx, root, meta.Entry{Name: "x", Type: meta.TypeDir, Mode: 0o755})
	if !errors.Is(err, meta.ErrOfflineWrites) || cairn.KindOf(err) != cairn.Unavailable {
		t.Fatalf("offline create: %v", err)
	}
	// A put's batched commit is refused the same way, at once.
	for i, r := range v.CommitVersions(ctx, []meta.BatchCommit{{Parent: root, Name: "new",
		Commit: meta.Commit{Version: meta.Version{Size: 1}, Mode: 0o644, Cur: meta.KnownEntry(nil), Unlocked: true}}}) {
		if !errors.Is(r.Err, meta.ErrOfflineWrites) || cairn.KindOf(r.Err) != cairn.Unavailable {
			t.Fatalf("offline batched commit %d: %+v, %v", i, r.Entry, r.Err)
		}
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("offline reads and refused writes took %v: they asked etcd", d)
	}

	resume()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, off := s.Offline(); !off {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still offline 30 s after etcd was resumed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := commit(t, s, v, root, "b", 6, 2)
	got, err := v.Get(ctx, meta.RootIno, "b")
	if err != nil || got.Rev != b.Rev {
		t.Fatalf("online again: get b = %+v, %v", got, err)
	}
}
