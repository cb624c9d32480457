package manifest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"runtime"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"github.com/zeebo/blake3"
	"golang.org/x/crypto/chacha20poly1305"
)

var testWrap = [32]byte{1, 2, 3, 4, 5, 6, 7, 8}

func randomManifest(n int, seed uint64) *Manifest {
	r := rand.New(rand.NewPCG(seed, 1))
	m := &Manifest{Chunks: make([]Ref, n)}
	for i := range m.Chunks {
		c := &m.Chunks[i]
		for j := range c.ID {
			c.ID[j] = byte(r.Uint32())
			c.Key[j] = byte(r.Uint32())
		}
		c.Size = 1 + r.Uint32N(128<<10)
		m.Size += int64(c.Size)
	}
	return m
}

// repetitiveManifest has n references to the same chunk, like a file of
// zeros: its body compresses.
func repetitiveManifest(n int) *Manifest {
	m := &Manifest{}
	ref := Ref{ID: cairn.ID{9}, Key: [32]byte{7}, Size: 128 << 10}
	for range n {
		m.Chunks = append(m.Chunks, ref)
		m.Size += int64(ref.Size)
	}
	return m
}

func sealT(t testing.TB, m *Manifest) ([]byte, cairn.ID) {
	t.Helper()
	stored, id, err := Seal(m, testWrap)
	if err != nil {
		t.Fatal(err)
	}
	if blake3.Sum256(stored) != id {
		t.Fatal("id is not the BLAKE3 of the stored bytes")
	}
	return stored, id
}

func TestRoundTrip(t *testing.T) {
	cases := map[string]*Manifest{
		"empty":      {Chunks: []Ref{}},
		"one":        randomManifest(1, 1),
		"many":       randomManifest(5000, 2),
		"repetitive": repetitiveManifest(5000),
	}
	for name, m := range cases {
		stored, id := sealT(t, m)
		got, err := Open(stored, id, testWrap)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("%s: round trip changed the manifest", name)
		}
		again, _ := sealT(t, m)
		if bytes.Equal(again, stored) {
			t.Fatalf("%s: two seals gave identical bytes (key and nonces must be fresh)", name)
		}
	}
	// The repetitive body is stored compressed, the random one nearly raw.
	rs, _ := sealT(t, repetitiveManifest(5000))
	if len(rs) > 5000*69/10 {
		t.Fatalf("repetitive manifest of 5000 chunks takes %d bytes: not compressed", len(rs))
	}
}

func TestSealRejectsInconsistent(t *testing.T) {
	m := randomManifest(3, 3)
	m.Size++
	if _, _, err := Seal(m, testWrap); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Seal(size off by one) = %v, want Invalid", err)
	}
	m = randomManifest(3, 3)
	m.Size -= int64(m.Chunks[1].Size)
	m.Chunks[1].Size = 0
	if _, _, err := Seal(m, testWrap); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Seal(empty chunk) = %v, want Invalid", err)
	}
	if _, _, err := Seal(nil, testWrap); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("Seal(nil) = %v, want Invalid", err)
	}
}

func TestWrongKey(t *testing.T) {
	stored, id := sealT(t, randomManifest(10, 4))
	other := testWrap
	other[31] ^= 1
	_, err := Open(stored, id, other)
	if !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("Open with wrong key = %v, want Permission", err)
	}
	if want := "wrong volume key"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}

func TestTruncation(t *testing.T) {
	stored, id := sealT(t, randomManifest(20, 5))
	for n := 0; n < len(stored); n++ {
		short := stored[:n]
		// Against the real id: the hash check catches it.
		if _, err := Open(short, id, testWrap); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("truncated to %d: %v, want Corrupt", n, err)
		}
		// Against the truncated bytes' own id (a lying index): the format
		// and the AEAD catch it.
		if _, err := Open(short, blake3.Sum256(short), testWrap); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("truncated to %d, own id: %v, want Corrupt", n, err)
		}
	}
}

