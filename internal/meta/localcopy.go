package meta

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	json "github.com/goccy/go-json"
	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// A LocalCopy is this device's copy, on its own disk, of one volume's
// namespace: every entry record (attributes and version list included)
// as of one etcd revision. It is what the device serves when the metadata
// service cannot be reached (doc/offline.md): a mount keeps it current
// from its watch and saves it now and then; a reader with no service
// (Vol.Get, Vol.ReadDir) answers from it.
//
// The copy is a cache of the service's state, never a source of truth:
// losing it costs a re-listing, so it is written whole (a snapshot, with
// fsync and rename) rather than logged, and a copy that fails its checksum
// or its decoding is set aside and never served in part. Offline work that
// must not be lost belongs to the journal, not here.
//
// Its methods are safe for concurrent use.
type LocalCopy struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex
	vol      Volume
	rev      int64 // the etcd revision the copy reflects
	saved    time.Time
	complete bool // a full listing was taken in (Replace): absent names are absent
	ents     map[uint64]map[string]*Entry
	n        int
	dirty    bool
	// dirs is where each directory's record is (offline writes name a
	// change's directory by its place and path: offwrite.go).
	dirs map[uint64]dirPlace
	// overlay, if set, makes the offline changes not replayed yet again
	// after a Replace (Vol.UseOfflineLog).
	overlay func(c *LocalCopy)

	// scanning collects the changes applied while a full listing is being
	// read (BeginReplace .. Replace), to be applied again on top of it.
	scanning bool
	pending  []EntryChange
}

// LocalCopyVersion is the version of the local copy's file format
// (doc/format.md, "Local copy of a volume's namespace").
const LocalCopyVersion = 1

var localCopyMagic = [8]byte{'c', 'a', 'i', 'r', 'n', 'l', 'c', 0}

// maxLocalCopyBody bounds what Decode accepts (a corrupt length must not
// make it allocate without limit).
const maxLocalCopyBody = 1 << 32

// LocalCopyFile is the body of a local copy's file (JSON between the
// header and the checksum: doc/format.md).
type LocalCopyFile struct {
	Volume   Volume        `json:"volume"`
	Rev      int64         `json:"rev"`
	Saved    int64         `json:"saved"` // unix ns
	Complete bool          `json:"complete"`
	Entries  []storedEntry `json:"entries"`
}

type storedEntry struct {
	Entry
	R int64 `json:"rev"`
}

// OpenLocalCopy returns the copy kept at path for volume vol (its ID
// must match). A missing file gives an empty copy; a torn, corrupt or
// foreign one is renamed aside (path + ".bad") with a warning and an
// empty copy is returned: a copy is served whole or not at all.
func OpenLocalCopy(path string, vol Volume, log *slog.Logger) *LocalCopy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &LocalCopy{path: path, log: log, vol: vol, ents: map[uint64]map[string]*Entry{}, dirs: map[uint64]dirPlace{}}
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("local copy of the namespace unreadable: starting without one", "path", path, "err", err)
		}
		return c
	}
	f, err := DecodeLocalCopy(b)
	if err == nil && f.Volume.ID != vol.ID {
		err = fmt.Errorf("copy of volume %s, not %s", f.Volume.ID, vol.ID)
	}
	if err != nil {
		log.Warn("local copy of the namespace discarded (set aside)", "path", path, "err", err)
		os.Rename(path, path+".bad")
		return c
	}
	c.vol, c.rev, c.saved, c.complete = f.Volume, f.Rev, time.Unix(0, f.Saved), f.Complete
	for i := range f.Entries {
		e := f.Entries[i].Entry
		e.Rev = f.Entries[i].R
		c.setLocked(e.Parent, e.Name, &e)
	}
	return c
}

// DecodeLocalCopy reads a local copy's file. Anything but a whole,
// well-formed file of a known version is an error (Kind Corrupt or
// Invalid): never part of one.
func DecodeLocalCopy(b []byte) (*LocalCopyFile, error) {
	const op = "read local copy"
	const head = 8 + 4 + 8
	if len(b) < head+blake3.New().Size() {
		return nil, cairn.E(op, cairn.Corrupt, "", errors.New("too short (torn)"))
	}
	if !bytes.Equal(b[:8], localCopyMagic[:]) {
		return nil, cairn.E(op, cairn.Corrupt, "", errors.New("not a cairn local copy"))
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != LocalCopyVersion {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("local copy format %d; this cairn reads %d", v, LocalCopyVersion))
	}
	n := binary.LittleEndian.Uint64(b[12:])
	if n > maxLocalCopyBody || uint64(len(b)) != head+n+32 {
		return nil, cairn.E(op, cairn.Corrupt, "", fmt.Errorf("length %d does not match the file's %d bytes (torn)", n, len(b)))
	}
	sum := blake3.Sum256(b[:head+n])
	if !bytes.Equal(sum[:], b[head+n:]) {
		return nil, cairn.E(op, cairn.Corrupt, "", errors.New("checksum mismatch"))
	}
	var f LocalCopyFile
	if err := unmarshalFast(b[head:head+n], &f); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, "", err)
	}
	if f.Volume.ID == "" || f.Rev < 0 {
		return nil, cairn.E(op, cairn.Corrupt, "", errors.New("no volume or a negative revision"))
	}
	seen := map[[2]any]bool{}
	for i := range f.Entries {
		e := &f.Entries[i].Entry
		if err := checkStored(e); err != nil {
			return nil, cairn.E(op, cairn.Corrupt, e.Name, err)
		}
		k := [2]any{e.Parent, e.Name}
		if seen[k] {
			return nil, cairn.E(op, cairn.Corrupt, e.Name, errors.New("entry listed twice"))
		}
		seen[k] = true
	}
	return &f, nil
}

