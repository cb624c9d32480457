package localstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/durable"
)

// File-system helpers. Linux (and other Unix) only: flock, fdatasync, mmap.

// tryLock takes an exclusive flock on f without waiting. It reports false if
// another open file description holds a lock.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}

func unlock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// lockWait takes a flock of kind how (LOCK_SH or LOCK_EX), polling so that
// ctx can interrupt the wait.
func lockWait(ctx context.Context, f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}

// writeFileAtomic writes data to path through a temporary file: write,
// fsync, rename, fsync the directory. A crash leaves either the old file (or
// none) or the new one, never a mix. The temporary file is path+".tmp"; any
// stale one is replaced.
func writeFileAtomic(path string, data []byte, sync bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && sync {
		err = fdatasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if sync {
		return durable.SyncDir(filepath.Dir(path))
	}
	return nil
}

// mapFile maps a whole file read-only. The mapping survives the file's
// removal; the caller unmaps it.
func mapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 || fi.Size() != int64(int(fi.Size())) {
		return nil, errors.New("index file empty or too large to map")
	}
	return syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmap(b []byte) {
	if b != nil {
		_ = syscall.Munmap(b)
	}
}

// dropPages tells the kernel this process will not need the mapped pages
// soon: they leave its resident set (they stay in the page cache).
func dropPages(b []byte) {
	if len(b) > 0 {
		_ = syscall.Madvise(b, syscall.MADV_DONTNEED)
	}
}

const (
	lockSH = syscall.LOCK_SH
	lockEX = syscall.LOCK_EX
)
