package wire

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"

	"cairn.dev/cairn/internal/cairn"
)

// Get stream: the answer to a get request, raw (it carries chunk data). For
// each requested ID, in request order:
//
//	ID (32) | status (1) | length (4, big-endian) | payload
//
// status 0: payload is the object; status 1: payload is an encoded error
// (EncodeError) for that ID alone.
const (
	getOK    = 0
	getError = 1
)

// AppendGetEntry appends an object to a get stream.
func AppendGetEntry(b []byte, id cairn.ID, data []byte) []byte {
	b = append(b, id[:]...)
	b = append(b, getOK)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// AppendGetError appends a failed ID to a get stream.
func AppendGetError(b []byte, id cairn.ID, err error) []byte {
	e := EncodeError(err)
	b = append(b, id[:]...)
	b = append(b, getError)
	b = binary.BigEndian.AppendUint32(b, uint32(len(e)))
	return append(b, e...)
}

// ReadGetEntry reads the next entry of a get stream. It returns the entry's
// ID and either its object or its error (entryErr); err reports a stream
// that is malformed (Kind Invalid) or broken (Kind IO, io.ErrUnexpectedEOF
// inside).
func ReadGetEntry(r io.Reader) (id cairn.ID, data []byte, entryErr, err error) {
	var hdr [ObjectHeader + 1]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return id, nil, nil, broken("get stream", err)
	}
	copy(id[:], hdr[:])
	status := hdr[cairn.IDSize]
	n := binary.BigEndian.Uint32(hdr[cairn.IDSize+1:])
	switch {
	case status == getOK && n <= MaxObject:
	case status == getError && n <= MaxErrorBody:
	default:
		return id, nil, nil, invalid("get stream", fmt.Errorf("entry %s: status %d, length %d", id.Short(), status, n))
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return id, nil, nil, broken("get stream", err)
	}
	if status == getError {
		return id, nil, DecodeError(0, Zstd, buf), nil
	}
	return id, buf, nil, nil
}

func broken(what string, err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return cairn.E("read "+what, cairn.IO, "", err)
}

// List stream: the answer to a list request, one zstd stream (flushed now
// and then so the client sees progress) of records:
//
//	'o' | ID (32) | size (uvarint)   an object
//	'x' | length (uvarint) | JSON    the listing failed (ErrorBody); last record
//	'.'                              the listing is complete; last record
//
// A stream that ends without '.' or 'x' was cut: the client reports Kind IO.
const (
	listObject = 'o'
	listError  = 'x'
	listEnd    = '.'
)

// ListWriter writes a list stream to w.
type ListWriter struct {
	enc *zstd.Encoder
	buf []byte
}

// NewListWriter starts a list stream on w. Call Close (after End or Fail)
// to release it.
func NewListWriter(w io.Writer) *ListWriter {
	enc := streamEncoders.Get().(*zstd.Encoder)
	enc.Reset(w)
	return &ListWriter{enc: enc}
}

// Object writes one object record.
func (l *ListWriter) Object(id cairn.ID, size int64) error {
	l.buf = append(l.buf[:0], listObject)
	l.buf = append(l.buf, id[:]...)
	l.buf = binary.AppendUvarint(l.buf, uint64(size))
	_, err := l.enc.Write(l.buf)
	return err
}

// Flush pushes what was written so far to the underlying writer.
func (l *ListWriter) Flush() error { return l.enc.Flush() }

// End writes the end record and finishes the stream.
func (l *ListWriter) End() error {
	if _, err := l.enc.Write([]byte{listEnd}); err != nil {
		return err
	}
	return l.enc.Close()
}

// Fail writes an error record and finishes the stream.
func (l *ListWriter) Fail(err error) error {
	j, _ := json.Marshal(BodyOf(err))
	l.buf = append(l.buf[:0], listError)
	l.buf = binary.AppendUvarint(l.buf, uint64(len(j)))
	l.buf = append(l.buf, j...)
	if _, err := l.enc.Write(l.buf); err != nil {
		return err
	}
	return l.enc.Close()
}

// Close returns the encoder to its pool. The stream must not be used after.
func (l *ListWriter) Close() {
	if l.enc != nil {
		l.enc.Reset(nil)
		streamEncoders.Put(l.enc)
		l.enc = nil
	}
}

// ListReader reads a list stream.
type ListReader struct {
	src  *errRecorder
	dec  *zstd.Decoder
	r    *bufio.Reader
	done bool
}

// NewListReader starts reading a list stream from r. Call Close when done.
func NewListReader(r io.Reader) (*ListReader, error) {
	src := &errRecorder{r: r}
	dec, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(1<<20), zstd.WithDecoderMaxMemory(1<<20))
	if err != nil {
		return nil, invalid("list stream", err)
	}
	return &ListReader{src: src, dec: dec, r: bufio.NewReaderSize(dec, 64<<10)}, nil
}

// Next returns the next object. At the end of a complete listing it returns
// io.EOF; a listing the server reported failed gives that error; a cut or
// malformed stream gives Kind IO or Invalid.
func (l *ListReader) Next() (cairn.ID, int64, error) {
	var id cairn.ID
	if l.done {
		return id, 0, io.EOF
	}
	tag, err := l.r.ReadByte()
	if err != nil {
		return id, 0, l.readErr(err)
	}
	switch tag {
	case listObject:
		if _, err := io.ReadFull(l.r, id[:]); err != nil {
			return id, 0, l.readErr(err)
		}
		size, err := binary.ReadUvarint(l.r)
		if err != nil {
			return id, 0, l.readErr(err)
		}
		if size > MaxObject {
			return id, 0, invalid("list stream", fmt.Errorf("object %s of %d bytes", id.Short(), size))
		}
		return id, int64(size), nil
	case listEnd:
		l.done = true
		if _, err := l.r.ReadByte(); err != io.EOF {
			return id, 0, invalid("list stream", errors.New("data after the end record"))
		}
		return id, 0, io.EOF
	case listError:
		l.done = true
		n, err := binary.ReadUvarint(l.r)
		if err != nil {
			return id, 0, l.readErr(err)
		}
		if n > MaxErrorBody {
			return id, 0, invalid("list stream", fmt.Errorf("error record of %d bytes", n))
		}
		j := make([]byte, n)
		if _, err := io.ReadFull(l.r, j); err != nil {
			return id, 0, l.readErr(err)
		}
		var b ErrorBody
		if err := json.Unmarshal(j, &b); err != nil {
			return id, 0, invalid("list stream", err)
		}
		return id, 0, b.Err()
	}
	return id, 0, invalid("list stream", fmt.Errorf("unknown record tag %#x", tag))
}

func (l *ListReader) readErr(err error) error {
	if l.src.err != nil && l.src.err != io.EOF {
		return broken("list stream", l.src.err) // the connection failed
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return broken("list stream", err) // cut short
	}
	return invalid("list stream", err) // not a valid zstd stream
}

// errRecorder remembers the first error of the reader under the decoder.
type errRecorder struct {
	r   io.Reader
	err error
}

func (e *errRecorder) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// Close releases the decoder.
func (l *ListReader) Close() { l.dec.Close() }
