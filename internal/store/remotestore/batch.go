package remotestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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

type putCall struct {
	ctx  context.Context
	id   cairn.ID
	data []byte // a copy: the caller's buffer is not kept
	done chan result
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

// putCoalesced queues a copy of the object for the next put batch.
func (s *Store) putCoalesced(ctx context.Context, id cairn.ID, data []byte) error {
	c := &putCall{ctx: ctx, id: id, data: bytes.Clone(data), done: make(chan result, 1)}
	if c.data == nil {
		c.data = []byte{}
	}
	if s.puts.add(c) {
		go s.runPuts()
	}
	_, err := wait(ctx, "put", id, c.done)
	return err
}

func (s *Store) runPuts() {
	max := s.o.PutBatchBytes
	for {
		size := 0
		batch, ok := s.puts.take(func(c *putCall, n int) bool {
			size += wire.ObjectHeader + len(c.data)
			return n < wire.MaxBatchObjects && size <= max
		})
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
			live[0].done <- result{nil, s.putOne(s.ctx, live[0].id, live[0].data)}
		default:
			s.putBatch(live)
		}
	}
}

// putBatch sends the calls as one put batch and hands each its result.
func (s *Store) putBatch(calls []*putCall) {
	// The body is gathered from the calls' own copies, not copied again.
	n := 0
	hdrs := make([]byte, 0, len(calls)*wire.ObjectHeader)
	body := make(net.Buffers, 0, 2*len(calls))
	for _, c := range calls {
		n += wire.ObjectHeader + len(c.data)
		hdrs = wire.AppendObject(hdrs, c.id, nil)
		body = append(body, hdrs[len(hdrs)-wire.ObjectHeader:], c.data)
	}
	for i, c := range calls { // AppendObject wrote length 0: the real lengths
		binary.BigEndian.PutUint32(hdrs[i*wire.ObjectHeader+cairn.IDSize:], uint32(len(c.data)))
	}
	errs := make([]error, len(calls))
	err := func() error {
		resp, err := s.doReader(s.ctx, "put", "", http.MethodPost, wire.PathPut, &body, int64(n), batchBody, http.StatusOK)
		if err != nil {
			return err
		}
		b, err := s.readBody(s.ctx, "put", "", resp, wire.MaxJSON)
		if err != nil {
			return err
		}
		var res wire.PutResult
		if err := wire.DecodeJSON(b, &res); err != nil {
			return s.wrap("put", "", err)
		}
		for _, f := range res.Failed {
			if f.Index < 0 || f.Index >= len(calls) {
				return s.wrap("put", "", cairn.E("put", cairn.Invalid, "", fmt.Errorf("result for object %d of %d", f.Index, len(calls))))
			}
			errs[f.Index] = s.wrap("put", calls[f.Index].id.String(), f.Error.Err())
		}
		return nil
	}()
	for i, c := range calls {
		if err != nil {
			errs[i] = err
		}
		c.done <- result{nil, errs[i]}
	}
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
