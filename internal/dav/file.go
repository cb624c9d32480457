package dav

import (
	"bufio"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/webdav"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/vpath"
)

// dirFile is an open collection: its listing and its dead properties.
type dirFile struct {
	fsys  *FS
	ctx   context.Context
	name  string
	parts []string
	base  string
	e     *meta.Entry

	list   []os.FileInfo
	listed bool
	off    int
}

var (
	_ webdav.File            = (*dirFile)(nil)
	_ webdav.DeadPropsHolder = (*dirFile)(nil)
)

func (d *dirFile) Close() error { return nil }

func (d *dirFile) Read([]byte) (int, error) {
	return 0, &os.PathError{Op: "read", Path: d.name, Err: syscall.EISDIR}
}

func (d *dirFile) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: d.name, Err: syscall.EISDIR}
}

func (d *dirFile) Seek(int64, int) (int64, error) {
	return 0, &os.PathError{Op: "seek", Path: d.name, Err: syscall.EISDIR}
}

func (d *dirFile) Stat() (os.FileInfo, error) { return entryInfo(d.e, d.base), nil }

// Readdir lists the collection (symbolic links and special files left out): count > 0 gives
// at most count entries per call and io.EOF at the end, as http.File does.
func (d *dirFile) Readdir(count int) ([]os.FileInfo, error) {
	if !d.listed {
		ents, err := d.fsys.vol.Meta.ReadDir(d.ctx, d.e.Ino)
		if err != nil {
			return nil, d.fsys.pathErr(d.ctx, "readdir", d.name, err)
		}
		cacheOf(d.ctx).put(d.parts, ents)
		for i := range ents {
			if hidden(&ents[i]) {
				continue
			}
			d.list = append(d.list, entryInfo(&ents[i], ents[i].Name))
		}
		d.listed = true
	}
	rest := d.list[d.off:]
	if count <= 0 {
		d.off = len(d.list)
		return rest, nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	if count > len(rest) {
		count = len(rest)
	}
	d.off += count
	return rest[:count], nil
}

func (d *dirFile) DeadProps() (map[xml.Name]webdav.Property, error) {
	return d.fsys.loadProps(d.ctx, d.e.Ino)
}

func (d *dirFile) Patch(patches []webdav.Proppatch) ([]webdav.Propstat, error) {
	return d.fsys.applyPatch(d.ctx, d.e.Ino, patches)
}

// regFile is an open regular file. Opened read-only it streams the
// version current at open (ver): reads at increasing offsets cost one
// pass over the chunks, and the first headMax bytes are kept so that
// reading the start again (content sniffing, then a seek to 0) costs
// nothing; a seek backwards past them starts the stream again. Opened for
// writing it works on a local copy (tmp) that Close commits.
type regFile struct {
	fsys   *FS
	ctx    context.Context
	name   string
	parent *meta.Entry // the directory the file is in
	base   string
	e      *meta.Entry   // nil: not created yet (its commit creates it)
	ver    *meta.Version // the version read; nil: empty
	write  bool
	mode   uint32 // of a file created here

	mu     sync.Mutex
	pos    int64
	closed bool
	// reading
	st   *stream
	head []byte
	// writing
	tmp       *os.File
	size      int64 // of tmp
	truncated bool  // start empty: do not fetch the current version
	dirty     bool  // Close must commit
	failed    error // a write or an upload's read failed: Close commits nothing
	pending   []webdav.Proppatch
	committed *meta.Entry
}

var (
	_ webdav.File            = (*regFile)(nil)
	_ webdav.DeadPropsHolder = (*regFile)(nil)
	_ io.ReaderFrom          = (*regFile)(nil)
)

// headMax is how much of a file's start a read-only handle keeps.
const headMax = 64 << 10

// stream is one pass over a version's content: fs.Volume.ReadFile writing
// into a pipe from its own goroutine.
type stream struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	off    int64 // offset of the next byte pr yields
}

func (s *stream) stop() {
	s.cancel()
	s.pr.CloseWithError(errors.New("stream closed"))
	<-s.done
}

func (f *regFile) startStream() {
	ctx, cancel := context.WithCancel(f.ctx)
	pr, pw := io.Pipe()
	s := &stream{pr: pr, cancel: cancel, done: make(chan struct{})}
	e, ver := f.e, f.ver
	go func() {
		defer close(s.done)
		err := f.fsys.vol.ReadFile(ctx, e, ver, pw)
		pw.CloseWithError(err) // nil: io.EOF for the reader
	}()
	f.st = s
}

