package ecstore

import (
	"context"
	"fmt"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/storeset"
)

var _ store.RangeReader = (*Store)(nil)

// GetRange reads n bytes of the object from off (store.RangeReader),
// without reading the whole object. The code is systematic, so byte p of
// the object is byte p mod S of data shard p / S: GetRange asks the members
// holding the data shards the range touches for just those bytes (a ranged
// read of their shard object when the member has one, else a whole shard,
// verified, then cut). When such a member fails, the same bytes of K other
// shards are read and the missing ones reconstructed (Reed-Solomon works
// byte position by byte position), so a member down costs K small reads,
// not the whole object. The bytes are not verified (a part cannot be
// checked against the object's ID), as the interface says; a caller that
// finds them wrong can Get the whole object, which checks every shard and
// reads around a damaged one. A range that does not fit the object fails
// with Kind Invalid; NotFound and Unavailable as for Get.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	const op = "get range"
	if err := storeset.CheckRange(ctx, id, off, n); err != nil {
		return nil, err
	}
	om, err := s.lookup(ctx, op, id)
	if err != nil {
		return nil, err
	}
	if off > om.size || n > om.size-off {
		return nil, cairn.E(op, cairn.Invalid, id.String(), fmt.Errorf("range [%d, +%d) of a %d-byte object", off, n, om.size))
	}
	out := make([]byte, n)
	S := shardSize(om.size, s.k)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for pos := off; pos < off+n; {
		j := int(pos / S)
		x := pos - int64(j)*S
		y := min(S, x+off+n-pos)
		dst := out[pos-off : pos-off+y-x]
		wg.Go(func() {
			if err := s.shardRange(ctx, op, om, j, x, y, dst); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
		pos += y - x
	}
	wg.Wait()
	if err := store.CtxErr(ctx, op, id.String()); err != nil {
		return nil, err
	}
	if first != nil {
		return nil, first
	}
	return out, nil
}

// readPart reads bytes [x, y) of shard i of om from member i.
func (s *Store) readPart(ctx context.Context, om *objMap, i int, x, y int64) ([]byte, error) {
	var b []byte
	err := s.set.Call(ctx, i, func(ctx context.Context, st cairn.Store) error {
		var ranged bool
		var err error
		if b, ranged, err = storeset.GetRange(ctx, st, om.shards[i], headerSize+x, y-x); ranged {
			if cairn.KindOf(err) == cairn.Invalid {
				// The shard is shorter than the map says: damaged.
				err = cairn.E("get range", cairn.Corrupt, om.shards[i].String(), err)
			}
			return err
		}
		return nil
	})
	if err != nil || b != nil {
		return b, err
	}
	// No ranged reads there: the whole shard, verified.
	p, err := s.fetchShard(ctx, om, i, nil)
	if err != nil {
		return nil, err
	}
	return p[x:y], nil
}

// shardRange fills dst with bytes [x, y) of data shard j of om: from member
// j, or, when that fails, reconstructed from the same bytes of K others.
func (s *Store) shardRange(ctx context.Context, op string, om *objMap, j int, x, y int64, dst []byte) error {
	var errs storeset.StoreErrors
	b, err := s.readPart(ctx, om, j, x, y)
	if err == nil {
		copy(dst, b)
		return nil
	}
	if ctx.Err() != nil {
		return store.CtxErr(ctx, op, om.id.String())
	}
	errs.Add(s.set.Name(j), err)
	unreachable, corrupt := 0, 0
	if k := cairn.KindOf(err); k == cairn.NotFound || k == cairn.Corrupt {
		if k == cairn.Corrupt {
			corrupt++
		}
		s.set.Report(storeset.Fault{Store: s.set.Name(j), ID: om.id, Stored: om.shards[j], Kind: k, Err: err})
		s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(j)})
	} else {
		unreachable++
	}

	// The same bytes of K other shards, fastest members first, more as
	// some fail.
	var order []int
	for _, i := range s.set.Order() {
		if i != j {
			order = append(order, i)
		}
	}
	sub := make([][]byte, s.n)
	have := 0
	for next := 0; have < s.k && next < len(order); {
		batch := order[next:min(len(order), next+s.k-have)]
		next += len(batch)
		type res struct {
			i   int
			b   []byte
			err error
		}
		results := make(chan res, len(batch))
		for _, i := range batch {
			go func() {
				b, err := s.readPart(ctx, om, i, x, y)
				results <- res{i, b, err}
			}()
		}
		for range batch {
			r := <-results
			if r.err == nil {
				sub[r.i] = r.b
				have++
				continue
			}
			errs.Add(s.set.Name(r.i), r.err)
			if k := cairn.KindOf(r.err); k == cairn.NotFound || k == cairn.Corrupt {
				if k == cairn.Corrupt {
					corrupt++
				}
				s.set.Report(storeset.Fault{Store: s.set.Name(r.i), ID: om.id, Stored: om.shards[r.i], Kind: k, Err: r.err})
				s.q.Add(storeset.Task{Op: storeset.OpPut, ID: om.id, Store: s.set.Name(r.i)})
			} else {
				unreachable++
			}
		}
		if ctx.Err() != nil {
			return store.CtxErr(ctx, op, om.id.String())
		}
	}
	if have < s.k {
		kind := cairn.Unavailable
		switch {
		case unreachable == 0 && corrupt == 0:
			kind = cairn.NotFound
		case unreachable == 0:
			kind = cairn.Corrupt
		}
		return errs.Err(op, kind, om.id.String(), fmt.Sprintf("bytes [%d, %d) of shard %d: %d of %d shards readable, %d needed", x, y, j, have, s.n, s.k))
	}
	if err := s.enc.ReconstructData(sub); err != nil {
		return cairn.E(op, cairn.Corrupt, om.id.String(), fmt.Errorf("reconstruct: %w", err))
	}
	copy(dst, sub[j])
	return nil
}
