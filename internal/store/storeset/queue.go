package storeset

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// Op is what a repair task asks for.
type Op uint8

// The repair operations. The values are stored in queue files.
const (
	// OpPut: the object (for ecstore: the member's shard of it and the
	// shard map) must be written to the member.
	OpPut Op = 1
	// OpDelete: the stored object must be deleted from the member.
	OpDelete Op = 2
)

func (o Op) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	}
	return fmt.Sprintf("op%d", uint8(o))
}

// Task is one repair waiting for one member.
type Task struct {
	Op    Op
	ID    cairn.ID // OpPut: the object the caller stored; OpDelete: the object to delete from Store
	Store string   // the member's name
}

// Queue is the repair queue: the tasks a wrapper could not finish when it
// acknowledged a Put or a Delete. It lives in memory and, when a directory
// is given, in a file there too, so that a restart carries on with them.
//
// Files: each open Queue appends to a file of its own,
// <dir>/<prefix>-<16 hex digits>.queue, which it holds flock'd while open.
// Opening adopts the files of Queues that are no longer open (their lock is
// free): their tasks are copied into the new file, which is synced, and the
// old file removed. So several processes may use one directory, and the
// tasks of one that crashed are picked up by the next to open. Close
// rewrites the file with only the tasks left, or removes it when none are.
//
// Appends are not synced: a power loss may drop the last tasks recorded.
// That loses no data, only the note of what to repair; a full repair walk
// (Repair with no options) finds those objects again.
//
// File format (version 1): the 8 bytes "cairnrq1", then records of
//
//	len    4 bytes, little-endian: length of payload (34..288)
//	crc    4 bytes, little-endian: CRC-32C (Castagnoli) of payload
//	payload: op (1 byte: 1 put, 2 delete; +128 when the task is done)
//	         id (32 bytes), store name (the rest, 1..255 bytes)
//
// A record that is cut short or fails its CRC ends the file (a crash while
// appending); what follows it is ignored.
type Queue struct {
	mu     sync.Mutex
	tasks  map[Task]struct{}
	dir    string
	prefix string
	f      *os.File // nil: memory only, or the file failed
	path   string
	log    *slog.Logger
}

const (
	queueMagic  = "cairnrq1"
	doneBit     = 0x80
	minPayload  = 1 + cairn.IDSize + 1
	maxPayload  = 1 + cairn.IDSize + 255
	queueSuffix = ".queue"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// OpenQueue opens the repair queue. With dir "", it lives in memory only.
// Otherwise dir is created if needed, and the files of closed Queues with
// the same prefix are adopted (see Queue). log may be nil.
func OpenQueue(dir, prefix string, log *slog.Logger) (*Queue, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	q := &Queue{tasks: map[Task]struct{}{}, dir: dir, prefix: prefix, log: log}
	if dir == "" {
		return q, nil
	}
	const op = "open repair queue"
	if prefix == "" || strings.ContainsAny(prefix, "/-") {
		return nil, cairn.E(op, cairn.Invalid, prefix, errors.New("prefix must be non-empty, without / or -"))
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	f, path, err := q.create()
	if err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	q.f, q.path = f, path
	if err := q.adopt(); err != nil {
		q.closeFile()
		os.Remove(path)
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	return q, nil
}

// create makes this Queue's file: written and locked under a temporary
// name, then renamed, so an adopter never sees it unlocked.
func (q *Queue) create() (*os.File, string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	base := q.prefix + "-" + hex.EncodeToString(rnd[:])
	tmp := filepath.Join(q.dir, base+".tmp")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, "", err
	}
	fail := func(err error) (*os.File, string, error) {
		f.Close()
		os.Remove(tmp)
		return nil, "", err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fail(err)
	}
	if _, err := f.Write([]byte(queueMagic)); err != nil {
		return fail(err)
	}
	path := filepath.Join(q.dir, base+queueSuffix)
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	return f, path, nil
}

// adopt takes over the tasks of every unlocked queue file of this prefix.
func (q *Queue) adopt() error {
	names, err := filepath.Glob(filepath.Join(q.dir, q.prefix+"-*"+queueSuffix))
	if err != nil {
		return err
	}
	var adopted []*os.File
	defer func() {
		for _, f := range adopted {
			f.Close() // releases the lock
		}
	}()
	for _, name := range names {
		if name == q.path {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // adopted by someone else meanwhile
			}
			return err
		}
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				continue // its Queue is open
			}
			return err
		}
		if _, err = os.Stat(name); err != nil {
			f.Close() // removed by whoever adopted it before we locked it
			continue
		}
		data, err := io.ReadAll(f)
		if err != nil {
			f.Close()
			return err
		}
		tasks, err := DecodeQueue(data)
		if err != nil {
			q.log.Warn("storeset: repair queue file damaged; keeping the tasks before the damage", "file", name, "err", err)
		}
		for _, t := range tasks {
			q.tasks[t] = struct{}{}
		}
		adopted = append(adopted, f)
	}
	if len(adopted) == 0 {
		return nil
	}
	var buf []byte
	for _, t := range q.sorted() {
		buf = appendRecord(buf, t, false)
	}
	if _, err := q.f.Write(buf); err != nil {
		return err
	}
	if err := q.f.Sync(); err != nil {
		return err
	}
	for _, f := range adopted {
		if err := os.Remove(f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Add queues t; queuing a task already queued does nothing.
func (q *Queue) Add(t Task) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.tasks[t]; ok {
		return
	}
	q.tasks[t] = struct{}{}
	q.appendLocked(t, false)
}

// Done removes t from the queue; removing a task not queued does nothing.
func (q *Queue) Done(t Task) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.tasks[t]; !ok {
		return
	}
	delete(q.tasks, t)
	q.appendLocked(t, true)
}

