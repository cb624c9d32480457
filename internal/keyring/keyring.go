// Package keyring keeps a device's volume master keys in one file, sealed with
// a key derived from the owner's passphrase (Argon2id), or, when the owner
// asks for it, unsealed in a file only they can read.
package keyring

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/chacha20poly1305"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/volkey"
)

// FormatVersion of the keyring file.
const FormatVersion = 1

// KDF holds Argon2id parameters. Defaults follow RFC 9106's second
// recommended option (64 MiB, 3 passes), with 2 lanes for 2-core machines.
type KDF struct {
	Alg       string `json:"alg"`
	Time      uint32 `json:"time"`
	MemoryKiB uint32 `json:"memory_kib"`
	Threads   uint8  `json:"threads"`
	Salt      []byte `json:"salt"`
}

// DefaultKDF returns fresh parameters with a random salt.
func DefaultKDF() KDF {
	return KDF{Alg: "argon2id", Time: 3, MemoryKiB: 64 * 1024, Threads: 2, Salt: random(16)}
}

type file struct {
	Format     int               `json:"format"`
	Protection string            `json:"protection"` // "passphrase" or "none"
	KDF        *KDF              `json:"kdf,omitempty"`
	Nonce      []byte            `json:"nonce,omitempty"`
	Sealed     []byte            `json:"sealed,omitempty"`
	Keys       map[string][]byte `json:"keys,omitempty"` // protection "none" only
}

// Keyring is an open keyring: volume ID → master key.
type Keyring struct {
	path string
	kdf  *KDF
	kek  []byte // nil when unprotected
	keys map[string]volkey.Master
}

// Protected reports whether the keyring is sealed with a passphrase.
func (k *Keyring) Protected() bool { return k.kek != nil }

// Create makes a new, empty keyring at path (which must not exist). A nil
// passphrase leaves the keys unsealed in a 0600 file.
func Create(path string, passphrase []byte) (*Keyring, error) {
	if _, err := os.Stat(path); err == nil {
		return nil, cairn.E("create keyring", cairn.Exist, path, nil)
	}
	k := &Keyring{path: path, keys: map[string]volkey.Master{}}
	if passphrase != nil {
		if len(passphrase) == 0 {
			return nil, cairn.E("create keyring", cairn.Invalid, path, errors.New("empty passphrase (use --no-passphrase to store keys unprotected)"))
		}
		kdf := DefaultKDF()
		k.kdf = &kdf
		k.kek = derive(passphrase, kdf)
	}
	return k, nil
}

// Open reads the keyring at path. passphrase is called only when the file is
// sealed; a wrong passphrase gives a Permission error.
func Open(path string, passphrase func() ([]byte, error)) (*Keyring, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, cairn.E("open keyring", cairn.NotFound, path, errors.New("no keyring: run 'cairn init' first"))
		}
		return nil, cairn.E("open keyring", cairn.IO, path, err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, cairn.E("open keyring", cairn.Corrupt, path, err)
	}
	if f.Format != FormatVersion {
		return nil, cairn.E("open keyring", cairn.Invalid, path, fmt.Errorf("keyring format %d, this cairn reads %d", f.Format, FormatVersion))
	}
	k := &Keyring{path: path, keys: map[string]volkey.Master{}}
	var raw map[string][]byte
	switch f.Protection {
	case "none":
		raw = f.Keys
	case "passphrase":
		if f.KDF == nil || f.KDF.Alg != "argon2id" || f.KDF.MemoryKiB > 4<<20 || f.KDF.Time > 100 || f.KDF.Threads == 0 {
			return nil, cairn.E("open keyring", cairn.Corrupt, path, errors.New("bad key-derivation parameters"))
		}
		pass, err := passphrase()
		if err != nil {
			return nil, err
		}
		k.kdf = f.KDF
		k.kek = derive(pass, *f.KDF)
		aead, _ := chacha20poly1305.NewX(k.kek)
		if len(f.Nonce) != aead.NonceSize() {
			return nil, cairn.E("open keyring", cairn.Corrupt, path, errors.New("bad nonce"))
		}
		plain, err := aead.Open(nil, f.Nonce, f.Sealed, []byte("cairn keyring v1"))
		if err != nil {
			return nil, cairn.E("open keyring", cairn.Permission, path, errors.New("wrong passphrase"))
		}
		if err := json.Unmarshal(plain, &raw); err != nil {
			return nil, cairn.E("open keyring", cairn.Corrupt, path, err)
		}
	default:
		return nil, cairn.E("open keyring", cairn.Corrupt, path, fmt.Errorf("unknown protection %q", f.Protection))
	}
	for id, key := range raw {
		if len(key) != volkey.Size {
			return nil, cairn.E("open keyring", cairn.Corrupt, path, fmt.Errorf("key for volume %s has %d bytes", id, len(key)))
		}
		k.keys[id] = volkey.Master(key)
	}
	return k, nil
}

// Key returns the master key of volume id.
func (k *Keyring) Key(volID, volName string) (volkey.Master, error) {
	m, ok := k.keys[volID]
	if !ok {
		return m, cairn.E("volume key", cairn.Permission, volName, errors.New("this device holds no key for the volume"))
	}
	return m, nil
}

// Add records a volume's key (call Save to persist).
func (k *Keyring) Add(volID string, m volkey.Master) { k.keys[volID] = m }

// Remove forgets a key (call Save to persist).
func (k *Keyring) Remove(id string) { delete(k.keys, id) }

// NewMaster returns a fresh random volume master key.
func NewMaster() volkey.Master { return volkey.Master(random(volkey.Size)) }

// Save writes the keyring atomically (temp file, fsync, rename) with mode 0600.
func (k *Keyring) Save() error {
	raw := make(map[string][]byte, len(k.keys))
	for id, m := range k.keys {
		raw[id] = append([]byte(nil), m[:]...)
	}
	f := file{Format: FormatVersion}
	if k.kek == nil {
		f.Protection, f.Keys = "none", raw
	} else {
		plain, _ := json.Marshal(raw)
		aead, _ := chacha20poly1305.NewX(k.kek)
		f.Protection, f.KDF = "passphrase", k.kdf
		f.Nonce = random(aead.NonceSize())
		f.Sealed = aead.Seal(nil, f.Nonce, plain, []byte("cairn keyring v1"))
	}
	b, _ := json.MarshalIndent(f, "", "  ")
	return durable.ReplaceFile(k.path, b, 0o600)
}

func derive(pass []byte, p KDF) []byte {
	return argon2.IDKey(pass, p.Salt, p.Time, p.MemoryKiB, p.Threads, chacha20poly1305.KeySize)
}

func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}
