// Package surrogate is the surrogate service of data staging (the data
// staging paper, §2.3) and its client: an untrusted machine near a device
// offers a quota of soft-state space, under a lease, to the realm's
// devices, which stage there chunks they predict they will read (already
// encrypted and named by the BLAKE3 hash of their ciphertext) and read them
// back at one-hop latency.
//
// The API is the paper's (Figure 2): register (the client's X25519 public
// key; answers a client ID, a quota, a session key sealed to that key and a
// lease expiry), renew, deregister, stage (batched), unstage, get. Every
// request but register carries a MAC made with the session key over its
// method, path, body hash, time and nonce; a state-changing request whose
// nonce was seen within the time window is refused (a replay). The
// surrogate keeps soft state only: a restart, an expired lease or a
// deregistration deletes a client's chunks. It sees chunk IDs and
// ciphertext, never a file name, a file size or a key.
//
// The wire format, version 1, is written down in doc/surrogate.md; change
// one only with the other. Every decoder here takes untrusted bytes, bounds
// what it allocates and fails with Kind Invalid; each is fuzzed.
package surrogate

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
)

// Version is the wire format's version: the "format" of every JSON body and
// the first line of every MAC's input.
const Version = 1

// Paths (under the node's HTTP/2, mutual-TLS listener: the client must be a
// device of the realm, the server a surrogate).
const (
	PathPrefix     = "/surrogate/v1/"
	PathInfo       = PathPrefix + "info"       // GET → Info (TLS only, no session)
	PathRegister   = PathPrefix + "register"   // POST RegisterRequest → RegisterReply (TLS only)
	PathRenew      = PathPrefix + "renew"      // POST, empty, MAC → LeaseReply
	PathDeregister = PathPrefix + "deregister" // POST, empty, MAC → 204
	PathStage      = PathPrefix + "stage"      // POST object batch, MAC → UsageReply
	PathUnstage    = PathPrefix + "unstage"    // POST ID list, MAC → UsageReply
	PathChunk      = PathPrefix + "chunk/"     // + hex ID: GET, MAC → the chunk's bytes
)

// Headers of an authenticated request.
const (
	HeaderClient = "Cairn-Surrogate-Client" // the client ID (32 hex digits)
	HeaderTime   = "Cairn-Surrogate-Time"   // the client's idea of the surrogate's clock, Unix milliseconds
	HeaderNonce  = "Cairn-Surrogate-Nonce"  // 16 random bytes, 32 hex digits
	HeaderMAC    = "Cairn-Surrogate-Mac"    // HMAC-SHA256(session key, MACInput), 64 hex digits
)

// Limits. A server refuses a request beyond them (Kind Invalid); a client
// never sends one.
const (
	MaxRegisterBody = 4 << 10  // bytes of a register request
	MaxStageBytes   = 17 << 20 // bytes of one stage batch body
	MaxStageObjects = 4096     // chunks in one stage batch
	MaxChunk        = 16 << 20 // bytes of one staged chunk (a larger one is read from the real stores)
	MaxUnstageIDs   = 4096     // IDs in one unstage request
	MaxReply        = 64 << 10 // bytes of a JSON reply (client side)
	KeySize         = 32       // X25519 public key, session key
	ClientIDSize    = 16       // bytes of a client ID
	NonceSize       = 16       // bytes of a nonce
	macSize         = sha256.Size
	sealedKeySize   = KeySize + 32 + 16 // box.AnonymousOverhead (ephemeral key + Poly1305 tag)
)

// ClientID names one registration (one session). It is random: it says
// nothing about the client.
type ClientID [ClientIDSize]byte

func (c ClientID) String() string { return hex.EncodeToString(c[:]) }

// ParseClientID parses 32 hex digits.
func ParseClientID(s string) (ClientID, error) {
	var c ClientID
	if len(s) != 2*ClientIDSize {
		return c, invalid("client ID", fmt.Errorf("%d characters, want %d", len(s), 2*ClientIDSize))
	}
	if _, err := hex.Decode(c[:], []byte(s)); err != nil {
		return c, invalid("client ID", err)
	}
	return c, nil
}

// Nonce is a request's nonce.
type Nonce [NonceSize]byte

// ParseNonce parses 32 hex digits.
func ParseNonce(s string) (Nonce, error) {
	var n Nonce
	if len(s) != 2*NonceSize {
		return n, invalid("nonce", fmt.Errorf("%d characters, want %d", len(s), 2*NonceSize))
	}
	if _, err := hex.Decode(n[:], []byte(s)); err != nil {
		return n, invalid("nonce", err)
	}
	return n, nil
}

