package realm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/vpath"
)

// The pins file: edits land (two at once too), come back sorted by
// priority, survive a reload; a damaged file is refused whole and left
// as it was.
func TestPinsFile(t *testing.T) {
	home := t.TempDir()
	if ps, err := LoadPins(home); err != nil || len(ps) != 0 {
		t.Fatalf("no pins file: %v %v", ps, err)
	}
	var wg sync.WaitGroup
	for i, p := range []string{"home:/a", "home:/b", "photos:/2026", "home:/c/d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := editPins(home, func(ps []Pin) ([]Pin, error) {
				return append(ps, Pin{Path: p, VolumeID: "v" + p[:1], Priority: i % 2, Added: int64(i)}), nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ps, err := LoadPins(home)
	if err != nil || len(ps) != 4 {
		t.Fatalf("pins: %v %v", ps, err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.Path)
	}
	if strings.Join(got, " ") != "home:/b home:/c/d home:/a photos:/2026" {
		t.Fatalf("order: %v", got)
	}
	p, _ := vpath.Parse("home:/b")
	if err := Unpin(home, p); err != nil {
		t.Fatal(err)
	}
	if err := Unpin(home, p); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("unpin twice: %v", err)
	}
	if ps, _ = LoadPins(home); len(ps) != 3 {
		t.Fatalf("after unpin: %v", ps)
	}

	for name, body := range map[string]string{
		"version 2":     `{"version":2,"pins":[]}`,
		"unknown field": `{"version":1,"pins":[],"x":1}`,
		"not canonical": `{"version":1,"pins":[{"path":"home:/a/../b","volume_id":"v"}]}`,
		"empty part":    `{"version":1,"pins":[{"path":"home://a","volume_id":"v"}]}`,
		"no volume ID":  `{"version":1,"pins":[{"path":"home:/a"}]}`,
		"twice":         `{"version":1,"pins":[{"path":"home:/a","volume_id":"v"},{"path":"home:/a","volume_id":"v"}]}`,
		"torn":          `{"version":1,"pins":[{"pa`,
	} {
		if _, err := DecodePins([]byte(body)); !errors.Is(err, cairn.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := filepath.Join(home, pinsFile)
	os.WriteFile(bad, []byte(`{"version":2}`), 0o600)
	if err := editPins(home, func(ps []Pin) ([]Pin, error) { return nil, nil }); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("edit of a damaged file: %v", err)
	}
	if b, _ := os.ReadFile(bad); string(b) != `{"version":2}` {
		t.Fatalf("damaged file changed: %q", b)
	}
}

func FuzzDecodePins(f *testing.F) {
	f.Add([]byte(`{"version":1,"pins":[{"path":"home:/a","volume_id":"v","priority":3,"added":1}]}`))
	f.Add([]byte(`{"version":1,"pins":[]}`))
	f.Add([]byte(`{"version":1,"pins":[{"path":"home:/","volume_id":"v"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		pf, err := DecodePins(b)
		if err != nil {
			if !errors.Is(err, cairn.ErrCorrupt) {
				t.Fatalf("error of another kind: %v", err)
			}
			return
		}
		for _, p := range pf.Pins {
			vp, err := vpath.Parse(p.Path)
			if err != nil || vp.String() != p.Path || p.VolumeID == "" {
				t.Fatalf("accepted %+v", p)
			}
		}
	})
}
