package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func ids(n int) []cairn.ID {
	out := make([]cairn.ID, n)
	for i := range out {
		out[i][0], out[i][1], out[i][31] = byte(i), byte(i>>8), 0xa5
	}
	return out
}

func TestIDsRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 7, 1000, MaxIDs} {
		in := ids(n)
		out, err := DecodeIDs(EncodeIDs(in))
		if err != nil || len(out) != n {
			t.Fatalf("n=%d: %d IDs, %v", n, len(out), err)
		}
		for i := range in {
			if in[i] != out[i] {
				t.Fatalf("n=%d: ID %d differs", n, i)
			}
		}
	}
	if _, err := DecodeIDs(EncodeIDs(ids(MaxIDs + 1))); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("MaxIDs+1: %v, want Invalid", err)
	}
	if _, err := DecodeIDs(Compress(nil, make([]byte, 33))); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("33 bytes: %v, want Invalid", err)
	}
	if _, err := DecodeIDs(make([]byte, 64)); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("uncompressed: %v, want Invalid", err)
	}
	// A compression bomb: 64 MiB of zeros, far more than MaxIDs.
	bomb := Compress(nil, make([]byte, 64<<20))
	if _, err := DecodeIDs(bomb); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("bomb of %d bytes: %v, want Invalid", len(bomb), err)
	}
}

// streamed compresses b as a streamed frame, which declares no content size.
func streamed(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	w := NewListWriter(&buf) // any stream encoder will do
	defer w.Close()
	if _, err := w.enc.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecompressWithoutContentSize(t *testing.T) {
	mid := bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16) // 100 KiB: past the first guess
	got, err := Decompress(streamed(t, mid), 1<<20)
	if err != nil || !bytes.Equal(got, mid) {
		t.Fatalf("100 KiB streamed frame: %d bytes, %v", len(got), err)
	}
	if _, derr := Decompress(streamed(t, make([]byte, 8<<20)), 1<<20); !errors.Is(derr, cairn.ErrInvalid) {
		t.Fatalf("8 MiB streamed frame, limit 1 MiB: %v, want Invalid", derr)
	}
	tiny, err := Decompress(Compress(nil, []byte("tiny")), 1<<20)
	if err != nil || string(tiny) != "tiny" {
		t.Fatalf("tiny: %q, %v", tiny, err)
	}
}

func TestBitmapRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 8, 9, 5000} {
		bits := make([]bool, n)
		for i := range bits {
			bits[i] = i%3 == 0
		}
		got, err := DecodeBitmap(EncodeBitmap(bits), n)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(bits) {
			t.Fatalf("n=%d: %v", n, err)
		}
		if n > 0 {
			if _, err := DecodeBitmap(EncodeBitmap(bits), n+8); !errors.Is(err, cairn.ErrInvalid) {
				t.Fatalf("n=%d decoded as n+8: %v", n, err)
			}
		}
	}
	if _, err := DecodeBitmap(Compress(nil, []byte{0xff}), 3); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("bits past the end: %v", err)
	}
}

func TestObjectsRoundTrip(t *testing.T) {
	var b []byte
	in := ids(5)
	for i, id := range in {
		b = AppendObject(b, id, bytes.Repeat([]byte{byte(i)}, i*100))
	}
	objs, err := DecodeObjects(b)
	if err != nil || len(objs) != 5 {
		t.Fatalf("%d objects, %v", len(objs), err)
	}
	for i, o := range objs {
		if o.ID != in[i] || len(o.Data) != i*100 {
			t.Fatalf("object %d: %s, %d bytes", i, o.ID.Short(), len(o.Data))
		}
	}
	for _, cut := range []int{1, ObjectHeader - 1, ObjectHeader + 1} {
		if _, err := DecodeObjects(b[:len(b)-cut]); !errors.Is(err, cairn.ErrInvalid) {
			t.Fatalf("cut %d: %v", cut, err)
		}
	}
}

