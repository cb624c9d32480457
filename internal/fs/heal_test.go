package fs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/memstore"
)

// drillRecord is where a stored object's payload lies in a local store's
// pack (doc/format.md: 32-byte pack header, records of a 48-byte header
// whose bytes 12..44 are the ID, then the payload).
type drillRecord struct {
	pack     string
	off, len int64
}

func drillRecords(t *testing.T, dir string) map[cairn.ID]drillRecord {
	t.Helper()
	packs, _ := filepath.Glob(filepath.Join(dir, "packs", "*.pack"))
	out := map[cairn.ID]drillRecord{}
	for _, p := range packs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for off := int64(32); off+48 <= int64(len(b)); {
			h := b[off : off+48]
			if string(h[:4]) != "crec" {
				break
			}
			n := int64(binary.LittleEndian.Uint32(h[8:]))
			if h[4] == 1 {
				out[cairn.ID(h[12:44])] = drillRecord{p, off + 48, n}
			}
			off += 48 + n
		}
	}
	return out
}

// TestCorruptionDrill is issue 14's acceptance drill, short form: a
// volume of 30 files (some sharing data) on a local store; one byte
// flipped in each of 20 random chunks. Without the original files,
// fsck --repair names exactly the files whose chunks were flipped; with a
// store holding good copies of half of those chunks, exactly the files
// still missing one; with the original files, every file reads back
// byte-identical.
func TestCorruptionDrill(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(14, 2))
	svc, err := meta.New(etcdtest.New(t), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	master := keyring.NewMaster()
	if err := svc.CreateVolume(ctx, meta.Volume{Name: "v", KeyCheck: fs.KeyCheck(master), ChunkMin: 2048, ChunkAvg: 8192, ChunkMax: 65536,
		KeepVersions: 2, TrashTTL: time.Hour}, 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	mv, err := svc.Open(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	storeDir := t.TempDir()
	st, err := localstore.Open(ctx, storeDir, localstore.Options{TrustIDs: true, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	v, err := fs.Open(svc, mv, master, st, fs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	root, err := mv.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// 30 files: ten of their own, ten sharing a prefix, ten holding
	// another file's data and more.
	blob := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	src := t.TempDir()
	shared := blob(40 << 10)
	data := map[string][]byte{}
	var names []string
	for i := range 30 {
		name := fmt.Sprintf("f%02d", i)
		var b []byte
		switch {
		case i < 10:
			b = blob(20<<10 + rng.IntN(60<<10))
		case i < 20:
			b = append(slices.Clone(shared), blob(10<<10+rng.IntN(30<<10))...)
		default:
			b = append(slices.Clone(data[fmt.Sprintf("f%02d", i-20)]), blob(5<<10)...)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		data[name], names = b, append(names, name)
		if _, _, err := v.WriteFile(ctx, root, name, source(b), fs.Attrs{Mode: 0o644, Mtime: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// Which file names which chunk, from the manifests.
	chunkFiles := map[cairn.ID][]string{}
	for _, name := range names {
		e, err := mv.Get(ctx, root.Ino, name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := v.Manifest(ctx, e.Current())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range m.Chunks {
			if !slices.Contains(chunkFiles[r.ID], name) {
				chunkFiles[r.ID] = append(chunkFiles[r.ID], name)
			}
		}
	}
	var chunks []cairn.ID
	for id := range chunkFiles {
		chunks = append(chunks, id)
	}
	slices.SortFunc(chunks, func(a, b cairn.ID) int { return bytes.Compare(a[:], b[:]) })
	rng.Shuffle(len(chunks), func(i, j int) { chunks[i], chunks[j] = chunks[j], chunks[i] })
	flipped := chunks[:20]
	t.Logf("%d files, %d distinct chunks; flipping 20", len(names), len(chunks))

	// A mirror holding good copies of the first ten.
	mirror := memstore.New()
	for _, id := range flipped[:10] {
		b, err := st.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := mirror.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	recs := drillRecords(t, storeDir)
	for _, id := range flipped {
		rec, ok := recs[id]
		if !ok {
			t.Fatalf("chunk %s not found in the packs", id.Short())
		}
		f, err := os.OpenFile(rec.pack, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		off := rec.off + rng.Int64N(rec.len)
		var b [1]byte
		f.ReadAt(b[:], off)
		b[0] ^= 1 << rng.IntN(8)
		f.WriteAt(b[:], off)
		f.Close()
	}
	damagedBy := func(ids []cairn.ID) []string {
		set := map[string]bool{}
		for _, id := range ids {
			for _, name := range chunkFiles[id] {
				set["v:/"+name] = true
			}
		}
		var out []string
		for p := range set {
			out = append(out, p)
		}
		slices.Sort(out)
		return out
	}
	unreadable := func(rep *fs.RepairReport) []string {
		set := map[string]bool{}
		for _, d := range rep.After.Damaged {
			set[d.Path] = true
		}
		var out []string
		for p := range set {
			out = append(out, p)
		}
		slices.Sort(out)
		return out
	}

	// 1. Nothing to heal from: exactly the damaged files are named.
	rep, err := fs.FsckRepair(ctx, []*fs.Volume{v}, st, fs.RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := damagedBy(flipped); rep.OK() || !slices.Equal(unreadable(rep), want) || rep.Needed != 20 {
		t.Fatalf("without sources: unreadable %v (needed %d), want %v (20)", unreadable(rep), rep.Needed, want)
	}
	// 2. Another store holds half: those heal, the rest stay named.
	rep, err = fs.FsckRepair(ctx, []*fs.Volume{v}, st, fs.RepairOptions{Others: []fs.NamedStore{{Name: "mirror", Store: mirror}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := damagedBy(flipped[10:]); rep.FromStores != 10 || !slices.Equal(unreadable(rep), want) {
		t.Fatalf("with a mirror: healed %d from stores, unreadable %v; want 10, %v", rep.FromStores, unreadable(rep), want)
	}
	// 3. The original files: everything heals.
	rep, err = fs.FsckRepair(ctx, []*fs.Volume{v}, st, fs.RepairOptions{Sources: []string{src}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.FromSources != 10 {
		t.Fatalf("with the sources: healed %d from sources, still unreadable %v, store errors %v", rep.FromSources, unreadable(rep), rep.After.StoreErrors)
	}
	for _, name := range names {
		e, err := mv.Get(ctx, root.Ino, name)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := v.ReadFile(ctx, e, nil, &buf); err != nil || !bytes.Equal(buf.Bytes(), data[name]) {
			t.Fatalf("%s after the repair: %v, identical %v", name, err, bytes.Equal(buf.Bytes(), data[name]))
		}
	}
	// And a fresh process agrees.
	st.Close()
	st2, err := localstore.Open(ctx, storeDir, localstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	n := 0
	if err := st2.Verify(ctx, func(cairn.ID, error) { n++ }); err != nil || n != 0 {
		t.Fatalf("store after the repair: %d damaged objects, %v", n, err)
	}
}
