package localstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// crash stops s like a killed process: no pack is sealed, files and locks
// are released.
func (s *Store) crash() {
	s.crashed.Store(true)
	s.Close()
}

type obj struct {
	id   cairn.ID
	data []byte
}

func putN(t testing.TB, s *Store, seed uint64, n, size int) []obj {
	t.Helper()
	objs := make([]obj, n)
	for i := range objs {
		id, data := storetest.Blob(seed+uint64(i), size)
		if err := s.Put(bg, id, data); err != nil {
			t.Fatalf("Put: %v", err)
		}
		objs[i] = obj{id, data}
	}
	return objs
}

func mustGet(t testing.TB, s *Store, o obj) {
	t.Helper()
	got, err := s.Get(bg, o.id)
	if err != nil {
		t.Fatalf("Get %s: %v", o.id.Short(), err)
	}
	if !bytes.Equal(got, o.data) {
		t.Fatalf("Get %s: wrong content", o.id.Short())
	}
}

func mustMissing(t testing.TB, s *Store, id cairn.ID) {
	t.Helper()
	if _, err := s.Get(bg, id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Get %s: err = %v, want NotFound", id.Short(), err)
	}
}

func verifyClean(t testing.TB, s *Store) {
	t.Helper()
	err := s.Verify(bg, func(id cairn.ID, err error) {
		t.Errorf("Verify: %s: %v", id.Short(), err)
	})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

// files returns the pack directory's files with the given suffix.
func files(t testing.TB, dir, suffix string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "packs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), suffix) {
			out = append(out, filepath.Join(dir, "packs", e.Name()))
		}
	}
	return out
}

// unsealedPack crashes a store after n puts and returns the path of its
// unsealed pack.
func unsealedPack(t *testing.T, n int) (dir, pack string, objs []obj) {
	dir = t.TempDir()
	s := open(t, dir, Options{})
	objs = putN(t, s, 1, n, 1000)
	s.crash()
	if idx := files(t, dir, ".idx"); len(idx) != 0 {
		t.Fatalf("crashed store left indexes: %v", idx)
	}
	packs := files(t, dir, ".pack")
	if len(packs) != 1 {
		t.Fatalf("want 1 pack, have %v", packs)
	}
	return dir, packs[0], objs
}

func TestTornTail(t *testing.T) {
	const n = 20
	const rec = recHeaderSize + 1000
	full := int64(packHeaderSize + n*rec)
	lastOff := full - rec
	tests := []struct {
		name     string
		damage   func(t *testing.T, f *os.File)
		survive  int   // objects that must survive
		wantSize int64 // pack size after recovery
	}{
		{"truncated-in-payload", func(t *testing.T, f *os.File) { f.Truncate(full - 500) }, n - 1, lastOff},
		{"truncated-in-header", func(t *testing.T, f *os.File) { f.Truncate(lastOff + 20) }, n - 1, lastOff},
		{"garbled-payload", func(t *testing.T, f *os.File) { f.WriteAt([]byte("xx"), full-10) }, n - 1, full},
		{"garbled-header", func(t *testing.T, f *os.File) { f.WriteAt([]byte{0xff}, lastOff+15) }, n - 1, lastOff},
		// The last two records are zeros (the end), the one before has a
		// damaged payload (skipped).
		{"zeroed-tail", func(t *testing.T, f *os.File) { f.WriteAt(make([]byte, 3000), full-3000) }, n - 3, full - 2*rec},
		{"garbage-appended", func(t *testing.T, f *os.File) { f.WriteAt(bytes.Repeat([]byte{0xa5}, 100), full) }, n, full},
		{"half-header-appended", func(t *testing.T, f *os.File) {
			f.WriteAt(appendRecHeader(nil, kindData, cairn.ID{1}, 5000)[:30], full)
		}, n, full},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, pack, objs := unsealedPack(t, n)
			if fi, _ := os.Stat(pack); fi.Size() != full {
				t.Fatalf("pack has %d bytes, want %d", fi.Size(), full)
			}
			f, err := os.OpenFile(pack, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, f)
			f.Close()

			s := open(t, dir, Options{})
			for _, o := range objs[:tc.survive] {
				mustGet(t, s, o)
			}
			for _, o := range objs[tc.survive:] {
				mustMissing(t, s, o.id)
			}
			verifyClean(t, s)
			if fi, _ := os.Stat(pack); fi.Size() != tc.wantSize {
				t.Errorf("recovered pack has %d bytes, want %d", fi.Size(), tc.wantSize)
			}
			if len(files(t, dir, ".idx")) != 1 {
				t.Errorf("recovery did not write the index")
			}
			more := putN(t, s, 1000, 5, 3000)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = open(t, dir, Options{})
			defer s.Close()
			for _, o := range append(objs[:tc.survive], more...) {
				mustGet(t, s, o)
			}
			verifyClean(t, s)
		})
	}
}

