package mount

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Quiet time (write-back mode). Writing pending namespace changes and
// queued commits costs CPU here and in etcd; on a small machine, doing it
// while a program keeps the mount busy (tar x, git clone) slows the
// program as much as the work is worth. So that work waits while requests
// keep coming, as a local disk's write-back waits (Linux writes dirty
// pages back after seconds, not at each write): until the mount has had
// no request for quietTime, or the oldest waiting change is as old as its
// bound (writeBackAge, queueAge). Anything that needs the work done (an
// fsync, a rename or removal, the unmount) does not wait.

// quietTime is how long the mount must go without a request to count as
// quiet: longer than the gaps between one program's requests (tens of
// microseconds here), shorter than a person notices.
const quietTime = 20 * time.Millisecond

// quietFor returns how long work waiting since since (zero: nothing
// waits) should still wait: until the mount is quiet, at most until
// since+maxAge. Zero or less: now.
func (m *Mount) quietFor(since time.Time, maxAge time.Duration) time.Duration {
	if since.IsZero() {
		return 0
	}
	now := time.Now()
	untilQuiet := time.Unix(0, m.activity.Load()).Add(time.Duration(m.quietTime.Load())).Sub(now)
	return min(untilQuiet, since.Add(maxAge).Sub(now))
}

// busyFS notes the time of each request the kernel makes (Mount.activity).
type busyFS struct {
	fuse.RawFileSystem
	m *Mount
}

func (b *busyFS) touch() { b.m.activity.Store(time.Now().UnixNano()) }

func (b *busyFS) Lookup(c <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Lookup(c, h, name, out)
}

func (b *busyFS) GetAttr(c <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.GetAttr(c, in, out)
}

func (b *busyFS) SetAttr(c <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.SetAttr(c, in, out)
}

func (b *busyFS) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Mkdir(c, in, name, out)
}

func (b *busyFS) Symlink(c <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Symlink(c, h, target, name, out)
}

func (b *busyFS) Unlink(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	b.touch()
	return b.RawFileSystem.Unlink(c, h, name)
}

func (b *busyFS) Rmdir(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	b.touch()
	return b.RawFileSystem.Rmdir(c, h, name)
}

func (b *busyFS) Rename(c <-chan struct{}, in *fuse.RenameIn, from, to string) fuse.Status {
	b.touch()
	return b.RawFileSystem.Rename(c, in, from, to)
}

func (b *busyFS) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Create(c, in, name, out)
}

func (b *busyFS) Open(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Open(c, in, out)
}

func (b *busyFS) Read(c <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	b.touch()
	return b.RawFileSystem.Read(c, in, buf)
}

func (b *busyFS) Write(c <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	b.touch()
	return b.RawFileSystem.Write(c, in, data)
}

func (b *busyFS) Release(c <-chan struct{}, in *fuse.ReleaseIn) {
	b.touch()
	b.RawFileSystem.Release(c, in)
}

func (b *busyFS) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	b.touch()
	return b.RawFileSystem.ReadDirPlus(c, in, out)
}

func (b *busyFS) Statx(c <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	b.touch()
	return b.RawFileSystem.Statx(c, in, out)
}
