package etcdsvc

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// Advisory locks (flock(2)) coordinate the processes of one realm. A flock
// belongs to an open file description: the kernel drops it when the last
// descriptor closes, including when the process is killed. Go opens files
// with O_CLOEXEC, so children never inherit them.

// tryLock takes mode (syscall.LOCK_SH or LOCK_EX) on f without blocking and
// reports whether it got it.
func tryLock(f *os.File, mode int) (bool, error) {
	for {
		err := syscall.Flock(int(f.Fd()), mode|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, syscall.EINTR):
			continue
		default:
			return false, err
		}
	}
}

// lockWait takes mode on f, polling every few milliseconds until it gets it
// or ctx ends. (A blocking flock cannot be interrupted by a context.)
func lockWait(ctx context.Context, f *os.File, mode int) error {
	const poll = 5 * time.Millisecond
	for {
		ok, err := tryLock(f, mode)
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

func unlock(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