// checkStored applies to a stored entry the checks decode applies to a
// record read from etcd: a root only as the root, names that are one
// element of a path, a known type.
func checkStored(e *Entry) error {
	if e.Parent == 0 {
		if e.Name != "" {
			return errors.New("entry in directory 0000000000000000")
		}
	} else if err := checkName(e.Name); err != nil {
		return err
	}
	return e.checkType()
}

// encodeLocalCopy returns the file for a copy's state.
func encodeLocalCopy(f *LocalCopyFile) []byte {
	body, _ := json.Marshal(f)
	return wrapLocalCopy(body)
}

// wrapLocalCopy puts body between the header and the checksum.
func wrapLocalCopy(body []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(8 + 4 + 8 + len(body) + 32)
	buf.Write(localCopyMagic[:])
	binary.Write(&buf, binary.LittleEndian, uint32(LocalCopyVersion))
	binary.Write(&buf, binary.LittleEndian, uint64(len(body)))
	buf.Write(body)
	sum := blake3.Sum256(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes()
}

func (c *LocalCopy) setLocked(parent uint64, name string, e *Entry) {
	d := c.ents[parent]
	if d == nil {
		d = map[string]*Entry{}
		c.ents[parent] = d
	}
	old, ok := d[name]
	if !ok {
		c.n++
	} else if old.IsDir() && (!e.IsDir() || old.Ino != e.Ino) {
		c.undirLocked(old, parent, name)
	}
	d[name] = e
	if e.IsDir() {
		c.dirs[e.Ino] = dirPlace{parent: parent, name: name}
	}
}

// dirPlace is where a directory's record is: name in directory parent.
type dirPlace struct {
	parent uint64
	name   string
}

func (c *LocalCopy) undirLocked(old *Entry, parent uint64, name string) {
	if p, ok := c.dirs[old.Ino]; ok && p.parent == parent && p.name == name {
		delete(c.dirs, old.Ino)
	}
}

// pathLocked is the path of directory ino ("/" for the root; a directory
// the copy cannot place gets what it can, from "?").
func (c *LocalCopy) pathLocked(ino uint64) string {
	var parts []string
	for i := 0; ino != RootIno && ino != 0 && i < 4096; i++ {
		p, ok := c.dirs[ino]
		if !ok {
			parts = append(parts, "?")
			break
		}
		parts = append(parts, p.name)
		ino = p.parent
	}
	if len(parts) == 0 {
		return "/"
	}
	var b strings.Builder
	for i := len(parts) - 1; i >= 0; i-- {
		b.WriteString("/")
		b.WriteString(parts[i])
	}
	return b.String()
}

// setOverlay sets the function that makes the offline changes not
// replayed yet again in the copy, and calls it now.
func (c *LocalCopy) setOverlay(f func(c *LocalCopy)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.overlay = f
	if c.complete {
		f(c)
	}
}

func (c *LocalCopy) delLocked(parent uint64, name string) {
	d := c.ents[parent]
	old, ok := d[name]
	if !ok {
		return
	}
	if old.IsDir() {
		c.undirLocked(old, parent, name)
	}
	delete(d, name)
	c.n--
	if len(d) == 0 {
		delete(c.ents, parent)
	}
}

// LocalCopyState says what a copy holds.
type LocalCopyState struct {
	Volume   string
	Rev      int64     // the etcd revision it reflects (0: none)
	Saved    time.Time // when it was last saved (zero: never)
	Entries  int
	Complete bool // a full listing was taken in: a name it lacks is absent
}

// State returns what the copy holds now.
func (c *LocalCopy) State() LocalCopyState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return LocalCopyState{Volume: c.vol.Name, Rev: c.rev, Saved: c.saved, Entries: c.n, Complete: c.complete}
}

// Usable reports whether the copy can answer for the volume: it took in
// a full listing once.
func (c *LocalCopy) Usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.complete
}

