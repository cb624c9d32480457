package fs_test

import (
	"bytes"
	"context"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/volkey"
)

// After a rotation (a later key epoch), new manifests open only with the
// new epoch's key: a volume opened with the old keys reads what was written
// before and gets a permission error for what was written after, while one
// with every epoch reads both, and new data still dedups with old.
func TestKeyEpochs(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, 10)
	old := random(200 << 10)
	f.write(t, "before", old)

	e1 := keyring.NewMaster()
	rotated, err := fs.Open(f.svc, f.vol.Meta, f.master, f.st, fs.Options{Epochs: []volkey.Master{e1}})
	if err != nil {
		t.Fatal(err)
	}
	defer rotated.Close()
	newer := random(200 << 10)
	if _, _, err = rotated.WriteFile(ctx, f.root, "after", source(newer), fs.Attrs{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	before, _ := f.st.Stats(ctx)
	if _, _, err = rotated.WriteFile(ctx, f.root, "again", source(old), fs.Attrs{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.st.Stats(ctx); st.Objects != before.Objects+1 {
		t.Fatalf("old content written after the rotation stored %d new objects, want 1 (its manifest)", st.Objects-before.Objects)
	}
	read := func(v *fs.Volume, name string) ([]byte, error) {
		e, err := v.Meta.Get(ctx, f.root.Ino, name)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		err = v.ReadFile(ctx, e, nil, &buf)
		return buf.Bytes(), err
	}
	for _, name := range []string{"before", "after", "again"} {
		want := old
		if name == "after" {
			want = newer
		}
		if got, rerr := read(rotated, name); rerr != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s with every epoch: %v", name, rerr)
		}
	}
	if got, rerr := read(f.vol, "before"); rerr != nil || !bytes.Equal(got, old) {
		t.Fatalf("old data with the old key: %v", rerr)
	}
	for _, name := range []string{"after", "again"} {
		if _, rerr := read(f.vol, name); cairn.KindOf(rerr) != cairn.Permission {
			t.Fatalf("%s with the old key only: %v, want a permission error", name, rerr)
		}
	}
	// A wrong later epoch does not open the new manifests either.
	wrong, err := fs.Open(f.svc, f.vol.Meta, f.master, f.st, fs.Options{Epochs: []volkey.Master{keyring.NewMaster()}})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if _, rerr := read(wrong, "after"); cairn.KindOf(rerr) != cairn.Permission {
		t.Fatalf("after with a wrong epoch key: %v", rerr)
	}
}
