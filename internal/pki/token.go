package pki

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// TokenPrefix starts every join token, so a person (and a log scrubber)
// recognises one.
const TokenPrefix = "cairn-join-v1-"

// Token is a one-time join token: what `cairn invite` prints and `cairn join`
// takes. It carries the random secret that authenticates the joiner, the
// fingerprint of the realm CA (so the joiner accepts no other CA) and the
// address of the join endpoint. It names no role or node: those stay on the
// server, in the token's record.
type Token struct {
	ID            [16]byte // names the server-side record; sent in the clear
	Secret        [32]byte // never sent
	CAFingerprint [32]byte // SHA-256 of the realm CA certificate
	Addr          string   // host:port of the join endpoint
}

// String encodes the token: TokenPrefix, then base64url (no padding) of
// ID || Secret || CAFingerprint || len(Addr) (1 byte) || Addr || CRC-32C of
// everything before it (4 bytes, big-endian; catches copy-and-paste damage).
func (t Token) String() string {
	b := make([]byte, 0, 16+32+32+1+len(t.Addr)+4)
	b = append(b, t.ID[:]...)
	b = append(b, t.Secret[:]...)
	b = append(b, t.CAFingerprint[:]...)
	b = append(b, byte(len(t.Addr)))
	b = append(b, t.Addr...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ParseToken decodes a token made by String. Kind Invalid for anything else.
func ParseToken(s string) (Token, error) {
	const op = "parse join token"
	var t Token
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, TokenPrefix) {
		return t, cairn.E(op, cairn.Invalid, "", fmt.Errorf("a join token starts with %q", TokenPrefix))
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s[len(TokenPrefix):])
	if err != nil {
		return t, cairn.E(op, cairn.Invalid, "", fmt.Errorf("damaged token: %w", err))
	}
	const fixed = 16 + 32 + 32 + 1
	if len(b) < fixed+1+4 {
		return t, cairn.E(op, cairn.Invalid, "", errors.New("token too short"))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return t, cairn.E(op, cairn.Invalid, "", errors.New("token checksum mismatch: was it copied whole?"))
	}
	n := int(body[fixed-1])
	if n == 0 || len(body) != fixed+n {
		return t, cairn.E(op, cairn.Invalid, "", errors.New("token address length mismatch"))
	}
	copy(t.ID[:], body[0:16])
	copy(t.Secret[:], body[16:48])
	copy(t.CAFingerprint[:], body[48:80])
	t.Addr = string(body[fixed:])
	return t, nil
}

// Key derivation contexts (BLAKE3 DeriveKey) from the token secret.
const (
	ctxJoinMAC     = "cairn v1 join mac"
	ctxJoinPayload = "cairn v1 join payload"
)

// MACKey is the key that authenticates the join exchange in both directions.
// The server keeps it (not the secret) in the token's record.
func (t Token) MACKey() [32]byte { return deriveKey(ctxJoinMAC, t.Secret[:]) }

// payloadKey seals a device's payload. The server never stores it.
func (t Token) payloadKey() [32]byte { return deriveKey(ctxJoinPayload, t.Secret[:]) }

func deriveKey(ctx string, secret []byte) (k [32]byte) {
	blake3.DeriveKey(ctx, secret, k[:])
	return k
}

// IDString is the token ID in hex, the key of its record.
func (t Token) IDString() string { return hex.EncodeToString(t.ID[:]) }

// newToken makes a token with fresh random ID and secret.
func newToken(fp [32]byte, addr string) (Token, error) {
	t := Token{CAFingerprint: fp, Addr: addr}
	if _, err := rand.Read(t.ID[:]); err != nil {
		return t, err
	}
	if _, err := rand.Read(t.Secret[:]); err != nil {
		return t, err
	}
	return t, nil
}

// TokenRecord is the server's record of one token.
type TokenRecord struct {
	ID      string    `json:"id"`      // hex of Token.ID
	MACKey  []byte    `json:"mac_key"` // Token.MACKey(): verifies the joiner
	Role    Role      `json:"role"`
	Name    string    `json:"name,omitempty"` // empty: the joiner proposes one
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	Used    time.Time `json:"used,omitzero"`     // zero until redeemed
	UsedBy  string    `json:"used_by,omitempty"` // the name issued
	// Payload is the device payload, sealed under a key derived from the
	// token's secret, which the server does not hold; cleared on use.
	Payload []byte `json:"payload,omitempty"`
}

// TokenStore keeps token records. It is an interface so that the records can
// later live in etcd; TokenList keeps them in memory or in a file.
type TokenStore interface {
	// Add records a new token.
	Add(ctx context.Context, rec TokenRecord) error
	// Get returns the record of id, Kind NotFound if there is none.
	Get(ctx context.Context, id string) (TokenRecord, error)
	// Redeem marks the token used by usedBy at now, atomically: of
	// concurrent callers exactly one succeeds. It fails with Kind
	// Permission if the token is already used or expired at now, NotFound
	// if unknown. It returns the record as it was before, payload included;
	// the stored record keeps no payload.
	Redeem(ctx context.Context, id, usedBy string, now time.Time) (TokenRecord, error)
}

// TokenRetention is how long a used or expired token's record is kept (so
// that a second use is reported as "already used", not "unknown").
const TokenRetention = 7 * 24 * time.Hour

const tokenFormat = 1

// Versions of the files and messages of this package (doc/format.md, "Node
// wire protocol"): the token list, the revocation list, the join exchange.
const (
	TokenListFormat  = tokenFormat
	RevocationFormat = revocationFormat
	JoinFormat       = joinFormat
)

// TokenList is a TokenStore in memory or, if opened with a path, in a JSON
// file (mode 0600: its MAC keys let their holder join) updated under a file
// lock, so several processes may share it.
type TokenList struct {
	path string
	mu   sync.Mutex
	recs map[string]TokenRecord // memory only
}

type tokenFile struct {
	Format int           `json:"format"`
	Tokens []TokenRecord `json:"tokens"`
}

// NewTokenList returns an empty list kept in memory.
func NewTokenList() *TokenList { return &TokenList{recs: map[string]TokenRecord{}} }

// OpenTokenList returns the list kept in the file at path (created on the
// first Add).
func OpenTokenList(path string) (*TokenList, error) {
	l := &TokenList{path: path}
	if _, err := l.load(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *TokenList) load() (map[string]TokenRecord, error) {
	if l.path == "" {
		return l.recs, nil
	}
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]TokenRecord{}, nil
	}
	if err != nil {
		return nil, cairn.E("read tokens", cairn.IO, l.path, err)
	}
	var f tokenFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, cairn.E("read tokens", cairn.Corrupt, l.path, err)
	}
	if f.Format != tokenFormat {
		return nil, cairn.E("read tokens", cairn.Corrupt, l.path, fmt.Errorf("format %d, this cairn reads %d", f.Format, tokenFormat))
	}
	m := make(map[string]TokenRecord, len(f.Tokens))
	for _, r := range f.Tokens {
		m[r.ID] = r
	}
	return m, nil
}

