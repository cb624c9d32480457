package remotestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
)

// queue holds calls waiting to be sent and counts the runners sending them.
type queue[T any] struct {
	mu      sync.Mutex
	waiting []T
	running int
	max     int
}

// add queues c and reports whether the caller must start a runner.
func (q *queue[T]) add(c T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.waiting = append(q.waiting, c)
	if q.running < q.max {
		q.running++
		return true
	}
	return false
}

// take removes up to what fits from the queue (fits is asked of each call
// in turn, the first included, with the number taken so far; the first is
// taken even if it does not fit); if nothing is waiting, the runner stops
// (ok false).
func (q *queue[T]) take(fits func(c T, n int) bool) (batch []T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) == 0 {
		q.running--
		return nil, false
	}
	n := 0
	for n < len(q.waiting) && (fits(q.waiting[n], n) || n == 0) {
		n++
	}
	batch = append(batch, q.waiting[:n]...)
	clear(q.waiting[:n])
	q.waiting = q.waiting[n:]
	if len(q.waiting) == 0 {
		q.waiting = nil // let the array go
	}
	return batch, true
}

type result struct {
	data []byte
	err  error
}

type getCall struct {
	ctx  context.Context
	id   cairn.ID
	done chan result // buffered: a runner never blocks on a caller that left
}

// wait returns the call's result, or Canceled when ctx ends first.
func wait(ctx context.Context, op string, id cairn.ID, done chan result) ([]byte, error) {
	select {
	case r := <-done:
		return r.data, r.err
	case <-ctx.Done():
		return nil, cairn.E(op, cairn.Canceled, id.String(), ctx.Err())
	}
}

// getCoalesced queues a Get for the next get request.
func (s *Store) getCoalesced(ctx context.Context, id cairn.ID) ([]byte, error) {
	c := &getCall{ctx: ctx, id: id, done: make(chan result, 1)}
	if s.gets.add(c) {
		go s.runGets()
	}
	return wait(ctx, "get", id, c.done)
}

func (s *Store) runGets() {
	for {
		batch, ok := s.gets.take(func(_ *getCall, n int) bool { return n < s.o.GetBatch })
		if !ok {
			return
		}
		live := batch[:0]
		for _, c := range batch {
			if c.ctx.Err() == nil {
				live = append(live, c)
			}
		}
		switch len(live) {
		case 0:
		case 1:
			data, err := s.getOne(s.ctx, live[0].id)
			live[0].done <- result{data, err}
		default:
			s.getBatch(live)
		}
	}
}

// getBatch sends one get request for the calls and hands each its entry as
// the stream delivers it.
func (s *Store) getBatch(calls []*getCall) {
	ids := make([]cairn.ID, len(calls))
	for i, c := range calls {
		ids[i] = c.id
	}
	failAll := func(from int, err error) {
		for _, c := range calls[from:] {
			c.done <- result{nil, err}
		}
	}
	resp, err := s.do(s.ctx, "get", "", http.MethodPost, wire.PathGet, wire.EncodeIDs(ids), zstdBody, http.StatusOK)
	if err != nil {
		failAll(0, err)
		return
	}
	defer resp.Body.Close()
	for i, c := range calls {
		id, data, entryErr, err := wire.ReadGetEntry(resp.Body)
		if err == nil && id != c.id {
			err = cairn.E("get", cairn.Invalid, "", fmt.Errorf("entry %d is %s, asked for %s", i, id.Short(), c.id.Short()))
		}
		if err != nil {
			if s.ctx.Err() != nil {
				err = cairn.E("get", cairn.Canceled, "", s.ctx.Err())
			}
			failAll(i, s.wrap("get", "", err))
			return
		}
		switch {
		case entryErr != nil:
			c.done <- result{nil, s.wrap("get", c.id.String(), entryErr)}
		case cairn.ID(blake3.Sum256(data)) != c.id:
			c.done <- result{nil, s.wrap("get", c.id.String(), errCorrupt(c.id))}
		default:
			c.done <- result{data, nil}
		}
	}
}

func errCorrupt(id cairn.ID) error {
	return cairn.E("get", cairn.Corrupt, id.String(), errors.New("node sent data that does not hash to the ID"))
}

// guardedReader reads from b until close is called; after that it never
// touches b again (net/http may read a request body after RoundTrip
// returned, and Put must not keep the caller's buffer).
type guardedReader struct {
	mu     sync.Mutex
	r      *bytes.Reader
	closed bool
}

func (g *guardedReader) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, io.ErrClosedPipe
	}
	return g.r.Read(p)
}

func (g *guardedReader) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
