package keyring

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable/durabletest"
)

func TestSealedRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keyring")
	k, err := Create(p, []byte("correct horse"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMaster()
	k.Add("vol1", m)
	if serr := k.Save(); serr != nil {
		t.Fatal(serr)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	raw, _ := os.ReadFile(p)
	if containsBytes(raw, m[:]) || containsBytes(raw, []byte(base64.StdEncoding.EncodeToString(m[:]))) {
		t.Fatal("sealed keyring contains the raw key")
	}
	k2, err := Open(p, func() ([]byte, error) { return []byte("correct horse"), nil })
	if err != nil {
		t.Fatal(err)
	}
	got, err := k2.Key("vol1", "home")
	if err != nil || got != m {
		t.Fatalf("Key = %x, %v", got, err)
	}
	if _, kerr := k2.Key("other", "x"); !errors.Is(kerr, cairn.ErrPermission) {
		t.Fatalf("missing key err = %v", kerr)
	}
	_, err = Open(p, func() ([]byte, error) { return []byte("wrong"), nil })
	if !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("wrong passphrase err = %v, want Permission", err)
	}
}

func TestUnprotected(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keyring")
	k, _ := Create(p, nil)
	m := NewMaster()
	k.Add("v", m)
	if err := k.Save(); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(p); !containsBytes(raw, []byte(base64.StdEncoding.EncodeToString(m[:]))) {
		t.Fatal("unprotected keyring does not hold the key in the clear (test would not tell sealed from unsealed)")
	}
	k2, err := Open(p, func() ([]byte, error) { t.Fatal("asked for a passphrase"); return nil, nil })
	if err != nil || k2.Protected() {
		t.Fatal(err)
	}
	if got, _ := k2.Key("v", "v"); got != m {
		t.Fatal("key changed")
	}
	if _, err := Create(p, nil); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("Create over existing = %v", err)
	}
}

func TestCorruptKeyring(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keyring")
	os.WriteFile(p, []byte("{not json"), 0o600)
	if _, err := Open(p, nil); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("err = %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "none"), nil); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("err = %v", err)
	}
}

func containsBytes(h, n []byte) bool {
	for i := 0; i+len(n) <= len(h); i++ {
		if string(h[i:i+len(n)]) == string(n) {
			return true
		}
	}
	return false
}

// TestSaveFullDisk saves a keyring on a full file system: Save must fail
// and the keyring saved before must still open with its keys (a lost
// write error once renamed an empty file over it and reported success).
func TestSaveFullDisk(t *testing.T) {
	dir := durabletest.SmallTmpfs(t)
	p := filepath.Join(dir, "keyring")
	k, err := Create(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMaster()
	k.Add("vol1", m)
	if err = k.Save(); err != nil {
		t.Fatal(err)
	}
	// Fill the file system.
	durabletest.Fill(t, dir)
	k.Add("vol2", NewMaster())
	if err = k.Save(); !errors.Is(err, cairn.ErrIO) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full disk = %v, want an IO error wrapping ENOSPC", err)
	}
	k2, err := Open(p, nil)
	if err != nil {
		t.Fatalf("the keyring saved before the full disk does not open: %v", err)
	}
	if got, kerr := k2.Key("vol1", "home"); kerr != nil || got != m {
		t.Fatalf("Key(vol1) = %x, %v; want the key saved before", got, kerr)
	}
}
