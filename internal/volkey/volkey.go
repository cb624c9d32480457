// Package volkey derives a volume's working keys from its 32-byte master key.
// Each purpose gets its own key through BLAKE3's key-derivation mode with a
// fixed, versioned context string, so learning one derived key reveals nothing
// about the others or about the master key.
package volkey

import "github.com/zeebo/blake3"

// Size is the length of every key in bytes.
const Size = 32

// Master is a volume's master key. It never leaves a trusted device.
type Master [Size]byte

func (m Master) derive(context string) [Size]byte {
	var out [Size]byte
	blake3.DeriveKey(context, m[:], out[:])
	return out
}

// Convergence keys the BLAKE3 that turns a chunk's plaintext into its chunk
// key: equal plaintexts in one volume get equal keys (dedup), and nobody
// without this key can confirm a guessed plaintext.
func (m Master) Convergence() [Size]byte { return m.derive("cairn v1 chunk convergence") }

// Gear seeds the FastCDC gear table, so chunk boundaries (and thus chunk
// sizes seen by a store) do not leak content to anyone without the key.
func (m Master) Gear() [Size]byte { return m.derive("cairn v1 fastcdc gear table") }

// ManifestWrap wraps (encrypts) each manifest's own random key.
func (m Master) ManifestWrap() [Size]byte { return m.derive("cairn v1 manifest key wrap") }
