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

// Put sends only what the node lacks (LBFS §3.2, the conditional write).
//
// Concurrent Puts of small objects queue, and up to Options.InFlight
// runners each take what has queued as one put batch: the runner asks the
// node which of the batch's objects it lacks (one has request, answered
// with a bitmap of the missing), then sends those, and only those, in one
// put request (a lone object as PUT /v1/o/<id>). A Put whose object the
// node has is answered by the has reply alone. Batches are pipelined, one
// per runner, so a large file costs about two round trips plus the
// transfer of its new data, not two round trips per batch in sequence. A
// large object goes alone: its Put asks with a has of its own ID first.
//
// No question is asked when it cannot pay: when the objects to be sent
// hold less than askMin bytes, when Has has just reported the ID missing
// (missingIDs), or when Options.SendAlways is set.

// askMin is the least number of object bytes worth a has question before
// they are sent: the question costs a round trip and about two hundred
// bytes with its answer, while an object below a few KiB costs little more
// than that to send. Chunks (16 KiB on average, 4 KiB at least) are always
// asked about, small manifests alone are not.
const askMin = 4 << 10

type putCall struct {
	ctx  context.Context
	id   cairn.ID
	size int
	send bool // send without asking (see sendAtOnce)

	mu   sync.Mutex
	data []byte // the caller's buffer: read only under mu, and only before left
	left bool   // the caller has returned; data is never touched again

	done chan putResult // buffered: a runner never blocks on a caller that left
}

type putResult struct {
	present bool // the node has the object; its data was not sent
	err     error
}

// leave records that the caller returns without its result: no runner
// reads its buffer from then on.
func (c *putCall) leave() {
	c.mu.Lock()
	c.left, c.data = true, nil
	c.mu.Unlock()
}

// appendTo appends the call's object, framed for a put batch, to b. It
// does not if the caller has left (ok false).
func (c *putCall) appendTo(b []byte) (_ []byte, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.left {
		return b, false
	}
	b = wire.AppendObject(b, c.id, c.data)
	return b, true
}

// sendAtOnce reports whether a Put of id goes without asking the node
// first. It takes id out of the recently missing.
func (s *Store) sendAtOnce(id cairn.ID) bool {
	return s.o.SendAlways || s.missing.take(id)
}

// checkPresent is the end of a Put whose object the node already has. Its
// data did not travel, so the node did not check it against its ID: Put
// checks here, as every store checks on Put (Kind Corrupt), and then keeps
// nothing.
func checkPresent(id cairn.ID, data []byte) error {
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E("put", cairn.Corrupt, id.String(), errors.New("data does not hash to its ID"))
	}
	return nil
}

// putCoalesced queues the object for the next put batch. The runner reads
// the caller's buffer, under the call's lock, only while the caller waits,
// and copies what it sends: Put keeps nothing once it returns, and an
// object the node has is never copied.
func (s *Store) putCoalesced(ctx context.Context, id cairn.ID, data []byte) error {
	c := &putCall{ctx: ctx, id: id, size: len(data), data: data, send: s.sendAtOnce(id), done: make(chan putResult, 1)}
	if s.puts.add(c) {
		go s.runPuts()
	}
	select {
	case r := <-c.done:
		if r.present {
			return checkPresent(id, data)
		}
		return r.err
	case <-ctx.Done():
		c.leave()
		return cairn.E("put", cairn.Canceled, id.String(), ctx.Err())
	}
}

func (s *Store) runPuts() {
	max := s.o.PutBatchBytes
	for {
		size := 0
		batch, ok := s.puts.take(func(c *putCall, n int) bool {
			size += wire.ObjectHeader + c.size
			return n < wire.MaxBatchObjects && size <= max
		})
		if !ok {
			return
		}
		s.putBatch(batch)
	}
}

// putBatch asks the node which of the calls' objects it lacks, hands each
// object it has its result, and sends the others.
func (s *Store) putBatch(batch []*putCall) {
	var ask, send []*putCall
	askBytes := 0
	for _, c := range batch {
		switch {
		case c.ctx.Err() != nil: // its caller is leaving
		case c.send:
			send = append(send, c)
		default:
			ask = append(ask, c)
			askBytes += c.size
		}
	}
	if askBytes < askMin {
		send, ask = append(send, ask...), nil
	}
	if len(ask) > 0 {
		ids := make([]cairn.ID, len(ask))
		for i, c := range ask {
			ids[i] = c.id
		}
		found := make([]bool, len(ids))
		if err := s.hasBatch(s.ctx, "put", "", ids, found); err != nil {
			for _, c := range ask {
				c.done <- putResult{err: err}
			}
		} else {
			for i, c := range ask {
				if found[i] {
					c.done <- putResult{present: true}
				} else {
					send = append(send, c)
				}
			}
		}
	}
	if len(send) > 0 {
		s.send(send)
	}
}

