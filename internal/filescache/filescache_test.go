package filescache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func entry(n int) Entry {
	var m cairn.ID
	m[0], m[31] = byte(n), 0xee
	return Entry{Stat: Stat{Dev: 2049, Ino: uint64(1000 + n), Size: int64(4096 * n), Mtime: 1700000000123456789 + int64(n), Ctime: 1700000001987654321 - int64(n)},
		Parent: 77, Rev: int64(500 + n), Ino: uint64(9000 + n), N: uint64(n), Manifest: m}
}

func TestRoundTripAndFinish(t *testing.T) {
	c := New("vol1", "home:/backup", 42)
	paths := []string{"/src/a/x", "/src/a/y", "/src/b", "/other/z"}
	for i, p := range paths {
		c.Record(p, entry(i+1))
	}
	if !c.Finish([]string{"/src"}) {
		t.Fatal("Finish of new entries reports no change")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "cache")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	d, err := Load(path, "vol1", "home:/backup", 42)
	if err != nil || d.Len() != 4 {
		t.Fatalf("Load: %d entries, %v", d.Len(), err)
	}
	for i, p := range paths {
		e, k := d.Lookup(p)
		if k < 0 || e != entry(i+1) {
			t.Fatalf("Lookup(%s) = %+v, %d; want %+v", p, e, k, entry(i+1))
		}
	}
	if _, k := d.Lookup("/src/a"); k >= 0 {
		t.Fatal("found an entry never recorded")
	}
	// A put of /src that meets x unchanged, y changed, and not b: b is
	// dropped (gone from the sources), /other/z kept (another source).
	_, kx := d.Lookup("/src/a/x")
	d.Keep(kx)
	y := entry(9)
	d.Record("/src/a/y", y)
	if !d.Finish([]string{"/src"}) {
		t.Fatal("no change reported")
	}
	if _, k := d.Lookup("/src/b"); k >= 0 {
		t.Fatal("/src/b kept though gone from the sources")
	}
	if e, k := d.Lookup("/src/a/y"); k < 0 || e != y {
		t.Fatal("/src/a/y not updated")
	}
	if _, k := d.Lookup("/other/z"); k < 0 {
		t.Fatal("/other/z dropped")
	}
	// Everything kept: nothing to save.
	for _, p := range []string{"/src/a/x", "/src/a/y"} {
		_, k := d.Lookup(p)
		d.Keep(k)
	}
	if d.Finish([]string{"/src"}) {
		t.Fatal("a put that changed nothing reports a change")
	}
	// After a failed put (no roots), entries not met are kept.
	if d.Finish(nil) {
		t.Fatal("Finish(nil) with nothing met reports a change")
	}
	if d.Len() != 3 {
		t.Fatalf("%d entries after a failed put, want 3", d.Len())
	}

	// Another volume, destination or etcd cluster: ignored.
	for _, w := range []struct {
		vol, dest string
		cluster   uint64
	}{{"vol2", "home:/backup", 42}, {"vol1", "home:/other", 42}, {"vol1", "home:/backup", 43}} {
		if e, err := Load(path, w.vol, w.dest, w.cluster); err == nil || e.Len() != 0 {
			t.Fatalf("Load for %v: %d entries, %v; want none and an error", w, e.Len(), err)
		}
	}
	// Absent: empty, no error.
	if e, err := Load(filepath.Join(dir, "none"), "vol1", "home:/backup", 42); err != nil || e.Len() != 0 {
		t.Fatalf("Load of an absent file: %d, %v", e.Len(), err)
	}
}

func TestTornOrDamagedIsIgnored(t *testing.T) {
	c := New("vol1", "home:/", 7)
	for i := range 50 {
		c.Record("/src/f"+string(rune('a'+i%26))+string(rune('a'+i/26)), entry(i))
	}
	c.Finish(nil)
	b := c.Encode()
	path := filepath.Join(t.TempDir(), "cache")
	// Every truncation and every single flipped byte is refused.
	for n := 0; n < len(b); n++ {
		if _, err := Decode(b[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Decode of the first %d of %d bytes: %v", n, len(b), err)
		}
	}
	for i := 0; i < len(b); i++ {
		d := bytes.Clone(b)
		d[i] ^= 0x10
		if _, err := Decode(d); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Decode with byte %d flipped: %v", i, err)
		}
		if i == len(b)/2 {
			if err := os.WriteFile(path, d, 0o600); err != nil {
				t.Fatal(err)
			}
			if l, err := Load(path, "vol1", "home:/", 7); !errors.Is(err, ErrCorrupt) || l.Len() != 0 {
				t.Fatalf("Load of a damaged file: %d entries, %v", l.Len(), err)
			}
		}
	}
	if d, err := Decode(b); err != nil || d.Len() != 50 {
		t.Fatalf("Decode: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	c := New("vol1", "home:/x", 1)
	c.Record("/a/b", entry(1))
	c.Record("/a/c", entry(2))
	c.Finish(nil)
	f.Add(c.Encode())
	f.Add([]byte(magic + "\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		// What decodes encodes to the same bytes.
		if e := d.Encode(); !bytes.Equal(e, b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