func TestIndexRebuilt(t *testing.T) {
	for _, damage := range []string{"removed", "garbled", "truncated", "wrong-pack"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{PackSize: 64 << 10})
			objs := putN(t, s, 1, 100, 2000)
			if err := s.Delete(bg, objs[0].id); err != nil {
				t.Fatal(err)
			}
			s.Close()
			idx := files(t, dir, ".idx")
			if len(idx) < 3 {
				t.Fatalf("want several sealed packs, have %d", len(idx))
			}
			for i, p := range idx {
				switch damage {
				case "removed":
					os.Remove(p)
				case "garbled":
					b, _ := os.ReadFile(p)
					b[len(b)/2] ^= 1
					os.WriteFile(p, b, 0o600)
				case "truncated":
					os.Truncate(p, 70)
				case "wrong-pack":
					b, _ := os.ReadFile(idx[(i+1)%len(idx)])
					os.WriteFile(p, b, 0o600)
				}
			}
			s = open(t, dir, Options{})
			defer s.Close()
			mustMissing(t, s, objs[0].id)
			for _, o := range objs[1:] {
				mustGet(t, s, o)
			}
			verifyClean(t, s)
			for _, p := range idx {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatalf("index not rebuilt: %v", err)
				}
				id, _ := parsePackID(strings.TrimSuffix(filepath.Base(p), ".idx"))
				if _, err := decodeIdx(b, id); err != nil {
					t.Fatalf("rebuilt index %s: %v", p, err)
				}
			}
		})
	}
}

func TestCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	objs := putN(t, s, 1, 10, 5000)
	s.Close()
	pack := files(t, dir, ".pack")[0]
	f, _ := os.OpenFile(pack, os.O_RDWR, 0)
	bad := objs[3]
	off := int64(packHeaderSize + 3*(recHeaderSize+5000) + recHeaderSize + 100)
	f.WriteAt([]byte{0x55, 0xaa}, off)
	f.Close()

	s = open(t, dir, Options{})
	var reported []cairn.ID
	err := s.Verify(bg, func(id cairn.ID, err error) {
		if !errors.Is(err, cairn.ErrCorrupt) {
			t.Errorf("Verify reports %v, want Corrupt", err)
		}
		reported = append(reported, id)
	})
	if err != nil || len(reported) != 1 || reported[0] != bad.id {
		t.Fatalf("Verify = %v, reported %v; want exactly %s", err, reported, bad.id.Short())
	}
	if _, err := s.Get(bg, bad.id); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Get of a damaged object: %v, want Corrupt", err)
	}
	if found, _ := s.Has(bg, []cairn.ID{bad.id}); found[0] {
		t.Fatal("Has reports a damaged object present, so it would never be re-uploaded")
	}
	for i, o := range objs {
		if i != 3 {
			mustGet(t, s, o)
		}
	}
	// Repair: put it again.
	if err := s.Put(bg, bad.id, bad.data); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, bad)
	s.Close()
	s = open(t, dir, Options{})
	defer s.Close()
	mustGet(t, s, bad) // skips the damaged copy, finds the good one
	if _, err := s.Compact(bg); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		mustGet(t, s, o)
	}
}