// Get returns the copy's entry name in directory parent (0, "": the
// root's). NotFound if the copy holds none.
func (c *LocalCopy) Get(parent uint64, name string) (*Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.ents[parent][name]; e != nil {
		return cloneEntry(e), nil
	}
	return nil, cairn.E("lookup", cairn.NotFound, name, nil)
}

// ReadDir returns the copy's entries of directory ino, sorted by name.
func (c *LocalCopy) ReadDir(ino uint64) []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.ents[ino]
	out := make([]Entry, 0, len(d))
	for _, e := range d {
		out = append(out, *cloneEntry(e))
	}
	sortEntries(out)
	return out
}

func cloneEntry(e *Entry) *Entry {
	n := *e
	n.Versions = append([]Version(nil), e.Versions...)
	n.Links = append([]Link(nil), e.Links...)
	return &n
}

// BeginReplace marks the start of a full listing (Vol.Snapshot): the
// changes applied from now until Replace are applied again on top of the
// listing, when they are newer than it.
func (c *LocalCopy) BeginReplace() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scanning, c.pending = true, nil
}

// AbortReplace ends a BeginReplace whose listing failed: the copy stays
// as it is (with the changes applied meanwhile).
func (c *LocalCopy) AbortReplace() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scanning, c.pending = false, nil
}

// Replace takes in a full listing of the volume read at revision rev.
func (c *LocalCopy) Replace(ents []Entry, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ents, c.n, c.dirs = map[uint64]map[string]*Entry{}, 0, map[uint64]dirPlace{}
	for i := range ents {
		e := ents[i]
		c.setLocked(e.Parent, e.Name, &e)
	}
	c.rev, c.complete, c.dirty = rev, true, true
	pending := c.pending
	c.scanning, c.pending = false, nil
	c.applyLocked(EntryEvents{Changes: pending}, rev)
	if c.overlay != nil {
		c.overlay(c)
	}
}

// Apply takes in one response of a watch on the volume (which must have
// started at or before the copy's revision, or the copy must be replaced
// after it: the mount's watch loop does both).
func (c *LocalCopy) Apply(ev EntryEvents) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scanning {
		c.pending = append(c.pending, ev.Changes...)
	}
	c.applyLocked(ev, c.rev)
	c.rev = max(c.rev, ev.Rev)
	c.dirty = true
}

func (c *LocalCopy) applyLocked(ev EntryEvents, after int64) {
	for _, ch := range ev.Changes {
		if ch.Rev <= after {
			continue // already in the copy
		}
		if old := c.ents[ch.Parent][ch.Name]; old != nil && old.Rev > ch.Rev {
			continue
		}
		if ch.Entry == nil {
			c.delLocked(ch.Parent, ch.Name)
		} else {
			e := *ch.Entry
			c.setLocked(ch.Parent, ch.Name, &e)
		}
	}
}

// ListedDir takes in a whole listing of directory ino read at revision
// at, when it is not older than the copy (a newer copy already holds
// what the listing says, and more).
func (c *LocalCopy) ListedDir(ino uint64, ents []Entry, at int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.complete || at < c.rev || c.scanning {
		return
	}
	for name := range c.ents[ino] {
		c.delLocked(ino, name)
	}
	for i := range ents {
		e := ents[i]
		c.setLocked(ino, e.Name, &e)
	}
	c.rev, c.dirty = at, true
}

// Save writes the copy to its file if it changed since the last save:
// a new file, fsync'd, renamed over the old, and the directory fsync'd.
func (c *LocalCopy) Save(ctx context.Context) error {
	const op = "save local copy"
	c.mu.Lock()
	if !c.dirty || !c.complete {
		c.mu.Unlock()
		return nil
	}
	now := time.Now()
	f := &LocalCopyFile{Volume: c.vol, Rev: c.rev, Saved: now.UnixNano(), Complete: c.complete}
	f.Entries = make([]storedEntry, 0, c.n)
	for _, d := range c.ents {
		for _, e := range d {
			f.Entries = append(f.Entries, storedEntry{Entry: *e, R: e.Rev})
		}
	}
	c.dirty = false
	c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return cairn.E(op, cairn.Canceled, c.path, err)
	}
	sort.Slice(f.Entries, func(i, j int) bool {
		a, b := f.Entries[i], f.Entries[j]
		if a.Parent != b.Parent {
			return a.Parent < b.Parent
		}
		return a.Name < b.Name
	})
	b := encodeLocalCopy(f)
	if err := writeFileSync(c.path, b); err != nil {
		c.mu.Lock()
		c.dirty = true
		c.mu.Unlock()
		return cairn.E(op, cairn.IO, c.path, err)
	}
	c.mu.Lock()
	c.saved = now
	c.mu.Unlock()
	return nil
}

// writeFileSync replaces path by b atomically and durably.
func writeFileSync(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err = tmp.Write(b); err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
