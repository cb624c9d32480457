// Package pipeline turns file contents into stored chunks and back: it cuts
// a stream with keyed FastCDC, derives each chunk's convergent key, compresses,
// encrypts and names every chunk, asks a store which chunks it lacks and puts
// only those; and it fetches, verifies and reassembles chunks for reading.
//
// Chunk encoding, format version 1 (doc/format.md#chunks-and-manifests):
//
//	K      = BLAKE3-256 keyed(convergence key, P)          chunk key
//	inner  = flag || payload                                flag 0: payload = P; 1: zstd(P)
//	                                                        2: zstd(P) with a base chunk's
//	                                                           plaintext as raw dictionary
//	Kn     = BLAKE3 derive_key("cairn v1 chunk nonce key", K)
//	nonce  = BLAKE3-256 keyed(Kn, inner)[:12]
//	stored = 0x01 || nonce || AES-256-GCM(K, nonce, aad 0x01 || nonce, inner)
//	ID     = BLAKE3-256(stored)
//
// The nonce is synthetic (as in SIV): a function of the message it seals.
// K is a function of P, but inner need not be (a zstd upgrade or another
// compress-or-not decision changes it); two different inner messages under
// one K get different nonces (but for a 2^-96 chance), so a key never seals
// two messages under one nonce, which is what a GCM nonce-reuse attack
// needs. Such a change costs dedup, never confidentiality. The same inner
// always gives the same stored bytes, which is what makes convergent dedup
// work.
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
	// flagDelta: the payload is a zstd frame made with the plaintext of
	// another chunk (the base, named by the ref) as a raw dictionary.
	flagDelta = 2
)

const (
	nonceSize = 12
	tagSize   = 16
	// hdrSize is the length of the header before the ciphertext: the
	// version byte and the nonce. The AEAD authenticates it as its
	// associated data.
	hdrSize = 1 + nonceSize
	// Overhead is the stored size of a chunk beyond its payload: header,
	// flag byte and GCM tag.
	Overhead = hdrSize + 1 + tagSize

	// Compression is decided on a sample: chunks of at least sampleAbove
	// bytes get a zstd pass over sampleSize bytes from their middle first,
	// and are compressed whole only if that saves at least 1/32.
	sampleAbove = 8 << 10
	sampleSize  = 2 << 10
	// Chunks below minCompress bytes are stored raw: the zstd frame
	// overhead eats any gain.
	minCompress = 64
)

// nonceKeyContext is the BLAKE3 derive_key context of the nonce key Kn.
const nonceKeyContext = "cairn v1 chunk nonce key"

