// Package meta is cairn's namespace on etcd: volumes, directories, files,
// symlinks, their attributes and versions, the trash, writer locks and the
// garbage-collection fence. etcd is the consistency anchor (SCFS §2.4): the
// only place where "which version of a file is current" is decided. Chunks and
// manifests live in stores; a file record only names its manifest.
//
// The key layout is written down in doc/format.md ("Metadata keys, version 1").
package meta

import (
	"fmt"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// FormatVersion is the version of the metadata key layout (the prefix
// /cairn/v1/). Records change within it by RecordFormat.
const FormatVersion = 1

// RecordFormat is the newest entry-record format this binary reads and
// writes. Format 2 adds hard links (an entry's Links) and special files
// (types p, s, c and b, with Rdev). The realm record's format says the
// newest format any record of the realm may have: it is raised, by a
// compare-and-swap (Service.UseFormat), before the first record that needs
// the new format is written, and a binary whose RecordFormat is lower
// refuses the realm (realm.Open) rather than rewrite records it does not
// understand. Records of format 1 are records of format 2 without those
// fields, so no existing record is rewritten. Format 3 adds key epochs
// (keyepoch/<volID>/<n>, users.go): manifests written after a volume's key
// was rotated are wrapped with a key an older binary does not know, so it
// must not read (it would see "wrong key") nor write (with the old key,
// which a removed member holds) such a volume. No record changed.
const RecordFormat = 3

// Type is the type of a namespace entry.
type Type string

// Entry types.
const (
	TypeDir     Type = "d"
	TypeFile    Type = "f"
	TypeSymlink Type = "l"
	// Special files (record format 2): kept as entries with their type,
	// mode, owner and, for devices, Rdev; they have no versions.
	TypeFIFO   Type = "p"
	TypeSocket Type = "s"
	TypeChar   Type = "c"
	TypeBlock  Type = "b"
)

// Special reports whether t is a FIFO, socket or device node.
func (t Type) Special() bool {
	switch t {
	case TypeFIFO, TypeSocket, TypeChar, TypeBlock:
		return true
	}
	return false
}

// Known reports whether t is a type this binary reads (d, f, l, p, s, c, b).
func (t Type) Known() bool {
	switch t {
	case TypeDir, TypeFile, TypeSymlink:
		return true
	}
	return t.Special()
}

// checkType checks the fields that depend on e's type: a known type; a
// device number only on a device; a special file with no size, versions,
// target or links (it has no data: the kernel serves a FIFO's and a
// socket's, a driver a device's).
func (e *Entry) checkType() error {
	if !e.Type.Known() {
		return fmt.Errorf("unknown entry type %q", e.Type)
	}
	if e.Rdev != 0 && e.Type != TypeChar && e.Type != TypeBlock {
		return fmt.Errorf("device number on an entry of type %q", e.Type)
	}
	if e.Type.Special() && (e.Size != 0 || len(e.Versions) > 0 || e.Target != "" || len(e.Links) > 0) {
		return fmt.Errorf("special file (type %q) with data, versions, target or links", e.Type)
	}
	return nil
}

// ModeBits returns the file type bits (as stat's st_mode & S_IFMT) of an
// entry of type t: S_IFREG for a regular file or an unknown type.
func ModeBits(t Type) uint32 {
	switch t {
	case TypeDir:
		return syscall.S_IFDIR
	case TypeSymlink:
		return syscall.S_IFLNK
	case TypeFIFO:
		return syscall.S_IFIFO
	case TypeSocket:
		return syscall.S_IFSOCK
	case TypeChar:
		return syscall.S_IFCHR
	case TypeBlock:
		return syscall.S_IFBLK
	}
	return syscall.S_IFREG
}

// SpecialType returns the type of a special file whose st_mode is mode,
// or false for any other file type.
func SpecialType(mode uint32) (Type, bool) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO:
		return TypeFIFO, true
	case syscall.S_IFSOCK:
		return TypeSocket, true
	case syscall.S_IFCHR:
		return TypeChar, true
	case syscall.S_IFBLK:
		return TypeBlock, true
	}
	return "", false
}

// Link is one name of an inode that has several (record format 2).
type Link struct {
	Parent uint64 `json:"parent"`
	Name   string `json:"name"`
}

// RootIno is the inode number of every volume's root directory.
const RootIno uint64 = 1

