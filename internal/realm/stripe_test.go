package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
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
	// A read keeps W+1 morsels' worth of chunks ahead.
	if n := r2.readaheadFor(stores); n != 3*64 {
		t.Fatalf("readahead for a stripe set of 2: %d chunks", n)
	}

	// gc sweeps the morsels' benefactors through the stripe wrapper
	// (chunk IDs), never raw (where it would see morsel IDs no version
	// names, and delete them); the file reads back after it.
	rep, _, err := r2.GC(ctx, GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var viaStripe bool
	for _, s := range rep.Stores {
		if s.Name == "b1" || s.Name == "b2" {
			t.Fatalf("gc swept %s raw: %+v", s.Name, rep.Stores)
		}
		viaStripe = viaStripe || s.Name == "stripe:2,greedy@b2,b1"
	}
	if !viaStripe {
		t.Fatalf("gc did not sweep the stripe set: %+v", rep.Stores)
	}
	if got, _, err := readFile(r2, "f"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back after gc: %d bytes, %v", len(got), err)
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
	if held["b1"] < mib/4 || held["b2"] < mib/4 || held["b1"]+held["b2"] < int64(len(data)) || held["b3"] > 4096 {
		t.Fatalf("bytes held: %v", held)
	}
}

// Two devices importing at once, under a stripe policy, datasets each
// more than half of the donated pool: the reservations, made before
// anything is written, let exactly one import through; the other fails
// with ErrNoRoom having written nothing, and no benefactor is promised or
// holds more than its donation.
func TestStripeReservationRace(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{})
	const mib = 1 << 20
	donations := map[string]int64{"b1": 6 * mib, "b2": 5 * mib}
	homes := map[string]string{}
	for n, d := range donations {
		homes[n] = joinAs(t, a, pki.Benefactor, n)
		serveStandalone(t, homes[n], StandaloneOptions{Donation: d})
	}
	for n := range homes {
		waitNode(t, a.Meta, n, meta.NodeOnline, 30*time.Second)
	}
	const pol = "stripe:2"
	if _, err := a.SetPolicy(ctx, DefaultVolume, "/", pol); err != nil {
		t.Fatal(err)
	}
	const size = 6 * mib
	type result struct {
		name    string
		err     error
		writing bool // the error came from the write, after the reservation
	}
	results := make(chan result, 2)
	start := make(chan struct{})
	for i, r := range []*Realm{a, b} {
		go func() {
			<-start
			name := fmt.Sprintf("f%d", i)
			v, err := r.PolicyVolume(WithDatasetSize(ctx, size), DefaultVolume, pol)
			writing := err == nil
			if err == nil {
				data := make([]byte, size)
				rand.Read(data)
				root, _ := v.Meta.Root(ctx)
				_, _, err = v.WriteFile(ctx, root, name, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644})
			}
			results <- result{name, err, writing}
		}()
	}
	close(start)
	var won []string
	for range 2 {
		r := <-results
		if r.err == nil {
			won = append(won, r.name)
			continue
		}
		if !errors.Is(r.err, meta.ErrNoRoom) || r.writing {
			t.Fatalf("the losing import (failed writing: %v): %v", r.writing, r.err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d of 2 imports of 6 MiB into 11 MiB donated succeeded", len(won))
	}
	recs, err := a.Meta.Reservations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int64{}
	for _, r := range recs {
		per[r.Node] += r.Bytes
	}
	for n, d := range donations {
		if per[n] > d {
			t.Errorf("%d bytes reserved on %s, which donates %d", per[n], n, d)
		}
		var used int64
		filepath.WalkDir(filepath.Join(homes[n], "store"), func(p string, de iofs.DirEntry, err error) error {
			if err == nil && !de.IsDir() {
				if info, ierr := de.Info(); ierr == nil {
					used += info.Size()
				}
			}
			return nil
		})
		if used > d {
			t.Errorf("%s holds %d bytes, donates %d", n, used, d)
		}
	}
	if got, _, err := readFile(b, won[0]); err != nil || len(got) != size {
		t.Fatalf("the winner's file read on b: %d bytes, %v", len(got), err)
	}
}
