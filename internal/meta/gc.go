package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// The GC fence keeps garbage collection from deleting objects that a writer
// has stored but not yet committed:
//
//   - a writer reads the fence generation (WriteGen) before it stores any
//     object, waiting while a collection runs;
//   - its commit compares that the generation is unchanged and that no
//     collection holds the fence;
//   - a collection takes the fence (a key bound to its lease) and bumps the
//     generation in one transaction, marks, sweeps, then releases the fence
//     and bumps the generation again.
//
// So a commit succeeds only if no collection started since the writer began:
// every object it references was either stored after the last sweep or is
// re-checked by the writer. A writer whose commit is fenced writes its
// objects again (dedup makes that cheap) and retries. A collector that dies
// loses its lease and the fence key with it; a collector checks that its lease
// is alive before each batch of deletions, so a stalled one stops deleting.

func (s *Service) gcLockKey() string { return s.key("gc", "lock") }
func (s *Service) gcGenKey() string  { return s.key("gc", "gen") }

func (s *Service) fenceCmps(gen int64) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.gcLockKey()), "=", 0),
		clientv3.Compare(clientv3.ModRevision(s.gcGenKey()), "=", gen),
	}
}

func (s *Service) currentGen(ctx context.Context) (int64, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.gcGenKey())
	if err != nil {
		return 0, etcdErr("gc generation", "", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// WriteGen returns the generation a writer must pass in Commit.Gen. It waits
// while a garbage collection holds the fence.
func (s *Service) WriteGen(ctx context.Context) (int64, error) {
	if s.isOffline() {
		// Offline: the last one read (a replay commits with the one
		// current then).
		return s.off.gen.Load(), nil
	}
	for {
		cctx, cancel := s.opCtx(ctx)
		resp, err := s.cli.Txn(cctx).Then(clientv3.OpGet(s.gcLockKey()), clientv3.OpGet(s.gcGenKey())).Commit()
		cancel()
		if err != nil {
			return 0, etcdErr("gc generation", "", err)
		}
		lock := resp.Responses[0].GetResponseRange().Kvs
		gen := resp.Responses[1].GetResponseRange().Kvs
		if len(lock) == 0 {
			if len(gen) == 0 {
				return 0, nil
			}
			s.off.gen.Store(gen[0].ModRevision)
			return gen[0].ModRevision, nil
		}
		// A collection runs: wait for its fence to go.
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		wch := s.cli.Watch(wctx, s.gcLockKey(), clientv3.WithRev(resp.Header.Revision+1))
		for range wch {
			break
		}
		wcancel()
		if err := ctx.Err(); err != nil {
			return 0, cairn.E("gc generation", cairn.Canceled, "", err)
		}
	}
}

// Fence is a running garbage collection's hold on the GC fence.
type Fence struct {
	s     *Service
	lease clientv3.LeaseID
	done  <-chan *clientv3.LeaseKeepAliveResponse
	stop  context.CancelFunc
}

// BeginGC takes the GC fence. It fails with Conflict if another collection
// holds it.
func (s *Service) BeginGC(ctx context.Context) (*Fence, error) {
	cctx, cancel := s.opCtx(ctx)
	defer cancel()
	// The fence outlives short writer-lock leases: a collector that stalls
	// for a few seconds must not lose it while it deletes.
	ttl := max(s.opts.LockTTL, 10*time.Second)
	lease, err := s.cli.Grant(cctx, int64(ttl/time.Second))
	if err != nil {
		return nil, etcdErr("begin gc", "", err)
	}
	host, _ := os.Hostname()
	who := fmt.Sprintf("%s pid %d since %s", host, os.Getpid(), time.Now().Format(time.RFC3339))
	resp, err := s.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(s.gcLockKey()), "=", 0)).
		Then(clientv3.OpPut(s.gcLockKey(), who, clientv3.WithLease(lease.ID)), clientv3.OpPut(s.gcGenKey(), "begin")).
		Else(clientv3.OpGet(s.gcLockKey())).Commit()
	if err != nil {
		return nil, etcdErr("begin gc", "", err)
	}
	if !resp.Succeeded {
		_, _ = s.cli.Revoke(cctx, lease.ID)
		holder := ""
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			holder = string(kvs[0].Value)
		}
		return nil, cairn.E("begin gc", cairn.Conflict, "", fmt.Errorf("another garbage collection is running (%s)", holder))
	}
	kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := s.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		stop()
		return nil, etcdErr("begin gc", "", err)
	}
	f := &Fence{s: s, lease: lease.ID, stop: stop}
	// Drain keepalive responses; the channel closes when the lease is lost.
	alive := make(chan *clientv3.LeaseKeepAliveResponse)
	go func() {
		defer close(alive)
		for range ch {
		}
	}()
	f.done = alive
	return f, nil
}

// Alive returns an error if the fence has been lost (lease expired): the
// collector must stop deleting.
func (f *Fence) Alive(ctx context.Context) error {
	select {
	case <-f.done:
		return cairn.E("gc", cairn.Conflict, "", errors.New("lost the GC fence (lease expired)"))
	default:
	}
	cctx, cancel := f.s.opCtx(ctx)
	defer cancel()
	resp, err := f.s.cli.TimeToLive(cctx, f.lease)
	if err != nil {
		return etcdErr("gc", "", err)
	}
	if resp.TTL < 0 { // -1: expired (0 only means less than a second left)
		return cairn.E("gc", cairn.Conflict, "", errors.New("lost the GC fence (lease expired)"))
	}
	return nil
}

// End releases the fence and bumps the generation.
func (f *Fence) End(ctx context.Context) error {
	defer f.stop()
	cctx, cancel := f.s.opCtx(context.WithoutCancel(ctx))
	defer cancel()
	_, err := f.s.cli.Txn(cctx).Then(clientv3.OpDelete(f.s.gcLockKey()), clientv3.OpPut(f.s.gcGenKey(), "end")).Commit()
	if err != nil {
		return etcdErr("end gc", "", err)
	}
	_, _ = f.s.cli.Revoke(cctx, f.lease)
	return nil
}
