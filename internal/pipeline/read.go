package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/manifest"
)

// Read fetches the chunks of refs, verifies and decodes them, and writes
// the plaintext to w in order. Up to Readahead chunks are fetched and
// decoded in parallel ahead of the one being written. A chunk missing from
// the store fails with an error matching cairn.ErrNotFound, a damaged one
// with cairn.ErrCorrupt; both name the chunk. On error, w may have received
// a prefix of the data.
func (e *Engine) Read(ctx context.Context, refs []manifest.Ref, w io.Writer) error {
	spans := make([]span, len(refs))
	for i, r := range refs {
		spans[i] = span{ref: r, lo: 0, hi: int(r.Size)}
	}
	return e.read(ctx, spans, w)
}

// ReadRange writes to w the bytes [off, off+n) of the file made of refs,
// fetching only the chunks that overlap that range. A range reaching past
// the end of the file is cut short there (so nothing is written when off is
// at or after the end); a negative off or n fails with cairn.Invalid.
func (e *Engine) ReadRange(ctx context.Context, refs []manifest.Ref, off, n int64, w io.Writer) error {
	if off < 0 || n < 0 {
		return cairn.E("read range", cairn.Invalid, "", fmt.Errorf("offset %d, length %d", off, n))
	}
	end := off + n
	if end < off { // overflow: read to the end
		end = 1<<63 - 1
	}
	var spans []span
	var pos int64
	for _, r := range refs {
		next := pos + int64(r.Size)
		if next > off && pos < end {
			spans = append(spans, span{ref: r, lo: int(max(off, pos) - pos), hi: int(min(end, next) - pos)})
		}
		if next >= end {
			break
		}
		pos = next
	}
	return e.read(ctx, spans, w)
}

// span is the part [lo, hi) of one chunk's plaintext to write.
type span struct {
	ref    manifest.Ref
	lo, hi int
}

// fetch is one chunk being fetched and decoded.
type fetch struct {
	span
	plain        []byte // the decoded chunk, aliasing inner or out
	inner, outer *[]byte
	err          error
	done         chan struct{}
}

func (f *fetch) release() {
	putBuf(f.inner)
	putBuf(f.outer)
	f.inner, f.outer, f.plain = nil, nil, nil
}

func (e *Engine) read(parent context.Context, spans []span, w io.Writer) error {
	if len(spans) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	ahead := min(e.cfg.Readahead, len(spans))
	queue := make(chan *fetch, ahead)
	slots := make(chan struct{}, ahead)
	go func() {
		defer close(queue)
		for _, s := range spans {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			f := &fetch{span: s, done: make(chan struct{})}
			go e.fetch(ctx, f)
			queue <- f
		}
	}()

	var err error
	for f := range queue {
		<-f.done
		if err == nil {
			err = f.err
			if err == nil {
				if _, werr := w.Write(f.plain[f.lo:f.hi]); werr != nil {
					err = cairn.E("read", cairn.IO, "", fmt.Errorf("writing output: %w", werr))
				}
			}
			if err != nil {
				cancel()
			}
		}
		f.release()
		<-slots
	}
	if err == nil && ctx.Err() != nil {
		err = ctxErr(ctx, "read", "")
	}
	return err
}

// fetch gets, verifies and decodes one chunk.
func (e *Engine) fetch(ctx context.Context, f *fetch) {
	defer close(f.done)
	id := f.ref.ID.Short()
	stored, err := e.st.Get(ctx, f.ref.ID)
	if err != nil {
		kind := cairn.KindOf(err)
		if ctx.Err() != nil && kind == cairn.Other {
			kind = cairn.Canceled
		}
		f.err = cairn.E("read chunk", kind, id, err)
		return
	}
	if len(stored) < Overhead {
		f.err = cairn.E("read chunk", cairn.Corrupt, id, errors.New("truncated"))
		return
	}
	f.inner = getBuf(len(stored) - Overhead + 1)
	bufs := decodeBufs{inner: *f.inner}
	if f.ref.Size <= manifest.MaxChunkSize && len(stored)-Overhead < int(f.ref.Size) {
		// Compressed: decompress into a second buffer.
		f.outer = getBuf(int(f.ref.Size))
		bufs.plain = *f.outer
	}
	f.plain, f.err = decodeChunk(f.ref, stored, &bufs)
	if f.err == nil && f.hi > len(f.plain) {
		f.err = cairn.E("read chunk", cairn.Corrupt, id, errors.New("shorter than its ref"))
	}
}
