package ecstore

import (
	"errors"
	"testing"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

func testStore(t testing.TB, k, m int) *Store {
	t.Helper()
	var named []Named
	for i := range k + m {
		named = append(named, Named{Name: string(rune('a' + i)), Store: memstore.New()})
	}
	s, err := New(k, m, named, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The encoding is pinned: the same object always gives the same shards
// (so a rebuilt shard matches the map, and two writers of one object
// write the same bytes). A change here is a format change.
func TestEncodingGolden(t *testing.T) {
	s := testStore(t, 2, 2)
	id, data := storetest.Blob(1, 1000)
	objs, om, mb, err := s.encode(id, data)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"b9b746646b57d690af9fdffcf3179a30d6ad075a268cc27dbebf5e1c0a57d072",
		"d77c74ddb84cc7dfa23c21e6b92f0bc2d269320435df3b10b8734d1458e349dd",
		"0bacd4e5eaafc2e20136478687d4d656595bbbd40941588e909b5486ab258ae8",
		"713d6f0c906832aed54bd854ce358d12cb013e2927b9cc05bf80956ea46c88be",
		"325dbf0fcfef49ae9dde15c6ed925b728426a45c73265751d3915d983d03042d", // the map
	}
	for i, o := range objs {
		if got := cairn.ID(blake3.Sum256(o)).String(); got != want[i] {
			t.Errorf("shard %d: %s, want %s", i, got, want[i])
		}
		if len(o) != headerSize+500 {
			t.Errorf("shard %d: %d bytes", i, len(o))
		}
	}
	if got := om.mapID.String(); got != want[4] {
		t.Errorf("map: %s, want %s", got, want[4])
	}
	if len(mb) != 180 || cairn.ID(blake3.Sum256(mb)) != om.mapID {
		t.Errorf("map bytes: %d, hash mismatch %v", len(mb), cairn.ID(blake3.Sum256(mb)) != om.mapID)
	}
	// Systematic: the data shards are the object's bytes.
	if string(objs[0][headerSize:]) != string(data[:500]) || string(objs[1][headerSize:]) != string(data[500:]) {
		t.Error("data shards are not the object's bytes")
	}
}

func TestDecode(t *testing.T) {
	s := testStore(t, 2, 2)
	for _, n := range []int{0, 1, 2, 3, 1000, 1001} {
		id, data := storetest.Blob(uint64(n), n)
		objs, om, mb, err := s.encode(id, data)
		if err != nil {
			t.Fatal(err)
		}
		dm, err := decodeMap(mb)
		if err != nil || dm.id != id || dm.size != int64(n) || dm.mapID != om.mapID || dm.k != 2 || dm.m != 2 {
			t.Fatalf("decodeMap(%d bytes) = %+v, %v", n, dm, err)
		}
		shards := make([][]byte, 4)
		for i, o := range objs {
			if shards[i], err = decodeShard(o, dm, i); err != nil {
				t.Fatalf("decodeShard %d: %v", i, err)
			}
		}
		// Any two shards give the object back.
		for a := range 4 {
			for b := a + 1; b < 4; b++ {
				sub := make([][]byte, 4)
				sub[a], sub[b] = shards[a], shards[b]
				if err := s.enc.ReconstructData(sub); err != nil {
					t.Fatal(err)
				}
				got, err := s.join("get", dm, sub)
				if err != nil || string(got) != string(data) {
					t.Fatalf("%d bytes from shards %d and %d: %v", n, a, b, err)
				}
			}
		}
		if _, err := decodeShard(objs[1], dm, 0); err == nil {
			t.Fatal("shard 1 accepted as shard 0")
		}
		if _, err := decodeShard(objs[1][:len(objs[1])-1], dm, 1); err == nil {
			t.Fatal("short shard accepted")
		}
		if _, err := decodeMap(objs[0]); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("a shard decoded as a map: %v", err)
		}
	}
	bad := make([]byte, mapSize(4))
	copy(bad, mapMagic)
	bad[8] = 2
	if _, err := decodeMap(bad); err == nil || !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("version 2 map: %v", err)
	}
}

func FuzzDecodeMap(f *testing.F) {
	s := testStore(f, 2, 2)
	id, data := storetest.Blob(1, 1000)
	_, _, mb, _ := s.encode(id, data)
	f.Add(mb)
	f.Add(mb[:60])
	f.Add([]byte(mapMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		om, err := decodeMap(b)
		if err != nil {
			if !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("error of the wrong kind: %v", err)
			}
			return
		}
		if len(om.shards) != om.k+om.m || om.k < 1 || om.m < 1 || om.size < 0 {
			t.Fatalf("impossible map %+v", om)
		}
		if again := om.encode(); string(again) != string(b) {
			t.Fatal("map does not re-encode to its bytes")
		}
	})
}

func FuzzDecodeShard(f *testing.F) {
	s := testStore(f, 2, 2)
	id, data := storetest.Blob(1, 1000)
	objs, _, _, _ := s.encode(id, data)
	for _, o := range objs {
		f.Add(o)
	}
	f.Add([]byte(shardMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, m, i, size, id, err := checkHeader(b, shardMagic)
		if err != nil {
			return
		}
		om := &objMap{k: k, m: m, size: size, id: id, shards: make([]cairn.ID, k+m)}
		p, err := decodeShard(b, om, i)
		if err != nil {
			return
		}
		if int64(len(p)) != shardSize(size, k) {
			t.Fatalf("payload of %d bytes for an object of %d in %d", len(p), size, k)
		}
		if string(encodeShard(k, m, i, size, id, p)) != string(b) {
			t.Fatal("shard does not re-encode to its bytes")
		}
		if _, err := decodeShard(b, om, (i+1)%(k+m)); err == nil && k+m > 1 {
			t.Fatal("shard accepted at another index")
		}
	})
}

func FuzzDecodeMapCache(f *testing.F) {
	s := testStore(f, 2, 2)
	id, data := storetest.Blob(1, 1000)
	_, _, mb, _ := s.encode(id, data)
	seed := []byte(cacheMagic)
	seed = appendCacheRecord(seed, recAdd, mb)
	seed = appendCacheRecord(seed, recRemove, id[:])
	seed = appendCacheRecord(seed, recNotMap, id[:])
	f.Add(seed)
	f.Add([]byte(cacheMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := decodeMapCache(b)
		if err != nil && !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("error of the wrong kind: %v", err)
		}
		out := []byte(cacheMagic)
		for _, r := range recs {
			out = appendCacheRecord(out, r.kind, r.data)
		}
		again, err := decodeMapCache(out)
		if err != nil || len(again) != len(recs) {
			t.Fatalf("re-encoded cache: %d records, %v; want %d", len(again), err, len(recs))
		}
		for _, r := range liveRecords(recs) {
			if r.kind == recRemove {
				t.Fatal("a removal among the live records")
			}
		}
	})
}