var (
	zencOnce sync.Once
	zenc     *zstd.Encoder
	zdecOnce sync.Once
	zdec     *zstd.Decoder
	// nonceKDF has absorbed the derive_key context; chunkNonce clones it.
	nonceKDF = blake3.NewDeriveKey(nonceKeyContext)
	// rawNonceKDF derives the nonce of raw chunks from the chunk key.
	rawNonceKDF = blake3.NewDeriveKey(rawNonceContext)
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

	// The header's nonce bytes are filled in by seal.
	stored = append(dst[:0], make([]byte, hdrSize)...)
	stored = append(stored, flagZstd)
	if shouldCompress(plain, stored[hdrSize+1:]) {
		z := encoder().EncodeAll(plain, stored)
		if len(z)-hdrSize-1 < len(plain) {
			stored, compressed = z, true
		}
	}
	switch {
	case compressed:
		stored = seal(&ref.Key, stored[:hdrSize], stored[hdrSize:])
	case head == 1:
		buf[0] = flagRaw
		stored = seal(&ref.Key, stored[:hdrSize], buf)
	default:
		stored[hdrSize] = flagRaw
		stored = append(stored[:hdrSize+1], plain...)
		stored = seal(&ref.Key, stored[:hdrSize], stored[hdrSize:])
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

// seal encrypts the inner message under key: it writes the version and the
// nonce into hdr[:hdrSize] and the ciphertext and tag after them. inner is
// either hdr's continuation in the same array (encrypted in place) or a
// slice that does not overlap hdr's capacity; hdr's array is used when its
// capacity suffices.
func seal(key *[32]byte, hdr, inner []byte) []byte {
	if cap(hdr) < hdrSize+len(inner)+tagSize {
		hdr = make([]byte, hdrSize, hdrSize+len(inner)+tagSize)
	}
	hdr = hdr[:hdrSize]
	hdr[0] = ChunkVersion
	n := chunkNonce(key, inner)
	copy(hdr[1:], n[:])
	// In place, hdr[hdrSize:hdrSize] is inner[:0], as Seal requires.
	ct := newAEAD(*key).Seal(hdr[hdrSize:hdrSize], hdr[1:], inner, hdr)
	return hdr[:hdrSize+len(ct)]
}

// chunkNonce returns the synthetic nonce of inner under the chunk key k:
// the first 12 bytes of BLAKE3 keyed by Kn = derive_key(nonceKeyContext, k).
//
// A raw inner message (flagRaw || plaintext) is the only raw message there
// can be under k, because k is a keyed hash of that very plaintext; so it
// needs no hash over its bytes, only a nonce of its own that looks like any
// other: the first 12 bytes of derive_key(rawNonceContext, k), one BLAKE3
// block. Only compressed messages, whose bytes depend on the compressor's
// version and decisions, pay for the keyed hash over the message; random
// data skips that pass on write and on read (measured: -28% write and -30%
// read throughput on random data when every chunk paid for it). A store
// cannot tell the two kinds apart: both nonces are keyed hashes.
const rawNonceContext = "cairn v1 raw chunk nonce"

// Clones of the context-keyed hashers, reused: blake3.DeriveKey would
// allocate 10 KiB per chunk, and a clone on the stack (10 KiB: the
// hasher's buffer) made every fetch goroutine's stack grow, copied, for
// every chunk read (runtime.newstack in a cold read's profile).
var (
	nonceHashers    = sync.Pool{New: func() any { return nonceKDF.Clone() }}
	rawNonceHashers = sync.Pool{New: func() any { return rawNonceKDF.Clone() }}
)

func chunkNonce(k *[32]byte, inner []byte) (n [nonceSize]byte) {
	if len(inner) > 0 && inner[0] == flagRaw {
		var sum [32]byte
		d := rawNonceHashers.Get().(*blake3.Hasher)
		d.Reset()
		d.Write(k[:])
		d.Sum(sum[:0])
		rawNonceHashers.Put(d)
		copy(n[:], sum[:])
		return n
	}
	var kn [32]byte
	d := nonceHashers.Get().(*blake3.Hasher)
	d.Reset()
	d.Write(k[:])
	d.Sum(kn[:0])
	nonceHashers.Put(d)
	h, err := blake3.NewKeyed(kn[:])
	if err != nil {
		panic(err) // only for a bad key length
	}
	h.Write(inner)
	var sum [32]byte
	h.Sum(sum[:0])
	copy(n[:], sum[:])
	return n
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

// DecodeDelta is DecodeChunk for a ref with a Base: base is the base's
// plaintext (from DecodeChunk of the base's stored bytes).
func DecodeDelta(ref manifest.Ref, stored, base []byte) ([]byte, error) {
	bufs := decodeBufs{base: base}
	return decodeChunk(ref, stored, &bufs)
}

// DecodeChunk verifies stored against ref and returns the chunk's plaintext.
// It checks the ID (BLAKE3 of stored), the version byte, the AEAD tag, that
// the nonce is the one the decrypted inner message gives, the compression
// flag, the zstd frame (decoding at most ref.Size bytes) and that the
// plaintext is ref.Size bytes long. Every failure is a
// cairn.Corrupt error naming the chunk by its short ID.
func DecodeChunk(ref manifest.Ref, stored []byte) ([]byte, error) {
	var bufs decodeBufs
	return decodeChunk(ref, stored, &bufs)
}

// decodeBufs are the buffers a decode may use; nil ones are allocated.
// The plaintext returned aliases one of them.
type decodeBufs struct {
	inner, plain []byte
	// base is the plaintext of ref.Base, for a delta chunk.
	base []byte
	// verified: the store noted that stored hashes to ref.ID
	// (store.VerifyNote), so decodeChunk does not hash it again.
	verified bool
}

var errShort = errors.New("truncated")

func decodeChunk(ref manifest.Ref, stored []byte, bufs *decodeBufs) ([]byte, error) {
	corrupt := func(err error) error {
		return cairn.E("decode chunk", cairn.Corrupt, ref.ID.Short(), err)
	}
	if !bufs.verified && blake3.Sum256(stored) != ref.ID {
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
	n := len(stored) - hdrSize - tagSize
	if cap(bufs.inner) < n {
		bufs.inner = make([]byte, n)
	}
	hdr := stored[:hdrSize]
	inner, err := newAEAD(ref.Key).Open(bufs.inner[:0], hdr[1:], stored[hdrSize:], hdr)
	if err != nil {
		return nil, corrupt(errors.New("authentication failed (wrong key or damaged)"))
	}
	// Only a writer holding K can make this fail (a store cannot pass the
	// tag): the check keeps one stored form per inner message.
	if nonce := chunkNonce(&ref.Key, inner); string(nonce[:]) != string(hdr[1:]) {
		return nil, corrupt(errors.New("nonce does not match the content"))
	}
	payload := inner[1:]
	if (inner[0] == flagDelta) != (ref.Base != nil) {
		return nil, corrupt(fmt.Errorf("chunk flag %d but the ref names a base: %t", inner[0], ref.Base != nil))
	}
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
	case flagDelta:
		if len(payload) >= int(ref.Size) {
			return nil, corrupt(fmt.Errorf("delta payload of %d bytes for %d plaintext bytes", len(payload), ref.Size))
		}
		if bufs.base == nil || len(bufs.base) != int(ref.Base.Size) {
			return nil, corrupt(fmt.Errorf("delta chunk decoded without its base %s", ref.Base.ID.Short()))
		}
		if cap(bufs.plain) < int(ref.Size) {
			bufs.plain = make([]byte, ref.Size)
		}
		plain, err := decodeDelta(payload, bufs.base, bufs.plain[:0:ref.Size])
		if err != nil {
			return nil, corrupt(fmt.Errorf("decoding delta against %s: %w", ref.Base.ID.Short(), err))
		}
		if len(plain) != int(ref.Size) {
			return nil, corrupt(fmt.Errorf("plaintext is %d bytes, ref says %d", len(plain), ref.Size))
		}
		return plain, nil
	default:
		return nil, corrupt(fmt.Errorf("unknown flag %d", inner[0]))
	}
}

// Delta chunks. A small file rewritten with a few changed bytes would send
// each changed chunk whole; stored instead as a zstd frame that uses the
// previous version's chunk at that place (the base) as a raw dictionary, it
// costs about what the change costs. The chunk key is still the convergent
// key of the new plaintext and the nonce a keyed hash of the inner message
// (as for flag 1), so a store cannot tell a delta from any other chunk; the
// base is named only in the (encrypted) manifest. A base is never itself a
// delta, so a reader needs at most one extra object per chunk.

// deltaLevel is the zstd level of deltas.
const deltaLevel = zstd.SpeedFastest

// deltaWindow is the zstd window of every delta: it covers the base and
// the chunk, so the whole base can be referenced. Deltas are made only for
// small files (the caller's limit is 256 KiB), so both fit.
const deltaWindow = 1 << 20

// MaxDeltaInput is the largest base plus chunk a delta is made for.
const MaxDeltaInput = deltaWindow

// noDict is the dictionary a pooled delta coder holds between uses, so it
// keeps no reference to a base's plaintext.
var noDict = make([]byte, 8)

// Building a zstd coder per delta cost 1.5 ms and 3 MB of allocation per
// 32 KiB chunk (its tables), 6x the time of a put without deltas; pooled
// coders are reset with the next base as their dictionary instead.
var (
	deltaEncoders = sync.Pool{New: func() any {
		enc, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(deltaLevel),
			zstd.WithEncoderCRC(false),
			zstd.WithEncoderConcurrency(1),
			zstd.WithLowerEncoderMem(true),
			zstd.WithWindowSize(deltaWindow),
			zstd.WithEncoderDictRaw(0, noDict))
		if err != nil {
			panic(err) // the options are constants
		}
		return enc
	}}
	deltaDecoders = sync.Pool{New: func() any {
		dec, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecodeAllCapLimit(true),
			zstd.WithDecoderMaxMemory(manifest.MaxChunkSize),
			zstd.WithDecoderDictRaw(0, noDict))
		if err != nil {
			panic(err)
		}
		return dec
	}}
)

// encodeDelta encodes plain as a delta chunk against base, a plain chunk
// whose plaintext is basePlain. The result has the same Key and Size as
// the plain encoding of plain; ok is false if zstd did not make the
// payload shorter than plain.
func encodeDelta(hp *hasherPool, plain []byte, base manifest.Ref, basePlain []byte) (ref manifest.Ref, stored []byte, ok bool) {
	if base.Base != nil || len(basePlain) != int(base.Size) || len(plain) == 0 || len(basePlain) == 0 ||
		len(basePlain)+len(plain) > MaxDeltaInput {
		return ref, nil, false
	}
	enc := deltaEncoders.Get().(*zstd.Encoder)
	if err := enc.ResetWithOptions(nil, zstd.WithEncoderDictRaw(0, basePlain)); err != nil {
		return ref, nil, false
	}
	stored = make([]byte, hdrSize, hdrSize+1+len(plain)/2+tagSize+64)
	stored = append(stored, flagDelta)
	stored = enc.EncodeAll(plain, stored)
	if enc.ResetWithOptions(nil, zstd.WithEncoderDictRaw(0, noDict)) == nil {
		deltaEncoders.Put(enc)
	}
	if len(stored)-hdrSize-1 >= len(plain) {
		return ref, nil, false
	}
	ref.Key = hp.chunkKey(plain)
	ref.Size = uint32(len(plain))
	b := base
	ref.Base = &b
	stored = seal(&ref.Key, stored[:hdrSize], stored[hdrSize:])
	ref.ID = blake3.Sum256(stored)
	return ref, stored, true
}

// decodeDelta decompresses a delta payload with base as its dictionary
// into dst, whose capacity caps the output.
func decodeDelta(payload, base, dst []byte) ([]byte, error) {
	dec := deltaDecoders.Get().(*zstd.Decoder)
	if err := dec.ResetWithOptions(nil, zstd.WithDecoderDictRaw(0, base)); err != nil {
		return nil, err
	}
	out, err := dec.DecodeAll(payload, dst)
	if dec.ResetWithOptions(nil, zstd.WithDecoderDictRaw(0, noDict)) == nil {
		deltaDecoders.Put(dec)
	}
	return out, err
}
