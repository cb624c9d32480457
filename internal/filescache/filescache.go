// Package filescache is `cairn put`'s files cache (restic's and borg's
// idea): for each local file a put stored or found unchanged, what the file
// looked like (size, mtime, ctime, inode, device) and which volume record
// held its content then (the entry's etcd ModRevision and the version's
// identity). A later put that finds the file and the record both unchanged
// skips the file without reading it or decoding its entry. The file's
// format is in doc/format.md ("Files cache").
//
// A cache file is only a hint: one that is torn, damaged, of another
// version or of another volume or destination is ignored (Load returns an
// empty cache and says why), and an entry is used only while the volume's
// record is still the one it names.
package filescache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// Format is the version of the cache files this cairn writes and reads.
const Format = 1

// magic opens every cache file; the byte after it is the format version.
const magic = "cairn files cache\n"

// sumSize is the length of the BLAKE3 checksum that ends a cache file.
const sumSize = 32

// Stat is what a local file looked like.
type Stat struct {
	Dev, Ino uint64
	Size     int64
	Mtime    int64 // unix ns
	Ctime    int64 // unix ns: any change of the file's data or inode moves it
}

// Entry is one local file's record.
type Entry struct {
	Stat Stat
	// Parent and Rev locate the volume's record: the entry named like the
	// local file in directory Parent, at etcd ModRevision Rev.
	Parent uint64
	Rev    int64
	// Ino, N and Manifest identify the version that holds the content:
	// the inode, the version number and its manifest.
	Ino      uint64
	N        uint64
	Manifest cairn.ID
}

// Cache is a loaded (or new) cache: the entries read from its file
// (sorted by local path: absolute, cleaned), and those recorded since.
type Cache struct {
	// Volume, Dest and Cluster say what the entries are about: the
	// volume's ID, the destination path (VOLUME:/DIR) and the etcd
	// cluster whose revisions Rev are.
	Volume, Dest string
	Cluster      uint64

	paths []string
	ents  []Entry
	idx   map[string]int32
	kept  []atomic.Bool // per loaded entry: Keep was called

	mu  sync.Mutex
	rec map[string]Entry
}

// New returns an empty cache.
func New(volume, dest string, cluster uint64) *Cache {
	return &Cache{Volume: volume, Dest: dest, Cluster: cluster, idx: map[string]int32{}, rec: map[string]Entry{}}
}

// Len is the number of entries loaded.
func (c *Cache) Len() int { return len(c.paths) }

// Lookup returns path's entry as loaded, and its index for Keep (-1 and
// the zero Entry if there is none).
func (c *Cache) Lookup(path string) (Entry, int) {
	i, ok := c.idx[path]
	if !ok {
		return Entry{}, -1
	}
	return c.ents[i], int(i)
}

// Keep records that the loaded entry i (from Lookup) still holds.
func (c *Cache) Keep(i int) { c.kept[i].Store(true) }

// Record records path's entry anew.
func (c *Cache) Record(path string, e Entry) {
	c.mu.Lock()
	c.rec[path] = e
	c.mu.Unlock()
}

// Finish makes the cache the one to save after a put of the sources roots
// (local paths, absolute and cleaned): the entries kept and recorded, and
// the loaded ones of paths outside every root (another put's sources, to
// the same destination). It reports whether that differs from what was
// loaded. Keep, Record and Lookup must not be called after it.
func (c *Cache) Finish(roots []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	for p, e := range c.rec {
		if i, ok := c.idx[p]; !ok || c.ents[i] != e {
			changed = true
			break
		}
	}
	for i := 0; i < len(c.paths) && !changed; i++ {
		changed = !c.kept[i].Load() && under(c.paths[i], roots)
	}
	if !changed {
		// What was loaded stands (an unchanged tree's put).
		for i := range c.kept {
			c.kept[i].Store(false)
		}
		c.rec = map[string]Entry{}
		return false
	}
	out := make(map[string]Entry, len(c.paths)+len(c.rec))
	for i, p := range c.paths {
		if _, ok := c.rec[p]; ok {
			continue
		}
		if !c.kept[i].Load() && under(p, roots) {
			continue // gone from the sources: dropped
		}
		out[p] = c.ents[i]
	}
	for p, e := range c.rec {
		out[p] = e
	}
	c.set(out)
	c.rec = map[string]Entry{}
	return true
}

// set makes m the loaded entries.
func (c *Cache) set(m map[string]Entry) {
	c.paths = make([]string, 0, len(m))
	for p := range m {
		c.paths = append(c.paths, p)
	}
	sort.Strings(c.paths)
	c.ents = make([]Entry, len(c.paths))
	c.idx = make(map[string]int32, len(c.paths))
	for i, p := range c.paths {
		c.ents[i] = m[p]
		c.idx[p] = int32(i)
	}
	c.kept = make([]atomic.Bool, len(c.paths))
}

func under(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r) && (strings.HasSuffix(r, "/") || p[len(r)] == '/') {
			return true
		}
	}
	return false
}

