package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
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

// A policy's member whose server is stopped takes a while to fail its open
// (the bucket listing is retried with backoff). Meanwhile other stores
// open, and the router reads, without waiting for it; and while it is
// tried again, other requests to it fail at once with its last error.
func TestMemberOpenDoesNotBlock(t *testing.T) {
	ctx := context.Background()
	a, _, _ := twoDevices(t, Options{})
	if _, err := a.AddStore(ctx, "d1", "file://"+t.TempDir()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there: connections are refused
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "cairn", "AWS_SECRET_ACCESS_KEY": "cairn-secret", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"} {
		t.Setenv(k, v)
	}
	if aerr := a.Meta.AddStore(ctx, meta.StoreRecord{Name: "dead", URL: "s3://dead-bucket/c?endpoint=" + addr + "&insecure=1"}); aerr != nil {
		t.Fatal(aerr)
	}
	dead := &member{name: "dead", r: a}
	type result struct {
		err error
		at  time.Time
	}
	openDead := func() chan result {
		c := make(chan result, 1)
		go func() {
			_, oerr := dead.open(ctx)
			c <- result{oerr, time.Now()}
		}()
		return c
	}
	first := openDead()
	time.Sleep(50 * time.Millisecond) // dead's open is retrying its listing
	if _, oerr := (&member{name: "d1", r: a}).open(ctx); oerr != nil {
		t.Fatal(oerr)
	}
	if _, rerr := a.routerOnly(ctx); rerr != nil {
		t.Fatal(rerr)
	}
	d1At := time.Now()
	r := <-first
	if !errors.Is(r.err, cairn.ErrUnavailable) || !strings.Contains(r.err.Error(), "dead") {
		t.Fatalf("open of a stopped store = %v, want Unavailable naming it", r.err)
	}
	t.Logf("dead: %v", r.err)
	if !d1At.Before(r.at) {
		t.Fatalf("d1 opened %v after dead's open failed: it waited for it", d1At.Sub(r.at))
	}
	t.Logf("dead's open failed after retrying; d1 opened %v before", r.at.Sub(d1At))

	// A retry is due: one request tries again, the others fail at once.
	dead.mu.Lock()
	dead.tried = time.Now().Add(-memberRetry)
	dead.mu.Unlock()
	retry := openDead()
	time.Sleep(50 * time.Millisecond)
	_, err = dead.open(ctx)
	failedAt := time.Now()
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("open during a retry = %v, want the last error", err)
	}
	if r := <-retry; r.err == nil || !failedAt.Before(r.at) {
		t.Fatalf("retry: %v; the other open returned %v after it", r.err, failedAt.Sub(r.at))
	}
}