func TestCompactFreesSpace(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{PackSize: 256 << 10, NoSync: true})
	objs := putN(t, s, 1, 1000, 1500)
	for i, o := range objs {
		if i%5 != 0 {
			if err := s.Delete(bg, o.id); err != nil {
				t.Fatal(err)
			}
		}
	}
	s.Close() // seal the last pack, so that Stats before and after compare
	s = open(t, dir, Options{PackSize: 256 << 10, NoSync: true})
	before, _ := s.Stats(bg)
	freed, err := s.Compact(bg)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := s.Stats(bg)
	t.Logf("before %+v, freed %d, after %+v", before, freed, after)
	if freed <= 0 || after.Disk != before.Disk-freed {
		t.Fatalf("freed %d, disk %d -> %d", freed, before.Disk, after.Disk)
	}
	if after.Objects != 200 || after.Disk > 2*after.Bytes {
		t.Fatalf("after compaction: %+v", after)
	}
	check := func(s *Store) {
		for i, o := range objs {
			if i%5 == 0 {
				mustGet(t, s, o)
			} else {
				mustMissing(t, s, o.id)
			}
		}
		verifyClean(t, s)
	}
	check(s)
	// Delete more: packs holding only tombstones of removed packs go away.
	for i, o := range objs {
		if i%5 == 0 && i%10 != 0 {
			s.Delete(bg, o.id)
		}
	}
	if _, err := s.Compact(bg); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, dir, Options{PackSize: 256 << 10, NoSync: true})
	defer s.Close()
	for i, o := range objs {
		if i%10 == 0 {
			mustGet(t, s, o)
		} else {
			mustMissing(t, s, o.id)
		}
	}
	u, _ := s.Stats(bg)
	if u.Objects != 100 {
		t.Fatalf("after reopen: %+v", u)
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []Options{
		{PackSize: 1000},
		{PackSize: 5 << 30},
		{BatchBytes: 10},
		{CompactBelow: 1.5},
		{CompactBelow: -1},
	} {
		if _, err := Open(bg, t.TempDir(), o); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("Open(%+v) err = %v, want Invalid", o, err)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, markerName), []byte("something else\n"), 0o600)
	if _, err := Open(bg, dir, Options{}); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("Open of a foreign directory: %v, want Invalid", err)
	}
	s := open(t, t.TempDir(), Options{})
	defer s.Close()
	big := make([]byte, MaxObjectSize+1)
	if err := s.Put(bg, cairn.ID{}, big); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("Put of %d bytes: %v, want Invalid", len(big), err)
	}
}

func TestObjectLargerThanPack(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{PackSize: 64 << 10, NoSync: true})
	objs := putN(t, s, 1, 3, 10)
	objs = append(objs, putN(t, s, 10, 2, 200<<10)...)
	objs = append(objs, putN(t, s, 20, 3, 10)...)
	for _, o := range objs {
		mustGet(t, s, o)
	}
	s.Close()
	s = open(t, dir, Options{PackSize: 64 << 10})
	defer s.Close()
	for _, o := range objs {
		mustGet(t, s, o)
	}
	verifyClean(t, s)
}

func TestUseAfterClose(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	o := putN(t, s, 1, 1, 10)[0]
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Put(bg, o.id, o.data); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Put after Close: %v, want Invalid", err)
	}
	if err := s.Delete(bg, o.id); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Delete after Close: %v, want Invalid", err)
	}
}

// A copy found damaged (by Get or by Verify) stays dead for every later
// process: before, only this process's memory knew, so the next one's Has
// answered "present" and a Put of the original data changed nothing
// (issue 14). Put then writes a good copy, and Compact drops the bad one.
func TestDamageQuarantinedAcrossReopen(t *testing.T) {
	for _, how := range []string{"get", "verify", "check"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, Options{})
			objs := putN(t, s, 1, 10, 5000)
			s.Close()
			pack := files(t, dir, ".pack")[0]
			f, err := os.OpenFile(pack, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			bad := objs[3]
			off := int64(packHeaderSize + 3*(recHeaderSize+5000) + recHeaderSize + 100)
			var b [1]byte
			f.ReadAt(b[:], off)
			b[0] ^= 0x01
			f.WriteAt(b[:], off)
			f.Close()

			s = open(t, dir, Options{})
			switch how {
			case "get":
				if _, err := s.Get(bg, bad.id); !errors.Is(err, cairn.ErrCorrupt) {
					t.Fatalf("Get of a damaged object: %v, want Corrupt", err)
				}
			case "verify":
				if err := s.Verify(bg, func(cairn.ID, error) {}); err != nil {
					t.Fatal(err)
				}
			case "check":
				good, err := s.Check(bg, []cairn.ID{objs[0].id, bad.id})
				if err != nil || len(good) != 2 || !good[0] || good[1] {
					t.Fatalf("Check = %v, %v; want [true false]", good, err)
				}
			}
			s.Close()

			s = open(t, dir, Options{})
			defer s.Close()
			if found, _ := s.Has(bg, []cairn.ID{bad.id}); found[0] {
				t.Fatal("after reopening, Has reports the damaged object present: a Put of the original would change nothing")
			}
			if _, err := s.Get(bg, bad.id); !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("after reopening, Get of the quarantined object: %v, want Corrupt (not merely missing)", err)
			}
			if err := s.Put(bg, bad.id, bad.data); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Compact(bg); err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				mustGet(t, s, o)
			}
			n := 0
			if err := s.Verify(bg, func(cairn.ID, error) { n++ }); err != nil || n != 0 {
				t.Fatalf("Verify after the repair: %d damaged, %v", n, err)
			}
		})
	}
}