func (l *TokenList) save(m map[string]TokenRecord) error {
	if l.path == "" {
		l.recs = m
		return nil
	}
	f := tokenFile{Format: tokenFormat, Tokens: make([]TokenRecord, 0, len(m))}
	for _, r := range m {
		f.Tokens = append(f.Tokens, r)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return cairn.E("write tokens", cairn.Other, l.path, err)
	}
	if err := durable.ReplaceFile(l.path, append(b, '\n'), 0o600); err != nil {
		return cairn.E("write tokens", cairn.IO, l.path, err)
	}
	return nil
}

// locked runs fn on the current records under the process and file locks,
// and saves what fn returns (if fn reports a change).
func (l *TokenList) locked(fn func(m map[string]TokenRecord) (changed bool, err error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path != "" {
		unlock, err := lockFile(l.path + ".lock")
		if err != nil {
			return cairn.E("lock tokens", cairn.IO, l.path, err)
		}
		defer unlock()
	}
	m, err := l.load()
	if err != nil {
		return err
	}
	changed, err := fn(m)
	if err != nil || !changed {
		return err
	}
	return l.save(m)
}

// Add implements TokenStore. It also drops records past TokenRetention.
func (l *TokenList) Add(ctx context.Context, rec TokenRecord) error {
	if err := ctx.Err(); err != nil {
		return cairn.E("add token", cairn.Canceled, "", err)
	}
	return l.locked(func(m map[string]TokenRecord) (bool, error) {
		if _, ok := m[rec.ID]; ok {
			return false, cairn.E("add token", cairn.Exist, rec.ID, nil)
		}
		for id, r := range m {
			if time.Since(r.Expires) > TokenRetention {
				delete(m, id)
			}
		}
		m[rec.ID] = rec
		return true, nil
	})
}

// Get implements TokenStore.
func (l *TokenList) Get(ctx context.Context, id string) (TokenRecord, error) {
	var rec TokenRecord
	if err := ctx.Err(); err != nil {
		return rec, cairn.E("get token", cairn.Canceled, "", err)
	}
	err := l.locked(func(m map[string]TokenRecord) (bool, error) {
		r, ok := m[id]
		if !ok {
			return false, cairn.E("get token", cairn.NotFound, id, errors.New("unknown join token"))
		}
		rec = r
		return false, nil
	})
	return rec, err
}

// Redeem implements TokenStore.
func (l *TokenList) Redeem(ctx context.Context, id, usedBy string, now time.Time) (TokenRecord, error) {
	var rec TokenRecord
	if err := ctx.Err(); err != nil {
		return rec, cairn.E("redeem token", cairn.Canceled, "", err)
	}
	err := l.locked(func(m map[string]TokenRecord) (bool, error) {
		r, ok := m[id]
		if !ok {
			return false, cairn.E("redeem token", cairn.NotFound, id, errors.New("unknown join token"))
		}
		if err := r.usable(now); err != nil {
			return false, err
		}
		rec = r
		r.Used, r.UsedBy, r.Payload = now.UTC(), usedBy, nil
		m[id] = r
		return true, nil
	})
	return rec, err
}

// usable reports why the token cannot be used at now, or nil.
func (r TokenRecord) usable(now time.Time) error {
	if !r.Used.IsZero() {
		return cairn.E("redeem token", cairn.Permission, r.ID, fmt.Errorf("join token already used (by %s at %s)", r.UsedBy, r.Used.Format(time.RFC3339)))
	}
	if !now.Before(r.Expires) {
		return cairn.E("redeem token", cairn.Permission, r.ID, fmt.Errorf("join token expired at %s", r.Expires.Format(time.RFC3339)))
	}
	return nil
}
