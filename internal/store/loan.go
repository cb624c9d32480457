package store

import (
	"context"
	"sync"
)

// LoanNote lets a store lend the bytes a Get returns instead of giving
// them away, so that it can reuse their memory for a later read once the
// reader is done with them. A cold read of 1 GiB from a cloud bucket
// allocated a fresh 17 MiB buffer per pack, ~350 MB of new heap per
// read; on this project's virtual machines first-touched memory is slow
// and its cost swings with the neighbours (bench/RESULTS.md, issue 5).
//
// A reader that will say when it is done makes a note with WithLoanNote,
// passes the context to Get, then calls Take with exactly the bytes Get
// returned: if those very bytes (same backing array, same length) were
// lent, Take returns the function that gives them back, and until the
// reader calls it the bytes are the reader's alone, to read and to
// overwrite (the pipeline decrypts a chunk in place). A reader that never
// calls it only loses the reuse: the garbage collector frees the memory.
//
// A layer between the reader and the store that keeps the bytes a Get
// returned after its own Get returns (a background repair, a cache that
// fills later, reconstructed data made from lent shards) must make its
// Gets under WithoutLoans: lent bytes are reused once the reader above it
// gives them back. A layer that only passes the bytes up, or returns
// other bytes, needs nothing: a loan whose bytes the reader never sees
// is never given back.
//
// One note serves one Get (several stores may lend under it, as when a
// wrapper tries one copy, then another; Take gives back none but the
// one it returns). The zero note holds nothing.
type LoanNote struct {
	mu    sync.Mutex
	loans []loan
}

type loan struct {
	data     []byte
	giveBack func()
}

type loanKey struct{}

// WithLoanNote returns a context carrying a fresh loan note for one Get.
func WithLoanNote(ctx context.Context) (context.Context, *LoanNote) {
	n := new(LoanNote)
	return context.WithValue(ctx, loanKey{}, n), n
}

// WithoutLoans returns ctx without its loan note: no store lends under it.
func WithoutLoans(ctx context.Context) context.Context {
	if ctx.Value(loanKey{}) == nil {
		return ctx
	}
	return context.WithValue(ctx, loanKey{}, (*LoanNote)(nil))
}

// CanLend reports whether a Get made with ctx may lend its bytes: the
// reader above asked for loans and no layer in between forbade them.
func CanLend(ctx context.Context) bool {
	n, _ := ctx.Value(loanKey{}).(*LoanNote)
	return n != nil
}

// Lend is called by a store that is about to return data from a Get made
// with ctx and will reuse data's memory once giveBack is called. It
// reports false when ctx carries no note (see CanLend): the store must
// then never reuse data, and giveBack is not kept.
func Lend(ctx context.Context, data []byte, giveBack func()) bool {
	n, _ := ctx.Value(loanKey{}).(*LoanNote)
	if n == nil || len(data) == 0 {
		return false
	}
	n.mu.Lock()
	n.loans = append(n.loans, loan{data: data, giveBack: giveBack})
	n.mu.Unlock()
	return true
}

// Take returns the function that gives back data, these very bytes, if a
// store lent them under the note, else nil. The caller calls it once,
// when it no longer touches data. The note forgets every loan.
func (n *LoanNote) Take(data []byte) func() {
	n.mu.Lock()
	defer n.mu.Unlock()
	var fn func()
	for _, l := range n.loans {
		if len(data) > 0 && len(l.data) == len(data) && &l.data[0] == &data[0] {
			fn = l.giveBack
		}
	}
	n.loans = nil
	return fn
}
