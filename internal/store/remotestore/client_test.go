package remotestore

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// lying is a store that returns damaged data.
type lying struct{ *memstore.Store }

func (l lying) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	b, err := l.Store.Get(ctx, id)
	if err == nil && len(b) > 0 {
		b[0] ^= 1
	}
	return b, err
}

func TestLyingNodeIsCaught(t *testing.T) {
	r := newRealm(t)
	st := lying{memstore.New()}
	addr := r.serve(t, "liar", st)
	id, data := storetest.Blob(1, 1000)
	if err := st.Store.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	for _, batch := range []int{1, 128} {
		cfg, _ := pki.ClientTLS(r.creds(t, "laptop", pki.Device), pki.TLSOptions{Revocations: r.rev})
		s, err := New(Options{Addr: addr, TLS: cfg, GetBatch: batch})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 { // concurrent, so that some go in one get request
			wg.Go(func() {
				if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
					t.Errorf("GetBatch %d: Get from a lying node: %v, want Corrupt", batch, err)
				}
			})
		}
		wg.Wait()
		s.Close()
	}
}

func TestRefusals(t *testing.T) {
	r := newRealm(t)
	addr := r.serve(t, "node", memstore.New())
	id, data := storetest.Blob(1, 1000)
	dev := r.client(t, addr, "laptop", "node")
	defer dev.Close()
	if err := dev.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}

	check := func(name string, s *Store, kind cairn.Kind, contains string) {
		t.Helper()
		_, err := s.Get(bg, id)
		if cairn.KindOf(err) != kind || !strings.Contains(err.Error(), contains) {
			t.Errorf("%s: Get: %v; want kind %v containing %q", name, err, kind, contains)
		}
	}

	// No client certificate.
	c := r.creds(t, "anon", pki.Device)
	cfg, _ := pki.ClientTLS(c, pki.TLSOptions{Revocations: r.rev})
	cfg.Certificates = nil
	anon, _ := New(Options{Addr: addr, TLS: cfg})
	check("anonymous", anon, cairn.Permission, "no verified client certificate")
	anon.Close()

	// A certificate of another CA.
	other, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	oc, _ := other.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: "laptop", Role: pki.Device}, pki.IssueOptions{})
	foreign := r.clientAs(t, addr, oc, "node")
	check("other CA", foreign, cairn.Unavailable, "")
	foreign.Close()

	// The wrong node answers.
	wrong := r.client(t, addr, "laptop", "elsewhere")
	check("wrong node", wrong, cairn.Unavailable, "expected node elsewhere")
	wrong.Close()

	// Surrogate and benefactor certificates open nothing.
	for _, role := range []pki.Role{pki.Surrogate, pki.Benefactor} {
		s := r.clientAs(t, addr, r.creds(t, "spare-"+string(role), role), "node")
		if err := s.Delete(bg, id); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s Delete: %v", role, err)
		}
		if err := s.List(bg, func(cairn.ID, int64) error { return nil }); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s List: %v", role, err)
		}
		if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s Get: %v", role, err)
		}
		if _, err := s.Has(bg, []cairn.ID{id}); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s Has: %v", role, err)
		}
		if err := s.Put(bg, id, data); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s Put: %v", role, err)
		}
		if _, err := s.Stats(bg); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("%s Stats: %v", role, err)
		}
		if err := s.Health(bg); err != nil {
			t.Errorf("%s Health: %v", role, err)
		}
		s.Close()
	}
	if _, err := dev.Get(bg, id); err != nil {
		t.Fatalf("the object is gone after refused deletes: %v", err)
	}

	// Revoked: refused at once on the open connection, and on a new one,
	// by an answer of the verified node (not a TLS alert).
	if err := r.rev.RevokeName("laptop"); err != nil {
		t.Fatal(err)
	}
	check("revoked, open connection", dev, cairn.Permission, "revoked")
	dev.tr.CloseIdleConnections()
	check("revoked, new connection", dev, cairn.Permission, "revoked")

	// Nobody listening.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := ln.Addr().String()
	ln.Close()
	s := r.client(t, gone, "laptop2", "node")
	check("no node", s, cairn.Unavailable, "")
	s.Close()
}

// slowHas delays Has and records how many run at once.
type slowHas struct {
	*memstore.Store
	now, max atomic.Int64
	calls    atomic.Int64
}

func (s *slowHas) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	s.calls.Add(1)
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		m := s.max.Load()
		if n <= m || s.max.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(50 * time.Millisecond)
	return s.Store.Has(ctx, ids)
}

