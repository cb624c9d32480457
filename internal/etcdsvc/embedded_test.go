package etcdsvc

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"cairn.dev/cairn/internal/cairn"
)

func testClient(t testing.TB, ep string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestEmbeddedStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir() + "/data"
	s, err := StartEmbedded(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fresh start: %v", s.StartTime())
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v, %v; want mode 0700", fi.Mode(), err)
	}
	cli := testClient(t, s.Endpoint())
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	st, err := cli.Status(ctx, s.Endpoint())
	if err != nil || st.Header.MemberId != s.MemberID() {
		t.Fatalf("status: %v, member %x want %x", err, st.Header.MemberId, s.MemberID())
	}

	// A second server on the same data dir is refused at once, not hung.
	t0 := time.Now()
	_, err = StartEmbedded(ctx, dir, Options{})
	if !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("second server on one dir: %v, want Conflict", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("refusal took %v", d)
	}

	s.Close()
	select {
	case <-s.Done():
	default:
		t.Error("Done not closed after Close")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// Reopen (on new ports): the data is there.
	s, err = StartEmbedded(ctx, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("restart: %v", s.StartTime())
	cli = testClient(t, s.Endpoint())
	r, err := cli.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get after restart: %v, %v", r, err)
	}
}

func TestEmbeddedCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := StartEmbedded(ctx, t.TempDir(), Options{})
	if cairn.KindOf(err) != cairn.Canceled {
		t.Fatalf("start with canceled ctx: %v, want Canceled", err)
	}
}

// BenchmarkStartEmbedded measures a fresh start (new data dir) to serving,
// and a stop.
func BenchmarkStartEmbedded(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		s, err := StartEmbedded(ctx, b.TempDir(), Options{})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
