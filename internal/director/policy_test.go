package director

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// A policy's member whose open takes a while (a cloud store's listing is
// retried with backoff while its server is stopped) does not hold up the
// others: meanwhile other stores open, and the router reads, without
// waiting for it; and while it is tried again, other requests to it fail
// at once with its last error.
func TestMemberOpenDoesNotBlock(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	release := make(chan struct{}, 2)
	d1 := memstore.New()
	e.storeOpen = func(ctx context.Context, name string) (*Named, error) {
		switch name {
		case "d1":
			return &Named{Store: d1, URL: "file:///d1"}, nil
		case "dead":
			<-release
			return nil, cairn.E("open store", cairn.IO, name, errors.New("connection refused"))
		}
		return nil, nil
	}
	d := New(e, Options{})
	defer d.Close()
	dead := &member{name: "dead", d: d}
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
	waitOpening := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			dead.mu.Lock()
			o := dead.opening != nil
			dead.mu.Unlock()
			if o {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the dead member's open did not start")
			}
			time.Sleep(time.Millisecond)
		}
	}
	first := openDead()
	waitOpening()
	if _, oerr := (&member{name: "d1", d: d}).open(ctx); oerr != nil {
		t.Fatal(oerr)
	}
	if _, rerr := d.routerOnly(ctx); rerr != nil {
		t.Fatal(rerr)
	}
	release <- struct{}{}
	r := <-first
	if !errors.Is(r.err, cairn.ErrUnavailable) || !strings.Contains(r.err.Error(), "dead") {
		t.Fatalf("open of a stopped store = %v, want Unavailable naming it", r.err)
	}

	// A retry is due: one request tries again, the others fail at once.
	dead.mu.Lock()
	dead.tried = time.Now().Add(-memberRetry)
	dead.mu.Unlock()
	retry := openDead()
	waitOpening()
	if _, err := dead.open(ctx); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("open during a retry = %v, want the last error", err)
	}
	release <- struct{}{}
	if r := <-retry; r.err == nil {
		t.Fatal("the retry succeeded")
	}
}

// copies:2 over a registered store and two nodes, one of them offline: the
// write strategy writes to the wrapper (versions record the policy), the
// member on the offline node is only a member down (the director's
// decision for a member: Fail, so the wrapper uses the others), and a read
// of a version naming the policy goes through the same wrapper.
func TestCopiesPolicyWithANodeAsleep(t *testing.T) {
	ctx := context.Background()
	e := newEnv()
	bucket := memstore.New()
	e.stores["bucket"] = &Named{Store: bucket, URL: "file:///bucket"}
	nas := memstore.New()
	e.node("nas", pki.Benefactor, meta.NodeOnline, nas)
	e.node("attic", pki.Benefactor, meta.NodeOffline, memstore.New())
	var (
		mu    sync.Mutex
		asked []string
	)
	d := New(e, Options{PolicyDir: t.TempDir(), Decide: func(ctx context.Context, n meta.NodeStatus, use Use) Decision {
		mu.Lock()
		asked = append(asked, n.Name+"/"+use.String())
		mu.Unlock()
		return DefaultDecide(ctx, n, use)
	}})
	defer d.Close()
	const pol = "copies:2@attic,bucket,nas"
	w, err := d.ForWrite(ctx, pol)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != pol || w.Default {
		t.Fatalf("write: name %q, default %v", w.Name, w.Default)
	}
	// Objects are placed by ID: with several, some are placed on attic.
	var id cairn.ID
	var data []byte
	for i := range 8 {
		id, data = storetest.Blob(uint64(i), 4000)
		if err := w.Store.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	// One copy is acknowledged, the other written in the background: on
	// the spare, since attic's open fails.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		hb, _ := bucket.Has(ctx, []cairn.ID{id})
		hn, _ := nas.Has(ctx, []cairn.ID{id})
		if hb[0] && hn[0] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("copies: bucket %v, nas %v", hb[0], hn[0])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 || asked[0] != "attic/member" {
		t.Fatalf("decider asked %v, want attic as a member", asked)
	}
	var attic string
	ps, err := d.Policy(ctx, pol)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range ps.Health() {
		if h.Name == "attic" {
			attic = h.LastError
		}
	}
	if !strings.Contains(attic, "the node is offline") {
		t.Fatalf("attic's health says %q, want its state", attic)
	}
	// Read through the router as a version naming the policy would.
	rd := New(e, Options{NoCache: true, PolicyDir: t.TempDir()})
	defer rd.Close()
	rw, err := rd.ForWrite(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rw.Store.Get(store.WithSources(ctx, []string{pol}), id); err != nil || string(got) != string(data) {
		t.Fatalf("read through the policy: %v", err)
	}
}
