// Package wire is the node wire protocol, version 1: the paths, encodings,
// limits and error mapping shared by the node's chunk service
// (internal/node) and its client (internal/store/remotestore). The protocol
// is written down in doc/format.md, "Node wire protocol, version 1"; change
// one only with the other.
//
// Every decoder here takes untrusted bytes, bounds what it allocates by the
// limits below, and fails with Kind Invalid; each is fuzzed.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/klauspost/compress/zstd"

	"cairn.dev/cairn/internal/cairn"
)

// Version is the protocol version, the first element of every path.
const Version = 1

// Paths.
const (
	PathHealth = "/health"   // GET, anonymous: "ok"
	PathHas    = "/v1/has"   // POST ID list → bitmap of the missing
	PathObject = "/v1/o/"    // + hex ID: PUT, GET, DELETE one object
	PathPut    = "/v1/put"   // POST object batch → put results
	PathGet    = "/v1/get"   // POST ID list → get stream
	PathList   = "/v1/list"  // GET → list stream
	PathStats  = "/v1/stats" // GET → stats
	PathJoin   = "/v1/join"  // POST, token-authenticated (pki.JoinPath)
	// POST report (JSON, zstd) → RegisterReply (JSON, zstd); benefactors
	// and surrogates only (register.go)
	PathRegister = "/v1/register"
	// GET → the realm's metadata gateways (JSON list of host:port),
	// devices only: how a device that lost every gateway it knew finds
	// the metadata service again (DESIGN decision 13)
	PathMetaService = "/v1/metaservice"
	// POST WakeRequest (JSON) → WakeReply (JSON); devices only, on a
	// node that serves as a wake proxy (wake.go)
	PathWake = "/v1/wake"
)

// Headers and media types.
const (
	Zstd         = "zstd"                         // Content-Encoding of every compressed body
	TypeIDs      = "application/x-cairn-ids"      // ID list: n × 32 bytes
	TypeBitmap   = "application/x-cairn-bitmap"   // one bit per ID
	TypeObject   = "application/octet-stream"     // one raw object
	TypeObjects  = "application/x-cairn-objects"  // object batch (raw)
	TypeGetReply = "application/x-cairn-getreply" // get stream (raw)
	TypeList     = "application/x-cairn-list"     // list stream
	TypeJSON     = "application/json"             // stats, put results, errors
)

// Limits. A server refuses a request beyond them with 413 (Kind Invalid); a
// client never sends one.
const (
	MaxObject       = 128 << 20 // bytes of one object
	MaxIDs          = 16384     // IDs in one has or get request
	MaxBatchObjects = 4096      // objects in one put batch
	MaxBatchBytes   = 64 << 20  // bytes of one put batch body
	MaxErrorBody    = 64 << 10  // bytes of an encoded error (client side)
	MaxJSON         = 1 << 20   // bytes of a decoded JSON reply (put results, stats)
	maxCompressed   = MaxIDs*cairn.IDSize + 4096
)

var (
	encoder *zstd.Encoder
	decoder *zstd.Decoder
)

func init() {
	var err error
	encoder, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic(err)
	}
	decoder, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxMemory(MaxJSON+maxCompressed), zstd.WithDecoderMaxWindow(1<<20))
	if err != nil {
		panic(err)
	}
}

// Compress returns src as one zstd frame (with its content size), appended
// to dst.
func Compress(dst, src []byte) []byte { return encoder.EncodeAll(src, dst) }

// Decompress decodes one or more zstd frames of at most max bytes in all.
// Anything else, including a larger output (a compression bomb), is Kind
// Invalid.
func Decompress(src []byte, max int) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return nil, invalid("zstd", err)
	}
	n := min(max, 64<<10) // tiny frames carry no content size: try small first
	if h.HasFCS {
		if h.FrameContentSize > uint64(max) {
			return nil, invalid("zstd", fmt.Errorf("content of %d bytes exceeds %d", h.FrameContentSize, max))
		}
		n = int(h.FrameContentSize)
	}
	out, err := decoder.DecodeAll(src, make([]byte, 0, n))
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) && n < max {
		out, err = decoder.DecodeAll(src, make([]byte, 0, max))
	}
	if err != nil {
		return nil, invalid("zstd", err)
	}
	if len(out) > max {
		return nil, invalid("zstd", fmt.Errorf("content exceeds %d bytes", max))
	}
	return out, nil
}

