package dav

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"os"
	"path"
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

// FS is a volume as x/net/webdav sees it: a webdav.FileSystem whose names
// are slash paths inside the volume ("/a/b"). Nothing is cached between
// calls: every one looks its path up in the metadata, so a change made by
// any device shows at once (close-to-open, like the mount).
//
// Symbolic links and special files (FIFOs, sockets, device nodes) are
// not served: they are left out of listings and their names read as
// absent (WebDAV has no notion of them; nginx's dav answers 404 for what
// is not a regular file, and rclone skips them), and a PUT or MKCOL onto
// such a name is refused (EEXIST: 405) rather than replacing it.
//
// Errors: what x/net/webdav turns into a status is an *os.PathError
// carrying a syscall.Errno (ENOENT: 404 or 409, EEXIST: 405 or 412, ...);
// other failures (the metadata service or a store unreachable) keep their
// cairn error and give a 5xx.
type FS struct {
	vol   *fs.Volume
	stage string // where uploads are staged until their commit
	uid   uint32 // owner of what the gateway creates
	gid   uint32
	log   *slog.Logger
}

var _ webdav.FileSystem = (*FS)(nil)

// split validates a request path and returns its components. A path that
// is not a valid cairn path (a ".." component, a bad name) is EINVAL.
func (f *FS) split(op, name string) ([]string, error) {
	parts, err := vpath.SplitClean(name)
	if err != nil {
		return nil, &os.PathError{Op: op, Path: name, Err: syscall.EINVAL}
	}
	return parts, nil
}

// volPath names parts for people and the trash: VOLUME:/a/b.
func (f *FS) volPath(parts []string) string {
	return f.vol.Name() + ":/" + strings.Join(parts, "/")
}

// pathErr turns a cairn error into what x/net/webdav understands, logging
// the cause it hides.
func (f *FS) pathErr(ctx context.Context, op, name string, err error) error {
	if err == nil {
		return nil
	}
	if cairn.KindOf(err) == cairn.Permission {
		markDenied(ctx)
	}
	var errno syscall.Errno
	switch cairn.KindOf(err) {
	case cairn.NotFound, cairn.NotDir:
		// A component that is a file is "no such collection" to WebDAV.
		errno = syscall.ENOENT
	case cairn.Exist:
		errno = syscall.EEXIST
	case cairn.IsDir:
		errno = syscall.EISDIR
	case cairn.NotEmpty:
		errno = syscall.ENOTEMPTY
	case cairn.Permission:
		errno = syscall.EACCES
	case cairn.Invalid:
		errno = syscall.EINVAL
	default:
		return err
	}
	f.log.Debug("webdav", "op", op, "path", name, "err", err)
	return &os.PathError{Op: op, Path: name, Err: errno}
}

// dir returns the directory parts names (the root for none): ENOENT if it
// is absent or not a directory.
func (f *FS) dir(ctx context.Context, op, name string, parts []string) (*meta.Entry, error) {
	e, err := f.vol.Meta.Lookup(ctx, parts)
	if err != nil {
		return nil, f.pathErr(ctx, op, name, err)
	}
	if !e.IsDir() {
		return nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
	}
	return e, nil
}

// listCache keeps, for one PROPFIND, the entries its listings read, so
// that x/net/webdav opening each listed child (for its properties) does
// not walk the path from the root again. Only read-only opens and Stat
// use it, and only within the request.
type listCache struct {
	mu sync.Mutex
	m  map[string]*meta.Entry // by clean slash path
}

type listCacheKey struct{}

// withListCache returns ctx with a fresh listCache.
func withListCache(ctx context.Context) context.Context {
	return context.WithValue(ctx, listCacheKey{}, &listCache{m: map[string]*meta.Entry{}})
}

func cacheOf(ctx context.Context) *listCache {
	c, _ := ctx.Value(listCacheKey{}).(*listCache)
	return c
}

func (c *listCache) get(parts []string) *meta.Entry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m["/"+strings.Join(parts, "/")]
}

func (c *listCache) put(dir []string, ents []meta.Entry) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := "/" + strings.Join(dir, "/")
	if p != "/" {
		p += "/"
	}
	for i := range ents {
		c.m[p+ents[i].Name] = &ents[i]
	}
}

// resolveRead is resolve for a caller that needs no parent: from the
// request's listCache when the entry is there.
func (f *FS) resolveRead(ctx context.Context, op, name string, parts []string) (*meta.Entry, *meta.Entry, error) {
	if e := cacheOf(ctx).get(parts); e != nil && len(parts) > 0 {
		if hidden(e) {
			return nil, nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
		}
		return nil, e, nil
	}
	return f.resolve(ctx, op, name, parts)
}

