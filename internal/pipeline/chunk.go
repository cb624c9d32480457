// Package pipeline turns file contents into stored chunks and back: it cuts
// a stream with keyed FastCDC, derives each chunk's convergent key, compresses,
// encrypts and names every chunk, asks a store which chunks it lacks and puts
// only those; and it fetches, verifies and reassembles chunks for reading.
//
// Chunk encoding, format version 1 (doc/format-chunk-manifest.md):
//
//	K      = BLAKE3-256 keyed(convergence key, P)        chunk key
//	inner  = flag || payload                              flag 0: payload = P; 1: zstd(P)
//	stored = 0x01 || AES-256-GCM(K, nonce 0^12, aad 0x01, inner)
//	ID     = BLAKE3-256(stored)
//
// The all-zero nonce is safe because every key encrypts exactly one
// plaintext: K is a function of P, and the encoding of P is deterministic
// (the same zstd settings give the same payload, so the same inner), so a
// key never seals two different messages, which is the only thing a
// nonce-reuse attack on GCM needs. Encrypting the same P twice gives the same
// stored bytes, which is what makes convergent dedup work.
package pipeline

import (
	"crypto/aes"
	"crypto/cipher"
	"errors"
	"fmt"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/manifest"
	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"
)

// ChunkVersion is the first byte of every stored chunk.
const ChunkVersion = 1

// Flags inside the encrypted inner message. The flag is encrypted so a store
// cannot tell which chunks compressed.
const (
	flagRaw  = 0
	flagZstd = 1
)

const (
	tagSize = 16
	// Overhead is the stored size of a chunk beyond its payload: version
	// byte, flag byte and GCM tag.
	Overhead = 2 + tagSize

	// Compression is decided on a sample: chunks of at least sampleAbove
	// bytes get a zstd pass over sampleSize bytes from their middle first,
	// and are compressed whole only if that saves at least 1/32.
	sampleAbove = 8 << 10
	sampleSize  = 2 << 10
	// Chunks below minCompress bytes are stored raw: the zstd frame
	// overhead eats any gain.
	minCompress = 64
)

var (
	zencOnce  sync.Once
	zenc      *zstd.Encoder
	zdecOnce  sync.Once
	zdec      *zstd.Decoder
	zeroNonce [12]byte
)

// encoder is shared by every goroutine: EncodeAll is safe for concurrent use
// and keeps one block encoder per concurrent caller, up to GOMAXPROCS.
func encoder() *zstd.Encoder {
	zencOnce.Do(func() {
		var err error
		zenc, err = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderCRC(false), // the AEAD authenticates the payload
			zstd.WithLowerEncoderMem(true))
		if err != nil {
			panic(err)
		}
	})
	return zenc
}

// decoder limits every DecodeAll to cap(dst): callers pass a dst whose
// capacity is the chunk's declared size, so a zstd bomb stops there.
func decoder() *zstd.Decoder {
	zdecOnce.Do(func() {
		var err error
		zdec, err = zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(0),
			zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxMemory(manifest.MaxChunkSize))
		if err != nil {
			panic(err)
		}
	})
	return zdec
}

// hasherPool holds keyed BLAKE3 hashers for one convergence key (a keyed
// hasher costs a 10 KiB allocation to build).
type hasherPool struct {
	conv [32]byte
	pool sync.Pool
}

func newHasherPool(conv [32]byte) *hasherPool {
	hp := &hasherPool{conv: conv}
	hp.pool.New = func() any {
		h, err := blake3.NewKeyed(conv[:])
		if err != nil {
			panic(err)
		}
		return h
	}
	return hp
}

// chunkKey returns the convergent key of plain.
func (hp *hasherPool) chunkKey(plain []byte) (k [32]byte) {
	h := hp.pool.Get().(*blake3.Hasher)
	h.Reset()
	h.Write(plain)
	h.Sum(k[:0])
	hp.pool.Put(h)
	return k
}

// EncodeChunk encodes plain (at most manifest.MaxChunkSize bytes) as a
// version 1 chunk under the convergence key conv and returns its Ref and
// its stored bytes.
func EncodeChunk(conv [32]byte, plain []byte) (manifest.Ref, []byte) {
	ref, stored, _ := encodeChunk(newHasherPool(conv), plain, 0, make([]byte, 0, len(plain)+Overhead))
	return ref, stored
}