func invalid(what string, err error) error {
	return cairn.E("decode "+what, cairn.Invalid, "", err)
}

// EncodeIDs is the body of a has or get request: the IDs, 32 bytes each,
// compressed.
func EncodeIDs(ids []cairn.ID) []byte {
	raw := make([]byte, 0, len(ids)*cairn.IDSize)
	for _, id := range ids {
		raw = append(raw, id[:]...)
	}
	return Compress(nil, raw)
}

// DecodeIDs reverses EncodeIDs. An empty list is allowed; more than MaxIDs
// is not.
func DecodeIDs(body []byte) ([]cairn.ID, error) {
	raw, err := Decompress(body, MaxIDs*cairn.IDSize)
	if err != nil {
		return nil, err
	}
	if len(raw)%cairn.IDSize != 0 {
		return nil, invalid("ids", fmt.Errorf("%d bytes is not a whole number of IDs", len(raw)))
	}
	ids := make([]cairn.ID, len(raw)/cairn.IDSize)
	for i := range ids {
		copy(ids[i][:], raw[i*cairn.IDSize:])
	}
	return ids, nil
}

// EncodeBitmap is the answer to a has request: bit i (least significant bit
// first within each byte) is set when ids[i] is missing, compressed.
func EncodeBitmap(bits []bool) []byte {
	raw := make([]byte, (len(bits)+7)/8)
	for i, b := range bits {
		if b {
			raw[i/8] |= 1 << (i % 8)
		}
	}
	return Compress(nil, raw)
}

// DecodeBitmap reverses EncodeBitmap for a request of n IDs: exactly
// ceil(n/8) bytes, unused high bits zero.
func DecodeBitmap(body []byte, n int) ([]bool, error) {
	want := (n + 7) / 8
	raw, err := Decompress(body, want)
	if err != nil {
		return nil, err
	}
	if len(raw) != want {
		return nil, invalid("bitmap", fmt.Errorf("%d bytes for %d IDs", len(raw), n))
	}
	if n%8 != 0 && raw[want-1]>>(n%8) != 0 {
		return nil, invalid("bitmap", errors.New("bits set past the last ID"))
	}
	bits := make([]bool, n)
	for i := range bits {
		bits[i] = raw[i/8]&(1<<(i%8)) != 0
	}
	return bits, nil
}

// Object is one object of a put batch. Data aliases the batch body.
type Object struct {
	ID   cairn.ID
	Data []byte
}

// ObjectHeader is the size of an object's header in a put batch or get
// stream: ID (32) + length (4, big-endian).
const ObjectHeader = cairn.IDSize + 4

