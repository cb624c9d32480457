package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/etcdsvc"
	cmeta "cairn.dev/cairn/internal/meta"
)

// TestPutGetHardLinks: put stores a local file with two names once, the
// second name a link of the first (one inode, link count 2, no second
// upload); an incremental put of the unchanged tree changes nothing; get
// restores the two names as one local file (same inode, nlink 2).
func TestPutGetHardLinks(t *testing.T) {
	r := newRealm(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a"), []byte("hard linked"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a"), filepath.Join(src, "sub", "b")); err != nil {
		t.Fatal(err)
	}
	s := putJSON(t, r, src, "home:/t")
	if s.Files != 1 || s.Links != 1 || s.Failed != 0 {
		t.Fatalf("put summary: %+v, want 1 file stored and 1 link", s)
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
	a, err := mv.Lookup(ctx, []string{"t", "tree", "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := mv.Lookup(ctx, []string{"t", "tree", "sub", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino || a.Nlink() != 2 || b.Nlink() != 2 || len(a.Versions) != 1 {
		t.Fatalf("stored: a %+v, b %+v; want one inode with 2 names", a, b)
	}

	again := putJSON(t, r, src, "home:/t")
	if again.Files != 0 || again.Links != 0 || again.Skipped != 1 || again.Failed != 0 {
		t.Fatalf("incremental put of the unchanged tree: %+v", again)
	}
	if b2, err := mv.Lookup(ctx, []string{"t", "tree", "sub", "b"}); err != nil || b2.Rev != b.Rev {
		t.Fatalf("b changed by an incremental put: %+v, %v", b2, err)
	}

	dst := filepath.Join(t.TempDir(), "out")
	r.ok("get", "home:/t/tree", dst)
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dst, "a"), &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(dst, "sub", "b"), &sb); err != nil {
		t.Fatal(err)
	}
	if sa.Ino != sb.Ino || sa.Nlink != 2 {
		t.Fatalf("restored: a ino %d nlink %d, sub/b ino %d nlink %d", sa.Ino, sa.Nlink, sb.Ino, sb.Nlink)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "sub", "b")); string(got) != "hard linked" {
		t.Fatalf("restored content %q", got)
	}
}
