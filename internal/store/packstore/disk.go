package packstore

// The local copy of the index: an append-only log of what the index learned
// and forgot, under Options.Dir. It is a cache: everything in it can be
// learned again from the backing store (a listing and each pack's trailer),
// so it is never fsync'd, a damaged or torn tail is cut off at open, and a
// missing file is rebuilt. doc/format.md ("Pack objects", "Local index")
// describes it.

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

const (
	logMagic      = "cairnpxl"
	logVersion    = 1
	logHeaderSize = 16
	logRecHeader  = 8 // kind, 3 zero bytes, payload length
	logRecCRC     = 4

	recPack  = 1 // pack ID, size, n, m, data entries, tombstones
	recPlain = 2 // object ID, size
	recGone  = 3 // ID of a pack or plain object deleted from the backing store

	logName  = "index.log"
	lockName = "lock"

	maxLogRecord = 1 << 30
)

// diskIndex is the open log. Its methods are called with Store.mu held.
type diskIndex struct {
	dir  string
	lock *os.File
	f    *os.File
	size int64 // bytes in the log
	live int64 // bytes a fresh snapshot would take
	err  error // first write error; the log is abandoned after it
}

// openDisk locks dir and opens its log. It fails with Kind Conflict when
// another process has the directory open.
func openDisk(dir string) (*diskIndex, error) {
	const op = "packstore open"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	if err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, cairn.E(op, cairn.Conflict, dir, errors.New("the pack index directory is in use by another process"))
		}
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, logName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lock.Close()
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	return &diskIndex{dir: dir, lock: lock, f: f}, nil
}

// load replays the log into x and cuts off whatever follows the last good
// record. A log of another version is set aside and replaced.
func (d *diskIndex) load(x *index) error {
	data, err := io.ReadAll(d.f)
	if err != nil {
		return cairn.E("packstore open", cairn.IO, d.dir, err)
	}
	good := int64(0)
	if len(data) >= logHeaderSize && string(data[:8]) == logMagic && le.Uint32(data[8:]) == logVersion {
		good = logHeaderSize
		for good < int64(len(data)) {
			n, ok := replay(x, data[good:])
			if !ok {
				break
			}
			good += int64(n)
		}
	}
	if good == 0 {
		if err := d.f.Truncate(0); err != nil {
			return cairn.E("packstore open", cairn.IO, d.dir, err)
		}
		hdr := make([]byte, logHeaderSize)
		copy(hdr, logMagic)
		le.PutUint32(hdr[8:], logVersion)
		if _, err := d.f.WriteAt(hdr, 0); err != nil {
			return cairn.E("packstore open", cairn.IO, d.dir, err)
		}
		good = logHeaderSize
	} else if good < int64(len(data)) {
		if err := d.f.Truncate(good); err != nil {
			return cairn.E("packstore open", cairn.IO, d.dir, err)
		}
	}
	if _, err := d.f.Seek(good, io.SeekStart); err != nil {
		return cairn.E("packstore open", cairn.IO, d.dir, err)
	}
	d.size = good
	d.live = snapshotSize(x)
	return nil
}

// replay applies the record at the start of b; it reports its length, or
// false when b does not start with a whole, intact record.
func replay(x *index, b []byte) (int, bool) {
	if len(b) < logRecHeader+logRecCRC {
		return 0, false
	}
	kind, n := b[0], le.Uint32(b[4:])
	if b[1]|b[2]|b[3] != 0 || n > maxLogRecord || int64(len(b)) < int64(logRecHeader+logRecCRC)+int64(n) {
		return 0, false
	}
	end := logRecHeader + int(n)
	if crc32.Checksum(b[:end], castagnoli) != le.Uint32(b[end:]) {
		return 0, false
	}
	p := b[logRecHeader:end]
	switch kind {
	case recPack:
		pk, err := decodePackRecord(p)
		if err != nil {
			return 0, false
		}
		if old := x.packs[pk.id]; old != nil {
			x.removePack(old)
		}
		delete(x.plain, pk.id)
		x.addPack(pk)
	case recPlain:
		if len(p) != 40 {
			return 0, false
		}
		id := cairn.ID(p[:32])
		if x.packs[id] == nil {
			x.addPlain(id, int64(le.Uint64(p[32:])))
		}
	case recGone:
		if len(p) != 32 {
			return 0, false
		}
		id := cairn.ID(p)
		if pk := x.packs[id]; pk != nil {
			x.removePack(pk)
		}
		delete(x.plain, id)
	default:
		return 0, false
	}
	return end + logRecCRC, true
}

func appendRecord(b []byte, kind byte, payload func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, kind, 0, 0, 0, 0, 0, 0, 0)
	b = payload(b)
	le.PutUint32(b[start+4:], uint32(len(b)-start-logRecHeader))
	return le.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