// AppendObject appends one object of a put batch: ID, length as uint32
// big-endian, data. Chunk data is already compressed and encrypted, so the
// batch travels raw.
func AppendObject(b []byte, id cairn.ID, data []byte) []byte {
	b = append(b, id[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// DecodeObjects splits a put batch body. It checks the framing only, not
// the IDs.
func DecodeObjects(body []byte) ([]Object, error) {
	if len(body) > MaxBatchBytes {
		return nil, invalid("object batch", fmt.Errorf("%d bytes exceeds %d", len(body), MaxBatchBytes))
	}
	var objs []Object
	for len(body) > 0 {
		if len(objs) == MaxBatchObjects {
			return nil, invalid("object batch", fmt.Errorf("more than %d objects", MaxBatchObjects))
		}
		if len(body) < ObjectHeader {
			return nil, invalid("object batch", errors.New("truncated object header"))
		}
		var o Object
		copy(o.ID[:], body)
		n := binary.BigEndian.Uint32(body[cairn.IDSize:])
		body = body[ObjectHeader:]
		if uint64(n) > MaxObject || int(n) > len(body) {
			return nil, invalid("object batch", fmt.Errorf("object %s: length %d exceeds what remains", o.ID.Short(), n))
		}
		o.Data = body[:n:n]
		body = body[n:]
		objs = append(objs, o)
	}
	return objs, nil
}

// ErrorBody is how an error crosses the wire (JSON, compressed): its Kind by
// number (cairn.Kind values are stable), op, path and message.
type ErrorBody struct {
	Op   string     `json:"op,omitempty"`
	Kind cairn.Kind `json:"kind"`
	Path string     `json:"path,omitempty"`
	Msg  string     `json:"msg,omitempty"`
}

// BodyOf describes err for the wire. The message is err's text without its
// op and path (which travel in their own fields).
func BodyOf(err error) ErrorBody {
	var e *cairn.Error
	b := ErrorBody{Kind: cairn.KindOf(err), Msg: err.Error()}
	if errors.As(err, &e) {
		b.Op, b.Path = e.Op, e.Path
		if e.Err != nil {
			b.Msg = e.Err.Error()
		} else {
			b.Msg = ""
		}
	}
	return b
}

// Err rebuilds the error: a *cairn.Error of the same Kind, so that
// errors.Is(err, cairn.ErrNotFound) holds on the far side. A Kind this side
// does not know becomes Other.
func (b ErrorBody) Err() error {
	k := b.Kind
	if k.String() == cairn.Other.String() && k != cairn.Other {
		k = cairn.Other
	}
	var cause error
	if b.Msg != "" {
		cause = errors.New(b.Msg)
	}
	return cairn.E(b.Op, k, b.Path, cause)
}

// EncodeError is the body of an error reply: ErrorBody as JSON, compressed.
func EncodeError(err error) []byte {
	j, _ := json.Marshal(BodyOf(err))
	return Compress(nil, j)
}

// DecodeError reads an error reply. A body that is not one (a proxy's page,
// net/http's own "400 Bad Request") gives an error whose Kind follows the
// HTTP status.
func DecodeError(status int, contentEncoding string, body []byte) error {
	if contentEncoding == Zstd {
		if raw, err := Decompress(body, MaxErrorBody); err == nil {
			var b ErrorBody
			if json.Unmarshal(raw, &b) == nil {
				return b.Err()
			}
		}
	}
	msg := fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	if len(body) > 0 && len(body) < 512 && contentEncoding == "" {
		msg += ": " + string(body)
	}
	return cairn.E("", KindOfStatus(status), "", errors.New(msg))
}

// Status is the HTTP status that carries an error of kind k.
func Status(k cairn.Kind) int {
	switch k {
	case cairn.NotFound:
		return http.StatusNotFound
	case cairn.Invalid:
		return http.StatusBadRequest
	case cairn.Exist, cairn.Conflict:
		return http.StatusConflict
	case cairn.Corrupt:
		return http.StatusUnprocessableEntity
	case cairn.Permission:
		return http.StatusForbidden
	case cairn.Unavailable, cairn.Canceled:
		return http.StatusServiceUnavailable
	case cairn.IsDir, cairn.NotDir, cairn.NotEmpty:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// KindOfStatus is the Kind a client gives a reply that carries no error
// body.
func KindOfStatus(status int) cairn.Kind {
	switch {
	case status == http.StatusNotFound:
		return cairn.NotFound
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return cairn.Permission
	case status == http.StatusUnprocessableEntity:
		return cairn.Corrupt
	case status == http.StatusConflict:
		return cairn.Conflict
	case status == http.StatusServiceUnavailable || status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		return cairn.Unavailable
	case status >= 400 && status < 500:
		return cairn.Invalid
	}
	return cairn.Other
}

// PutResult is the answer to a put batch (JSON, compressed): the objects
// that failed, by index in the batch; every other object is stored.
type PutResult struct {
	Failed []PutFailure `json:"failed,omitempty"`
}

// PutFailure is one failed object of a put batch.
type PutFailure struct {
	Index int       `json:"i"`
	Error ErrorBody `json:"error"`
}

// Stats is the answer to a stats request (JSON, compressed).
type Stats struct {
	Objects int64 `json:"objects"`
	Bytes   int64 `json:"bytes"`
	Disk    int64 `json:"disk"`
}

// EncodeJSON marshals v and compresses it.
func EncodeJSON(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return Compress(nil, j), nil
}

// DecodeJSON decompresses body (at most MaxJSON bytes) and unmarshals it
// into v.
func DecodeJSON(body []byte, v any) error {
	raw, err := Decompress(body, MaxJSON)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return invalid("json", err)
	}
	return nil
}

// streamEncoders pools the encoders of streamed replies (list).
var streamEncoders = sync.Pool{New: func() any {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithLowerEncoderMem(true), zstd.WithWindowSize(1<<20))
	if err != nil {
		panic(err)
	}
	return e
}}
