package faultstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/faultstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// Without faults the wrapper is a store like any other.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) cairn.Store { return faultstore.New(memstore.New()) })
}

func TestFaults(t *testing.T) {
	s := faultstore.New(memstore.New())
	defer s.Close()
	id, data := storetest.Blob(1, 100)
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}

	s.SetDown(true)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrUnavailable) || !errors.Is(err, faultstore.ErrDown) {
		t.Fatalf("Get while down: %v", err)
	}
	if _, err := s.Has(bg, []cairn.ID{id}); !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("Has while down: %v", err)
	}
	s.SetDown(false)
	if got, err := s.Get(bg, id); err != nil || string(got) != string(data) {
		t.Fatalf("Get after restart: %v", err)
	}

	if !s.Damage(id) {
		t.Fatal("Damage of a held object reported false")
	}
	got, err := s.Get(bg, id)
	if err != nil || cairn.ID(blake3.Sum256(got)) == id || len(got) != len(data) {
		t.Fatalf("damaged Get: %v, hash matches %v", err, cairn.ID(blake3.Sum256(got)) == id)
	}
	s.CorruptAsError(true)
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("damaged Get as error: %v", err)
	}
	// Put over a damaged object changes nothing, as in a real store.
	if err := s.Put(bg, id, data); err != nil || !s.Damaged(id) {
		t.Fatalf("Put over damage: %v, damaged %v", err, s.Damaged(id))
	}
	if err := s.Delete(bg, id); err != nil || s.Damaged(id) {
		t.Fatalf("Delete: %v, damaged %v", err, s.Damaged(id))
	}
	if err := s.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(bg, id); err != nil {
		t.Fatalf("Get after Delete and Put: %v", err)
	}
	other, _ := storetest.Blob(2, 10)
	if s.Damage(other) {
		t.Fatal("Damage of a missing object reported true")
	}

	s.Hold()
	done := make(chan error)
	go func() {
		_, err := s.Get(bg, id)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("held Get returned: %v", err)
	case <-time.After(10 * time.Millisecond):
	}
	s.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.Hold()
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := s.Get(ctx, id); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("held Get with canceled ctx: %v", err)
	}
	s.Release()

	if err := s.Lose(id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get of a lost object: %v", err)
	}
	if c := s.Calls(); c.Gets < 7 || c.Puts != 3 || c.Deletes != 1 {
		t.Fatalf("calls %+v", c)
	}
}
