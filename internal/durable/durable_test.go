package durable_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/durable/durabletest"
)

func TestWriteAppendSync(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := durable.WriteFile(p, []byte("a longer first content"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteFile(p, []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := durable.AppendFile(p, []byte(", then more"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "short, then more" {
		t.Fatalf("content %q (%v), want the second write and the append", b, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v (%v): a rewrite must keep the file's mode", fi.Mode(), err)
	}
	if err := durable.AppendFile(filepath.Join(dir, "new"), []byte("x"), 0o600); err != nil {
		t.Fatalf("append creates: %v", err)
	}
	if err := durable.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing", "f")
	if err := durable.WriteFile(missing, nil, 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("write into a missing directory: %v", err)
	}
	if err := durable.SyncDir(filepath.Dir(missing)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncDir of a missing directory: %v", err)
	}
}

func TestReplaceFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := durable.ReplaceFile(p, []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := durable.ReplaceFile(p, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "second" {
		t.Fatalf("content %q (%v), want the second", b, err)
	}
	if fi, serr := os.Stat(p); serr != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v (%v), want 0600", fi.Mode(), serr)
	}
	checkNoTemp(t, dir)
	missing := filepath.Join(dir, "missing", "f")
	err = durable.ReplaceFile(missing, nil, 0o600)
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, cairn.ErrIO) {
		t.Fatalf("replace in a missing directory: %v, want an IO error wrapping ENOENT", err)
	}
	var ce *cairn.Error
	if !errors.As(err, &ce) || ce.Path != missing || ce.Op == "" {
		t.Fatalf("error %#v: want Op and Path %s", err, missing)
	}
}

// TestReplaceFileFullDisk replaces a file on a full file system: the write
// fails, and the old file must be left whole, with no temporary file.
func TestReplaceFileFullDisk(t *testing.T) {
	dir := durabletest.SmallTmpfs(t)
	p := filepath.Join(dir, "keyring")
	old := []byte(strings.Repeat("old ", 100))
	if err := durable.ReplaceFile(p, old, 0o600); err != nil {
		t.Fatal(err)
	}
	filler := durabletest.Fill(t, dir)
	err := durable.ReplaceFile(p, []byte(strings.Repeat("new ", 1000)), 0o600)
	if !errors.Is(err, syscall.ENOSPC) || !errors.Is(err, cairn.ErrIO) {
		t.Fatalf("replace on a full disk: %v, want an IO error wrapping ENOSPC", err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != string(old) {
		t.Fatalf("after a failed replace the file holds %d bytes (%v), want the old %d", len(b), err, len(old))
	}
	checkNoTemp(t, dir, "keyring", filler)
	// With room again it works.
	if err := os.Remove(filepath.Join(dir, filler)); err != nil {
		t.Fatal(err)
	}
	if err := durable.ReplaceFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "new" {
		t.Fatalf("content %q (%v), want new", b, err)
	}
}

// checkNoTemp fails if dir holds any file but those named.
func checkNoTemp(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "f" && !slices.Contains(names, e.Name()) {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
