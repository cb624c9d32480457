package meta

import (
	"errors"
	"strings"
	"testing"

	json "github.com/goccy/go-json"

	"cairn.dev/cairn/internal/cairn"
)

func decodeVol() *Vol {
	s := &Service{opts: Options{Prefix: "/cairn/v1/"}}
	return &Vol{s: s, base: "/cairn/v1/v/vol1/"}
}

func entryJSON(t testing.TB, e Entry) []byte {
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeChecksKey: the key says where an entry is; a value that names
// another place is Corrupt, and the error names the key.
func TestDecodeChecksKey(t *testing.T) {
	v := decodeVol()
	const parent = 0x1234
	key := func(name string) []byte { return []byte(v.entryKey(parent, name)) }
	good := Entry{Name: "a", Parent: parent, Ino: 7, Type: TypeFile}
	if e, err := v.decode("read dir", key("a"), entryJSON(t, good), 3); err != nil || e.Name != "a" || e.Rev != 3 {
		t.Fatalf("good entry: %+v, %v", e, err)
	}
	root := Entry{Name: "", Parent: 0, Ino: RootIno, Type: TypeDir}
	if _, err := v.decode("lookup", []byte(v.entryKey(0, "")), entryJSON(t, root), 1); err != nil {
		t.Fatalf("root: %v", err)
	}
	bad := []struct {
		key  string
		e    Entry
		want string
	}{
		{"x", Entry{Name: "a", Parent: parent, Type: TypeDir}, `"a"`},
		{"x", Entry{Name: "../x", Parent: parent, Type: TypeFile}, `"../x"`},
		{"x", Entry{Name: "a/f", Parent: parent, Type: TypeFile}, `"a/f"`},
		{"x", Entry{Name: "x", Parent: parent + 1, Type: TypeFile}, "parent"},
		{"..", Entry{Name: "..", Parent: parent, Type: TypeDir}, `".."`},
		{".", Entry{Name: ".", Parent: parent, Type: TypeDir}, `"."`},
		{"a\x00b", Entry{Name: "a\x00b", Parent: parent, Type: TypeFile}, "NUL"},
		{"", Entry{Name: "", Parent: parent, Type: TypeFile}, "not an entry key"},
	}
	for _, c := range bad {
		_, err := v.decode("read dir", key(c.key), entryJSON(t, c.e), 1)
		if !errors.Is(err, cairn.ErrCorrupt) {
			t.Errorf("key %q value name %q: err %v, want Corrupt", c.key, c.e.Name, err)
			continue
		}
		if !strings.Contains(err.Error(), "v/vol1/e/0000000000001234/") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("key %q value name %q: error %q does not name the key and %s", c.key, c.e.Name, err, c.want)
		}
	}
	// A root record that names a child.
	if _, err := v.decode("lookup", []byte(v.entryKey(0, "")), entryJSON(t, Entry{Name: "x", Type: TypeDir}), 1); !errors.Is(err, cairn.ErrCorrupt) {
		t.Errorf("root named x: %v", err)
	}
}

// TestDecodeChecksType: a record of a type this binary does not know, a
// device number on a non-device, or data on a special file is Corrupt; the
// seven known types decode.
func TestDecodeChecksType(t *testing.T) {
	v := decodeVol()
	k := []byte(v.entryKey(0x1234, "a"))
	for _, typ := range []Type{TypeDir, TypeFile, TypeSymlink, TypeFIFO, TypeSocket, TypeChar, TypeBlock} {
		if _, err := v.decode("lookup", k, entryJSON(t, Entry{Name: "a", Parent: 0x1234, Type: typ}), 1); err != nil {
			t.Errorf("type %q: %v", typ, err)
		}
	}
	if e, err := v.decode("lookup", k, entryJSON(t, Entry{Name: "a", Parent: 0x1234, Type: TypeChar, Rdev: 0x103}), 1); err != nil || e.Rdev != 0x103 {
		t.Errorf("char device: %+v, %v", e, err)
	}
	for _, bad := range []string{
		`{"name":"a","parent":4660,"type":"x"}`,
		`{"name":"a","parent":4660}`,
		`{"name":"a","parent":4660,"type":"f","rdev":3}`,
		`{"name":"a","parent":4660,"type":"p","size":3}`,
		`{"name":"a","parent":4660,"type":"s","versions":[{"size":0}]}`,
	} {
		if _, err := v.decode("lookup", k, []byte(bad), 1); !errors.Is(err, cairn.ErrCorrupt) || !strings.Contains(err.Error(), "v/vol1/e/0000000000001234/a") {
			t.Errorf("%s: %v, want Corrupt naming the key", bad, err)
		}
	}
}

// FuzzDecodeEntry: any key and value either decode to an entry that sits
// where its key says, under a name that is one path element, or fail with
// Corrupt; never a panic.
func FuzzDecodeEntry(f *testing.F) {
	v := decodeVol()
	f.Add(v.entryKey(0x1234, "a"), string(entryJSON(f, Entry{Name: "a", Parent: 0x1234, Type: TypeFile})))
	f.Add(v.entryKey(0x1234, "a"), string(entryJSON(f, Entry{Name: "../a", Parent: 0x1234, Type: TypeFile})))
	f.Add(v.entryKey(0, ""), string(entryJSON(f, Entry{Ino: RootIno, Type: TypeDir})))
	f.Add(v.entryKey(0x1234, ".."), `{"name":"..","parent":4660}`)
	f.Add("/cairn/v1/v/vol1/e/zz/a", `{"name":"a"}`)
	f.Add(v.entryKey(0x1, "a"), `{`)
	f.Add(v.entryKey(0x1234, "a"), `{"name":"a","parent":4660,"type":"c","rdev":259}`)
	f.Fuzz(func(t *testing.T, k, val string) {
		e, err := v.decode("fuzz", []byte(k), []byte(val), 1)
		if err != nil {
			if !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("error %v is not Corrupt", err)
			}
			return
		}
		parent, name, ok := v.parseEntryKey(k)
		if !ok || e.Parent != parent || e.Name != name {
			t.Fatalf("key %q decoded to %q in %x", k, e.Name, e.Parent)
		}
		if !e.Type.Known() || (e.Rdev != 0 && e.Type != TypeChar && e.Type != TypeBlock) {
			t.Fatalf("key %q: type %q with rdev %d accepted", k, e.Type, e.Rdev)
		}
		if parent != 0 && (name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00")) {
			t.Fatalf("key %q: name %q accepted", k, name)
		}
	})
}
