package storeset

import (
	"context"
	"fmt"

	"cairn.dev/cairn/internal/cairn"
)

// rangeOp is the op of the errors of a wrapper's GetRange
// (store.RangeReader).
const rangeOp = "get range"

// CheckRange makes the checks a wrapper's GetRange makes before it asks a
// member for bytes [off, off+n) of id: ctx is live (else Kind Canceled), off
// and n are not negative (else Kind Invalid).
func CheckRange(ctx context.Context, id cairn.ID, off, n int64) error {
	if err := ctx.Err(); err != nil {
		return cairn.E(rangeOp, cairn.Canceled, id.String(), err)
	}
	if off < 0 || n < 0 {
		return cairn.E(rangeOp, cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d)", off, n))
	}
	return nil
}

// GetRange reads n bytes of object id from off with st's own ranged read
// (store.RangeReader), and fails with Kind IO when st returns another
// number of bytes. ok is false, and nothing is asked, when st has no
// ranged reads.
func GetRange(ctx context.Context, st cairn.Store, id cairn.ID, off, n int64) (b []byte, ok bool, err error) {
	rr, ok := st.(interface {
		GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error)
	})
	if !ok {
		return nil, false, nil
	}
	b, err = rr.GetRange(ctx, id, off, n)
	if err == nil && int64(len(b)) != n {
		err = cairn.E(rangeOp, cairn.IO, id.String(), fmt.Errorf("asked for %d bytes, got %d", n, len(b)))
	}
	return b, true, err
}