// encodeChunk encodes the plaintext buf[head:] into dst's storage when its
// capacity suffices (len(plain)+Overhead; more if compression does not pay),
// reporting whether the payload is compressed. With head == 1 the byte
// buf[0] is scratch: the raw inner message is built in place there and
// encrypted straight from buf, saving a copy of the plaintext.
func encodeChunk(hp *hasherPool, buf []byte, head int, dst []byte) (ref manifest.Ref, stored []byte, compressed bool) {
	plain := buf[head:]
	ref.Key = hp.chunkKey(plain)
	ref.Size = uint32(len(plain))

	stored = append(dst[:0], ChunkVersion, flagZstd)
	if shouldCompress(plain, stored[2:]) {
		z := encoder().EncodeAll(plain, stored)
		if len(z)-2 < len(plain) {
			stored, compressed = z, true
		}
	}
	if compressed {
		stored = sealInPlace(ref.Key, stored)
	} else if head == 1 {
		buf[0] = flagRaw
		stored = newAEAD(ref.Key).Seal(stored[:1], zeroNonce[:], buf, stored[:1])
	} else {
		stored[1] = flagRaw
		stored = sealInPlace(ref.Key, append(stored[:2], plain...))
	}
	ref.ID = blake3.Sum256(stored)
	return ref, stored, compressed
}

// shouldCompress reports whether a full zstd pass over plain is worth
// trying. Incompressible data pays only for a 2 KiB sample; scratch is spare
// capacity the sample's output may use.
func shouldCompress(plain, scratch []byte) bool {
	if len(plain) < minCompress {
		return false
	}
	if len(plain) < sampleAbove {
		return true
	}
	mid := len(plain)/2 - sampleSize/2
	z := encoder().EncodeAll(plain[mid:mid+sampleSize], scratch[:0])
	return len(z) <= sampleSize-sampleSize/32
}

// sealInPlace encrypts b[1:] (the inner message) with key, appending the tag.
func sealInPlace(key [32]byte, b []byte) []byte {
	if cap(b)-len(b) < tagSize {
		b = append(make([]byte, 0, len(b)+tagSize), b...)
	}
	aead := newAEAD(key)
	return b[:1+len(aead.Seal(b[1:1], zeroNonce[:], b[1:], b[:1]))]
}

func newAEAD(key [32]byte) cipher.AEAD {
	block, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err) // only for a bad key length
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// DecodeChunk verifies stored against ref and returns the chunk's plaintext.
// It checks the ID (BLAKE3 of stored), the version byte, the AEAD tag, the
// compression flag, the zstd frame (decoding at most ref.Size bytes) and
// that the plaintext is ref.Size bytes long. Every failure is a
// cairn.Corrupt error naming the chunk by its short ID.
func DecodeChunk(ref manifest.Ref, stored []byte) ([]byte, error) {
	var bufs decodeBufs
	return decodeChunk(ref, stored, &bufs)
}

// decodeBufs are the buffers a decode may use; nil ones are allocated.
// The plaintext returned aliases one of them.
type decodeBufs struct {
	inner, plain []byte
}

var errShort = errors.New("truncated")

func decodeChunk(ref manifest.Ref, stored []byte, bufs *decodeBufs) ([]byte, error) {
	corrupt := func(err error) error {
		return cairn.E("decode chunk", cairn.Corrupt, ref.ID.Short(), err)
	}
	if blake3.Sum256(stored) != ref.ID {
		return nil, corrupt(errors.New("content does not match its id"))
	}
	if len(stored) < Overhead {
		return nil, corrupt(errShort)
	}
	if stored[0] != ChunkVersion {
		return nil, corrupt(fmt.Errorf("unsupported chunk version %d (this cairn reads %d)", stored[0], ChunkVersion))
	}
	if ref.Size > manifest.MaxChunkSize {
		return nil, corrupt(fmt.Errorf("declared size %d exceeds %d", ref.Size, manifest.MaxChunkSize))
	}
	n := len(stored) - 1 - tagSize
	if cap(bufs.inner) < n {
		bufs.inner = make([]byte, n)
	}
	inner, err := newAEAD(ref.Key).Open(bufs.inner[:0], zeroNonce[:], stored[1:], stored[:1])
	if err != nil {
		return nil, corrupt(errors.New("authentication failed (wrong key or damaged)"))
	}
	payload := inner[1:]
	switch inner[0] {
	case flagRaw:
		if len(payload) != int(ref.Size) {
			return nil, corrupt(fmt.Errorf("plaintext is %d bytes, ref says %d", len(payload), ref.Size))
		}
		return payload, nil
	case flagZstd:
		// The encoder keeps zstd output only when it is shorter.
		if len(payload) >= int(ref.Size) {
			return nil, corrupt(fmt.Errorf("compressed payload of %d bytes for %d plaintext bytes", len(payload), ref.Size))
		}
		if cap(bufs.plain) < int(ref.Size) {
			bufs.plain = make([]byte, ref.Size)
		}
		plain, err := decoder().DecodeAll(payload, bufs.plain[:0:ref.Size])
		if err != nil {
			return nil, corrupt(fmt.Errorf("decompressing: %w", err))
		}
		if len(plain) != int(ref.Size) {
			return nil, corrupt(fmt.Errorf("plaintext is %d bytes, ref says %d", len(plain), ref.Size))
		}
		return plain, nil
	default:
		return nil, corrupt(fmt.Errorf("unknown flag %d", inner[0]))
	}
}
