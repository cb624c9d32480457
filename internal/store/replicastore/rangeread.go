package replicastore

import (
	"context"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

var _ store.RangeReader = (*Store)(nil)

// GetRange reads n bytes of the object from off (store.RangeReader) from
// the first member in read order that answers: with its own ranged read
// when it has one (the bytes are then not verified, as the interface
// says), else with a whole Get, verified, then cut. It goes on to the next
// member when one has no copy or cannot be reached; a range that does not
// fit the object fails at once with Kind Invalid. NotFound and Unavailable
// as for Get. A caller that finds the bytes wrong can Get the whole object,
// which is verified copy by copy.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	const op = "get range"
	if err := storeset.CheckRange(ctx, id, off, n); err != nil {
		return nil, err
	}
	var errs storeset.StoreErrors
	unreachable, corrupt := 0, 0
	for _, i := range s.readOrder(id) {
		var b []byte
		err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
			var ranged bool
			var err error
			if b, ranged, err = storeset.GetRange(ctx, st, id, off, n); ranged {
				return err
			}
			data, err := st.Get(ctx, id)
			switch {
			case err != nil:
				return err
			case cairn.ID(blake3.Sum256(data)) != id:
				return cairn.E(op, cairn.Corrupt, id.String(), errors.New("copy does not hash to its ID"))
			case off > int64(len(data)) || n > int64(len(data))-off:
				return cairn.E(op, cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, len(data)))
			}
			b = append(make([]byte, 0, n), data[off:off+n]...)
			return nil
		})
		if err == nil {
			return b, nil
		}
		if ctx.Err() != nil {
			return nil, store.CtxErr(ctx, op, id.String())
		}
		switch cairn.KindOf(err) {
		case cairn.Invalid:
			return nil, err
		case cairn.NotFound:
		case cairn.Corrupt:
			corrupt++
		default:
			unreachable++
		}
		errs.Add(s.set.Name(i), err)
	}
	switch {
	case unreachable >= s.quorum:
		return nil, errs.Err(op, cairn.Unavailable, id.String(), fmt.Sprintf("no copy read; %d stores did not answer", unreachable))
	case corrupt > 0:
		return nil, errs.Err(op, cairn.Corrupt, id.String(), "every copy found is damaged")
	}
	return nil, cairn.E(op, cairn.NotFound, id.String(), nil)
}