// Has reports whether t is queued.
func (q *Queue) Has(t Task) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.tasks[t]
	return ok
}

func (q *Queue) appendLocked(t Task, done bool) {
	if q.f == nil {
		return
	}
	if _, err := q.f.Write(appendRecord(nil, t, done)); err != nil {
		q.log.Warn("storeset: repair queue file failed; queue kept in memory only", "file", q.path, "err", err)
		q.closeFile()
	}
}

// Tasks returns the queued tasks, sorted by member, then object.
func (q *Queue) Tasks() []Task {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sorted()
}

func (q *Queue) sorted() []Task {
	out := make([]Task, 0, len(q.tasks))
	for t := range q.tasks {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Task) int {
		if c := strings.Compare(a.Store, b.Store); c != 0 {
			return c
		}
		if c := strings.Compare(string(a.ID[:]), string(b.ID[:])); c != 0 {
			return c
		}
		return int(a.Op) - int(b.Op)
	})
	return out
}

// Len returns the number of tasks queued for member store, or for all
// members when store is "".
func (q *Queue) Len(store string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if store == "" {
		return len(q.tasks)
	}
	n := 0
	for t := range q.tasks {
		if t.Store == store {
			n++
		}
	}
	return n
}

// Close rewrites the file with the tasks left (or removes it when there
// are none) and releases it. A memory-only Queue just forgets its tasks.
func (q *Queue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.f == nil {
		return nil
	}
	defer q.closeFile()
	if len(q.tasks) == 0 {
		return os.Remove(q.path)
	}
	buf := []byte(queueMagic)
	for _, t := range q.sorted() {
		buf = appendRecord(buf, t, false)
	}
	// Still under our lock on the old inode: nobody adopts the new file
	// before we are done, and once we close it is free.
	return durable.ReplaceFile(q.path, buf, 0o600)
}

func (q *Queue) closeFile() {
	if q.f != nil {
		q.f.Close()
		q.f = nil
	}
}

func appendRecord(b []byte, t Task, done bool) []byte {
	op := byte(t.Op)
	if done {
		op |= doneBit
	}
	payload := make([]byte, 0, maxPayload)
	payload = append(payload, op)
	payload = append(payload, t.ID[:]...)
	payload = append(payload, t.Store...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(payload, castagnoli))
	return append(b, payload...)
}

// DecodeQueue replays a queue file: the tasks added and not done, sorted
// as Tasks sorts them. On damage (a bad magic, a record cut short or
// failing its CRC, an unknown op, a bad length) it returns the tasks
// replayed up to the damage and an error of Kind Corrupt.
func DecodeQueue(data []byte) ([]Task, error) {
	q := &Queue{tasks: map[Task]struct{}{}}
	if len(data) < len(queueMagic) || string(data[:len(queueMagic)]) != queueMagic {
		return nil, cairn.E("decode repair queue", cairn.Corrupt, "", errors.New("not a repair queue file (bad magic)"))
	}
	data = data[len(queueMagic):]
	off := len(queueMagic)
	for len(data) > 0 {
		bad := func(why string) ([]Task, error) {
			return q.sorted(), cairn.E("decode repair queue", cairn.Corrupt, "", fmt.Errorf("record at offset %d: %s", off, why))
		}
		if len(data) < 8 {
			return bad("cut short")
		}
		n := binary.LittleEndian.Uint32(data)
		sum := binary.LittleEndian.Uint32(data[4:])
		if n < minPayload || n > maxPayload {
			return bad(fmt.Sprintf("bad length %d", n))
		}
		if uint32(len(data)-8) < n {
			return bad("cut short")
		}
		p := data[8 : 8+n]
		if crc32.Checksum(p, castagnoli) != sum {
			return bad("CRC mismatch")
		}
		op := Op(p[0] &^ doneBit)
		if op != OpPut && op != OpDelete {
			return bad(fmt.Sprintf("unknown op %d", p[0]))
		}
		t := Task{Op: op, ID: cairn.ID(p[1 : 1+cairn.IDSize]), Store: string(p[1+cairn.IDSize:])}
		if p[0]&doneBit != 0 {
			delete(q.tasks, t)
		} else {
			q.tasks[t] = struct{}{}
		}
		data = data[8+n:]
		off += 8 + int(n)
	}
	return q.sorted(), nil
}