// ParseTime parses a request's time: decimal Unix milliseconds.
func ParseTime(s string) (time.Time, error) {
	if len(s) == 0 || len(s) > 20 {
		return time.Time{}, invalid("time", fmt.Errorf("%q is no Unix millisecond count", s))
	}
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms < 0 {
		return time.Time{}, invalid("time", fmt.Errorf("%q is no Unix millisecond count", s))
	}
	return time.UnixMilli(ms), nil
}

// MACInput is what a request's MAC covers: the format version, the method,
// the path, the client ID, the time, the nonce and the BLAKE3-256 hash of
// the body, one per line. The path names the chunk of a get, so a MAC made
// for one chunk opens no other.
func MACInput(method, path string, client ClientID, ms int64, nonce Nonce, body []byte) []byte {
	bh := blake3.Sum256(body)
	return fmt.Appendf(nil, "cairn-surrogate/%d\n%s\n%s\n%s\n%d\n%s\n%s", Version, method, path, client, ms, hex.EncodeToString(nonce[:]), hex.EncodeToString(bh[:]))
}

// MAC is HMAC-SHA256(key, MACInput(...)).
func MAC(key *[KeySize]byte, method, path string, client ClientID, ms int64, nonce Nonce, body []byte) []byte {
	m := hmac.New(sha256.New, key[:])
	m.Write(MACInput(method, path, client, ms, nonce, body))
	return m.Sum(nil)
}

// ParseMAC parses 64 hex digits.
func ParseMAC(s string) ([]byte, error) {
	if len(s) != 2*macSize {
		return nil, invalid("mac", fmt.Errorf("%d characters, want %d", len(s), 2*macSize))
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, invalid("mac", err)
	}
	return b, nil
}

// RegisterRequest is the body of a register request (JSON).
type RegisterRequest struct {
	Format int `json:"format"`
	// Key is the client's X25519 public key (32 bytes, base64 in JSON):
	// the session key is sealed to it. A client makes a new key pair per
	// registration.
	Key []byte `json:"key"`
	// Want is the quota the client asks for: it is granted at most this
	// (0: as much as the surrogate grants one client).
	Want int64 `json:"want,omitempty"`
}

// RegisterReply answers a register request (JSON).
type RegisterReply struct {
	Format int `json:"format"`
	// Client is the client ID the session's requests carry.
	Client string `json:"client"`
	// Quota is the most bytes of chunks the client may keep staged.
	Quota int64 `json:"quota"`
	// Sealed is the 32-byte session key, sealed to Key as a NaCl
	// anonymous box (X25519, XSalsa20-Poly1305): only the holder of the
	// private key opens it.
	Sealed []byte `json:"sealed"`
	// Expires is when the lease ends unless renewed (the surrogate's
	// clock), Lease its length and Now the surrogate's clock when it
	// answered: a client times its requests by the surrogate's clock.
	Expires time.Time `json:"expires"`
	Lease   int64     `json:"lease_ms"`
	Now     time.Time `json:"now"`
}

// LeaseReply answers renew (JSON).
type LeaseReply struct {
	Format  int       `json:"format"`
	Expires time.Time `json:"expires"`
	Lease   int64     `json:"lease_ms"`
	Now     time.Time `json:"now"`
}

// UsageReply answers stage and unstage (JSON): the bytes the client has
// staged now and its quota.
type UsageReply struct {
	Format int   `json:"format"`
	Used   int64 `json:"used"`
	Chunks int64 `json:"chunks"`
	Quota  int64 `json:"quota"`
}

// Info answers GET info (JSON): what the surrogate offers. Anything a
// device of the realm may ask; it needs no session.
type Info struct {
	Format int `json:"format"`
	// Offer is the space offered to all clients together; Free what no
	// client has been granted yet.
	Offer int64 `json:"offer"`
	Free  int64 `json:"free"`
	// Quota is what a new registration would be granted now.
	Quota   int64     `json:"quota"`
	Lease   int64     `json:"lease_ms"`
	Clients int       `json:"clients"`
	Now     time.Time `json:"now"`
}

func invalid(what string, err error) error {
	return cairn.E("decode "+what, cairn.Invalid, "", err)
}

// decodeJSON unmarshals one small JSON body of format Version.
func decodeJSON(what string, b []byte, max int, v any, format func() int) error {
	if len(b) > max {
		return invalid(what, fmt.Errorf("%d bytes exceeds %d", len(b), max))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return invalid(what, err)
	}
	if f := format(); f != Version {
		return invalid(what, fmt.Errorf("format %d, this cairn speaks %d", f, Version))
	}
	return nil
}

// DecodeRegisterRequest decodes and checks a register request.
func DecodeRegisterRequest(b []byte) (RegisterRequest, error) {
	var r RegisterRequest
	if err := decodeJSON("register request", b, MaxRegisterBody, &r, func() int { return r.Format }); err != nil {
		return r, err
	}
	if len(r.Key) != KeySize {
		return r, invalid("register request", fmt.Errorf("key of %d bytes, want %d", len(r.Key), KeySize))
	}
	if r.Want < 0 {
		return r, invalid("register request", fmt.Errorf("quota asked for %d", r.Want))
	}
	return r, nil
}

