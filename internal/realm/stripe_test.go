package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// A file under stripe:2 goes, in morsels, to the two benefactors with the
// most room (greedy), never to the third; its version records that stripe
// set; a device that reads with no cache gets it back byte for byte from
// them; and the benefactors' stores hold no plaintext byte pattern of it.
func TestStripeGreedy(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	const mib = 1 << 20
	homes := map[string]string{}
	for _, b := range []struct {
		name     string
		donation int64
	}{{"b1", 6 * mib}, {"b2", 12 * mib}, {"b3", 4 * mib}} {
		homes[b.name] = joinAs(t, a, pki.Benefactor, b.name)
		serveStandalone(t, homes[b.name], StandaloneOptions{Donation: b.donation})
	}
	for n := range homes {
		waitNode(t, a.Meta, n, meta.NodeOnline, 30*time.Second)
	}
	donors, err := a.Meta.Donors(ctx)
	if err != nil || len(donors) != 3 || donors[0].Name != "b2" || donors[1].Name != "b1" {
		t.Fatalf("donors %+v, %v", donors, err)
	}

	const pol = "stripe:2"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", pol); err != nil {
		t.Fatal(err)
	}
	v, err := a.PolicyVolume(ctx, DefaultVolume, pol)
	if err != nil {
		t.Fatal(err)
	}
	// Random data with a plaintext marker every 4 KiB.
	marker := []byte("PLAINTEXT-MARKER-cairn-stripe-test")
	data := make([]byte, 3*mib)
	rand.Read(data)
	for off := 0; off+len(marker) < len(data); off += 4 << 10 {
		copy(data[off:], marker)
	}
	root, _ := v.Meta.Root(ctx)
	if _, _, werr := v.WriteFile(ctx, root, "f", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
		t.Fatal(werr)
	}
	// Reservations exist while the writer holds them, on b2 and b1 only.
	recs, err := a.Meta.Reservations(ctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("reservations %v, %v", recs, err)
	}
	for _, r := range recs {
		if r.Node == "b3" {
			t.Fatalf("reserved on b3: %+v", r)
		}
	}

	// Read back on a fresh open of the device, with no cache: from the
	// benefactors.
	r2, err := Open(ctx, a.Home, Options{NoCache: true, NoPassphrase: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	got, stores, err := readFile(r2, "f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}
	if len(stores) != 1 || stores[0] != "stripe:2,greedy@b2,b1" {
		t.Fatalf("the version records %v", stores)
	}

	// Each of b2 and b1 holds morsels, b3 nothing; none holds the marker.
	held := map[string]int64{}
	for n, home := range homes {
		err := filepath.WalkDir(filepath.Join(home, "store"), func(p string, de iofs.DirEntry, err error) error {
			if err != nil || de.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if bytes.Contains(b, marker) {
				t.Errorf("%s holds plaintext in %s", n, p)
			}
			if strings.HasSuffix(p, ".pack") {
				held[n] += int64(len(b))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("bytes held per benefactor: %v; reservations %d", held, len(recs))
	if held["b1"] < mib || held["b2"] < mib || held["b3"] > 4096 {
		t.Fatalf("bytes held: %v", held)
	}
}
