// Package etcdtest starts etcd servers for tests: New gives an in-process
// single-node server (≈0.1 s), Cluster a real multi-member cluster of
// separate etcd processes on loopback, for tests of external mode and of
// member failures.
package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"cairn.dev/cairn/internal/etcdsvc"
)

// New starts an embedded single-node etcd in a temporary directory and
// returns a client of it. Both are closed at t.Cleanup. The server skips
// fsync: its data does not outlive the test.
func New(t testing.TB) *clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := etcdsvc.StartEmbedded(ctx, t.TempDir(), etcdsvc.Options{NoFsync: true})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	cli, err := NewClient(srv.Endpoint())
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// NewClient returns a client of endpoints that logs nothing.
func NewClient(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}
