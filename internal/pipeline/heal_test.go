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

// checkingStore is a mapStore whose Get verifies, as the Store contract
// asks: damaged bytes fail with Kind Corrupt.
type checkingStore struct{ *mapStore }

func (s checkingStore) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	b, err := s.mapStore.Get(ctx, id)
	if err == nil && blake3.Sum256(b) != id {
		return nil, cairn.E("get", cairn.Corrupt, id.Short(), nil)
	}
	return b, err
}

func (s checkingStore) Delete(ctx context.Context, id cairn.ID) error {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
	return nil
}

// Under store.WithCheckPresent a write reads back what Has says is
// present and writes afresh a damaged copy (after deleting it): the
// store's index is a hint (issue 14). Without it the damaged copy is
// trusted, as before.
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
