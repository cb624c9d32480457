package etcdsvc_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/metagw"
	"cairn.dev/cairn/internal/pki"
)

// peerCreds makes a realm CA and a node's credentials, saved in dir/name,
// and returns the member's peer options (without Listen).
func peerCreds(t *testing.T, ca *pki.CA, dir, name string, role pki.Role) (*pki.Credentials, etcdsvc.PeerOptions) {
	t.Helper()
	c, err := ca.NewCredentials(pki.NodeIdentity{Realm: ca.Realm, Name: name, Role: role}, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(dir, name)
	if err := c.Save(d); err != nil {
		t.Fatal(err)
	}
	return c, etcdsvc.PeerOptions{Name: name, CertFile: filepath.Join(d, pki.NodeCertFile), KeyFile: filepath.Join(d, pki.NodeKeyFile)}
}

// peerGateway serves a member's peer address: a metadata gateway (devices
// only) in front of its peer socket, on a fresh loopback port. It returns
// the address.
func peerGateway(t *testing.T, c *pki.Credentials, sock string) string {
	t.Helper()
	gw, err := metagw.New(metagw.Config{Credentials: c, Revocations: pki.NoRevocations{}, Upstream: []string{"unix://" + sock}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return ln.Addr().String()
}

func testClient(t testing.TB, ep string) *clientv3.Client {
	t.Helper()
	// As every connection cairn makes: a request failed by the leader
	// change of the move is repeated (under -race a write met "request
	// timed out, possibly due to previous leader failure" in CI).
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{etcdsvc.RetryLeaderChanges()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// The realm's etcd moves from one device's member to another's with etcd's
// membership changes while a client writes in a loop: no write fails and
// none is lost. The first member starts as every realm's does (no peer
// listener) and gets one, as a realm made before members could move.
// Peers admit the realm's devices only.
func TestMoveMember(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	ca, err := pki.CreateCA(filepath.Join(tmp, "ca"), "move-test")
	if err != nil {
		t.Fatal(err)
	}
	credsA, peerA := peerCreds(t, ca, tmp, "a", pki.Device)
	credsB, peerB := peerCreds(t, ca, tmp, "b", pki.Device)
	credsS, _ := peerCreds(t, ca, tmp, "s", pki.Surrogate)
	dirA, dirB := filepath.Join(tmp, "ea"), filepath.Join(tmp, "eb")
	peerA.Listen = peerGateway(t, credsA, filepath.Join(dirA, "peer.sock"))
	peerB.Listen = peerGateway(t, credsB, filepath.Join(dirB, "peer.sock"))

	// A realm's member as it is made today, then given peers.
	a, err := etcdsvc.StartEmbedded(ctx, dirA, etcdsvc.Options{NoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	cli := testClient(t, a.Endpoint())
	if _, err := cli.Put(ctx, "before", "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.MemberUpdate(ctx, a.MemberID(), []string{peerA.PeerURL()}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	peerA.Name = "" // the member a realm starts with keeps its name
	if a, err = etcdsvc.StartEmbedded(ctx, dirA, etcdsvc.Options{NoFsync: true, Peer: &peerA}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if r, err := cli.Get(ctx, "before"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("after the restart with a peer listener: %v, %v", r, err)
	}

	// A client writes in a loop during the move.
	stop := make(chan struct{})
	var (
		mu       sync.Mutex
		written  []string
		failures []error
		longest  time.Duration
	)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := fmt.Sprintf("k/%06d", i)
			t0 := time.Now()
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := cli.Put(wctx, k, "v")
			cancel()
			d := time.Since(t0)
			mu.Lock()
			if err != nil {
				failures = append(failures, fmt.Errorf("%s: %w", k, err))
			} else {
				written = append(written, k)
			}
			longest = max(longest, d)
			mu.Unlock()
		}
	})
	waitWrites := func(n int) {
		t.Helper()
		mu.Lock()
		target := len(written) + n
		mu.Unlock()
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			got, f := len(written), len(failures)
			mu.Unlock()
			if got >= target || f > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the writer made %d of %d writes in 60s", got, target)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitWrites(20)

	mctx, mcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer mcancel()
	id, initial, err := etcdsvc.AddLearner(mctx, cli, "b", peerB.PeerURL())
	if err != nil {
		t.Fatal(err)
	}
	peerB.InitialCluster, peerB.Join = initial, true
	b, err := etcdsvc.StartEmbedded(mctx, dirB, etcdsvc.Options{NoFsync: true, Socket: filepath.Join(tmp, "b.sock"), Peer: &peerB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := etcdsvc.Promote(mctx, cli, id); err != nil {
		t.Fatal(err)
	}
	waitWrites(20)
	cli.SetEndpoints(b.Endpoint())
	if err := a.HandLeadership(mctx, id); err != nil {
		t.Fatal(err)
	}
	if err := etcdsvc.RemoveMember(mctx, cli, a.MemberID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-mctx.Done():
		t.Fatal("the removed member still runs")
	}
	waitWrites(20)
	close(stop)
	wg.Wait()

	if len(failures) > 0 {
		t.Fatalf("%d writes failed during the move, the first: %v", len(failures), failures[0])
	}
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != 1 || members.Members[0].ID != id {
		t.Fatalf("members after the move: %v, %v", members, err)
	}
	r, err := cli.Get(ctx, "k/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, kv := range r.Kvs {
		have[string(kv.Key)] = true
	}
	for _, k := range written {
		if !have[k] {
			t.Fatalf("write %s lost in the move", k)
		}
	}
	t.Logf("%d writes during the move, none failed, none lost; longest write %v", len(written), longest)

	// Peers: a device's certificate is admitted, a surrogate's is not.
	get := func(c *pki.Credentials) error {
		tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{c.TLSCertificate()}, InsecureSkipVerify: true}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(peerB.PeerURL() + "/version")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := get(credsA); err != nil {
		t.Fatalf("a device refused as a peer: %v", err)
	}
	if err := get(credsS); err == nil {
		t.Fatal("a surrogate's certificate was admitted as a peer")
	}
}