func TestErrorsKeepTheirKind(t *testing.T) {
	for k := cairn.Other; k <= cairn.Canceled; k++ {
		in := cairn.E("get", k, "abc", errors.New("why"))
		out := DecodeError(Status(k), Zstd, EncodeError(in))
		if cairn.KindOf(out) != k || out.Error() != in.Error() {
			t.Fatalf("kind %v: %v (kind %v), want %v", k, out, cairn.KindOf(out), in)
		}
	}
	if err := DecodeError(404, "", []byte("404 page not found")); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("plain 404: %v", err)
	}
	if err := DecodeError(400, "", nil); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("plain 400: %v", err)
	}
	// A Kind from a newer peer becomes Other.
	b := ErrorBody{Kind: 200, Msg: "future"}
	if k := cairn.KindOf(b.Err()); k != cairn.Other {
		t.Fatalf("unknown kind: %v", k)
	}
	if Status(cairn.NotFound) != http.StatusNotFound || Status(cairn.Corrupt) != http.StatusUnprocessableEntity {
		t.Fatal("status mapping changed")
	}
}

func TestGetStream(t *testing.T) {
	in := ids(3)
	var b []byte
	b = AppendGetEntry(b, in[0], []byte("hello"))
	b = AppendGetError(b, in[1], cairn.E("get", cairn.NotFound, in[1].String(), nil))
	b = AppendGetEntry(b, in[2], nil)
	r := bytes.NewReader(b)
	id, data, eerr, err := ReadGetEntry(r)
	if err != nil || eerr != nil || id != in[0] || string(data) != "hello" {
		t.Fatalf("entry 0: %v %q %v %v", id.Short(), data, eerr, err)
	}
	id, _, eerr, err = ReadGetEntry(r)
	if err != nil || id != in[1] || !errors.Is(eerr, cairn.ErrNotFound) {
		t.Fatalf("entry 1: %v %v", eerr, err)
	}
	id, data, eerr, err = ReadGetEntry(r)
	if err != nil || eerr != nil || id != in[2] || len(data) != 0 {
		t.Fatalf("entry 2: %v %v", eerr, err)
	}
	if _, _, _, err := ReadGetEntry(r); !errors.Is(err, cairn.ErrIO) {
		t.Fatalf("past the end: %v, want IO", err)
	}
	if _, _, _, err := ReadGetEntry(bytes.NewReader(b[:10])); !errors.Is(err, cairn.ErrIO) {
		t.Fatalf("cut: %v, want IO", err)
	}
}

func listStream(t *testing.T, n int, end func(*ListWriter) error) []byte {
	var buf bytes.Buffer
	w := NewListWriter(&buf)
	defer w.Close()
	for i, id := range ids(n) {
		if err := w.Object(id, int64(i*1000)); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 {
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := end(w); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func readList(b []byte) (int, error) {
	r, err := NewListReader(bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	defer r.Close()
	for n := 0; ; n++ {
		_, size, err := r.Next()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if size != int64(n*1000) {
			return n, fmt.Errorf("size %d at %d", size, n)
		}
	}
}

func TestListStream(t *testing.T) {
	b := listStream(t, 1000, (*ListWriter).End)
	if n, err := readList(b); n != 1000 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	failed := listStream(t, 10, func(w *ListWriter) error { return w.Fail(cairn.E("list", cairn.IO, "", errors.New("disk on fire"))) })
	if n, err := readList(failed); n != 10 || !errors.Is(err, cairn.ErrIO) {
		t.Fatalf("failed listing: %d, %v", n, err)
	}
	// Cut anywhere: never a clean end.
	for cut := 1; cut < len(b); cut += len(b)/50 + 1 {
		if _, err := readList(b[:len(b)-cut]); err == nil {
			t.Fatalf("stream cut by %d bytes read as complete", cut)
		}
	}
	if _, err := readList([]byte("not zstd at all")); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("garbage: %v, want Invalid", err)
	}
}
