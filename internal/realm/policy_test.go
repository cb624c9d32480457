package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
)

// A read that fails on every store the version names says why each
// failed: under ec:2+2 with three of the four directory stores broken, the
// router's error names those stores and their own errors, not just "not
// on ec:2+2@...".
func TestPolicyReadErrorNamesStores(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{NoCache: true})
	dirs := map[string]string{}
	for _, n := range []string{"d1", "d2", "d3", "d4"} {
		dirs[n] = filepath.Join(t.TempDir(), n)
		if _, err := a.AddStore(ctx, n, "file://"+dirs[n]); err != nil {
			t.Fatal(err)
		}
	}
	const pol = "ec:2+2@d1,d2,d3,d4"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", pol); err != nil {
		t.Fatal(err)
	}
	v, err := a.PolicyVolume(ctx, DefaultVolume, pol)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := v.Meta.Root(ctx)
	data := make([]byte, 200<<10)
	rand.Read(data)
	if _, _, werr := v.WriteFile(ctx, root, "f", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
		t.Fatal(werr)
	}
	if got, _, rerr := readFile(b, "f"); rerr != nil || !bytes.Equal(got, data) {
		t.Fatalf("read with all stores: %d bytes, %v", len(got), rerr)
	}

	// b opens its stores again (a new process would): d1 to d3 are now
	// files where their directories were.
	b.Close()
	b, err = Open(ctx, b.Home, Options{NoCache: true, NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, n := range []string{"d1", "d2", "d3"} {
		if rerr := os.RemoveAll(dirs[n]); rerr != nil {
			t.Fatal(rerr)
		}
		if werr := os.WriteFile(dirs[n], []byte("not a store"), 0o644); werr != nil {
			t.Fatal(werr)
		}
	}
	_, _, err = readFile(b, "f")
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("read with three stores broken = %v, want Unavailable", err)
	}
	t.Logf("the error: %v", err)
	for _, want := range []string{pol + ": ", "store d1: ", "store d2: ", "store d3: ", dirs["d2"]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q: %v", want, err)
		}
	}
}
