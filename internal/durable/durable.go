// Package durable writes files and directory entries so that they survive
// a crash: each function returns once the kernel has reported the bytes it
// wrote on stable storage (fsync). Errors are the operating system's, for
// the caller to wrap with its own operation and path, except ReplaceFile's,
// which are cairn errors naming the file.
package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"cairn.dev/cairn/internal/cairn"
)

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

// ReplaceFile atomically replaces the file at path with data, mode perm:
// it writes a temporary file in the same directory, fsyncs and closes it
// (checking every error), renames it over path and fsyncs the directory.
// After a crash path holds the old content or the new, never a part.
//
// It is for the small files cairn rewrites whole (keyring, realm.json,
// registrar.json, the WebDAV password file, the PKI files). On any error
// before the rename, a full disk included, the temporary file is removed
// and the old file is left as it was. An error from the last directory
// fsync means the new content is in place but maybe not yet durable.
// Errors are *cairn.Error with Op "write", Path path and Kind IO
// (Permission when the directory or file may not be written).
func ReplaceFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return replaceErr(path, err)
	}
	tmp := f.Name()
	// CreateTemp makes it 0600; Chmod is not subject to the umask.
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return replaceErr(path, err)
	}
	if err = SyncDir(dir); err != nil {
		return replaceErr(path, err)
	}
	return nil
}

func replaceErr(path string, err error) error {
	kind := cairn.IO
	if errors.Is(err, fs.ErrPermission) {
		kind = cairn.Permission
	}
	return cairn.E("write", kind, path, err)
}