func packRecord(b []byte, p *pack) []byte {
	return appendRecord(b, recPack, func(b []byte) []byte {
		b = append(b, p.id[:]...)
		b = le.AppendUint64(b, uint64(p.size))
		b = le.AppendUint32(b, uint32(len(p.objs)))
		b = le.AppendUint32(b, uint32(len(p.tombs)))
		for _, o := range p.objs {
			b = append(b, o.id[:]...)
			b = le.AppendUint64(b, uint64(o.off))
			b = le.AppendUint64(b, uint64(o.n))
		}
		for _, t := range p.tombs {
			b = append(b, t.id[:]...)
			b = append(b, t.target[:]...)
		}
		return b
	})
}

func decodePackRecord(p []byte) (*pack, error) {
	if len(p) < 48 {
		return nil, errors.New("short pack record")
	}
	pk := &pack{id: cairn.ID(p[:32]), size: int64(le.Uint64(p[32:]))}
	n, m := le.Uint32(p[40:]), le.Uint32(p[44:])
	if n > maxEntries || m > maxEntries || int64(len(p)) != 48+int64(n)*entrySize+int64(m)*tombSize {
		return nil, fmt.Errorf("pack record of %d bytes for %d entries and %d tombstones", len(p), n, m)
	}
	// The entries are the pack's own index, checked when it was learned;
	// checking them again costs little and keeps a damaged log harmless.
	t := trailer{indexOff: headerSize, n: int(n), m: int(m)}
	b := p[48:]
	for i := range int(n) {
		l := le.Uint64(b[i*entrySize+40:])
		if l > 1<<40 {
			return nil, errors.New("pack record with an impossible object length")
		}
		t.indexOff += int64(l)
	}
	if t.size() != pk.size {
		return nil, errors.New("pack record does not describe its pack's size")
	}
	objs, tombs, err := parseEntries(b, t)
	if err != nil {
		return nil, err
	}
	pk.objs, pk.tombs = objs, tombs
	return pk, nil
}

func plainRecord(b []byte, id cairn.ID, size int64) []byte {
	return appendRecord(b, recPlain, func(b []byte) []byte {
		b = append(b, id[:]...)
		return le.AppendUint64(b, uint64(size))
	})
}

func goneRecord(b []byte, id cairn.ID) []byte {
	return appendRecord(b, recGone, func(b []byte) []byte { return append(b, id[:]...) })
}

func snapshotSize(x *index) int64 {
	n := int64(logHeaderSize)
	for _, p := range x.packs {
		n += logRecHeader + 48 + int64(len(p.objs))*entrySize + int64(len(p.tombs))*tombSize + logRecCRC
	}
	n += int64(len(x.plain)) * (logRecHeader + 40 + logRecCRC)
	return n
}

// write appends records to the log. A write error is logged once by the
// caller and ends the log's use: the index lives on in memory.
func (d *diskIndex) write(b []byte, live int64) error {
	if d.err != nil || len(b) == 0 {
		return nil
	}
	if _, err := d.f.Write(b); err != nil {
		d.err = err
		return cairn.E("packstore index", cairn.IO, d.dir, err)
	}
	d.size += int64(len(b))
	d.live += live
	return nil
}

// worthCompacting reports whether the log holds much more than the index.
func (d *diskIndex) worthCompacting() bool {
	return d.err == nil && d.size > 2*d.live+(1<<20)
}

// rewrite replaces the log with a snapshot of x (a temporary file renamed
// over it).
func (d *diskIndex) rewrite(x *index) error {
	if d.err != nil {
		return nil
	}
	b := make([]byte, logHeaderSize, snapshotSize(x))
	copy(b, logMagic)
	le.PutUint32(b[8:], logVersion)
	for _, p := range x.packs {
		b = packRecord(b, p)
	}
	for id, p := range x.plain {
		b = plainRecord(b, id, p.size)
	}
	if err := durable.ReplaceFile(filepath.Join(d.dir, logName), b, 0o600); err != nil {
		return cairn.E("packstore index", cairn.IO, d.dir, err)
	}
	f, err := os.OpenFile(filepath.Join(d.dir, logName), os.O_RDWR, 0o600)
	if err != nil {
		d.err = err
		return cairn.E("packstore index", cairn.IO, d.dir, err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		d.err = err
		return cairn.E("packstore index", cairn.IO, d.dir, err)
	}
	d.f.Close()
	d.f, d.size, d.live = f, int64(len(b)), int64(len(b))
	return nil
}

func (d *diskIndex) close() error {
	err := d.f.Close()
	if e := d.lock.Close(); err == nil {
		err = e // closing the descriptor releases the flock
	}
	return err
}