// Volume is a volume's configuration, stored at vol/<name>.
type Volume struct {
	Name    string `json:"name"`
	ID      string `json:"id"`      // random, never reused; keys live under v/<ID>/
	Created int64  `json:"created"` // unix ns
	// KeyCheck is a value derived from the volume master key, so a device can
	// tell "wrong key for this volume" from corruption.
	KeyCheck string `json:"key_check"`
	// Chunking parameters, fixed at creation.
	ChunkMin int `json:"chunk_min"`
	ChunkAvg int `json:"chunk_avg"`
	ChunkMax int `json:"chunk_max"`
	// KeepVersions is V: how many versions of each file are kept.
	KeepVersions int `json:"keep_versions"`
	// TrashTTL is how long removed entries stay restorable.
	TrashTTL time.Duration `json:"trash_ttl"`
}

// Source identifies the local file a version was read from, so that `put`
// can skip a file whose size, mtime and inode are unchanged.
type Source struct {
	Dev   uint64 `json:"dev,omitempty"`
	Ino   uint64 `json:"ino,omitempty"`
	Size  int64  `json:"size,omitempty"`
	Mtime int64  `json:"mtime,omitempty"` // unix ns
}

// Version is one committed version of a regular file.
type Version struct {
	N         uint64   `json:"n"`         // 1, 2, 3, ... per file, never reused
	Manifest  cairn.ID `json:"manifest"`  // the sealed manifest object
	Size      int64    `json:"size"`      // plaintext bytes
	Mtime     int64    `json:"mtime"`     // file mtime at this version, unix ns
	Committed int64    `json:"committed"` // commit time, unix ns
	Stores    []string `json:"stores,omitempty"`
	Chunks    int      `json:"chunks,omitempty"`
	Src       Source   `json:"src,omitempty"`
	// Digest identifies the content (a keyed hash of the chunk list), so a
	// write of unchanged content updates the current version's mtime and
	// source instead of adding a version.
	Digest string `json:"digest,omitempty"`
}

// Entry is a directory entry with its inode. Stored at
// v/<volID>/e/<parent ino>/<name>. A file with several names (hard links)
// has one record per name, each a copy of the inode (see Links).
type Entry struct {
	Name   string `json:"name"`
	Parent uint64 `json:"parent"`
	Ino    uint64 `json:"ino"`
	Type   Type   `json:"type"`
	Mode   uint32 `json:"mode"` // permission bits (and setuid/setgid/sticky)
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Size   int64  `json:"size"`
	Mtime  int64  `json:"mtime"` // unix ns
	Ctime  int64  `json:"ctime"` // unix ns: last change of the record
	Target string `json:"target,omitempty"`
	// Rdev is a character or block device's device number (record
	// format 2), as stat's st_rdev.
	Rdev uint64 `json:"rdev,omitempty"`
	// Links, on a regular file with more than one name (record format 2),
	// lists every name of the inode, its own included, sorted by parent
	// and name. Each name's record is a full copy of the inode (same ino,
	// attributes and versions), and every change to the inode rewrites
	// every copy in one transaction. Absent: the inode has one name.
	Links []Link `json:"links,omitempty"`
	// Versions of a regular file, oldest first; the last is current.
	Versions []Version `json:"versions,omitempty"`

	// Rev is the etcd ModRevision the entry was read at (not stored).
	Rev int64 `json:"-"`
	// Touch, on a directory given as the parent of a create, removal,
	// rename or PutBatch entry (with its whole record as read, at Rev),
	// asks that its mtime and ctime advance to the change's time in the
	// change's own transaction, as a local disk's do when an entry is
	// added or removed: if its record is still the one read, else not
	// (the change is made all the same). Once the change is made, an
	// entry whose record it wrote has the times and Rev written. Not
	// stored.
	Touch bool `json:"-"`
}

// Current returns the current version of a file, or nil.
func (e *Entry) Current() *Version {
	if len(e.Versions) == 0 {
		return nil
	}
	return &e.Versions[len(e.Versions)-1]
}

// Nlink is the inode's number of names (a directory's subdirectories are
// not counted here).
func (e *Entry) Nlink() int {
	if len(e.Links) > 1 {
		return len(e.Links)
	}
	return 1
}

// IsDir reports whether e is a directory.
func (e *Entry) IsDir() bool { return e.Type == TypeDir }

// TrashItem is a removed entry (with, for a directory, its whole subtree
// still attached below it). Stored at v/<volID>/trash/<ID>.
type TrashItem struct {
	ID      string `json:"id"`
	Path    string `json:"path"` // where it was, for people and for restore
	Deleted int64  `json:"deleted"`
	Entry   Entry  `json:"entry"`
}
