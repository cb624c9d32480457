package userkey

import (
	"bytes"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/volkey"
)

func master(b byte) volkey.Master {
	var m volkey.Master
	for i := range m {
		m[i] = b + byte(i)
	}
	return m
}

func kindOf(t *testing.T, err error) cairn.Kind {
	t.Helper()
	var e *cairn.Error
	if !errors.As(err, &e) {
		t.Fatalf("not a cairn error: %v", err)
	}
	return e.Kind
}

func TestStanzaSealOpen(t *testing.T) {
	priv, pub := Generate()
	if p, err := priv.Public(); err != nil || p != pub {
		t.Fatalf("Public: %x %v, want %x", p, err, pub)
	}
	m := master(7)
	s, err := Seal(pub, "realm1", "vol1", m)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != StanzaSize || s[0] != StanzaFormat {
		t.Fatalf("stanza of %d bytes, format %d", len(s), s[0])
	}
	got, err := Open(priv, "realm1", "vol1", s)
	if err != nil || got != m {
		t.Fatalf("Open: %x %v", got, err)
	}
	// Two stanzas for one key differ (fresh ephemeral key each time).
	s2, _ := Seal(pub, "realm1", "vol1", m)
	if bytes.Equal(s, s2) {
		t.Fatal("two seals gave one stanza")
	}
	if bytes.Contains(s, m[:]) {
		t.Fatal("the stanza holds the master key in the clear")
	}
}

func TestStanzaWrongKeyOrContext(t *testing.T) {
	priv, pub := Generate()
	other, _ := Generate()
	s, err := Seal(pub, "realm1", "vol1", master(1))
	if err != nil {
		t.Fatal(err)
	}
	for name, open := range map[string]func() error{
		"another user's key": func() error { _, err := Open(other, "realm1", "vol1", s); return err },
		"another volume":     func() error { _, err := Open(priv, "realm1", "vol2", s); return err },
		"another realm":      func() error { _, err := Open(priv, "realm2", "vol1", s); return err },
	} {
		err := open()
		if err == nil {
			t.Fatalf("%s: opened", name)
		}
		if k := kindOf(t, err); k != cairn.Permission {
			t.Errorf("%s: kind %v, want Permission: %v", name, k, err)
		}
	}
}

func TestStanzaTampering(t *testing.T) {
	priv, pub := Generate()
	s, err := Seal(pub, "r", "v", master(3))
	if err != nil {
		t.Fatal(err)
	}
	// Every single-bit flip of every byte is refused.
	for i := range s {
		for bit := 0; bit < 8; bit++ {
			b := append([]byte(nil), s...)
			b[i] ^= 1 << bit
			if _, err := Open(priv, "r", "v", b); err == nil {
				t.Fatalf("byte %d bit %d flipped: opened", i, bit)
			} else if k := kindOf(t, err); k != cairn.Permission && k != cairn.Corrupt {
				t.Fatalf("byte %d bit %d flipped: kind %v", i, bit, k)
			}
		}
	}
	for _, b := range [][]byte{nil, s[:1], s[:len(s)-1], append(append([]byte(nil), s...), 0)} {
		if _, err := Open(priv, "r", "v", b); err == nil || kindOf(t, err) != cairn.Corrupt {
			t.Fatalf("stanza of %d bytes: %v, want Corrupt", len(b), err)
		}
	}
	if _, err := Seal(Public{}, "r", "v", master(1)); err == nil {
		t.Fatal("sealed to the all-zero (low-order) public key")
	}
}

// FuzzStanzaDecode feeds arbitrary bytes to the decoder and to Open: they
// never panic, and what Decode accepts has the one stanza size.
func FuzzStanzaDecode(f *testing.F) {
	priv, pub := Generate()
	s, err := Seal(pub, "r", "v", master(9))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(s)
	f.Add([]byte{})
	f.Add([]byte{StanzaFormat})
	f.Add(make([]byte, StanzaSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err == nil && (len(b) != StanzaSize || len(d.Sealed) != StanzaSize-1-Size) {
			t.Fatalf("decoded a stanza of %d bytes", len(b))
		}
		m, err := Open(priv, "r", "v", b)
		if err == nil && !bytes.Equal(b, s) {
			// Only the seed (or a forgery, which the AEAD forbids) opens.
			t.Fatalf("opened a stanza that is not the sealed one: %x", m)
		}
	})
}
