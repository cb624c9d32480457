package realm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/pki"
)

// stallingTokens holds the first Redeem until release is closed.
type stallingTokens struct {
	*pki.TokenList
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *stallingTokens) Redeem(ctx context.Context, id, usedBy string, now time.Time) (pki.TokenRecord, error) {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.TokenList.Redeem(ctx, id, usedBy, now)
}

// Two joiners with different tokens asking for the same name: exactly one
// gets it, even when the second asks while the first is being admitted.
// The loser's token stays unused (it can join under another name), and a
// join whose token cannot be used gives its claimed name back.
func TestJoinersRaceForAName(t *testing.T) {
	ctx := context.Background()
	a, err := Init(ctx, t.TempDir(), Options{Etcd: etcdtest.New(t).Endpoints(), NoPassphrase: true, NodeName: "desk", Logger: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	now := time.Now()
	list := pki.NewTokenList()
	for _, id := range []string{"tok-a", "tok-b"} {
		if err := list.Add(ctx, pki.TokenRecord{ID: id, Role: pki.Device, Created: now, Expires: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	st := &stallingTokens{TokenList: list, entered: make(chan struct{}), release: make(chan struct{})}
	rt := registeringTokens{TokenStore: st, meta: a.Meta, log: testLog()}

	first := make(chan error, 1)
	go func() {
		_, err := rt.Redeem(ctx, "tok-a", "twin", now)
		first <- err
	}()
	select {
	case <-st.entered:
	case err := <-first:
		t.Fatalf("first joiner: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("first joiner never reached its token")
	}
	_, err = rt.Redeem(ctx, "tok-b", "twin", now)
	close(st.release)
	if !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("second joiner asking for a name being given: %v, want Exist", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first joiner: %v", err)
	}
	if n, err := a.Meta.Node(ctx, "twin"); err != nil || n.Role != string(pki.Device) {
		t.Fatalf("twin: %+v %v", n, err)
	}
	// The loser's token is unused: it joins under another name.
	if _, err := rt.Redeem(ctx, "tok-b", "twin2", now); err != nil {
		t.Fatalf("the loser's token: %v", err)
	}
	// A used token gives back the name it claimed.
	if _, err := rt.Redeem(ctx, "tok-a", "third", now); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("a used token: %v", err)
	}
	if _, err := a.Meta.Node(ctx, "third"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("a failed join kept its name: %v", err)
	}
}
