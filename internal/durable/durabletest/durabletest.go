// Package durabletest gives tests a small file system to fill: the place
// where a lost write error shows (issue 14: a save on a full disk that
// renamed an empty file over the keyring and reported success).
package durabletest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallTmpfs mounts a 64 KiB tmpfs for the test and returns its
// directory; it is unmounted when the test ends. Mounting needs root (or
// CAP_SYS_ADMIN), as the tests have here and in CI; without it the test
// is skipped, saying why.
func SmallTmpfs(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// Fill writes the file "filler" in dir until the file system is full
// (ENOSPC; any other error fails the test) and returns its name.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill: %v", err)
			}
			return "filler"
		}
	}
}