// resolve looks parts up: its parent directory (nil for the root) and its
// entry. A symbolic link or special file reads as absent.
func (f *FS) resolve(ctx context.Context, op, name string, parts []string) (parent, e *meta.Entry, err error) {
	if len(parts) == 0 {
		e, err = f.vol.Meta.Root(ctx)
		return nil, e, f.pathErr(ctx, op, name, err)
	}
	parent, err = f.dir(ctx, op, name, parts[:len(parts)-1])
	if err != nil {
		return nil, nil, err
	}
	e, err = f.vol.Meta.Get(ctx, parent.Ino, parts[len(parts)-1])
	if err != nil {
		return parent, nil, f.pathErr(ctx, op, name, err)
	}
	if hidden(e) {
		return parent, nil, &os.PathError{Op: op, Path: name, Err: syscall.ENOENT}
	}
	return parent, e, nil
}

// hidden reports whether e is an entry the gateway does not serve: a
// symbolic link or a special file.
func hidden(e *meta.Entry) bool { return e.Type == meta.TypeSymlink || e.Type.Special() }

// newMode is the mode of something the gateway creates: what the client
// asked for (x/net/webdav asks 0777 for a collection, 0666 for a file, a
// copy's source mode for a copy) less group and other write.
func newMode(perm os.FileMode, def uint32) uint32 {
	m := uint32(perm.Perm()) &^ 0o022
	if m == 0 {
		return def
	}
	return m
}

// Mkdir makes a collection. Its parent must exist (ENOENT: 409).
func (f *FS) Mkdir(ctx context.Context, name string, perm os.FileMode) error {
	const op = "mkcol"
	parts, err := f.split(op, name)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return &os.PathError{Op: op, Path: name, Err: syscall.EEXIST}
	}
	parent, err := f.dir(ctx, op, name, parts[:len(parts)-1])
	if err != nil {
		return err
	}
	_, err = f.vol.Meta.Create(ctx, parent, meta.Entry{Name: parts[len(parts)-1], Type: meta.TypeDir,
		Mode: newMode(perm, 0o755), UID: f.uid, GID: f.gid})
	return f.pathErr(ctx, op, name, err)
}

// RemoveAll moves name, with everything below it, to the volume's trash
// (where 'cairn trash' and 'cairn restore' find it). An absent name is not
// an error; the root cannot be removed.
func (f *FS) RemoveAll(ctx context.Context, name string) error {
	const op = "delete"
	parts, err := f.split(op, name)
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		return &os.PathError{Op: op, Path: name, Err: syscall.EPERM}
	}
	parent, e, err := f.resolve(ctx, op, name, parts)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if mv, ok := ctx.Value(moveKey{}).(moveOf); ok && e.Type == meta.TypeFile && slashClean(name) == mv.dst && f.isFile(ctx, mv.src) {
		// x/net/webdav deletes the destination of an overwriting MOVE
		// before the move: a file moved onto a file instead replaces
		// it in the move itself, which keeps its history (versions
		// follow the path: meta.Vol.Rename).
		return nil
	}
	_, err = f.vol.Meta.Remove(ctx, parent, parts[len(parts)-1], f.volPath(parts), true)
	if errors.Is(err, cairn.ErrNotFound) {
		return nil
	}
	return f.pathErr(ctx, op, name, err)
}

// moveKey keys the context of a MOVE request: its moveOf.
type moveKey struct{}

// moveOf is a MOVE's source and destination, as slashClean paths.
type moveOf struct{ src, dst string }

// isFile reports whether name is a regular file.
func (f *FS) isFile(ctx context.Context, name string) bool {
	parts, err := f.split("move", name)
	if err != nil || len(parts) == 0 {
		return false
	}
	_, e, err := f.resolve(ctx, "move", name, parts)
	return err == nil && e.Type == meta.TypeFile
}

