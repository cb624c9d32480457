package meta

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	goccy "github.com/goccy/go-json"

	"cairn.dev/cairn/internal/cairn"
)

// record is one kind of record this package decodes, and how it decodes
// and encodes it: encoding/json for the small ones, unmarshalFast
// (goccy/go-json, guarded) for entries, trash items and the local copy,
// which goccy/go-json encodes, as it does node records (nodes.go).
type record struct {
	name   string
	new    func() any
	decode func([]byte, any) error
	encode func(any) ([]byte, error)
}

func records() []record {
	std := stdjson.Unmarshal
	rs := []record{
		{"MaintRecord", func() any { return new(MaintRecord) }, std, nil},
		{"RealmInfo", func() any { return new(RealmInfo) }, std, nil},
		{"MetaServiceRecord", func() any { return new(MetaServiceRecord) }, std, nil},
		{"MetaJoin", func() any { return new(MetaJoin) }, std, nil},
		{"NodeRecord", func() any { return new(NodeRecord) }, std, nil},
		{"CARecord", func() any { return new(CARecord) }, std, nil},
		{"PolicyRecord", func() any { return new(PolicyRecord) }, std, nil},
		{"revocation", func() any { return new(revocation) }, std, nil},
		{"StoreRecord", func() any { return new(StoreRecord) }, std, nil},
		{"UserRecord", func() any { return new(UserRecord) }, std, nil},
		{"GrantRecord", func() any { return new(GrantRecord) }, std, nil},
		{"DeviceUser", func() any { return new(DeviceUser) }, std, nil},
		{"Volume", func() any { return new(Volume) }, std, nil},
		{"storereq", func() any { return new(map[string]int64) }, std, nil},
		{"Offload", func() any { return new(Offload) }, std, nil},
		{"PrimaryRecord", func() any { return new(PrimaryRecord) }, std, nil},
		{"Entry", func() any { return new(Entry) }, unmarshalFast, nil},
		{"TrashItem", func() any { return new(TrashItem) }, unmarshalFast, nil},
		{"LocalCopyFile", func() any { return new(LocalCopyFile) }, unmarshalFast, nil},
	}
	for i := range rs {
		switch rs[i].name {
		case "NodeRecord", "Entry", "TrashItem", "LocalCopyFile":
			rs[i].encode = goccy.Marshal
		default:
			rs[i].encode = stdjson.Marshal
		}
	}
	return rs
}

// fill sets every field of v (a pointer) to a value that is not the zero
// value, every string to str.
func fill(v reflect.Value, depth int, str string) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem(), depth, str)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && v.Field(i).CanSet() {
				fill(v.Field(i), depth+1, str)
			}
		}
	case reflect.String:
		v.SetString(str + v.Type().Name())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(-1 - int64(depth))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(1<<(v.Type().Bits()-1)) + uint64(depth))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5e-7) // encoding/json writes 1.5e-7, goccy/go-json 1.5e-07
	case reflect.Slice:
		if depth > 6 {
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), depth+1, str)
		}
		v.Set(s)
	case reflect.Map:
		if depth > 6 {
			return
		}
		m := reflect.MakeMap(v.Type())
		for _, k := range []string{"zeta", "alpha<"} {
			kv := reflect.New(v.Type().Key()).Elem()
			if kv.Kind() != reflect.String {
				fill(kv, depth+1, str)
			} else {
				kv.SetString(k)
			}
			ev := reflect.New(v.Type().Elem()).Elem()
			fill(ev, depth+1, str)
			m.SetMapIndex(kv, ev)
		}
		v.Set(m)
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), depth+1, str)
		}
	}
}

