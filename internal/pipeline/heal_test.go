package pipeline

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// checkingStore is a mapStore that can check what it holds
// (store.Checker), dropping a damaged copy as the local store quarantines
// one.
type checkingStore struct{ *mapStore }

func (s checkingStore) Check(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	good := make([]bool, len(ids))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range ids {
		b, ok := s.m[id]
		good[i] = ok && blake3.Sum256(b) == id
		if ok && !good[i] {
			delete(s.m, id)
		}
	}
	return good, nil
}

// Under store.WithCheckPresent a write has a store that can check
// (store.Checker) verify what Has says is present, and writes afresh a
// damaged copy: the store's index is a hint (issue 14). Without it the
// damaged copy is trusted, as before.
func TestCheckPresentHealsDamagedChunk(t *testing.T) {
	ctx := context.Background()
	ms := newMapStore()
	st := checkingStore{ms}
	data := make([]byte, 300<<10)
	r := rand.New(rand.NewPCG(14, 1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	refs, _, err := newEngine(t, st, nil).WriteBytes(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) < 3 {
		t.Fatalf("%d chunks, want several", len(refs))
	}
	bad := refs[len(refs)/2].ID
	ms.mu.Lock()
	ms.m[bad][10] ^= 1
	ms.mu.Unlock()

	_, plain, err := newEngine(t, st, nil).WriteBytes(ctx, data)
	if err != nil || plain.HealedChunks != 0 || plain.NewChunks != 0 {
		t.Fatalf("plain write: %+v, %v (it trusts the store's Has)", plain, err)
	}
	e := newEngine(t, st, nil)
	_, ws, err := e.WriteBytes(store.WithCheckPresent(ctx), data)
	if err != nil {
		t.Fatal(err)
	}
	if ws.HealedChunks != 1 || ws.NewChunks != 1 || ws.DupChunks != len(refs)-1 {
		t.Fatalf("checked write: %+v; want 1 healed and new, %d dup", ws, len(refs)-1)
	}
	if got := readAll(t, e, refs); !bytes.Equal(got, data) {
		t.Fatal("the data does not read back after the checked write")
	}
}