// DecodeRegisterReply decodes and checks a register reply.
func DecodeRegisterReply(b []byte) (RegisterReply, error) {
	var r RegisterReply
	if err := decodeJSON("register reply", b, MaxReply, &r, func() int { return r.Format }); err != nil {
		return r, err
	}
	if _, err := ParseClientID(r.Client); err != nil {
		return r, err
	}
	if len(r.Sealed) != sealedKeySize {
		return r, invalid("register reply", fmt.Errorf("sealed key of %d bytes, want %d", len(r.Sealed), sealedKeySize))
	}
	if r.Quota < 0 || r.Lease <= 0 {
		return r, invalid("register reply", fmt.Errorf("quota %d, lease %d ms", r.Quota, r.Lease))
	}
	return r, nil
}

// DecodeLeaseReply decodes a renew reply.
func DecodeLeaseReply(b []byte) (LeaseReply, error) {
	var r LeaseReply
	if err := decodeJSON("lease reply", b, MaxReply, &r, func() int { return r.Format }); err != nil {
		return r, err
	}
	if r.Lease <= 0 {
		return r, invalid("lease reply", fmt.Errorf("lease %d ms", r.Lease))
	}
	return r, nil
}

// DecodeUsageReply decodes a stage or unstage reply.
func DecodeUsageReply(b []byte) (UsageReply, error) {
	var r UsageReply
	if err := decodeJSON("usage reply", b, MaxReply, &r, func() int { return r.Format }); err != nil {
		return r, err
	}
	if r.Used < 0 || r.Quota < 0 || r.Chunks < 0 {
		return r, invalid("usage reply", fmt.Errorf("used %d, chunks %d, quota %d", r.Used, r.Chunks, r.Quota))
	}
	return r, nil
}

// DecodeInfo decodes an info reply.
func DecodeInfo(b []byte) (Info, error) {
	var r Info
	if err := decodeJSON("info", b, MaxReply, &r, func() int { return r.Format }); err != nil {
		return r, err
	}
	if r.Offer < 0 || r.Free < 0 || r.Quota < 0 || r.Lease <= 0 || r.Clients < 0 {
		return r, invalid("info", fmt.Errorf("offer %d, free %d, quota %d, lease %d ms, clients %d", r.Offer, r.Free, r.Quota, r.Lease, r.Clients))
	}
	return r, nil
}

// Object is one chunk of a stage batch. Data aliases the batch body.
type Object = wire.Object

// AppendObject appends one chunk to a stage batch: the node wire's object
// framing (ID, length as uint32 big-endian, data).
func AppendObject(b []byte, id cairn.ID, data []byte) []byte { return wire.AppendObject(b, id, data) }

// DecodeStage splits a stage batch body and checks its limits (not the
// IDs: the server hashes each chunk).
func DecodeStage(body []byte) ([]Object, error) {
	if len(body) > MaxStageBytes {
		return nil, invalid("stage batch", fmt.Errorf("%d bytes exceeds %d", len(body), MaxStageBytes))
	}
	objs, err := wire.DecodeObjects(body)
	if err != nil {
		return nil, invalid("stage batch", err)
	}
	if len(objs) > MaxStageObjects {
		return nil, invalid("stage batch", fmt.Errorf("%d chunks exceeds %d", len(objs), MaxStageObjects))
	}
	if len(objs) == 0 {
		return nil, invalid("stage batch", errors.New("no chunk"))
	}
	for _, o := range objs {
		if len(o.Data) > MaxChunk {
			return nil, invalid("stage batch", fmt.Errorf("chunk %s of %d bytes exceeds %d", o.ID.Short(), len(o.Data), MaxChunk))
		}
	}
	return objs, nil
}

// EncodeIDs is an unstage body: n × 32 bytes.
func EncodeIDs(ids []cairn.ID) []byte {
	b := make([]byte, 0, len(ids)*cairn.IDSize)
	for _, id := range ids {
		b = append(b, id[:]...)
	}
	return b
}

// DecodeIDs decodes an unstage body.
func DecodeIDs(b []byte) ([]cairn.ID, error) {
	if len(b)%cairn.IDSize != 0 {
		return nil, invalid("ID list", fmt.Errorf("%d bytes is no multiple of %d", len(b), cairn.IDSize))
	}
	n := len(b) / cairn.IDSize
	if n == 0 || n > MaxUnstageIDs {
		return nil, invalid("ID list", fmt.Errorf("%d IDs, want 1 to %d", n, MaxUnstageIDs))
	}
	ids := make([]cairn.ID, n)
	for i := range ids {
		copy(ids[i][:], b[i*cairn.IDSize:])
	}
	return ids, nil
}
