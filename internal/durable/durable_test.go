package durable_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"cairn.dev/cairn/internal/durable"
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
