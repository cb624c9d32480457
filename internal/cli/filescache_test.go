package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPutFilesCache: the second put of an unchanged tree reads no file
// and no entry (every file a files-cache hit); a file whose ctime, mtime or
// size changed is read again; a file whose volume record changed since is
// not trusted; --force reads everything; a damaged cache is ignored.
func TestPutFilesCache(t *testing.T) {
	r := newRealm(t)
	src := filepath.Join(t.TempDir(), "tree")
	const n = 24
	for i := range n {
		writeFile(t, filepath.Join(src, fmt.Sprintf("d%d", i%3), fmt.Sprintf("f%02d", i)), randBytes(1000+i), 0o644)
	}
	// Files changed less than 2 s before a put are not remembered (racy).
	time.Sleep(2100 * time.Millisecond)

	s1 := putJSON(t, r, src, "home:/b")
	if s1.Files != n || s1.ReadFiles != n || s1.CacheHits != 0 {
		t.Fatalf("first put: %+v", s1)
	}
	s2 := putJSON(t, r, src, "home:/b")
	if s2.Files != 0 || s2.Skipped != n || s2.CacheHits != n || s2.ReadFiles != 0 || s2.ReadBytes != 0 || s2.NewChunks != 0 {
		t.Fatalf("second put of the unchanged tree: %+v, want %d cache hits and nothing read", s2, n)
	}

	// ctime alone (chmod to the same mode), mtime alone, size.
	ctimeF, mtimeF, sizeF := filepath.Join(src, "d0", "f00"), filepath.Join(src, "d1", "f01"), filepath.Join(src, "d2", "f02")
	if err := os.Chmod(ctimeF, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(mtimeF)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(mtimeF, fi.ModTime(), fi.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(sizeF, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("more"))
	f.Close()
	s3 := putJSON(t, r, src, "home:/b")
	if s3.ReadFiles != 3 || s3.CacheHits != n-3 || s3.Files+s3.Skipped != n {
		t.Fatalf("put after a chmod, a touch and an append: %+v, want 3 files read, %d cache hits", s3, n-3)
	}
	if got := r.ok("cat", "home:/b/tree/d2/f02"); !strings.HasSuffix(got, "more") {
		t.Fatal("the appended file was not stored")
	}

	// Another put makes a new version of f03 from elsewhere: its record
	// changed, so the cache's entry is not trusted, and the local file is
	// stored again.
	other := filepath.Join(t.TempDir(), "f03")
	writeFile(t, other, []byte("from elsewhere"), 0o644)
	putJSON(t, r, other, "home:/b/tree/d0")
	s4 := putJSON(t, r, src, "home:/b")
	if s4.ReadFiles != 1 || s4.Files != 1 {
		t.Fatalf("put after the volume's f03 changed: %+v, want f03 read and stored", s4)
	}
	want, _ := os.ReadFile(filepath.Join(src, "d0", "f03"))
	if got := r.ok("cat", "home:/b/tree/d0/f03"); got != string(want) {
		t.Fatal("f03 is not the local file's content")
	}

	s5 := putJSON(t, r, "--force", src, "home:/b")
	if s5.ReadFiles != n || s5.CacheHits != 0 {
		t.Fatalf("put --force: %+v, want all %d files read", s5, n)
	}

	// A damaged cache file is ignored (and said so), never trusted.
	caches, _ := filepath.Glob(filepath.Join(r.home, "cache", "files", "*"))
	if len(caches) != 1 { // home:/b (the put of the new f03 remembered nothing: racy)
		t.Fatalf("cache files: %v", caches)
	}
	for _, c := range caches {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 1
		if err := os.WriteFile(c, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res := r.run("put", "--json", src, "home:/b")
	if res.code != 0 || !strings.Contains(res.stderr, "ignoring the files cache") {
		t.Fatalf("put with a damaged cache: exit %d, stderr %s", res.code, res.stderr)
	}
	s6 := putJSON(t, r, src, "home:/b") // the cache was written afresh
	if s6.ReadFiles != 0 || s6.CacheHits < n-4 {
		t.Fatalf("put after the damaged cache was replaced: %+v", s6)
	}
}
