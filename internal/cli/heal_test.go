package cli_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
)

// packRecord is one data record in a local store's pack file
// (doc/format.md: 32-byte pack header, then records of a 48-byte header
// and a payload).
type packRecord struct {
	pack    string
	payload int64 // offset of the payload in the pack
	length  int64
}

// dataRecords lists the data records of every pack in the realm's store.
func dataRecords(t *testing.T, r *realmT) []packRecord {
	t.Helper()
	packs, _ := filepath.Glob(filepath.Join(r.home, "store", "packs", "*.pack"))
	var out []packRecord
	for _, p := range packs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(32); off+48 <= int64(len(b)); {
			h := b[off : off+48]
			if string(h[:4]) != "crec" {
				break // the unwritten tail of a pack being appended to
			}
			n := int64(binary.LittleEndian.Uint32(h[8:]))
			if h[4] == 1 {
				out = append(out, packRecord{pack: p, payload: off + 48, length: n})
			}
			off += 48 + n
		}
	}
	return out
}

// flip inverts one bit of byte i of rec's payload, as a failing disk would.
func flip(t *testing.T, rec packRecord, i int64) {
	t.Helper()
	f, err := os.OpenFile(rec.pack, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], rec.payload+i); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b[:], rec.payload+i); err != nil {
		t.Fatal(err)
	}
}

// largest is the largest data record: a chunk of a file of random bytes
// (its manifest is far smaller).
func largest(t *testing.T, recs []packRecord) packRecord {
	t.Helper()
	if len(recs) == 0 {
		t.Fatal("no data records in the store")
	}
	best := recs[0]
	for _, rec := range recs[1:] {
		if rec.length > best.length {
			best = rec
		}
	}
	return best
}

// Issue 14: after a byte of a stored chunk is flipped, put --force of the
// original file dedup'ed against the damaged chunk and reported success.
// Now it reads back what the store claims to hold and writes the damaged
// chunk afresh, and the file reads back byte-identical.
func TestPutForceHealsDamagedChunk(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	data := randBytes(1 << 20)
	path := filepath.Join(src, "f.bin")
	writeFile(t, path, data, 0o644)
	putJSON(t, r, path, "home:/")
	flip(t, largest(t, dataRecords(t, r)), 100)

	sum := putJSON(t, r, "--force", path, "home:/")
	if sum.HealedChunks != 1 || sum.NewChunks != 1 {
		t.Errorf("put --force: healed %d, new %d chunks; want 1, 1", sum.HealedChunks, sum.NewChunks)
	}
	if got := r.ok("cat", "home:/f.bin"); got != string(data) {
		t.Fatal("after put --force the file does not read back byte-identical")
	}
	r.ok("fsck", "--read-data")
}

// Once a read has found a chunk damaged, no later process counts it as
// present: a plain put of a new file holding the same data writes it
// afresh, which heals the old file too (versions name chunks by ID).
func TestDamageFoundByReadIsNotDedupedAgainst(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	data := randBytes(1 << 20)
	writeFile(t, filepath.Join(src, "a.bin"), data, 0o644)
	putJSON(t, r, filepath.Join(src, "a.bin"), "home:/")
	flip(t, largest(t, dataRecords(t, r)), 7)

	r.fails(cli.ExitDamaged, "cat", "home:/a.bin")
	writeFile(t, filepath.Join(src, "b.bin"), data, 0o644)
	sum := putJSON(t, r, filepath.Join(src, "b.bin"), "home:/")
	if sum.NewChunks != 1 {
		t.Errorf("put of the same data after the damage was found: %d new chunks, want 1 (the damaged one)", sum.NewChunks)
	}
	for _, name := range []string{"a.bin", "b.bin"} {
		if got := r.ok("cat", "home:/"+name); got != string(data) {
			t.Fatalf("%s does not read back byte-identical", name)
		}
	}
	out := r.ok("fsck", "--read-data")
	if strings.Contains(out, "DAMAGED") {
		t.Fatalf("fsck after healing:\n%s", out)
	}
}

// fsck --read-data --repair names the file that stays damaged (exit 5)
// when nothing holds a good copy, and heals it from --source.
func TestFsckRepairFromSource(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	a, b := randBytes(1<<20), []byte("small and whole\n")
	writeFile(t, filepath.Join(src, "a.bin"), a, 0o644)
	writeFile(t, filepath.Join(src, "b.txt"), b, 0o644)
	putJSON(t, r, src, "home:/")
	flip(t, largest(t, dataRecords(t, r)), 1000)
	base := filepath.Base(src)

	res := r.fails(cli.ExitDamaged, "fsck", "--read-data", "--repair")
	if !strings.Contains(res.stdout, "UNREADABLE home:/"+base+"/a.bin version 1") || strings.Contains(res.stdout, "UNREADABLE home:/"+base+"/b.txt") {
		t.Fatalf("fsck --repair without sources:\n%s", res.stdout)
	}
	out := r.ok("fsck", "--read-data", "--repair", "--source", src)
	if !strings.Contains(out, "healed 0 from other stores, 1 from") || strings.Contains(out, "UNREADABLE") {
		t.Fatalf("fsck --repair --source:\n%s", out)
	}
	if got := r.ok("cat", "home:/"+base+"/a.bin"); got != string(a) {
		t.Fatal("a.bin does not read back byte-identical after the repair")
	}
	if out := r.ok("fsck", "--read-data"); !strings.Contains(out, "no problems found") {
		t.Fatalf("fsck after the repair:\n%s", out)
	}
	r.fails(cli.ExitUsage, "fsck", "--source", src)
}

// A small file whose content is unchanged is normally not stored again
// (its chunks are taken to be stored). Once one of them was found damaged,
// a put of the original content writes it afresh.
func TestPutHealsSmallUnchangedFile(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	data := randBytes(100 << 10)
	path := filepath.Join(src, "s.bin")
	writeFile(t, path, data, 0o644)
	putJSON(t, r, path, "home:/")
	flip(t, largest(t, dataRecords(t, r)), 3)
	r.fails(cli.ExitDamaged, "cat", "home:/s.bin")

	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	sum := putJSON(t, r, path, "home:/")
	if sum.NewChunks < 1 {
		t.Errorf("put of the original content stored %d new chunks, want the damaged one", sum.NewChunks)
	}
	if got := r.ok("cat", "home:/s.bin"); got != string(data) {
		t.Fatal("the file does not read back byte-identical")
	}
}

// put --force of an unchanged small file (which takes the shortcut that
// stores nothing) has the local store check its chunks first: a damaged
// one nobody had noticed yet is written afresh.
func TestPutForceHealsSmallFile(t *testing.T) {
	r := newRealm(t)
	src := t.TempDir()
	data := randBytes(100 << 10)
	path := filepath.Join(src, "s.bin")
	writeFile(t, path, data, 0o644)
	putJSON(t, r, path, "home:/")
	flip(t, largest(t, dataRecords(t, r)), 5)

	// (The chunk is found damaged before the write, so the engine sees
	// it missing: a new chunk, not a healed one, in the summary.)
	sum := putJSON(t, r, "--force", path, "home:/")
	if sum.NewChunks != 1 {
		t.Errorf("put --force stored %d new chunks, want 1", sum.NewChunks)
	}
	if got := r.ok("cat", "home:/s.bin"); got != string(data) {
		t.Fatal("the file does not read back byte-identical")
	}
}
