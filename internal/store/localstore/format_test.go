package localstore

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

func samplePack(id packID) []byte {
	b := encodePackHeader(id)
	for i := range 5 {
		data := bytes.Repeat([]byte{byte(i)}, i*100)
		b = appendRecHeader(b, kindData, blake3.Sum256(data), len(data))
		b = append(b, data...)
	}
	b = appendRecHeader(b, kindTomb, cairn.ID{7}, tombSize)
	return appendTombPayload(b, id, packHeaderSize)
}

func TestScanPack(t *testing.T) {
	id := packID{1, 2, 3}
	b := samplePack(id)
	if err := checkPackHeader(b, id); err != nil {
		t.Fatal(err)
	}
	var recs []record
	end, st, err := scanPack(bytes.NewReader(b), packHeaderSize, int64(len(b)), true, func(r record) { recs = append(recs, r) })
	if err != nil || end != int64(len(b)) || st.bad != 0 || len(recs) != 6 {
		t.Fatalf("scan: end %d of %d, %+v, %d records, %v", end, len(b), st, len(recs), err)
	}
	if r := recs[5]; r.kind != kindTomb || r.target != id || r.tOff != packHeaderSize {
		t.Fatalf("tombstone decoded as %+v", r)
	}
	// Every truncation stops at a record boundary at or before the cut.
	for cut := packHeaderSize; cut < len(b); cut++ {
		end, _, err := scanPack(bytes.NewReader(b[:cut]), packHeaderSize, int64(cut), true, func(record) {})
		if err != nil || end > int64(cut) {
			t.Fatalf("cut %d: end %d, %v", cut, end, err)
		}
	}
}

func TestIdxRoundTrip(t *testing.T) {
	id := packID{9}
	var entries []byte
	for i := range 10 {
		var e [idxEntrySize]byte
		putEntry(e[:], cairn.ID{byte(i)}, int64(packHeaderSize+i*100), 52)
		entries = append(entries, e[:]...)
	}
	tombs := []tomb{{id: cairn.ID{3}, off: 1100, target: packID{8}, tOff: 32}}
	b := encodeIdx(id, 2000, entries, tombs)
	d, err := decodeIdx(b, id)
	if err != nil || !bytes.Equal(d.entries, entries) || len(d.tombs) != 1 || d.tombs[0] != tombs[0] || d.end != 2000 {
		t.Fatalf("round trip: %+v, %v", d, err)
	}
	for i := range b {
		c := append([]byte(nil), b...)
		c[i] ^= 0x40
		if _, err := decodeIdx(c, id); err == nil {
			t.Fatalf("flipping byte %d went unnoticed", i)
		}
	}
}

func FuzzScanPack(f *testing.F) {
	id := packID{1}
	f.Add(samplePack(id))
	f.Add(samplePack(id)[:100])
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, verify := range []bool{false, true} {
			prev := int64(packHeaderSize - 1)
			end, _, err := scanPack(bytes.NewReader(b), packHeaderSize, int64(len(b)), verify, func(r record) {
				if r.off <= prev || r.off+r.size() > int64(len(b)) {
					t.Fatalf("record %+v out of order or range", r)
				}
				if verify && r.kind == kindData && cairn.ID(blake3.Sum256(b[r.off+recHeaderSize:r.off+r.size()])) != r.id {
					t.Fatalf("verified record does not hash to its ID")
				}
				prev = r.off
			})
			if err != nil || end > int64(max(len(b), packHeaderSize)) {
				t.Fatalf("end %d of %d, %v", end, len(b), err)
			}
		}
	})
}

func FuzzDecodeIdx(f *testing.F) {
	id := packID{9}
	var e [idxEntrySize]byte
	putEntry(e[:], cairn.ID{1}, packHeaderSize, 10)
	f.Add(encodeIdx(id, 1000, e[:], []tomb{{off: 500, target: id, tOff: 32}}))
	f.Add(encodeIdx(id, 32, nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeIdx(b, id)
		if err != nil {
			return
		}
		if len(d.entries)%idxEntrySize != 0 {
			t.Fatal("partial entry")
		}
		for i := 0; i < len(d.entries); i += idxEntrySize {
			e := d.entries[i:]
			if entryOff(e)+recHeaderSize+int64(entryLen(e)) > d.end {
				t.Fatal("entry beyond end")
			}
		}
		if !bytes.Equal(encodeIdx(id, d.end, d.entries, d.tombs), b) {
			t.Fatal("re-encoding differs")
		}
	})
}

// TestTable checks the hash table against a map through random inserts and
// removals, with a tiny key space so that clusters wrap and collide.
func TestTable(t *testing.T) {
	var tab table
	ref := map[slot]bool{}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 50000 {
		k := uint64(r.IntN(5000)) + 1
		if r.IntN(3) == 0 && len(ref) > 0 {
			// remove a random present one
			for s := range ref {
				j := tab.find(s.key, s.val)
				if j < 0 {
					t.Fatalf("step %d: %v missing", i, s)
				}
				tab.remove(j)
				delete(ref, s)
				break
			}
			continue
		}
		s := slot{k, uint64(i)}
		tab.insert(s.key, s.val)
		ref[s] = true
	}
	if tab.n != len(ref) {
		t.Fatalf("n = %d, want %d", tab.n, len(ref))
	}
	for s := range ref {
		if tab.find(s.key, s.val) < 0 {
			t.Fatalf("%v missing", s)
		}
	}
	count := 0
	for _, s := range tab.slots {
		if s.key != 0 {
			count++
			if !ref[s] {
				t.Fatalf("stray %v", s)
			}
		}
	}
	if count != len(ref) {
		t.Fatalf("%d slots used, want %d", count, len(ref))
	}
}