func (f *regFile) fileSize() int64 {
	if f.write && (f.tmp != nil || f.truncated) {
		return f.size
	}
	if f.ver == nil {
		return 0
	}
	return f.ver.Size
}

func (f *regFile) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, os.ErrClosed
	}
	if f.write {
		if err := f.local(); err != nil {
			return 0, err
		}
		n, err := f.tmp.ReadAt(p, f.pos)
		f.pos += int64(n)
		if err == io.EOF && n > 0 {
			err = nil
		}
		return n, err
	}
	size := f.fileSize()
	if f.pos >= size || len(p) == 0 {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	if f.pos < int64(len(f.head)) {
		n := copy(p, f.head[f.pos:])
		f.pos += int64(n)
		return n, nil
	}
	if f.st != nil && f.st.off > f.pos {
		f.st.stop()
		f.st = nil
	}
	if f.st == nil {
		f.startStream()
	}
	// Skip forward to pos (keeping what belongs to the head).
	var buf []byte
	for f.st.off < f.pos {
		if buf == nil {
			buf = make([]byte, 32<<10)
		}
		want := min(int64(len(buf)), f.pos-f.st.off)
		if _, err := f.consume(buf[:want]); err != nil {
			return 0, f.readErr(err)
		}
	}
	if rest := size - f.pos; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := f.consume(p)
	f.pos += int64(n)
	if err != nil && n == 0 {
		return 0, f.readErr(err)
	}
	return n, nil
}

// consume reads from the stream, keeping the head.
func (f *regFile) consume(p []byte) (int, error) {
	n, err := f.st.pr.Read(p)
	if n > 0 && f.st.off == int64(len(f.head)) && f.st.off < headMax {
		keep := min(int64(n), headMax-f.st.off)
		f.head = append(f.head, p[:keep]...)
	}
	f.st.off += int64(n)
	return n, err
}

// readErr is what a read that hit err returns: the content ended before
// the version's size (ReadFile verifies every byte, so that is damage, or
// a canceled request).
func (f *regFile) readErr(err error) error {
	if err == io.EOF {
		return cairn.E("read", cairn.Corrupt, f.fsys.vol.Name()+":"+f.name, errors.New("content shorter than the version's size"))
	}
	return err
}

func (f *regFile) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, os.ErrClosed
	}
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = f.pos + offset
	case io.SeekEnd:
		abs = f.fileSize() + offset
	default:
		return 0, &os.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	if abs < 0 {
		return 0, &os.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	f.pos = abs
	return abs, nil
}

func (f *regFile) Readdir(int) ([]os.FileInfo, error) {
	return nil, &os.PathError{Op: "readdir", Path: f.name, Err: syscall.ENOTDIR}
}

// local makes the local copy of a file opened for writing: empty, or the
// current version fetched whole.
func (f *regFile) local() error {
	if f.tmp != nil {
		return nil
	}
	if f.failed != nil {
		return f.failed
	}
	tmp, err := os.CreateTemp(f.fsys.stage, "upload-*")
	if err != nil {
		f.failed = cairn.E("open", cairn.IO, f.fsys.stage, err)
		return f.failed
	}
	if !f.truncated && f.ver != nil && f.ver.Size > 0 {
		w := bufio.NewWriterSize(tmp, 1<<20)
		err := f.fsys.vol.ReadFile(f.ctx, f.e, f.ver, w)
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			f.failed = err
			return err
		}
		f.size = f.ver.Size
	}
	f.tmp = tmp
	return nil
}

func (f *regFile) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writeLocked(p)
}

func (f *regFile) writeLocked(p []byte) (int, error) {
	if f.closed {
		return 0, os.ErrClosed
	}
	if !f.write {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.EBADF}
	}
	if err := f.local(); err != nil {
		return 0, err
	}
	n, err := f.tmp.WriteAt(p, f.pos)
	f.pos += int64(n)
	f.size = max(f.size, f.pos)
	if n > 0 {
		f.dirty = true
	}
	if err != nil {
		f.failed = cairn.E("write", cairn.IO, f.tmp.Name(), err)
		return n, f.failed
	}
	return n, nil
}

