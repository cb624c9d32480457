package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
)

func TestNew(t *testing.T) {
	t0 := time.Now()
	cli := New(t)
	t.Logf("etcdtest.New: %v", time.Since(t0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "a")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "1" {
		t.Fatalf("get a: %v %v", r, err)
	}
}

// Two servers from New are independent.
func TestNewIsolated(t *testing.T) {
	a, b := New(t), New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Put(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	r, err := b.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 0 {
		t.Fatalf("second server sees the first's key: %v %v", r, err)
	}
}

func TestCluster(t *testing.T) {
	t0 := time.Now()
	c := Cluster(t, 3)
	t.Logf("3-member cluster up in %v (binary build included on first run)", time.Since(t0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	conn, err := etcdsvc.ConnectExternal(ctx, c.Endpoints(), etcdsvc.ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := conn.Client()
	for i := range 10 {
		if _, perr := cli.Put(ctx, fmt.Sprintf("k%d", i), "before"); perr != nil {
			t.Fatal(perr)
		}
	}

	// Kill the leader: the hardest single failure.
	leader := -1
	for i, ep := range c.Endpoints() {
		st, serr := cli.Status(ctx, ep)
		if serr != nil {
			t.Fatal(serr)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no member is leader")
	}
	pid := c.PID(leader)
	c.KillMember(leader)
	if kerr := syscall.Kill(pid, 0); !errors.Is(kerr, syscall.ESRCH) {
		t.Fatalf("member %d (pid %d) still exists after KillMember: %v", leader, pid, kerr)
	}
	if c.PID(leader) != 0 {
		t.Fatal("PID of a killed member is not 0")
	}

	t1 := time.Now()
	opCtx, opCancel := context.WithTimeout(ctx, 10*time.Second)
	defer opCancel()
	r, err := cli.Get(opCtx, "k", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 10 {
		t.Fatalf("read after killing the leader: %v, %v", r, err)
	}
	if _, perr := cli.Put(opCtx, "after", "kill"); perr != nil {
		t.Fatalf("write after killing the leader: %v", perr)
	}
	t.Logf("first read+write after killing the leader: %v", time.Since(t1))

	c.RestartMember(leader)
	// The restarted member catches up: a linearizable read there sees the
	// write made while it was down.
	one, err := NewClient(c.Endpoints()[leader])
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	r, err = one.Get(opCtx, "after")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "kill" {
		t.Fatalf("restarted member: %v, %v", r, err)
	}

	// With two members down the cluster has no quorum: the health check of
	// ConnectExternal reports it, quickly.
	c.KillMember((leader + 1) % 3)
	c.KillMember((leader + 2) % 3)
	t2 := time.Now()
	_, err = etcdsvc.ConnectExternal(ctx, c.Endpoints(), etcdsvc.ConnectOptions{DialTimeout: time.Second})
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("ConnectExternal without quorum: %v, want Unavailable", err)
	}
	if d := time.Since(t2); d > 5*time.Second {
		t.Errorf("ConnectExternal without quorum took %v", d)
	}
	t.Logf("no quorum: %v (after %v)", err, time.Since(t2))
}