// TestRecordEncodingsAgree: records were written with goccy/go-json until
// the small ones moved to encoding/json. Both write the same bytes for
// every record with every field set (strings that need escaping, invalid
// UTF-8, maps), and a record the old encoder wrote decodes, as the
// package decodes it now, to what was encoded: nothing on disk or in etcd
// changes, and nothing written before reads differently.
func TestRecordEncodingsAgree(t *testing.T) {
	// Strings with what the encoders escape; the second has invalid
	// UTF-8, which both write as \ufffd (so it decodes to U+FFFD, not to
	// what was encoded: only the encodings are compared).
	const escaped = "a<b>&c \"q\" \\ \u2028 é \x01 \t"
	for _, r := range records() {
		v := r.new()
		fill(reflect.ValueOf(v), 0, escaped+"\xff")
		old, err := goccy.Marshal(v)
		if err != nil {
			t.Fatalf("%s: goccy: %v", r.name, err)
		}
		if now, err := r.encode(v); err != nil || !bytes.Equal(old, now) {
			t.Errorf("%s with invalid UTF-8: the encoders differ (%v):\ngoccy: %s\nnow:   %s", r.name, err, old, now)
		}
	}
	for _, r := range records() {
		v := r.new()
		fill(reflect.ValueOf(v), 0, escaped)
		old, err := goccy.Marshal(v)
		if err != nil {
			t.Fatalf("%s: goccy: %v", r.name, err)
		}
		now, err := r.encode(v)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		if !bytes.Equal(old, now) {
			t.Errorf("%s: the encoders differ:\ngoccy: %s\nnow:   %s", r.name, old, now)
		}
		got := r.new()
		if err := r.decode(old, got); err != nil {
			t.Errorf("%s: a record goccy wrote does not decode: %v\n%s", r.name, err, old)
			continue
		}
		// Compared through the encoding: unexported fields are not
		// encoded, and an empty slice and a nil one encode alike.
		again, _ := r.encode(got)
		if !bytes.Equal(again, old) {
			t.Errorf("%s: decoded and encoded again:\n%s\nwritten:\n%s", r.name, again, old)
		}
	}
	// Records as an older cairn wrote them (goccy/go-json, before the
	// move), byte for byte.
	golden := []struct {
		rec  any
		data string
	}{
		{&PrimaryRecord{Format: 1, Policy: "copies:2@a,b", Primary: "a", Set: 1764660000000000000, SetBy: "a", Why: "set"},
			`{"format":1,"policy":"copies:2@a,b","primary":"a","set":1764660000000000000,"set_by":"a","why":"set"}`},
		{&StoreRecord{Name: "s3", URL: "s3://b/p?endpoint=127.0.0.1:9000&insecure=1", Added: 1764660000000000000},
			`{"name":"s3","url":"s3://b/p?endpoint=127.0.0.1:9000\u0026insecure=1","added":1764660000000000000}`},
	}
	for _, g := range golden {
		b, err := stdjson.Marshal(g.rec)
		if err != nil || string(b) != g.data {
			t.Errorf("%T encodes to %s (%v), an older cairn wrote %s", g.rec, b, err, g.data)
		}
		got := reflect.New(reflect.TypeOf(g.rec).Elem()).Interface()
		if err := stdjson.Unmarshal([]byte(g.data), got); err != nil || !reflect.DeepEqual(got, g.rec) {
			t.Errorf("%s decodes to %+v (%v), want %+v", g.data, got, err, g.rec)
		}
	}
}

// FuzzDecodeRecords: any bytes, decoded as each kind of record the way
// this package decodes it, either fail with an error or give a record
// whose encoding decodes, and is stable after a round trip; never a
// panic (goccy/go-json panicked on a truncated primary record).
func FuzzDecodeRecords(f *testing.F) {
	for _, r := range records() {
		v := r.new()
		fill(reflect.ValueOf(v), 0, "a<b>&\\\"\u2028é")
		b, _ := stdjson.Marshal(v)
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(`{"":2,"cy":"copies:2@a,b","pr\`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range records() {
			v := r.new()
			if err := r.decode(b, v); err != nil {
				continue
			}
			enc, err := r.encode(v)
			if err != nil {
				t.Fatalf("%s decoded from %q does not encode: %v", r.name, b, err)
			}
			// Stable from the second round: goccy/go-json keeps invalid
			// UTF-8 in a string it decodes and writes it as \ufffd, which
			// decodes to U+FFFD, written as itself.
			stable := false
			for i := 0; i < 2 && !stable; i++ {
				w := r.new()
				if err := r.decode(enc, w); err != nil {
					t.Fatalf("%s: its own encoding %s does not decode: %v", r.name, enc, err)
				}
				again, _ := r.encode(w)
				stable, enc = bytes.Equal(again, enc), again
			}
			if !stable {
				t.Fatalf("%s: %q decodes and encodes differently each time (last: %s)", r.name, b, enc)
			}
		}
	})
}

// panicky is a record whose decoder panics, as goccy/go-json did on a
// truncated primary record.
type panicky struct{}

func (*panicky) UnmarshalJSON([]byte) error { panic("index out of range [7] with length 7") }

// TestUnmarshalFastGuards: a decoder that panics is an error of
// unmarshalFast, not the end of the process.
func TestUnmarshalFastGuards(t *testing.T) {
	var p panicky
	err := unmarshalFast([]byte(`{}`), &p)
	if err == nil || !strings.Contains(err.Error(), "index out of range") {
		t.Fatalf("unmarshalFast of a panicking decoder: %v", err)
	}
	v := decodeVol()
	if _, err := v.decode("lookup", []byte(v.entryKey(1, "a")), []byte(`{"name":"a","parent":1,"type":"f","links":[{"parent":1,"name":"a\`), 1); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("truncated entry: %v", err)
	}
}
