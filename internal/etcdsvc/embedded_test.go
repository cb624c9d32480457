package etcdsvc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/datadir"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
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
	if fi, serr := os.Stat(dir); serr != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir: %v, %v; want mode 0700", fi.Mode(), serr)
	}
	cli := testClient(t, s.Endpoint())
	if _, perr := cli.Put(ctx, "k", "v"); perr != nil {
		t.Fatal(perr)
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
	if cerr := s.Close(); cerr != nil {
		t.Errorf("second Close: %v", cerr)
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

// TestEmbeddedRestartReplay checks what keeps etcd from panicking at restart
// with "error scanning unapplied entries [1, N): requested index is
// unavailable due to compaction" (see snapshotCount): after a stop, the
// entries a restart replays, from the last snapshot in the WAL to the
// committed index, must number at most 100 (etcd's in-memory snapshot
// interval), so that replaying them compacts nothing raft still has to read.
// With etcd's default snapshot count a young realm has no snapshot at all and
// replays its whole history. The panic itself is a rare race (an election
// tick between the apply loop's compaction and raft's Advance); set
// ETCDSVC_RESTART_ROUNDS to restart many times.
func TestEmbeddedRestartReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rounds := 3
	if v := os.Getenv("ETCDSVC_RESTART_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("ETCDSVC_RESTART_ROUNDS=%q: %v", v, err)
		}
		rounds = n
	}
	const memorySnapshotCount = 100 // etcdserver's, not exported
	dir := t.TempDir() + "/data"
	for round := range rounds {
		s, err := StartEmbedded(ctx, dir, Options{NoFsync: true})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		// Like internal/meta: a lease kept alive, create-if-absent txns, puts.
		lease, err := cli.Grant(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		kctx, kcancel := context.WithCancel(ctx)
		if _, kerr := cli.KeepAlive(kctx, lease.ID); kerr != nil {
			t.Fatal(kerr)
		}
		for i := range 2 * memorySnapshotCount {
			k := fmt.Sprintf("/k/%d/%d", round, i%40)
			if i%3 == 0 {
				_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
					Then(clientv3.OpPut(k, "v", clientv3.WithLease(lease.ID))).Commit()
			} else {
				_, err = cli.Put(ctx, k, "v")
			}
			if err != nil {
				t.Fatalf("round %d write %d: %v", round, i, err)
			}
		}
		// Round 1 keeps its client connected while the server stops.
		if round == 1 {
			s.Close()
		}
		kcancel()
		cli.Close()
		s.Close()

		snap, commit := walProgress(t, dir)
		if commit-snap > memorySnapshotCount {
			t.Fatalf("round %d: a restart would replay %d entries (WAL snapshot at %d, commit %d), want <= %d",
				round, commit-snap, snap, commit, memorySnapshotCount)
		}
	}
}

// walProgress reads the data dir of a stopped server: the index of the last
// snapshot recorded in its WAL (0 if none) and the committed index.
func walProgress(t *testing.T, dir string) (snap, commit uint64) {
	t.Helper()
	lg := zap.NewNop()
	wdir := datadir.ToWALDir(dir)
	snaps, err := wal.ValidSnapshotEntries(lg, wdir)
	if err != nil {
		t.Fatal(err)
	}
	last := &walpb.Snapshot{}
	if len(snaps) > 0 {
		last = snaps[len(snaps)-1]
	}
	hs, err := wal.Verify(lg, wdir, last)
	if err != nil {
		t.Fatal(err)
	}
	return last.GetIndex(), hs.GetCommit()
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

// TestEmbeddedMigratesLoopbackDataDir: a data dir made by an older version,
// whose server listened on loopback TCP for clients and peers, opens with
// its contents, and the server now listens only on its socket.
func TestEmbeddedMigratesLoopbackDataDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir() + "/data"
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	// The configuration of format 1 (see git history of embedded.go).
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	cfg := embed.NewConfig()
	cfg.Name = "cairn"
	cfg.Dir = dir
	cfg.TickMs, cfg.ElectionMs = tickMs, electionMs
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	cfg.SnapshotCount = snapshotCount
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("old-style server did not start")
	}
	old := uint64(e.Server.MemberID())
	cli := testClient(t, curl.Host)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	cli.Close()
	e.Close()

	s, err := StartEmbedded(ctx, dir, Options{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.MemberID() != old {
		t.Errorf("member %x, was %x", s.MemberID(), old)
	}
	if want := "unix://" + dir + "/sock"; s.Endpoint() != want {
		t.Errorf("endpoint %s, want %s", s.Endpoint(), want)
	}
	r, err := testClient(t, s.Endpoint()).Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get after migration: %v, %v", r, err)
	}
	addrs := listeners(t, os.Getpid())
	for _, a := range addrs {
		if a == curl.Host || a == purl.Host {
			t.Errorf("still listening on %s", a)
		}
	}
	if !slices.Contains(addrs, dir+"/sock") {
		t.Errorf("listening on %v, not on the socket", addrs)
	}
}
