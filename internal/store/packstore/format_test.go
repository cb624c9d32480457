package packstore

import (
	"bytes"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// buildPack makes a pack of the given objects and tombstones.
func buildPack(objects [][]byte, tombs []tomb) ([]byte, []obj) {
	b := newHeader()
	var objs []obj
	for _, o := range objects {
		objs = append(objs, obj{id: blake3.Sum256(o), off: int64(len(b)), n: int64(len(o))})
		b = append(b, o...)
	}
	return appendIndex(b, int64(len(b)), objs, tombs), objs
}

func TestPackFormat(t *testing.T) {
	ts := []tomb{{id: cairn.ID{1}, target: cairn.ID{2}}, {id: cairn.ID{3}, target: cairn.ID{2}}}
	pk, objs := buildPack([][]byte{[]byte("hello"), nil, bytes.Repeat([]byte{7}, 1000)}, ts)
	if ok, err := checkHeader(pk); !ok || err != nil {
		t.Fatalf("checkHeader = %v, %v", ok, err)
	}
	for _, tail := range []int{trailerSize, 100, len(pk)} {
		tr, gotObjs, gotTombs, need, err := decodeTail(pk[len(pk)-tail:], int64(len(pk)))
		if err != nil {
			t.Fatalf("decodeTail(%d bytes): %v", tail, err)
		}
		wantNeed := tr.indexLen() + trailerSize
		if int64(tail) < wantNeed {
			if need != wantNeed {
				t.Fatalf("decodeTail(%d bytes): need = %d, want %d", tail, need, wantNeed)
			}
			continue
		}
		if need != 0 || len(gotObjs) != 3 || len(gotTombs) != 2 {
			t.Fatalf("decodeTail: %d objects, %d tombstones, need %d", len(gotObjs), len(gotTombs), need)
		}
		for i, o := range gotObjs {
			if o != objs[i] || cairn.ID(blake3.Sum256(pk[o.off:o.off+o.n])) != o.id {
				t.Fatalf("object %d = %+v, want %+v", i, o, objs[i])
			}
		}
		if gotTombs[0] != ts[0] || gotTombs[1] != ts[1] {
			t.Fatalf("tombstones = %v", gotTombs)
		}
	}
	// Every single-byte change of the index or trailer is caught.
	idxStart := len(pk) - (3*entrySize + 2*tombSize + trailerSize)
	for i := idxStart; i < len(pk); i++ {
		bad := bytes.Clone(pk)
		bad[i] ^= 0x10
		_, _, _, _, err := decodeTail(bad[idxStart:], int64(len(bad)))
		if err == nil {
			t.Fatalf("a changed byte at %d of the index went unnoticed", i)
		}
	}
	if _, _, _, _, err := decodeTail(pk[len(pk)-trailerSize:], int64(len(pk))+1); err == nil || errors.Is(err, errNotPack) {
		t.Fatalf("a trailer for another size: err = %v, want a damaged-pack error", err)
	}
	plain := bytes.Repeat([]byte{9}, 100)
	if _, _, _, _, err := decodeTail(plain, 100); !errors.Is(err, errNotPack) {
		t.Fatalf("a plain object: err = %v, want errNotPack", err)
	}
	v2 := bytes.Clone(pk)
	v2[len(v2)-16] = 2
	if _, _, _, _, err := decodeTail(v2, int64(len(v2))); err == nil || !bytes.Contains([]byte(err.Error()), []byte("version 2")) {
		t.Fatalf("a version 2 trailer: err = %v, want one naming the version", err)
	}
}

// FuzzDecodeTail: decoding any tail never panics, and what it accepts
// encodes back to the same bytes.
func FuzzDecodeTail(f *testing.F) {
	pk, _ := buildPack([][]byte{[]byte("a"), []byte("bcd"), nil}, []tomb{{id: cairn.ID{5}, target: cairn.ID{6}}})
	f.Add(pk, int64(len(pk)))
	f.Add(pk[len(pk)-trailerSize:], int64(len(pk)))
	f.Add(pk[len(pk)-trailerSize:], int64(len(pk)+1))
	empty, _ := buildPack(nil, nil)
	f.Add(empty, int64(len(empty)))
	f.Add([]byte("not a pack at all, just some bytes of a chunk"), int64(45))
	f.Fuzz(func(t *testing.T, tail []byte, size int64) {
		// Make the checksum right half the time, so that the fuzzer
		// gets past it to the entries.
		if len(tail) >= trailerSize && size%2 == 0 {
			tail = bytes.Clone(tail)
			tr := tail[len(tail)-trailerSize:]
			l := int64(le.Uint32(tr[8:]))*entrySize + int64(le.Uint32(tr[12:]))*tombSize + trailerSize
			if l <= int64(len(tail)) {
				le.PutUint32(tr[20:], crc32.Checksum(tail[int64(len(tail))-l:len(tail)-trailerSize+20], castagnoli))
			}
		}
		tr, objs, tombs, need, err := decodeTail(tail, size)
		if err != nil || need > 0 {
			return
		}
		re := appendIndex(nil, tr.indexOff, objs, tombs)
		if !bytes.Equal(re, tail[len(tail)-len(re):]) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", re, tail[len(tail)-len(re):])
		}
		if tr.size() != size {
			t.Fatalf("accepted a trailer for %d bytes as one of %d", tr.size(), size)
		}
	})
}

// FuzzReplayLog: replaying any log bytes never panics.
func FuzzReplayLog(f *testing.F) {
	pk, objs := buildPack([][]byte{[]byte("x"), []byte("yz")}, []tomb{{id: cairn.ID{1}, target: cairn.ID{2}}})
	_ = pk
	rec := packRecord(nil, &pack{id: cairn.ID{9}, size: int64(len(pk)), objs: objs, tombs: []tomb{{id: cairn.ID{1}, target: cairn.ID{2}}}})
	rec = plainRecord(rec, cairn.ID{8}, 1<<20)
	rec = goneRecord(rec, cairn.ID{9})
	f.Add(rec)
	f.Fuzz(func(t *testing.T, b []byte) {
		x := newIndex()
		for len(b) > 0 {
			n, ok := replay(&x, b)
			if !ok {
				return
			}
			b = b[n:]
		}
	})
}