// send copies the calls' objects whose callers still wait into one body
// and sends it: as one put batch, or a lone object as PUT /v1/o/<id>.
func (s *Store) send(calls []*putCall) {
	n := 0
	for _, c := range calls {
		n += wire.ObjectHeader + c.size
	}
	buf := getBuf(n)
	defer putBuf(buf)
	body := (*buf)[:0]
	sent := calls[:0]
	for _, c := range calls {
		var ok bool
		if body, ok = c.appendTo(body); ok {
			sent = append(sent, c)
		}
	}
	*buf = body
	switch len(sent) {
	case 0:
	case 1:
		c := sent[0]
		c.done <- putResult{err: s.putOne(s.ctx, c.id, body[wire.ObjectHeader:])}
	default:
		errs := s.putObjects(sent, body)
		for i, c := range sent {
			c.done <- putResult{err: errs[i]}
		}
	}
}

// putObjects sends body, the calls' objects framed as a put batch, and
// returns each call's error.
func (s *Store) putObjects(calls []*putCall, body []byte) []error {
	errs := make([]error, len(calls))
	g := &guardedReader{r: bytes.NewReader(body)}
	defer g.close()
	err := func() error {
		resp, err := s.doReader(s.ctx, "put", "", http.MethodPost, wire.PathPut, g, int64(len(body)), batchBody, http.StatusOK)
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
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// putAlone puts an object too large to share a batch: it asks the node
// whether it has it first (unless sendAtOnce), then sends it in a request
// of its own.
func (s *Store) putAlone(ctx context.Context, id cairn.ID, data []byte) error {
	if len(data) >= askMin && !s.sendAtOnce(id) {
		found := make([]bool, 1)
		if err := s.hasBatch(ctx, "put", id.String(), []cairn.ID{id}, found); err != nil {
			return err
		}
		if found[0] {
			return checkPresent(id, data)
		}
	}
	return s.putOne(ctx, id, data)
}

// putOne sends one object in a request of its own. It stops reading data
// when it returns.
func (s *Store) putOne(ctx context.Context, id cairn.ID, data []byte) error {
	path := id.String()
	g := &guardedReader{r: bytes.NewReader(data)}
	defer g.close()
	resp, err := s.doReader(ctx, "put", path, http.MethodPut, wire.PathObject+path, g, int64(len(data)), objectBody, http.StatusNoContent)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// bufs recycles put batch bodies.
var bufs sync.Pool // of *[]byte

func getBuf(n int) *[]byte {
	if b, ok := bufs.Get().(*[]byte); ok && cap(*b) >= n {
		return b
	}
	b := make([]byte, 0, max(n, 64<<10))
	return &b
}

func putBuf(b *[]byte) {
	if cap(*b) <= wire.MaxBatchBytes {
		*b = (*b)[:0]
		bufs.Put(b)
	}
}

// missingIDs remembers IDs that Has reported missing, because a Put of
// them usually follows (the write pipeline asks Has, then Puts what is
// missing): such a Put is sent without asking again, and takes its ID out.
// A stale entry (another client has stored the object since) costs only
// the transfer that asking would have saved; when full, the set is
// emptied, which costs at most one question per ID forgotten.
type missingIDs struct {
	mu  sync.Mutex
	ids map[cairn.ID]struct{}
}

// maxMissing bounds missingIDs: 16384 IDs, about 1 MiB.
const maxMissing = 16384

// add records the IDs that found reports missing.
func (m *missingIDs) add(ids []cairn.ID, found []bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, f := range found {
		if f {
			continue
		}
		if m.ids == nil || len(m.ids) >= maxMissing {
			m.ids = make(map[cairn.ID]struct{})
		}
		m.ids[ids[i]] = struct{}{}
	}
}

// take reports whether id was recorded missing, and forgets it.
func (m *missingIDs) take(id cairn.ID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.ids[id]; ok {
		delete(m.ids, id)
		return true
	}
	return false
}