func TestBitFlips(t *testing.T) {
	stored, id := sealT(t, randomManifest(3, 6))
	// The volume key slot: type, length, nonce, wrapped key and tag.
	slotStart, slotEnd := headSize, headSize+3+volSlotSize
	for i := range len(stored) * 8 {
		bad := bytes.Clone(stored)
		bad[i/8] ^= 1 << (i % 8)
		if _, err := Open(bad, id, testWrap); !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("bit %d flipped: %v, want Corrupt", i, err)
		}
		_, err := Open(bad, blake3.Sum256(bad), testWrap)
		switch {
		case err == nil:
			t.Fatalf("bit %d flipped, own id: opened", i)
		case i/8 >= slotStart && i/8 < slotEnd && i/8 != slotStart+1 && i/8 != slotStart+2:
			// A damaged slot cannot be told from a slot for another key.
			if !errors.Is(err, cairn.ErrPermission) && !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("bit %d flipped in the key slot, own id: %v", i, err)
			}
		case !errors.Is(err, cairn.ErrCorrupt):
			t.Fatalf("bit %d flipped, own id: %v, want Corrupt", i, err)
		}
	}
}

func TestUnknownSlotsAreSkipped(t *testing.T) {
	m := randomManifest(4, 7)
	future := append([]byte{0x42}, binary.BigEndian.AppendUint16(nil, 5)...)
	future = append(future, 1, 2, 3, 4, 5)
	stored, id, err := seal(m, testWrap, [][]byte{future})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Open(stored, id, testWrap)
	if err != nil {
		t.Fatalf("manifest with an extra slot type: %v", err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatal("manifest with an extra slot type decoded wrong")
	}
	// The extra slot is authenticated: changing it breaks the body AEAD.
	bad := bytes.Clone(stored)
	bad[headSize+4] ^= 1
	if _, err := Open(bad, blake3.Sum256(bad), testWrap); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("tampered extra slot: %v, want Corrupt", err)
	}
}

func TestOpenRejectsVersionAndMagic(t *testing.T) {
	stored, _ := sealT(t, randomManifest(2, 8))
	for _, i := range []int{0, 3, len(Magic)} {
		bad := bytes.Clone(stored)
		bad[i] += 2 // the version byte becomes 3: neither 1 nor 2
		_, err := Open(bad, blake3.Sum256(bad), testWrap)
		if !errors.Is(err, cairn.ErrCorrupt) {
			t.Fatalf("byte %d changed: %v, want Corrupt", i, err)
		}
	}
}

func TestDecodeBodyBounds(t *testing.T) {
	// A count of 2^24 in a tiny body fails before allocating (room for
	// 2^24 refs would be over 1 GiB).
	body := binary.AppendUvarint(nil, 100)
	body = binary.AppendUvarint(body, 1<<24)
	body = append(body, make([]byte, 100)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := decodeBody(body, Version)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("huge count accepted")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("rejecting a huge count allocated %d bytes", grew)
	}
	good := encodeBody(randomManifest(3, 9), Version)
	if _, err := decodeBody(append(bytes.Clone(good), 0), Version); err == nil {
		t.Fatal("trailing byte accepted")
	}
	// A non-minimal varint (size written as 0x80|x, 0x00) is rejected.
	nonMin := append([]byte{0x80 | good[0], 0x00}, good[1:]...)
	if good[0] < 0x80 {
		if _, err := decodeBody(nonMin, Version); err == nil {
			t.Fatal("non-minimal varint accepted")
		}
	}
}

func FuzzOpenManifest(f *testing.F) {
	for i, m := range []*Manifest{{}, randomManifest(1, 1), randomManifest(7, 2), repetitiveManifest(50), deltaManifest(1, 3), deltaManifest(9, 4)} {
		stored, _, err := Seal(m, testWrap)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(stored, false)
		f.Add(encodeBody(m, versionOf(m)), true)
		f.Add(stored[:i*7%len(stored)], false)
	}
	f.Fuzz(func(t *testing.T, data []byte, asBody bool) {
		var m *Manifest
		var err error
		if asBody {
			// The body parsers of both versions, past the AEAD that
			// shields them in Open.
			for _, version := range []byte{Version, VersionDelta} {
				m, err = decodeBody(data, version)
				if err == nil && (versionOf(m) != version || !bytes.Equal(encodeBody(m, version), data)) {
					t.Fatalf("decoded version %d body does not re-encode to the same bytes", version)
				}
				if err == nil {
					break
				}
			}
		} else {
			m, err = Open(data, blake3.Sum256(data), testWrap)
			if err != nil && !errors.Is(err, cairn.ErrCorrupt) && !errors.Is(err, cairn.ErrPermission) {
				t.Fatalf("Open error of kind %v: %v", cairn.KindOf(err), err)
			}
		}
		if err != nil {
			return
		}
		var sum int64
		for _, c := range m.Chunks {
			if c.Size == 0 || c.Size > MaxChunkSize {
				t.Fatalf("accepted chunk size %d", c.Size)
			}
			if b := c.Base; b != nil && (b.Size == 0 || b.Size > MaxChunkSize || b.Base != nil) {
				t.Fatalf("accepted base %+v", b)
			}
			sum += int64(c.Size)
		}
		if sum != m.Size {
			t.Fatalf("accepted size %d, chunks sum to %d", m.Size, sum)
		}
		stored, id, err := Seal(m, testWrap)
		if err != nil {
			t.Fatalf("re-seal: %v", err)
		}
		if m2, err := Open(stored, id, testWrap); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-open: %v", err)
		}
	})
}