// ReadFrom copies r into the file (io.Copy uses it for a PUT's body and a
// COPY's source). A read error means the content is incomplete (a client
// that went away mid-upload, a source that failed verification): the file
// is then not committed at Close, which x/net/webdav calls whatever
// happened, and the previous version stays current.
func (f *regFile) ReadFrom(r io.Reader) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf := make([]byte, 256<<10)
	var total int64
	for {
		// Not io.ReadFull: a request body cut short reads as
		// io.ErrUnexpectedEOF, which must fail the upload.
		n, rerr := r.Read(buf)
		if n > 0 {
			k, werr := f.writeLocked(buf[:n])
			total += int64(k)
			if werr != nil {
				return total, werr
			}
		}
		switch {
		case rerr == io.EOF:
			return total, nil
		case rerr != nil:
			f.failed = fmt.Errorf("reading the content to store: %w", rerr)
			return total, f.failed
		}
	}
}

func (f *regFile) Stat() (os.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi := &fileInfo{name: f.base, size: f.fileSize(), mode: os.FileMode(f.mode & 0o777), mtime: time.Now(), e: f.e}
	if f.e != nil {
		fi.mode = os.FileMode(f.e.Mode & 0o777)
		if !f.dirty {
			fi.mtime = time.Unix(0, f.e.Mtime)
		}
	}
	if f.write {
		fi.tag = func() string {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.committed != nil {
				return etagOf(f.committed)
			}
			return etagOf(f.e)
		}
	}
	return fi, nil
}

// Close ends the handle. One opened for writing commits its copy as the
// file's new version if it changed (fs.Volume.WriteFile: chunks to the
// store, then a compare-and-swap in the metadata, under the file's writer
// lock) and returns the commit's error; a commit is not canceled by the
// client going away once the content is whole.
func (f *regFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.st != nil {
		f.st.stop()
		f.st = nil
	}
	if f.tmp != nil {
		defer func() {
			f.tmp.Close()
			os.Remove(f.tmp.Name())
		}()
	}
	if !f.write {
		return nil
	}
	if f.failed != nil {
		return fmt.Errorf("%s not stored: %w", f.fsys.vol.Name()+":"+f.name, f.failed)
	}
	if !f.dirty {
		return nil
	}
	ctx := context.WithoutCancel(f.ctx)
	// An existing file keeps its mode and owner as they are at the commit
	// (Mode, UID and GID apply to a file the commit creates).
	attrs := fs.Attrs{Mode: f.mode, UID: f.fsys.uid, GID: f.fsys.gid, Mtime: time.Now(), KeepAttrs: true}
	if parts, err := vpath.SplitClean(f.name); err == nil {
		attrs.Path = "/" + strings.Join(parts, "/") // where its placement policy applies
	}
	if f.e != nil {
		// Recreated with these if it was removed meanwhile.
		attrs.Mode, attrs.UID, attrs.GID = f.e.Mode, f.e.UID, f.e.GID
	}
	tmp, size := f.tmp, f.size
	open := func() (io.ReadCloser, error) {
		if tmp == nil {
			return io.NopCloser(eofReader{}), nil
		}
		return io.NopCloser(io.NewSectionReader(tmp, 0, size)), nil
	}
	e, _, err := f.fsys.vol.WriteFile(ctx, f.parent, f.base, open, attrs)
	if err != nil {
		return f.fsys.pathErr(ctx, "commit", f.name, err)
	}
	f.committed = e
	if len(f.pending) > 0 {
		if _, err := f.fsys.applyPatch(ctx, e.Ino, f.pending); err != nil {
			return err
		}
	}
	return nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// ino is the inode whose properties the handle reads and patches: 0 for a
// file not created yet.
func (f *regFile) ino() uint64 {
	switch {
	case f.committed != nil:
		return f.committed.Ino
	case f.e != nil:
		return f.e.Ino
	}
	return 0
}

func (f *regFile) DeadProps() (map[xml.Name]webdav.Property, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ino := f.ino(); ino != 0 {
		return f.fsys.loadProps(f.ctx, ino)
	}
	props := map[xml.Name]webdav.Property{}
	patchMap(props, f.pending)
	return props, nil
}

// Patch sets dead properties. On a file not created yet (a COPY copies
// the source's properties before closing the copy) they are kept and
// stored after the commit.
func (f *regFile) Patch(patches []webdav.Proppatch) ([]webdav.Propstat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ino := f.ino(); ino != 0 {
		return f.fsys.applyPatch(f.ctx, ino, patches)
	}
	if bad := checkPatch(patches); bad != nil {
		return bad, nil
	}
	f.pending = append(f.pending, patches...)
	return okPatch(patches), nil
}
