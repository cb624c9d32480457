package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Each decoder of untrusted bytes either succeeds or fails with a cairn
// error of Kind Invalid (or IO for a cut stream); it never panics.

func wantKind(t *testing.T, err error, kinds ...cairn.Kind) {
	t.Helper()
	if err == nil {
		return
	}
	k := cairn.KindOf(err)
	for _, want := range kinds {
		if k == want {
			return
		}
	}
	t.Fatalf("error of kind %v: %v", k, err)
}

func FuzzDecodeIDs(f *testing.F) {
	f.Add(EncodeIDs(ids(3)))
	f.Add(EncodeIDs(nil))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeIDs(b)
		wantKind(t, err, cairn.Invalid)
		if err == nil && len(got) > MaxIDs {
			t.Fatalf("%d IDs", len(got))
		}
	})
}

func FuzzDecodeBitmap(f *testing.F) {
	f.Add(EncodeBitmap([]bool{true, false, true}), 3)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > MaxIDs {
			return
		}
		got, err := DecodeBitmap(b, n)
		wantKind(t, err, cairn.Invalid)
		if err == nil && len(got) != n {
			t.Fatalf("%d bits for %d", len(got), n)
		}
	})
}

func FuzzDecodeObjects(f *testing.F) {
	f.Add(AppendObject(AppendObject(nil, ids(1)[0], []byte("abc")), ids(2)[1], nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		objs, err := DecodeObjects(b)
		wantKind(t, err, cairn.Invalid)
		total := 0
		for _, o := range objs {
			total += ObjectHeader + len(o.Data)
		}
		if err == nil && total != len(b) {
			t.Fatalf("objects cover %d of %d bytes", total, len(b))
		}
	})
}

func FuzzReadGetEntry(f *testing.F) {
	f.Add(AppendGetError(AppendGetEntry(nil, ids(1)[0], []byte("x")), ids(2)[1], cairn.E("get", cairn.NotFound, "", nil)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for range 100 {
			_, _, _, err := ReadGetEntry(r)
			if err != nil {
				wantKind(t, err, cairn.Invalid, cairn.IO)
				return
			}
		}
	})
}

func FuzzListReader(f *testing.F) {
	var buf bytes.Buffer
	w := NewListWriter(&buf)
	for i, id := range ids(20) {
		_ = w.Object(id, int64(i))
	}
	_ = w.End()
	w.Close()
	f.Add(buf.Bytes())
	f.Add(Compress(nil, []byte{'o'}))
	f.Add(Compress(nil, []byte{'x', 3, '{', '}', '}'}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewListReader(bytes.NewReader(b))
		if err != nil {
			wantKind(t, err, cairn.Invalid)
			return
		}
		defer r.Close()
		for range 100000 {
			_, size, err := r.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				return // any Kind: an 'x' record carries the server's
			}
			if size < 0 || size > MaxObject {
				t.Fatalf("size %d", size)
			}
		}
	})
}

func FuzzDecodeError(f *testing.F) {
	f.Add(500, EncodeError(cairn.E("put", cairn.Corrupt, "x", errors.New("bad"))))
	f.Fuzz(func(t *testing.T, status int, b []byte) {
		if err := DecodeError(status, Zstd, b); err == nil {
			t.Fatal("nil error")
		}
		var res PutResult
		wantKind(t, DecodeJSON(b, &res), cairn.Invalid)
	})
}

func FuzzDecodeReport(f *testing.F) {
	f.Add(EncodeReport(Report{Addr: "h:1", Capacity: 10, Lease: int64(MinLease)}))
	f.Add(Compress(nil, []byte(`{"name":"x","addr":"[::1]:9","lease":1000000000,"rate":1e308}`)))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReport(b)
		wantKind(t, err, cairn.Invalid)
		if err == nil && r.Check() != nil {
			t.Fatalf("decoded an invalid report: %+v", r)
		}
	})
}

func FuzzDecodeRegisterReply(f *testing.F) {
	b, _ := EncodeJSON(RegisterReply{Lease: int64(MinLease), Registrars: []string{"a:1"},
		Revoked: Revocations{Names: map[string]time.Time{"x": time.Unix(1, 0)}}})
	f.Add(b)
	f.Add(Compress(nil, []byte(`{"lease":1000000000,"revoked":{"names":{"a":"bad"}}}`)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRegisterReply(b)
		wantKind(t, err, cairn.Invalid)
		if err == nil && (r.Revoked.Names == nil || r.Revoked.Serials == nil || len(r.Registrars) > MaxRegistrars) {
			t.Fatalf("decoded %+v", r)
		}
	})
}