// deltaManifest is randomManifest with a base on every other chunk, which
// makes it a version 2 manifest.
func deltaManifest(n int, seed uint64) *Manifest {
	m := randomManifest(n, seed)
	for i := 0; i < n; i += 2 {
		b := randomManifest(1, seed+uint64(i)+100).Chunks[0]
		m.Chunks[i].Base = &b
	}
	return m
}

func TestDeltaManifestVersion2(t *testing.T) {
	for _, m := range []*Manifest{deltaManifest(1, 5), deltaManifest(300, 6)} {
		stored, id := sealT(t, m)
		if stored[len(Magic)] != VersionDelta {
			t.Fatalf("manifest with bases written as version %d", stored[len(Magic)])
		}
		got, err := Open(stored, id, testWrap)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatal("round trip changed the manifest")
		}
	}
	// Without any base, version 1 is written: older readers still open it.
	stored, _ := sealT(t, randomManifest(4, 7))
	if stored[len(Magic)] != Version {
		t.Fatalf("manifest without bases written as version %d", stored[len(Magic)])
	}
	// A base that is itself a delta is refused (depth 1 only).
	m := deltaManifest(1, 8)
	b2 := *m.Chunks[0].Base
	m.Chunks[0].Base.Base = &b2
	if _, _, err := Seal(m, testWrap); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("nested base: %v, want Invalid", err)
	}
	// A version 2 body naming no base is not canonical; a bad base flag
	// is corrupt.
	if _, err := decodeBody(encodeBody(randomManifest(2, 9), VersionDelta), VersionDelta); err == nil {
		t.Fatal("version 2 body without bases accepted")
	}
	dm := deltaManifest(1, 10)
	body := encodeBody(dm, VersionDelta)
	// The base flag: the base's ID, key and uvarint size follow it.
	body[len(body)-2*keySize-len(binary.AppendUvarint(nil, uint64(dm.Chunks[0].Base.Size)))-1]++
	if _, err := decodeBody(body, VersionDelta); err == nil {
		t.Fatal("base flag 2 accepted")
	}
	// Moving a version 1 manifest to version 2 (or back) breaks the key
	// slot's associated data.
	bad := bytes.Clone(stored)
	bad[len(Magic)] = VersionDelta
	if _, err := Open(bad, blake3.Sum256(bad), testWrap); err == nil {
		t.Fatal("version byte changed, still opened")
	}
}

// A version 1 manifest built from the format description (not by Seal)
// still opens: manifests written before version 2 existed stay readable.
func TestOpensVersion1FromSpec(t *testing.T) {
	m := randomManifest(5, 11)
	var km [32]byte
	km[0] = 42
	slotNonce, bodyNonce := make([]byte, nonceSize), make([]byte, nonceSize)
	slotNonce[0], bodyNonce[0] = 1, 2
	// Body: uvarint size, uvarint count, ID || K || uvarint size each.
	body := binary.AppendUvarint(nil, uint64(m.Size))
	body = binary.AppendUvarint(body, uint64(len(m.Chunks)))
	for _, r := range m.Chunks {
		body = append(append(append(body, r.ID[:]...), r.Key[:]...), binary.AppendUvarint(nil, uint64(r.Size))...)
	}
	wrapAEAD, _ := chacha20poly1305.NewX(testWrap[:])
	bodyAEAD, _ := chacha20poly1305.NewX(km[:])
	stored := append([]byte("CRNM"), 1, 1, SlotVolume, 0, 72)
	stored = append(stored, slotNonce...)
	stored = wrapAEAD.Seal(stored, slotNonce, km[:], []byte("CRNM\x01\x01"))
	stored = append(stored, bodyNonce...)
	stored = bodyAEAD.Seal(stored, bodyNonce, append([]byte{0}, body...), stored)
	got, err := Open(stored, blake3.Sum256(stored), testWrap)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatal("version 1 manifest opened to a different chunk list")
	}
}
