package store

import (
	"context"
	"slices"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestVerifyNote(t *testing.T) {
	id, other := cairn.ID{1}, cairn.ID{2}
	data := []byte("object bytes")
	NoteVerified(context.Background(), id, data) // no note: nothing happens

	ctx, n := WithVerifyNote(context.Background())
	if n.Verified(id, data) {
		t.Fatal("a fresh note says verified")
	}
	NoteVerified(ctx, id, data)
	if !n.Verified(id, data) {
		t.Fatal("the noted bytes are not verified")
	}
	if n.Verified(other, data) {
		t.Fatal("verified for another ID")
	}
	if n.Verified(id, slices.Clone(data)) {
		t.Fatal("a copy of the noted bytes counts as verified")
	}
	if n.Verified(id, data[:len(data)-1]) {
		t.Fatal("a prefix of the noted bytes counts as verified")
	}
	if n.Verified(id, nil) {
		t.Fatal("no bytes count as verified")
	}
}
