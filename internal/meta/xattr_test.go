package meta_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

func TestXattrs(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 10)
	root := mustLookup(t, v)
	f := commit(t, s, v, root, "f", 1, 1)

	if _, err := v.Xattr(ctx, f.Ino, "user.a"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("get missing = %v, want NotFound", err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.a", []byte("1"), meta.XattrReplace); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("replace missing = %v, want NotFound", err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.a", []byte("1"), meta.XattrCreate); err != nil {
		t.Fatal(err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.a", []byte("2"), meta.XattrCreate); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("create existing = %v, want Exist", err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.a", []byte("2"), meta.XattrReplace); err != nil {
		t.Fatal(err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.empty", nil, meta.XattrAny); err != nil {
		t.Fatal(err)
	}
	if err := v.SetXattr(ctx, f.Ino, strings.Repeat("n", 256), nil, meta.XattrAny); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("long name = %v, want Invalid", err)
	}
	if err := v.SetXattr(ctx, f.Ino, "user.big", make([]byte, meta.MaxXattrValue+1), meta.XattrAny); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("big value = %v, want Invalid", err)
	}
	all, err := v.Xattrs(ctx, f.Ino)
	if err != nil || len(all) != 2 || !bytes.Equal(all["user.a"], []byte("2")) || len(all["user.empty"]) != 0 {
		t.Fatalf("xattrs = %q, %v", all, err)
	}

	// Attributes follow the inode through a rename and a new version.
	d, _ := v.MkdirAll(ctx, []string{"d"}, 0o755, 0, 0)
	if err := v.Rename(ctx, root, "f", d, "g", "home:/d/g"); err != nil {
		t.Fatal(err)
	}
	g := commit(t, s, v, d, "g", 3, 3)
	if g.Ino != f.Ino {
		t.Fatalf("ino changed %d -> %d", f.Ino, g.Ino)
	}
	if b, err := v.Xattr(ctx, g.Ino, "user.a"); err != nil || string(b) != "2" {
		t.Fatalf("after rename = %q, %v", b, err)
	}
	if err := v.RemoveXattr(ctx, g.Ino, "user.empty"); err != nil {
		t.Fatal(err)
	}
	if err := v.RemoveXattr(ctx, g.Ino, "user.empty"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("remove twice = %v, want NotFound", err)
	}

	// Purging the trash drops the attributes of everything purged, also
	// inside a removed directory; the trash keeps them until then.
	sub, _ := v.MkdirAll(ctx, []string{"d", "sub"}, 0o755, 0, 0)
	if err := v.SetXattr(ctx, sub.Ino, "user.dir", []byte("x"), meta.XattrAny); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Remove(ctx, root, "d", "home:/d", true); err != nil {
		t.Fatal(err)
	}
	if b, err := v.Xattr(ctx, g.Ino, "user.a"); err != nil || string(b) != "2" {
		t.Fatalf("trashed file's attribute = %q, %v", b, err)
	}
	if _, err := v.PurgeTrash(ctx, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, ino := range []uint64{g.Ino, sub.Ino, d.Ino} {
		if all, err := v.Xattrs(ctx, ino); err != nil || len(all) != 0 {
			t.Fatalf("ino %x after purge: %q, %v", ino, all, err)
		}
	}
}
