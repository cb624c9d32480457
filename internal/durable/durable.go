// Package durable writes files and directory entries so that they survive
// a crash: each function returns once the kernel has reported the bytes it
// wrote on stable storage (fsync). Errors are the operating system's, for
// the caller to wrap with its own operation and path.
package durable

import "os"

// SyncDir fsyncs directory dir, making durable the names created, renamed
// or removed in it.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteFile creates or truncates the file at path (with perm if it is
// new), writes b and fsyncs it. Its name is durable once SyncDir of its
// directory returns.
func WriteFile(path string, b []byte, perm os.FileMode) error {
	return write(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, b, perm)
}

// AppendFile appends b to the file at path (created with perm if absent)
// and fsyncs it.
func AppendFile(path string, b []byte, perm os.FileMode) error {
	return write(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, b, perm)
}

func write(path string, flag int, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, flag, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
