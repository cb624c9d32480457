// Package userkey holds a user's X25519 key pair and the stanzas that wrap a
// volume's master key to one user's public key, age-style: a fresh
// ephemeral X25519 key per stanza, HKDF-SHA256 over the shared secret, and
// ChaCha20-Poly1305 over the 32-byte master key. Anyone may seal to a
// public key; only the holder of the matching private key opens.
package userkey

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"

	"golang.org/x/crypto/chacha20poly1305"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/volkey"
)

// StanzaFormat is the version of the stanza encoding (its first byte).
const StanzaFormat = 1

// Size is the length of a public or private key.
const Size = 32

// StanzaSize is the length of an encoded stanza: format byte, ephemeral
// public key, sealed master key (32 bytes and a 16-byte tag).
const StanzaSize = 1 + Size + volkey.Size + chacha20poly1305.Overhead

// Public and Private are a user's X25519 keys.
type (
	Public  [Size]byte
	Private [Size]byte
)

// Generate returns a fresh key pair.
func Generate() (Private, Public) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	return Private(k.Bytes()), Public(k.PublicKey().Bytes())
}

// Public returns the public key of priv.
func (priv Private) Public() (Public, error) {
	k, err := ecdh.X25519().NewPrivateKey(priv[:])
	if err != nil {
		return Public{}, cairn.E("user key", cairn.Corrupt, "", err)
	}
	return Public(k.PublicKey().Bytes()), nil
}

// stanzaAD binds a stanza to one volume of one realm: a stanza copied to
// another volume's grant does not open.
func stanzaAD(realmID, volID string) []byte {
	return []byte("cairn v1 volume key stanza\x00" + realmID + "\x00" + volID)
}

// stanzaKey is HKDF-SHA256(IKM = shared secret, salt = ephemeral public ||
// recipient public, info = stanzaAD), 32 bytes.
func stanzaKey(shared []byte, eph, to Public, realmID, volID string) ([]byte, error) {
	salt := append(append([]byte{}, eph[:]...), to[:]...)
	return hkdf.Key(sha256.New, shared, salt, string(stanzaAD(realmID, volID)), chacha20poly1305.KeySize)
}

// Seal wraps master to the public key to, for volume volID of realm realmID.
// The stanza is format byte 1 || ephemeral public key (32) ||
// ChaCha20-Poly1305(stanza key, zero nonce, master, AD = stanzaAD).
func Seal(to Public, realmID, volID string, master volkey.Master) ([]byte, error) {
	const op = "seal volume key"
	recipient, err := ecdh.X25519().NewPublicKey(to[:])
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, volID, err)
	}
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, volID, err)
	}
	shared, err := eph.ECDH(recipient)
	if err != nil {
		// A low-order public key: no secret is shared with anyone.
		return nil, cairn.E(op, cairn.Invalid, volID, err)
	}
	ephPub := Public(eph.PublicKey().Bytes())
	key, err := stanzaKey(shared, ephPub, to, realmID, volID)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, volID, err)
	}
	aead, _ := chacha20poly1305.New(key)
	out := make([]byte, 1+Size, StanzaSize)
	out[0] = StanzaFormat
	copy(out[1:], ephPub[:])
	// The key is fresh for every stanza (a new ephemeral key), so the
	// zero nonce is used once.
	return aead.Seal(out, make([]byte, aead.NonceSize()), master[:], stanzaAD(realmID, volID)), nil
}

// Stanza is a decoded stanza.
type Stanza struct {
	Ephemeral Public
	Sealed    []byte // the master key and its tag
}

// Decode parses a stanza without opening it (Corrupt if malformed).
func Decode(b []byte) (Stanza, error) {
	if len(b) == 0 || b[0] != StanzaFormat {
		f := -1
		if len(b) > 0 {
			f = int(b[0])
		}
		return Stanza{}, cairn.E("decode key stanza", cairn.Corrupt, "", fmt.Errorf("stanza format %d, this cairn reads %d", f, StanzaFormat))
	}
	if len(b) != StanzaSize {
		return Stanza{}, cairn.E("decode key stanza", cairn.Corrupt, "", fmt.Errorf("stanza of %d bytes, want %d", len(b), StanzaSize))
	}
	var s Stanza
	copy(s.Ephemeral[:], b[1:1+Size])
	s.Sealed = append([]byte(nil), b[1+Size:]...)
	return s, nil
}

// Open unwraps a stanza with the recipient's private key. A malformed
// stanza is Corrupt; one sealed to another key, for another volume or
// realm, or altered, is Permission.
func Open(priv Private, realmID, volID string, b []byte) (volkey.Master, error) {
	const op = "open volume key"
	var m volkey.Master
	s, err := Decode(b)
	if err != nil {
		return m, err
	}
	k, err := ecdh.X25519().NewPrivateKey(priv[:])
	if err != nil {
		return m, cairn.E(op, cairn.Corrupt, volID, err)
	}
	eph, err := ecdh.X25519().NewPublicKey(s.Ephemeral[:])
	if err != nil {
		return m, cairn.E(op, cairn.Corrupt, volID, err)
	}
	shared, err := k.ECDH(eph)
	if err != nil {
		return m, cairn.E(op, cairn.Corrupt, volID, fmt.Errorf("ephemeral key: %w", err))
	}
	to := Public(k.PublicKey().Bytes())
	key, err := stanzaKey(shared, s.Ephemeral, to, realmID, volID)
	if err != nil {
		return m, cairn.E(op, cairn.Other, volID, err)
	}
	aead, _ := chacha20poly1305.New(key)
	plain, err := aead.Open(nil, make([]byte, aead.NonceSize()), s.Sealed, stanzaAD(realmID, volID))
	if err != nil {
		return m, cairn.E(op, cairn.Permission, volID, errors.New("the stanza is not sealed to this user's key for this volume (or was altered)"))
	}
	copy(m[:], plain)
	return m, nil
}