// Encode returns the cache file's bytes for the entries loaded (after
// Finish: the entries to keep).
func (c *Cache) Encode() []byte {
	b := make([]byte, 0, 64+len(c.paths)*96)
	b = append(b, magic...)
	b = append(b, Format)
	b = appendString(b, c.Volume)
	b = appendString(b, c.Dest)
	b = binary.LittleEndian.AppendUint64(b, c.Cluster)
	b = binary.AppendUvarint(b, uint64(len(c.paths)))
	prev := ""
	for i, p := range c.paths {
		e := c.ents[i]
		n := commonPrefix(prev, p)
		b = binary.AppendUvarint(b, uint64(n))
		b = appendString(b, p[n:])
		prev = p
		s := e.Stat
		b = binary.AppendUvarint(b, s.Dev)
		b = binary.AppendUvarint(b, s.Ino)
		b = binary.AppendVarint(b, s.Size)
		b = binary.AppendVarint(b, s.Mtime)
		b = binary.AppendVarint(b, s.Ctime)
		b = binary.AppendUvarint(b, e.Parent)
		b = binary.AppendVarint(b, e.Rev)
		b = binary.AppendUvarint(b, e.Ino)
		b = binary.AppendUvarint(b, e.N)
		b = append(b, e.Manifest[:]...)
	}
	sum := blake3.Sum256(b)
	return append(b, sum[:]...)
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrCorrupt is what Decode returns for bytes that are not a whole cache
// file of this format.
var ErrCorrupt = errors.New("not a whole files cache of format 1")

// Decode parses a cache file's bytes. Anything but a whole file of this
// format, checksum verified, is an error wrapping ErrCorrupt.
func Decode(b []byte) (*Cache, error) {
	if len(b) < len(magic)+1+sumSize || string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: no header", ErrCorrupt)
	}
	if v := b[len(magic)]; v != Format {
		return nil, fmt.Errorf("%w: format %d", ErrCorrupt, v)
	}
	body, sum := b[:len(b)-sumSize], b[len(b)-sumSize:]
	if got := blake3.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: checksum mismatch (torn or damaged)", ErrCorrupt)
	}
	r := reader{b: body[len(magic)+1:]}
	c := New(r.str(), r.str(), r.u64())
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: bad entry count", ErrCorrupt)
	}
	// The paths are built in one buffer, made one string at the end.
	var buf []byte
	ends := make([]int, 0, n)
	c.ents = make([]Entry, 0, n)
	prevStart := 0
	for i := uint64(0); i < n && r.err == nil; i++ {
		shared := r.uvarint()
		if shared > uint64(len(buf)-prevStart) {
			return nil, fmt.Errorf("%w: bad path prefix", ErrCorrupt)
		}
		start := len(buf)
		buf = append(buf, buf[prevStart:prevStart+int(shared)]...)
		buf = append(buf, r.str()...)
		if i > 0 && string(buf[start:]) <= string(buf[prevStart:start]) {
			return nil, fmt.Errorf("%w: paths out of order", ErrCorrupt)
		}
		prevStart = start
		ends = append(ends, len(buf))
		var e Entry
		e.Stat.Dev = r.uvarint()
		e.Stat.Ino = r.uvarint()
		e.Stat.Size = r.varint()
		e.Stat.Mtime = r.varint()
		e.Stat.Ctime = r.varint()
		e.Parent = r.uvarint()
		e.Rev = r.varint()
		e.Ino = r.uvarint()
		e.N = r.uvarint()
		copy(e.Manifest[:], r.bytes(cairn.IDSize))
		c.ents = append(c.ents, e)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	all := string(buf)
	c.paths = make([]string, len(ends))
	c.idx = make(map[string]int32, len(ends))
	from := 0
	for i, end := range ends {
		c.paths[i] = all[from:end]
		c.idx[c.paths[i]] = int32(i)
		from = end
	}
	c.kept = make([]atomic.Bool, len(ends))
	return c, nil
}

type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated record")

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) u64() uint64 {
	b := r.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = errShort
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.b)) {
		r.err = errShort
		return ""
	}
	return string(r.bytes(int(n)))
}

// Load reads the cache file at path for volume, dest and cluster. A file
// that is absent gives an empty cache and a nil reason; one that cannot be
// read, is torn or damaged, or is about another volume, destination or
// etcd cluster gives an empty cache and the reason it was ignored.
func Load(path, volume, dest string, cluster uint64) (*Cache, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return New(volume, dest, cluster), nil
	}
	if err != nil {
		return New(volume, dest, cluster), err
	}
	c, err := Decode(b)
	if err != nil {
		return New(volume, dest, cluster), err
	}
	if c.Volume != volume || c.Dest != dest || c.Cluster != cluster {
		return New(volume, dest, cluster), fmt.Errorf("cache of %s %s (etcd cluster %x), not of %s %s (%x)", c.Volume, c.Dest, c.Cluster, volume, dest, cluster)
	}
	return c, nil
}

// Save writes the cache to path, replacing the file whole (a crash leaves
// the old file or the new one, and a torn one fails its checksum).
func (c *Cache) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return cairn.E("save files cache", cairn.IO, path, err)
	}
	return durable.ReplaceFile(path, c.Encode(), 0o600)
}
