package store_test

import (
	"context"
	"testing"

	"cairn.dev/cairn/internal/store"
)

// A loan is given back only for the very bytes lent, once taken; a Get
// without a note, or under WithoutLoans, lends nothing.
func TestLoanNote(t *testing.T) {
	ctx := context.Background()
	if store.CanLend(ctx) || store.Lend(ctx, []byte{1}, func() { t.Error("kept without a note") }) {
		t.Fatal("a context without a note takes loans")
	}
	ctx, note := store.WithLoanNote(ctx)
	if !store.CanLend(ctx) {
		t.Fatal("CanLend false under a note")
	}
	buf := make([]byte, 8)
	given := map[string]int{}
	lend := func(name string, b []byte) {
		if !store.Lend(ctx, b, func() { given[name]++ }) {
			t.Fatalf("Lend %s refused under a note", name)
		}
	}
	// A wrapper tried one copy, then another: only the one the reader
	// got is given back.
	lend("first", buf[:4])
	lend("second", buf[4:])
	fn := note.Take(buf[4:])
	if fn == nil {
		t.Fatal("Take of the lent bytes returned nil")
	}
	fn()
	if given["second"] != 1 || given["first"] != 0 {
		t.Fatalf("given back %v, want the second loan once", given)
	}
	// The note forgot both: nothing more to take.
	if note.Take(buf[:4]) != nil || note.Take(buf[4:]) != nil {
		t.Fatal("Take returned a loan twice")
	}
	// Other bytes (a copy, a shorter slice of the same array) are not the loan.
	lend("third", buf[:4])
	if note.Take(append([]byte(nil), buf[:4]...)) != nil || note.Take(buf[:3]) != nil {
		t.Fatal("Take gave back a loan for other bytes")
	}
	if store.Lend(ctx, nil, func() {}) {
		t.Fatal("Lend of no bytes accepted")
	}
	// A layer that keeps what it reads forbids loans below it.
	off := store.WithoutLoans(ctx)
	if store.CanLend(off) || store.Lend(off, buf, func() {}) {
		t.Fatal("WithoutLoans still takes loans")
	}
	if store.WithoutLoans(context.Background()) != context.Background() {
		t.Error("WithoutLoans of a context without a note made a new one")
	}
}
