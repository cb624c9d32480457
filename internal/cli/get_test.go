package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
	cmeta "cairn.dev/cairn/internal/meta"
)

// TestGetHostileEntries: records crafted in etcd (a directory whose value
// names it like a sibling symlink to a directory outside the target, a name
// that climbs out) and a symlink already in the target never make get
// write outside its target; the rest is restored and get exits non-zero.
func TestGetHostileEntries(t *testing.T) {
	r := newRealm(t)
	ctx := context.Background()
	outside := filepath.Join(t.TempDir(), "outside")
	outside2 := filepath.Join(t.TempDir(), "outside2")
	for _, d := range []string{outside, outside2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	conn, err := etcdsvc.Connect(ctx, r.home, etcdsvc.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ms, err := cmeta.New(conn.Client(), cmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	mv, err := ms.Open(ctx, "home")
	if err != nil {
		t.Fatal(err)
	}
	root, err := mv.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(parent *cmeta.Entry, e cmeta.Entry) *cmeta.Entry {
		t.Helper()
		ne, err := mv.Create(ctx, parent, e)
		if err != nil {
			t.Fatal(err)
		}
		return ne
	}
	mk(root, cmeta.Entry{Name: "a", Type: cmeta.TypeSymlink, Mode: 0o777, Target: outside})
	b := mk(root, cmeta.Entry{Name: "b", Type: cmeta.TypeDir, Mode: 0o755})
	mk(b, cmeta.Entry{Name: "f", Type: cmeta.TypeFile, Mode: 0o644})
	mk(root, cmeta.Entry{Name: "c", Type: cmeta.TypeFile, Mode: 0o644})
	d := mk(root, cmeta.Entry{Name: "d", Type: cmeta.TypeDir, Mode: 0o755})
	mk(d, cmeta.Entry{Name: "f", Type: cmeta.TypeFile, Mode: 0o644})
	mk(root, cmeta.Entry{Name: "good", Type: cmeta.TypeFile, Mode: 0o644})

	// Rewrite values under their keys: b's record says "a", c's "../c".
	rewrite := func(name, newName string) {
		t.Helper()
		resp, err := conn.Client().Get(ctx, "/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		suffix := "/e/0000000000000001/" + name
		for _, kv := range resp.Kvs {
			if !strings.HasSuffix(string(kv.Key), suffix) {
				continue
			}
			var e cmeta.Entry
			if err := json.Unmarshal(kv.Value, &e); err != nil {
				t.Fatal(err)
			}
			e.Name = newName
			val, _ := json.Marshal(e)
			if _, err := conn.Client().Put(ctx, string(kv.Key), string(val)); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("no key ending in %s", suffix)
	}
	rewrite("b", "a")
	rewrite("c", "../c")

	dst := filepath.Join(t.TempDir(), "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	// Already in the target: d is a symlink to another directory outside.
	if err := os.Symlink(outside2, filepath.Join(dst, "d")); err != nil {
		t.Fatal(err)
	}
	res := r.fails(cli.ExitError, "get", "home:/", dst)
	t.Logf("stderr: %s", res.stderr)
	for _, o := range []string{outside, outside2, filepath.Dir(dst)} {
		ents, _ := os.ReadDir(o)
		for _, e := range ents {
			if e.Name() != "dst" {
				t.Errorf("get wrote %s outside its target", filepath.Join(o, e.Name()))
			}
		}
	}
	if !strings.Contains(res.stderr, "e/0000000000000001/b") || !strings.Contains(res.stderr, "e/0000000000000001/c") {
		t.Errorf("stderr does not name the corrupt keys: %s", res.stderr)
	}
	// The rest is restored: the symlink as a symlink, d as a directory in
	// place of the symlink that was in the way, good.
	if tgt, err := os.Readlink(filepath.Join(dst, "a")); err != nil || tgt != outside {
		t.Errorf("symlink a: %q, %v", tgt, err)
	}
	if st, err := os.Lstat(filepath.Join(dst, "d", "f")); err != nil || !st.Mode().IsRegular() {
		t.Errorf("d/f: %v, %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "good")); err != nil {
		t.Errorf("good: %v", err)
	}
}
