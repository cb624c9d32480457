package remotestore

import "testing"

// The first call of a batch counts toward its size: a put batch of
// PutBatchBytes = wire.MaxBatchBytes must never exceed it.
func TestTakeCountsTheFirst(t *testing.T) {
	var q queue[int]
	q.max = 1
	for _, n := range []int{16, 64, 1} {
		q.add(n)
	}
	size := 0
	batch, ok := q.take(func(n, _ int) bool {
		size += n
		return size <= 64
	})
	if !ok || len(batch) != 1 || batch[0] != 16 {
		t.Fatalf("took %v, want [16] (16+64 exceeds 64)", batch)
	}
	batch, _ = q.take(func(int, int) bool { return false })
	if len(batch) != 1 || batch[0] != 64 {
		t.Fatalf("took %v, want [64]: the first is taken even if it does not fit", batch)
	}
}