func TestHasIsBatchedAndPipelined(t *testing.T) {
	r := newRealm(t)
	st := &slowHas{Store: memstore.New()}
	addr := r.serve(t, "node", st)
	s := r.client(t, addr, "laptop", "node")
	defer s.Close()
	ids := make([]cairn.ID, 8000)
	for i := range ids {
		ids[i], _ = storetest.Blob(uint64(i), 1)
	}
	start := time.Now()
	found, err := s.Has(bg, ids)
	if err != nil || len(found) != len(ids) {
		t.Fatal(err)
	}
	took := time.Since(start)
	// 8000 IDs in batches of 1024: 8 requests, 4 at a time, 50 ms each.
	if st.calls.Load() != 8 || st.max.Load() < 2 {
		t.Fatalf("%d has requests, at most %d at once; want 8, several at once", st.calls.Load(), st.max.Load())
	}
	if took > 350*time.Millisecond {
		t.Fatalf("Has of 8000 took %v: not pipelined", took)
	}
}

func TestOneConnectionAndCoalescing(t *testing.T) {
	r := newRealm(t)
	var reqs sync.Map // path -> *atomic.Int64
	count := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			p := req.URL.Path
			if strings.HasPrefix(p, wire.PathObject) {
				p = wire.PathObject
			}
			n, _ := reqs.LoadOrStore(req.Method+" "+p, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			h.ServeHTTP(w, req)
		})
	}
	addr, ln := r.serveWith(t, "node", memstore.New(), count)
	s := r.client(t, addr, "laptop", "node")
	defer s.Close()
	const n = 512
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id, data := storetest.Blob(uint64(i), 4096)
			if err := s.Put(bg, id, data); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for i := range n {
		wg.Go(func() {
			id, data := storetest.Blob(uint64(i), 4096)
			got, err := s.Get(bg, id)
			if err != nil || string(got) != string(data) {
				t.Errorf("Get %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	total := func(key string) int64 {
		if v, ok := reqs.Load(key); ok {
			return v.(*atomic.Int64).Load()
		}
		return 0
	}
	puts := total("POST "+wire.PathPut) + total("PUT "+wire.PathObject)
	gets := total("POST "+wire.PathGet) + total("GET "+wire.PathObject)
	t.Logf("%d puts in %d requests, %d gets in %d requests, %d connections", n, puts, n, gets, ln.accepted.Load())
	if puts >= n/4 || gets >= n/4 {
		t.Errorf("%d puts took %d requests and %d gets %d: not coalesced", n, puts, n, gets)
	}
	if ln.accepted.Load() != 1 {
		t.Errorf("%d TCP connections, want 1 (HTTP/2 reuse)", ln.accepted.Load())
	}
}

// blocking is a store whose Get waits until released.
type blocking struct {
	*memstore.Store
	release chan struct{}
}

func (b blocking) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return b.Store.Get(ctx, id)
}

func TestCancelWhileWaiting(t *testing.T) {
	r := newRealm(t)
	st := blocking{memstore.New(), make(chan struct{})}
	addr := r.serve(t, "node", st)
	s := r.client(t, addr, "laptop", "node")
	defer s.Close()
	defer close(st.release)
	id, data := storetest.Blob(1, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := s.Get(ctx, id)
			if !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
				t.Errorf("Get on a stuck node: %v after %v; want Canceled soon after the deadline", err, time.Since(start))
			}
		})
	}
	wg.Wait()
}

func TestClosed(t *testing.T) {
	r := newRealm(t)
	addr := r.serve(t, "node", memstore.New())
	s := r.client(t, addr, "laptop", "node")
	if err := s.Health(bg); err != nil {
		t.Fatal(err)
	}
	s.Close()
	id, _ := storetest.Blob(1, 1)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Get after Close: %v", err)
	}
	if _, err := New(Options{Addr: "nohost", TLS: nil}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("New with a bad address: %v", err)
	}
}

// A peer that answers every ClientHello with a forged TLS alert (what
// anyone on the path, or a stranger at a stale address, can send) makes a
// call fail with Unavailable, never Permission: only the verified node
// says that a client is not admitted.
func TestForgedAlertIsNotARefusal(t *testing.T) {
	r := newRealm(t)
	addr := ForgedAlertPeer(t)
	s := r.client(t, addr, "laptop", "node")
	defer s.Close()
	id, data := storetest.Blob(1, 1000)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrUnavailable) || errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("Get from a forged alert: %v, want Unavailable", err)
	}
	if err := s.Put(bg, id, data); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Put to a forged alert: %v, want Unavailable", err)
	}
	if _, err := s.Has(bg, []cairn.ID{id}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Has to a forged alert: %v, want Unavailable", err)
	}
}