// Rename moves oldName to newName. x/net/webdav has already removed an
// existing destination that MOVE may overwrite, except a file that a file
// replaces (RemoveAll): the rename replaces it, and the name keeps its
// history. A collection cannot move below itself.
func (f *FS) Rename(ctx context.Context, oldName, newName string) error {
	const op = "move"
	from, err := f.split(op, oldName)
	if err != nil {
		return err
	}
	to, err := f.split(op, newName)
	if err != nil {
		return err
	}
	if len(from) == 0 || len(to) == 0 {
		return &os.PathError{Op: op, Path: oldName, Err: syscall.EPERM}
	}
	if len(to) > len(from) && slicesEqual(to[:len(from)], from) {
		return &os.PathError{Op: op, Path: newName, Err: syscall.EINVAL}
	}
	srcParent, _, err := f.resolve(ctx, op, oldName, from)
	if err != nil {
		return err
	}
	dstParent, err := f.dir(ctx, op, newName, to[:len(to)-1])
	if err != nil {
		return err
	}
	err = f.vol.Meta.Rename(ctx, srcParent, from[len(from)-1], dstParent, to[len(to)-1], f.volPath(to))
	return f.pathErr(ctx, op, oldName, err)
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Stat describes name.
func (f *FS) Stat(ctx context.Context, name string) (os.FileInfo, error) {
	const op = "stat"
	parts, err := f.split(op, name)
	if err != nil {
		return nil, err
	}
	_, e, err := f.resolveRead(ctx, op, name, parts)
	if err != nil {
		return nil, err
	}
	return entryInfo(e, baseName(parts)), nil
}

// etag is the entity tag of name as it is now ("" if it has none).
func (f *FS) etag(ctx context.Context, name string) string {
	fi, err := f.Stat(ctx, name)
	if err != nil {
		return ""
	}
	if t, ok := fi.(*fileInfo); ok {
		return t.etag()
	}
	return ""
}

func baseName(parts []string) string {
	if len(parts) == 0 {
		return "/"
	}
	return parts[len(parts)-1]
}

// OpenFile opens name. A collection gives a directory handle (its dead
// properties may be patched). A regular file opened read-only streams its
// current version, verified chunk by chunk, without a copy on disk; opened
// for writing it gets a local copy (fetched on first use unless O_TRUNC),
// committed as a new version when it is closed, and Close returns the
// commit's error. With O_CREATE an absent file is created by that commit,
// so a failed upload leaves nothing behind.
func (f *FS) OpenFile(ctx context.Context, name string, flag int, perm os.FileMode) (webdav.File, error) {
	const op = "open"
	parts, err := f.split(op, name)
	if err != nil {
		return nil, err
	}
	write := flag&(os.O_WRONLY|os.O_RDWR) != 0
	resolve := f.resolve
	if !write && flag&os.O_CREATE == 0 {
		resolve = f.resolveRead
	}
	parent, e, err := resolve(ctx, op, name, parts)
	switch {
	case errors.Is(err, syscall.ENOENT) && parent != nil && flag&os.O_CREATE != 0:
		if e2, gerr := f.vol.Meta.Get(ctx, parent.Ino, parts[len(parts)-1]); gerr == nil && hidden(e2) {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.EEXIST}
		}
		return &regFile{fsys: f, ctx: ctx, name: name, parent: parent, base: parts[len(parts)-1],
			write: true, dirty: true, truncated: true, mode: newMode(perm, 0o644)}, nil
	case err != nil:
		return nil, err
	}
	if flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL {
		return nil, &os.PathError{Op: op, Path: name, Err: syscall.EEXIST}
	}
	if e.IsDir() {
		if flag&os.O_TRUNC != 0 {
			return nil, &os.PathError{Op: op, Path: name, Err: syscall.EISDIR}
		}
		return &dirFile{fsys: f, ctx: ctx, name: name, parts: parts, base: baseName(parts), e: e}, nil
	}
	rf := &regFile{fsys: f, ctx: ctx, name: name, parent: parent, base: parts[len(parts)-1], e: e, ver: e.Current(),
		write: write, mode: e.Mode}
	if write && flag&os.O_TRUNC != 0 {
		rf.truncated = true
		rf.dirty = true
	}
	return rf, nil
}

// fileInfo describes an entry (os.FileInfo), with its entity tag and
// content type for x/net/webdav (webdav.ETager, webdav.ContentTyper).
type fileInfo struct {
	name  string
	size  int64
	mode  os.FileMode
	mtime time.Time
	e     *meta.Entry
	// tag, if set, gives the entity tag instead of e: for a file being
	// written, whose tag is known only after its commit (x/net/webdav asks
	// for a PUT's ETag with the FileInfo it took before Close).
	tag func() string
}

var (
	_ webdav.ETager       = (*fileInfo)(nil)
	_ webdav.ContentTyper = (*fileInfo)(nil)
)

func entryInfo(e *meta.Entry, name string) *fileInfo {
	fi := &fileInfo{name: name, size: e.Size, mode: os.FileMode(e.Mode & 0o777), mtime: time.Unix(0, e.Mtime), e: e}
	if e.IsDir() {
		fi.mode |= os.ModeDir
		fi.size = 0
	}
	return fi
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.size }
func (fi *fileInfo) Mode() os.FileMode  { return fi.mode }
func (fi *fileInfo) ModTime() time.Time { return fi.mtime }
func (fi *fileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi *fileInfo) Sys() any           { return fi.e }

// ETag is strong and names the content: the current version's digest (a
// keyed hash of its chunk IDs, so equal content has an equal tag, and a
// rename keeps it).
func (fi *fileInfo) ETag(ctx context.Context) (string, error) {
	if t := fi.etag(); t != "" {
		return t, nil
	}
	return "", webdav.ErrNotImplemented
}

func (fi *fileInfo) etag() string {
	if fi.tag != nil {
		return fi.tag()
	}
	return etagOf(fi.e)
}

func etagOf(e *meta.Entry) string {
	if e == nil || e.IsDir() {
		return ""
	}
	v := e.Current()
	switch {
	case v == nil:
		return fmt.Sprintf(`"%x-0"`, e.Ino)
	case v.Digest != "":
		return `"` + v.Digest + `"`
	}
	return fmt.Sprintf(`"%x-%x"`, e.Ino, v.N)
}

// ContentType is guessed from the name's extension only: sniffing the
// content would fetch a chunk of every file a PROPFIND lists.
func (fi *fileInfo) ContentType(ctx context.Context) (string, error) {
	if t := mime.TypeByExtension(path.Ext(fi.name)); t != "" {
		return t, nil
	}
	return "application/octet-stream", nil
}
