package mount

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
)

// Mode says what a close waits for (SCFS §2.5 and DESIGN decision 4).
type Mode int

const (
	// Blocking: close returns once the new version is stored and current
	// in the metadata (durable in the stores; any later open anywhere
	// sees it).
	Blocking Mode = iota
	// NonBlocking: close returns once the writes are durable on local
	// disk and their commit is queued; the queue stores and commits them
	// in the background, in order, and survives a kill and a restart (the
	// next mount of the volume finishes it). The writer lock is held until
	// the commit is done. Other devices see the new version only then.
	NonBlocking
	// WriteBack: as NonBlocking, but a file's commit is queued at its last
	// writer's release, without fsync; and creates, mkdirs, symlinks and
	// attribute changes the mount can decide alone are answered at once
	// and written to the metadata in batches (writeback.go), both once the
	// mount is quiet (quiet.go). Other devices see each after its batch;
	// a killed mount loses the changes not yet written.
	WriteBack
)

// ParseMode reads "blocking", "non-blocking" or "write-back".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "blocking", "":
		return Blocking, nil
	case "non-blocking", "nonblocking":
		return NonBlocking, nil
	case "write-back", "writeback":
		return WriteBack, nil
	}
	return 0, cairn.E("mount", cairn.Invalid, s, errors.New("mode must be blocking, non-blocking or write-back"))
}

func (m Mode) String() string {
	switch m {
	case NonBlocking:
		return "non-blocking"
	case WriteBack:
		return "write-back"
	}
	return "blocking"
}

// queueRecord is one queued commit: a JSON record in the queue's journal
// (internal/journal) in the volume's cache directory (doc/format.md,
// "Mount cache"); before queue version 5, a JSON file queue/<seq>.json,
// moved into the journal at the next mount. The data it commits is the
// work copy named by Data.
type queueRecord struct {
	V   int    `json:"v"` // format version: queueVersion (1 is read too)
	Seq uint64 `json:"seq"`
	// The file, and where it was at its close: name Name in directory
	// Dir, whose own record is DirName in DirParent (the root: 0 and "").
	Ino       uint64 `json:"ino"`
	Name      string `json:"name"`
	Dir       uint64 `json:"dir"`
	DirParent uint64 `json:"dir_parent"`
	DirName   string `json:"dir_name"`
	Data      string `json:"data"` // file name in work/
	Size      int64  `json:"size"`
	Mtime     int64  `json:"mtime"` // unix ns
	Mode      uint32 `json:"mode"`
	UID       uint32 `json:"uid"`
	GID       uint32 `json:"gid"`
	Queued    int64  `json:"queued"` // unix ns
	// Path is the file's path in the volume at its close ("/dir/name"):
	// a commit finished by the next mount writes through the placement
	// policy in force there (fs.Attrs.Path), as a commit of the mount that
	// queued it does. Version 2; a version 1 record has none, and its
	// commit writes where the volume does.
	Path string `json:"path,omitempty"`
	// CRC32C is the CRC-32C (Castagnoli) of the data, set when neither
	// the data nor the record was fsynced at the close (write-back mode):
	// a commit finished by the next mount checks it, so that data a power
	// loss tore is kept in unsaved/ instead of committed. Version 3.
	CRC32C *uint32 `json:"crc32c,omitempty"`
	// Ctime is the file's change time as the mount showed it at the
	// close (unix ns): the commit records it, not its own time, so that
	// the ctime does not move when the commit lands. Version 4; without
	// it the commit records its own time.
	Ctime int64 `json:"ctime,omitempty"`
	// Fsync marks the record an fsync of a write-back file still open
	// appended (handle.Fsync): the mount that wrote it never commits it
	// and acks it once the file's close queued its commit; a next mount
	// (the writer was killed before that) commits the work copy as it
	// finds it (its whole size: the fsynced writes and any made after),
	// and only onto the same file at the recorded place. Version 5.
	Fsync bool `json:"fsync,omitempty"`
	// Alt lists the file's other names, made by link(2) on this mount
	// (node.Link) before or after the close: a commit finished by the
	// next mount lands at the first of Name in Dir and these places that
	// still holds the file (git writes an object to a temporary name,
	// links it to its final name and unlinks the temporary one). Version 5.
	Alt []queuePlace `json:"alt,omitempty"`
}

// queuePlace is one name of a file: name Name in directory Dir, whose
// own record is DirName in DirParent; Path as queueRecord's.
type queuePlace struct {
	Dir       uint64 `json:"dir"`
	DirParent uint64 `json:"dir_parent"`
	DirName   string `json:"dir_name"`
	Name      string `json:"name"`
	Path      string `json:"path,omitempty"`
}

// queueVersion is the version of the queue records this mount writes
// (5: in the journal); versions 1 to 4 (files queue/<seq>.json) are read
// too, and moved into the journal.
const queueVersion = 5

// QueueVersion is queueVersion, and CacheVersion the version of the mount
// cache's layout (doc/format.md, "Mount cache").
const (
	QueueVersion = queueVersion
	CacheVersion = 2
)

// dataCRC returns the CRC-32C of the first size bytes of f (the sum
// passthrough's summed computes).
func dataCRC(f *os.File, size int64) (uint32, error) {
	h := crc32.New(castagnoli)
	n, err := io.Copy(h, io.NewSectionReader(f, 0, size))
	if err == nil && n != size {
		err = io.ErrUnexpectedEOF
	}
	return h.Sum32(), err
}

type job struct {
	rec     queueRecord
	jseq    uint64 // the record's sequence number in the journal (0: none yet)
	payload []byte // the record as written at jseq
	n       *node  // nil for a commit queued before a restart
	// dropped: the file was removed on this mount (queue.drop); its
	// record is acked, its commit makes nothing.
	dropped bool
	c       *content // the copy whose file is the data (nil likewise)
}

// queue runs the queued commits of one mount, one at a time, in order,
// through the one drainer of journals (journal.Drainer.Serve): its job
// order is the drainer's Order, its delay, write-back's quiet period and
// the tests' hold are its Gate.
type queue struct {
	m     *Mount
	dir   string
	j     *journal.Journal
	delay time.Duration

	untrack func() // stops counting j in the metrics

	mu       sync.Mutex
	jobs     []*job
	prov     map[uint64]*job // by inode: the fsync records of files still open (queueRecord.Fsync)
	old      map[uint64]int  // inodes with commits queued before the restart
	seq      uint64
	stopping bool
	kick     chan struct{}
	stopc    chan struct{} // closed by stop
	done     chan struct{}
	// listed is the jobs of the drainer's current pass, by journal
	// sequence number (order); the drainer's goroutine's alone.
	listed map[uint64]*job
	// hold, for tests, keeps the commits queued while it is set
	// (HoldQueue).
	hold chan struct{}
}

const maxQueueBackoff = 30 * time.Second

// heldGate is how long a held queue's gate says to wait: the release
// kicks the drainer.
const heldGate = time.Hour

// queueAge bounds how long a commit queued in write-back mode waits for
// the mount to be quiet (quiet.go) before it is made anyway.
const queueAge = 5 * time.Second

// loadQueue opens the queue's journal in dir, moves into it the record
// files of queue versions 1 to 4 a previous mount left, and reads the
// commits not done. It returns the data files they name (work copies
// that are not leftovers).
func loadQueue(ctx context.Context, m *Mount, dir string, delay time.Duration) (*queue, map[string]bool, error) {
	q := &queue{m: m, dir: dir, delay: delay, old: map[uint64]int{}, prov: map[uint64]*job{}, kick: make(chan struct{}, 1), stopc: make(chan struct{}), done: make(chan struct{})}
	jn, err := journal.Open(ctx, dir, journal.Options{})
	if err != nil {
		return nil, nil, err
	}
	q.j = jn
	q.untrack = metrics.Default().TrackCommitQueue(jn.Len) // cairn_mount_commit_queue_length
	for _, d := range jn.Damage() {
		m.log.Error("the commit queue's journal is damaged: queued commits may be lost (their data, if any, is kept in unsaved/)", "err", d)
	}
	if err := q.migrate(ctx); err != nil {
		q.untrack()
		jn.Close()
		return nil, nil, err
	}
	// A record written again (a rename: queue.moved) whose old copy's
	// ack a crash lost is there twice: the later one counts.
	latest := map[uint64]*job{}
	var stale []uint64
	for _, r := range jn.Pending() {
		var rec queueRecord
		err := json.Unmarshal(r.Payload, &rec)
		if err == nil && (rec.V < 1 || rec.V > queueVersion) {
			err = fmt.Errorf("format version %d", rec.V)
		}
		if err != nil {
			// Left in the journal (never acked) for a newer cairn or a
			// person; its data, named by no readable record, goes to
			// unsaved/.
			m.log.Error("a queued commit cannot be read; its record is left in the journal", "journal", dir, "seq", r.Seq, "err", err)
			continue
		}
		if o := latest[rec.Seq]; o != nil {
			stale = append(stale, o.jseq)
		}
		latest[rec.Seq] = &job{rec: rec, jseq: r.Seq, payload: r.Payload}
	}
	jobs := make([]*job, 0, len(latest))
	closed := map[uint64]uint64{} // inode -> the seq of its last commit queued at a close
	for _, j := range latest {
		jobs = append(jobs, j)
		if !j.rec.Fsync {
			closed[j.rec.Ino] = max(closed[j.rec.Ino], j.rec.Seq)
		}
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].rec.Seq < jobs[b].rec.Seq })
	data := map[string]bool{}
	for _, j := range jobs {
		rec := &j.rec
		q.seq = max(q.seq, rec.Seq)
		p := q.dataPath(rec)
		if rec.Fsync && closed[rec.Ino] > rec.Seq {
			// The file's close queued its commit after the fsync: the
			// fsync's record was waiting for its ack.
			stale = append(stale, j.jseq)
			continue
		}
		fi, err := os.Stat(p)
		if err == nil && rec.Fsync {
			rec.Size = fi.Size() // the copy as the writer left it
		}
		if err != nil {
			// The commit was done and its copy kept in the cache, but
			// the record's ack did not reach the disk. A record written
			// without fsync (write-back) may instead have lost its data
			// with the machine's power: said, as it cannot be told apart.
			if rec.CRC32C != nil {
				m.log.Warn("a queued commit's data is gone: committed before a crash, or lost with the machine's power; its record is dropped", "seq", j.jseq, "ino", fmt.Sprintf("%016x", rec.Ino), "path", rec.Path)
			}
			stale = append(stale, j.jseq)
			continue
		}
		data[p] = true
		q.jobs = append(q.jobs, j)
		q.old[rec.Ino]++
	}
	if err := jn.Ack(ctx, stale...); err != nil {
		m.log.Warn("could not mark stale queue records done", "err", err)
	}
	if len(q.jobs) > 0 {
		m.log.Info("finishing commits queued before the last unmount", "count", len(q.jobs))
	}
	return q, data, nil
}

// migrate moves the record files of queue versions 1 to 4
// (queue/<seq>.json) into the journal, each as it was, fsyncs the journal,
// then removes them. A file that cannot be read stays where it is.
func (q *queue) migrate(ctx context.Context) error {
	names, err := filepath.Glob(filepath.Join(q.dir, "*.json"))
	if err != nil || len(names) == 0 {
		return err
	}
	sort.Strings(names)
	var moved []string
	for _, name := range names {
		var rec queueRecord
		b, err := os.ReadFile(name)
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err == nil && (rec.V < 1 || rec.V > 4) {
			err = fmt.Errorf("format version %d", rec.V)
		}
		if err != nil {
			q.m.log.Error("a queued commit of an older cairn cannot be read; it is left where it is", "record", name, "err", err)
			continue
		}
		if _, err := q.j.Append(ctx, b); err != nil {
			return err
		}
		moved = append(moved, name)
	}
	if err := q.j.Sync(ctx); err != nil {
		return err
	}
	for _, name := range moved {
		if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return cairn.E("queue migrate", cairn.IO, name, err)
		}
	}
	for _, tmp := range must(filepath.Glob(filepath.Join(q.dir, "*.json.tmp"))) {
		os.Remove(tmp) // a record a crash left half-written: never queued
	}
	if err := durable.SyncDir(q.dir); err != nil {
		return cairn.E("queue migrate", cairn.IO, q.dir, err)
	}
	q.m.log.Info("moved the queued commits of an older cairn into the queue's journal", "count", len(moved))
	return nil
}

func must[T any](v T, _ error) T { return v }

// queuedIn returns how many commits the queue in dir holds, without
// opening it (the mount using it may be running).
func queuedIn(dir string) int {
	recs, _ := journal.Read(dir)
	old, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	return len(recs) + len(old)
}

func (q *queue) dataPath(rec *queueRecord) string {
	return filepath.Join(q.m.cache.dir, "work", filepath.Base(rec.Data))
}

// write appends rec to the journal (one write) and, unless it has a
// CRC32C (write-back mode, where a close fsyncs nothing), fsyncs the
// journal; a record j had before (a rename writes it again) is acked
// after, and the drainer kicked (a pass that listed the old record gives
// the new one). It sets the record's new journal sequence number.
func (q *queue) write(ctx context.Context, j *job) error {
	b, _ := json.Marshal(&j.rec)
	seq, err := q.j.Append(ctx, b)
	if err == nil && j.rec.CRC32C == nil {
		err = q.j.Sync(ctx)
	}
	if err != nil {
		return cairn.E("queue commit", cairn.IO, q.dir, err)
	}
	if old := j.jseq; old != 0 {
		if err := q.j.Ack(ctx, old); err != nil {
			q.m.log.Warn("could not mark a queue record written again done", "seq", old, "err", err)
		}
		defer q.poke()
	}
	j.jseq, j.payload = seq, b
	return nil
}

// sync makes the queue's records durable (an fsync in write-back mode):
// the journal, and the data of the queued commits of inode ino (the
// copies a write-back close did not fsync).
func (q *queue) sync(ctx context.Context, ino uint64) error {
	q.mu.Lock()
	var paths []string
	for _, j := range q.jobs {
		if j.rec.Ino == ino && j.rec.CRC32C != nil {
			paths = append(paths, q.dataPath(&j.rec))
		}
	}
	q.mu.Unlock()
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // committed meanwhile
		}
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		if err != nil {
			return cairn.E("fsync", cairn.IO, p, err)
		}
	}
	if len(paths) > 0 {
		if err := durable.SyncDir(filepath.Join(q.m.cache.dir, "work")); err != nil {
			return cairn.E("fsync", cairn.IO, q.m.cache.dir, err)
		}
	}
	if err := q.j.Sync(ctx); err != nil {
		return cairn.E("fsync", cairn.IO, q.dir, err)
	}
	return nil
}

// add appends j's record to the journal, fsynced unless it has a CRC32C
// (write-back mode), and queues it.
func (q *queue) add(ctx context.Context, j *job) error {
	q.mu.Lock()
	q.seq++
	j.rec.Seq = q.seq
	if j.n != nil {
		j.n.firstQueued.CompareAndSwap(0, q.seq)
	}
	q.mu.Unlock()
	j.rec.V, j.rec.Queued = queueVersion, time.Now().UnixNano()
	// No rename of the file runs meanwhile (enqueue holds its placeMu):
	// the record has the file's place when it is listed for moved.
	if err := q.write(ctx, j); err != nil {
		return err
	}
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *queue) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// len returns how many commits are queued (the one running included).
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}

// stop makes run return once the queue is empty or a commit fails (what
// is left stays on disk for the next mount), and waits for it.
func (q *queue) stop() {
	q.mu.Lock()
	if !q.stopping {
		close(q.stopc)
	}
	q.stopping = true
	q.mu.Unlock()
	<-q.done
	// The acks of the commits done reach the disk; the records left are
	// the next mount's.
	if err := q.j.Sync(context.Background()); err != nil {
		q.m.log.Warn("could not fsync the commit queue's journal", "err", err)
	}
	q.untrack()
	q.j.Close()
}

// run commits the queued jobs in order until stop, through the one
// drainer (journal.Drainer.Serve): woken by add (poke), retrying while
// the stores or the metadata service are away (backoff 1 s to 30 s,
// without end: the mount cannot give its closes back), and at stop
// making the commits it can without waiting for their time.
func (q *queue) run(ctx context.Context) {
	defer close(q.done)
	d := &journal.Drainer{
		Apply:      q.apply,
		Retry:      func(err error) bool { return !permanent(err) },
		RetryFor:   journal.Forever,
		MinBackoff: time.Second,
		MaxBackoff: maxQueueBackoff,
		OnRetry: func(err error, wait time.Duration) {
			q.m.log.Warn("a queued commit failed; trying again", "retry_in", wait, "err", err)
		},
		Order: q.order,
		Gate:  q.gate,
	}
	if err := d.Serve(ctx, q.j, q.kick, q.stopc); err != nil && !errors.Is(err, context.Canceled) {
		q.m.log.Warn("unmounting with commits still queued: the next mount of the volume finishes them", "count", q.len(), "err", err)
	}
}

// order lists the records of the queued commits in the queue's order
// (the drainer's Order): a commit runs after those queued before it.
func (q *queue) order() []journal.Record {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.listed = make(map[uint64]*job, len(q.jobs))
	recs := make([]journal.Record, 0, len(q.jobs))
	for _, j := range q.jobs {
		if j.jseq != 0 {
			recs = append(recs, journal.Record{Seq: j.jseq, Payload: j.payload})
			q.listed[j.jseq] = j
		}
	}
	return recs
}

// listedJob returns the job of record seq of the current pass, nil if
// its record was written again since (its new one comes in the next
// pass) or it is done.
func (q *queue) listedJob(seq uint64) *job {
	j := q.listed[seq]
	if j == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if j.jseq != seq || !slices.Contains(q.jobs, j) {
		return nil
	}
	return j
}

// gate tells how long the commit of record r must still wait (the
// drainer's Gate): the queue's delay, write-back's quiet period
// (quiet.go), the tests' hold; nothing once the queue stops.
func (q *queue) gate(r journal.Record) time.Duration {
	j := q.listedJob(r.Seq)
	if j == nil {
		return 0 // Apply finds it gone
	}
	return q.wait(j)
}

func (q *queue) wait(j *job) time.Duration {
	q.mu.Lock()
	hold, stopping := q.hold, q.stopping
	q.mu.Unlock()
	if stopping {
		return 0
	}
	queued := time.Unix(0, j.rec.Queued)
	if w := time.Until(queued.Add(q.delay)); w > 0 {
		return w
	}
	// Write-back mode commits while the mount is quiet (quiet.go).
	if q.m.mode == WriteBack && j.n != nil {
		if w := q.m.quietFor(queued, queueAge); w > 0 {
			return w
		}
	}
	if hold != nil {
		return heldGate
	}
	return 0
}

// apply makes the commits of recs, in order (the drainer's Apply): each
// done or failed for good is finished (and its record acked); one to
// retry stops the pass with its error. A commit whose time has not come
// since the pass began (the mount got busy) ends the pass: the drainer
// asks the gate again.
func (q *queue) apply(ctx context.Context, recs []journal.Record, ack func(...uint64) error) error {
	for i, r := range recs {
		j := q.listedJob(r.Seq)
		if j == nil {
			return nil // written again: its new record comes next pass
		}
		if i > 0 && q.wait(j) > 0 {
			return nil
		}
		e, err := q.commit(ctx, j)
		if err != nil && !permanent(err) {
			return err
		}
		if aerr := q.finish(ctx, j, e, err, ack); aerr != nil {
			return aerr
		}
	}
	return nil
}

// permanent tells a commit that can never succeed (its directory or name
// is gone or taken by a directory, its data is gone) from one to retry.
func permanent(err error) bool {
	if errors.Is(err, errDropped) {
		return true
	}
	switch cairn.KindOf(err) {
	case cairn.NotFound, cairn.IsDir, cairn.NotDir, cairn.Exist, cairn.Invalid, cairn.Permission, cairn.Corrupt:
		return true
	}
	return false
}

// errDropped: the file was removed on this mount after its close; its
// queued writes go with it, as on a local disk.
var errDropped = errors.New("file removed before its queued commit")

func (q *queue) pathOf(j *job) string {
	if j.n != nil {
		return j.n.path("")
	}
	return fmt.Sprintf("%s:(directory %016x)/%s", q.m.vol.Name(), j.rec.Dir, j.rec.Name)
}

// commit stores and commits one job's data: the node's place and lock
// for a live job, the recorded place (and a new lock) for one queued
// before a restart, or for a live one whose node the kernel let go.
func (q *queue) commit(ctx context.Context, j *job) (*meta.Entry, error) {
	m, rec := q.m, &j.rec
	q.mu.Lock()
	dropped := j.dropped
	q.mu.Unlock()
	if dropped {
		return nil, errDropped
	}
	// The file's own entry, and its directories, may be pending
	// (write-back mode): written first.
	if err := m.wb.flush(ctx); err != nil {
		return nil, err
	}
	mtime := q.mtimeOf(j)
	var dir *meta.Entry
	var name string
	var attrs fs.Attrs
	var parent *node
	recorded := j.n == nil
	// tn is the file the commit goes to: j.n, or, if a file renamed over
	// it on this mount took its history, that file (node.heir).
	tn := j.n
	if j.n != nil {
		// From the place read to the compare-and-swap, no rename or
		// removal of the file on this mount runs (node.placeMu).
		tn.placeMu.Lock()
		for h := tn.heir.Load(); h != nil; h = tn.heir.Load() {
			// Replaced for good: nothing moves tn again.
			tn.placeMu.Unlock()
			if fq := h.firstQueued.Load(); fq != 0 && fq < rec.Seq {
				// The heir's content was queued first (this close's
				// release came late): this older content lands nowhere,
				// as when its file is removed.
				return nil, errDropped
			}
			tn = h
			tn.placeMu.Lock()
		}
		defer tn.placeMu.Unlock()
		var ok bool
		if name, parent, ok = tn.place(); !ok && (tn.removed.Load() || tn != j.n) {
			return nil, errDropped
		} else if !ok {
			// Not removed: the kernel let the node go (it evicted the
			// file from its caches). The file is where the close
			// recorded it, unless it moved since: checked below.
			recorded = true
		}
	}
	if !recorded {
		var errno syscall.Errno
		if dir, errno = parent.dirEntry(); errno != 0 {
			return nil, cairn.E("commit", cairn.NotFound, j.n.path(""), errno)
		}
		var err error
		if attrs, err = tn.commitAttrs(ctx, parent, name, mtime); err != nil {
			return nil, err
		}
		if tn != j.n {
			// Under the heir's writer lock, counted as a user of it.
			tn.holdLock()
			defer tn.unlockWrite(ctx)
		}
		if attrs.Lock, err = tn.commitLock(ctx, parent, name); err != nil {
			return nil, err
		}
		attrs.Path = volPath(parent, name)
	} else {
		dir = &meta.Entry{Ino: rec.Dir, Parent: rec.DirParent, Name: rec.DirName, Type: meta.TypeDir}
		name = rec.Name
		attrs = fs.Attrs{Mode: rec.Mode, UID: rec.UID, GID: rec.GID, Mtime: mtime}
		attrs.Path = rec.Path
		cur, err := m.ents.get(ctx, rec.Dir, rec.Name, true)
		if (err != nil || cur.Ino != rec.Ino) && len(rec.Alt) > 0 {
			// The file has other names (link(2)): the first that still
			// holds it, or none of them.
			for _, p := range rec.Alt {
				if c, aerr := m.ents.get(ctx, p.Dir, p.Name, true); aerr == nil && c.Ino == rec.Ino {
					dir = &meta.Entry{Ino: p.Dir, Parent: p.DirParent, Name: p.DirName, Type: meta.TypeDir}
					name, attrs.Path, cur, err = p.Name, p.Path, c, nil
					break
				}
			}
			if err != nil || cur.Ino != rec.Ino {
				return nil, cairn.E("commit", cairn.NotFound, q.pathOf(j), errors.New("the file is at none of the names it had at its close"))
			}
		}
		if err == nil {
			attrs.Mode, attrs.UID, attrs.GID = cur.Mode, cur.UID, cur.GID
		}
		if (j.n != nil || rec.Fsync) && (err != nil || cur.Ino != rec.Ino) {
			return nil, cairn.E("commit", cairn.NotFound, q.pathOf(j), errors.New("the file is no longer where it was closed, and this mount no longer knows where it went"))
		}
		var l *meta.Lock
		if j.n != nil {
			j.n.wl.mu.Lock()
			l = j.n.wl.lock
			j.n.wl.mu.Unlock()
		}
		if l == nil || l.Lost() {
			// The lock the queue held died with the process (or was
			// used up); wait for it longer than an open would.
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			l, err = m.vol.Meta.Lock(lctx, dir.Ino, name)
			cancel()
			if err != nil {
				return nil, err
			}
			defer l.Unlock(ctx) // a no-op once the commit released it
		}
		attrs.Lock = l
	}
	// A new file of write-back mode whose creation waits for this commit
	// (writeBack.claim) is made by it, under the inode number and with
	// the attributes the mount showed: no other device sees it before it
	// has its content.
	claimed, snap, isNew := m.wb.claim(dir.Ino, name, rec.Ino)
	if isNew {
		attrs.Ino, attrs.Cur = rec.Ino, nil
		attrs.Mode, attrs.UID, attrs.GID = snap.e.Mode, snap.e.UID, snap.e.GID
	}
	if j.c != nil {
		// The data is not copied out from under this commit (copyOut).
		j.c.qmu.Lock()
		defer j.c.qmu.Unlock()
	}
	f, err := os.Open(q.dataPath(rec))
	if err != nil {
		return nil, cairn.E("commit", cairn.NotFound, q.dataPath(rec), err)
	}
	defer f.Close()
	if j.n == nil && rec.CRC32C != nil {
		// Queued without fsync (write-back mode): what a power loss may
		// have torn is not committed.
		if sum, derr := dataCRC(f, rec.Size); derr != nil || sum != *rec.CRC32C {
			return nil, cairn.E("commit", cairn.Corrupt, q.dataPath(rec), fmt.Errorf("the data queued at a close does not match its checksum (lost with the machine's power?): %v", derr))
		}
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(io.NewSectionReader(f, 0, rec.Size)), nil }
	// A queued commit sets no attributes of its own (a chmod after the
	// close went to the entry): it leaves the entry's as they are then.
	attrs.KeepAttrs = true
	// The mtime of a utimes made after the close (queue.touched), read
	// after the claim: one made after this is made again on the record
	// written (writeBack.rebase, finishClaim).
	since := time.Now()
	attrs.Mtime = q.mtimeOf(j)
	if rec.Ctime != 0 {
		attrs.Ctime = time.Unix(0, rec.Ctime)
	}
	if isNew && snap.e.Ctime > attrs.Ctime.UnixNano() {
		attrs.Ctime = time.Unix(0, snap.e.Ctime) // changed since the close (a chmod)
	}
	e, _, err := m.vol.WriteFile(ctx, dir, name, open, attrs)
	if isNew && errors.Is(err, cairn.ErrExist) {
		// The name was made on another device meanwhile: this file is
		// kept under a name of its own (writeBack.renameAside), as a
		// pending create meeting one is.
		if nk, ok := m.wb.renameAside(ekey{dir.Ino, name}, claimed); ok {
			if attrs.Lock != nil {
				attrs.Lock.Unlock(ctx) // the old name's
				if j.n != nil {
					j.n.wl.mu.Lock()
					if j.n.wl.lock == attrs.Lock {
						j.n.wl.lock = nil
					}
					j.n.wl.mu.Unlock()
				}
			}
			name, attrs.Lock = nk.name, nil
			attrs.Path = attrs.Path[:strings.LastIndexByte(attrs.Path, '/')+1] + name
			e, _, err = m.vol.WriteFile(ctx, dir, name, open, attrs)
		} else {
			err = cairn.E("commit", cairn.Exist, q.pathOf(j), errors.New("the name was made on another device meanwhile, and no other name is free"))
		}
	}
	if err != nil {
		if tn != nil {
			tn.commitFailed()
		}
		return nil, err
	}
	if recorded && j.n != nil {
		j.n.wl.mu.Lock()
		if j.n.wl.lock == attrs.Lock {
			j.n.wl.lock = nil // used up by the commit
		}
		j.n.wl.mu.Unlock()
	}
	// The entry cache first, then the pending attribute changes made on
	// the record before e (rebase, finishClaim), then the node's record
	// (node.wrote, which stat prefers to an older record): a chmod
	// acknowledged meanwhile never reads back undone.
	m.ents.put(e)
	if isNew {
		var made *meta.Entry
		if e.Ino == rec.Ino {
			made = e // else the name was made on another device meanwhile: committed onto it
		}
		var mt *time.Time
		if j.n != nil {
			mt = tn.mtimeSince(since)
		}
		m.wb.finishClaim(ekey{dir.Ino, name}, claimed, snap.seq, made, mt)
	} else if j.n != nil && e.Ino == tn.ino {
		m.wb.rebase(tn, e, since)
	}
	if j.n != nil {
		if e.Ino == j.n.ino {
			// Before finish lets the copy go (node.wrote).
			j.n.wroteEntry(e)
		}
		tn.committed(ctx)
	}
	return e, nil
}

// mtimeOf returns the mtime job j commits (unix ns, as its record says;
// a utimes after its close changes it: touched).
func (q *queue) mtimeOf(j *job) time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	return time.Unix(0, j.rec.Mtime)
}

// touched gives the queued commits of inode ino queued by this mount the
// mtime t, set by a utimes after their close: the version committed has
// it, as the file here shows it (the copy's mtime). Their records are
// appended to the journal again (the old ones acked, as for a rename), so
// that the next mount commits it so too should this one be killed.
func (q *queue) touched(ino uint64, t time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.withProv() {
		if j.n == nil || j.rec.Ino != ino {
			continue
		}
		j.rec.Mtime = t.UnixNano()
		if err := q.write(context.Background(), j); err != nil {
			q.m.log.Warn("could not write a queued commit's record again with the mtime set after its close", "seq", j.jseq, "err", err)
		}
	}
}

// finish ends a job: done (its copy becomes the clean copy of the new
// version), dropped, or failed for good (its data kept in unsaved/). Its
// record is acked last, by ack (the drainer's: fsynced before it
// returns), whose error it returns.
func (q *queue) finish(ctx context.Context, j *job, e *meta.Entry, err error, ack func(...uint64) error) error {
	m, rec := q.m, &j.rec
	data := q.dataPath(rec)
	failed := err != nil && !errors.Is(err, errDropped)
	if err == nil || failed {
		m.countCommit(err)
	}
	switch {
	case err == nil:
		m.log.Debug("queued commit done", "path", q.pathOf(j), "queued_for", time.Since(time.Unix(0, rec.Queued)))
	case failed:
		m.log.Error("a queued commit cannot be done; its content is kept", "path", q.pathOf(j), "err", err)
	default:
		m.log.Info("a file removed after its close: its queued writes are dropped", "ino", fmt.Sprintf("%016x", rec.Ino))
	}
	var v *meta.Version
	if e != nil {
		v = e.Current()
	}
	if c, n := j.c, j.n; c != nil {
		c.wmu.Lock()
		m.cache.mu.Lock()
		still := c.path == data
		m.cache.mu.Unlock()
		c.mu.Lock()
		c.pending--
		if errors.Is(err, errDropped) {
			c.gone = true // descriptors still open keep reading what was written
		}
		// Still the copy's file: nothing was written since the close (a
		// write would have copied it first).
		still = still && c.frozen
		if still {
			c.frozen = false
			if v != nil {
				c.version, c.manifest = true, v.Manifest
			}
			if failed {
				c.dirty, c.keep = true, true // tried again at the next close
			}
		}
		c.mu.Unlock()
		if still && v != nil && e.Ino == c.ino {
			m.cache.adopt(c, cacheKey{c.ino, v.Manifest})
			n.remember(e)
		}
		c.wmu.Unlock()
		switch {
		case still:
		case failed:
			m.cache.keepUnsaved(data, rec.Ino)
		default:
			os.Remove(data)
		}
		// Closed meanwhile, its last commit done: its file goes (kept in
		// unsaved/ if it holds writes never committed).
		m.cache.settleClosed(c)
		n.forgetClosed(c)
		n.unlockWrite(ctx)
	} else {
		switch {
		case v != nil:
			m.cache.adoptFile(data, cacheKey{e.Ino, v.Manifest}, rec.Size)
		case failed:
			m.cache.keepUnsaved(data, rec.Ino)
		default:
			os.Remove(data)
		}
	}
	// Out of the queue first, so that no rename writes its record again
	// (withProv), then acked: a kill in between leaves a record whose
	// data is gone, dropped by the next mount.
	q.mu.Lock()
	if i := slices.Index(q.jobs, j); i >= 0 {
		q.jobs = slices.Delete(q.jobs, i, i+1)
	}
	if j.n == nil {
		if q.old[rec.Ino]--; q.old[rec.Ino] <= 0 {
			delete(q.old, rec.Ino)
		}
	}
	jseq := j.jseq
	q.mu.Unlock()
	if aerr := ack(jseq); aerr != nil {
		m.log.Warn("could not mark a done commit's record done (the next mount finds its data gone, or commits it again)", "seq", jseq, "err", aerr)
		return aerr
	}
	return nil
}

// renamed records that this mount gave file ino, in directory dir, the
// name name (write-back's conflict renames): the place its queued commits
// go to if the kernel lets its node go, or the next mount finishes them.
// The records are written again (as at their close: without fsync when
// they have a checksum; a record a crash leaves with the old name commits
// onto what holds that name then, as a record of a file replaced
// elsewhere does).
func (q *queue) renamed(ino, dir uint64, name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.withProv() {
		if j.rec.Ino != ino || j.rec.Dir != dir {
			continue
		}
		j.rec.Name = name
		j.rec.Path = j.rec.Path[:strings.LastIndexByte(j.rec.Path, '/')+1] + name
		if err := q.write(context.Background(), j); err != nil {
			q.m.log.Warn("could not write a queued commit's record again with the file's new name", "seq", j.jseq, "err", err)
		}
	}
}

// moved records that this mount renamed file ino to name in directory
// dir (whose place is path): the records of its queued commits are
// written again with the new place, so that the next mount, should this
// one be killed, commits them under the name the file has now and not
// under the one it was closed under (a temporary name that a program
// renamed over the real one, say). The records of the file replaced,
// replacedIno (0: none), are removed: its queued writes go with it, as
// on a local disk (this mount's own commit of them finds the file
// removed; after a kill, its data is a work copy no record names, kept
// in unsaved/ by the next mount).
func (q *queue) moved(ino uint64, dir *meta.Entry, name, path string, replacedIno uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.withProv() {
		switch {
		case j.rec.Ino == ino:
			j.rec.Name, j.rec.Path = name, path
			j.rec.Dir, j.rec.DirParent, j.rec.DirName = dir.Ino, dir.Parent, dir.Name
			// The new place is no longer an other name (moving).
			j.rec.Alt = slices.DeleteFunc(j.rec.Alt, func(a queuePlace) bool { return a.Dir == dir.Ino && a.Name == name })
			if err := q.write(context.Background(), j); err != nil {
				q.m.log.Warn("could not write a queued commit's record again with the file's new name", "seq", j.jseq, "path", path, "err", err)
			}
		case replacedIno != 0 && j.rec.Ino == replacedIno && j.n != nil:
			// Acked, not dropped: its commit still lands, as a version
			// of the file that took its place and history (node.heir).
			if err := q.j.Ack(context.Background(), j.jseq); err != nil {
				q.m.log.Warn("could not mark the queued commit's record of a file replaced by a rename done", "seq", j.jseq, "err", err)
			}
		}
	}
}

// drop records that this mount removed file ino (its last name, by
// unlink: a file replaced by a rename leaves its history, and the commits
// of this mount still to land in it, to the file that replaced it): its
// queued commits, this mount's and those a killed one left, are dropped
// and their records acked, as on a local disk, so that a next mount does
// not commit them again under the name (which would bring the file
// back). Unless linked is false (the metadata said the name was the
// file's last), a commit of a file with other names made here
// (queueRecord.Alt) is kept.
func (q *queue) drop(ino uint64, linked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.withProv() {
		if j.rec.Ino == ino && (!linked || len(j.rec.Alt) == 0) {
			q.dropJob(j)
		}
	}
}

// dropJob drops job j (q.mu held): acked, its commit a no-op.
func (q *queue) dropJob(j *job) {
	j.dropped = true
	if err := q.j.Ack(context.Background(), j.jseq); err != nil {
		q.m.log.Warn("could not mark the queued commit's record of a removed file done", "seq", j.jseq, "err", err)
	}
}

// moving, called before this mount renames file ino to place p (in
// etcd), writes the records of its queued commits again with p among
// their places (queueRecord.Alt), and acks the records of this mount's
// queued commits of replacedIno (0: none), the file the rename replaces,
// whose commits land in the renamed file's history (node.heir) or
// nowhere: a kill between the rename and moved, after it, leaves a next
// mount records that commit the renamed file where it is, and none that
// commits the replaced file's content onto it. It returns the jobs whose
// records it acked, for restore.
func (q *queue) moving(ino uint64, p queuePlace, replacedIno uint64) []*job {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var acked []*job
	for _, j := range q.withProv() {
		switch {
		case j.rec.Ino == ino:
			if j.rec.Dir == p.Dir && j.rec.Name == p.Name || slices.ContainsFunc(j.rec.Alt, func(a queuePlace) bool { return a.Dir == p.Dir && a.Name == p.Name }) {
				continue
			}
			j.rec.Alt = append(j.rec.Alt, p)
			if err := q.write(context.Background(), j); err != nil {
				q.m.log.Warn("could not write a queued commit's record again with the name it is being renamed to", "seq", j.jseq, "path", p.Path, "err", err)
			}
		case replacedIno != 0 && j.rec.Ino == replacedIno && j.n != nil && !j.dropped:
			if err := q.j.Ack(context.Background(), j.jseq); err != nil {
				q.m.log.Warn("could not mark the queued commit's record of a file being replaced done", "seq", j.jseq, "err", err)
				continue
			}
			acked = append(acked, j)
		}
	}
	return acked
}

// restore writes again the records moving acked, of the jobs still
// queued, unless the rename succeeded (ok) and replaced their file
// (replacedIno).
func (q *queue) restore(js []*job, ok bool, replacedIno uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range js {
		if ok && j.rec.Ino == replacedIno || j.dropped || !slices.Contains(q.jobs, j) {
			continue
		}
		if err := q.write(context.Background(), j); err != nil {
			q.m.log.Warn("could not write again the record of a queued commit of a file a failed rename would have replaced", "seq", j.jseq, "err", err)
		}
	}
}

// withProv returns the jobs and the fsync records (q.mu held).
func (q *queue) withProv() []*job {
	js := slices.Clone(q.jobs)
	for _, j := range q.prov {
		js = append(js, j)
	}
	return js
}

// fsynced appends, and fsyncs, an fsync record (queueRecord.Fsync) of a
// file still open in write-back mode, in place of the one it had.
func (q *queue) fsynced(ctx context.Context, j *job) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	j.rec.Seq, j.rec.V, j.rec.Queued, j.rec.Fsync = q.seq, queueVersion, time.Now().UnixNano(), true
	if old := q.prov[j.rec.Ino]; old != nil {
		j.jseq = old.jseq // acked by write once the new one is in
	}
	if err := q.write(ctx, j); err != nil {
		return err
	}
	q.prov[j.rec.Ino] = j
	if err := q.j.Sync(ctx); err != nil {
		return cairn.E("fsync", cairn.IO, q.dir, err)
	}
	return nil
}

// dropFsynced acks the fsync record of inode ino, if any: its close
// queued a commit, or the file is gone.
func (q *queue) dropFsynced(ctx context.Context, ino uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.prov[ino]
	if j == nil {
		return
	}
	delete(q.prov, ino)
	if err := q.j.Ack(ctx, j.jseq); err != nil {
		q.m.log.Warn("could not mark an fsync record done", "seq", j.jseq, "err", err)
	}
}

// has reports whether a commit of inode ino is queued.
func (q *queue) has(ino uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.jobs {
		if j.rec.Ino == ino {
			return true
		}
	}
	return false
}

// queuedBefore reports whether a commit of inode ino queued before the
// mount started is not done yet. Until it is, the mount shows the file's
// committed version and refuses to open it for writing (EBUSY): the
// queued commit takes the file's writer lock of its own, which a writer
// here would otherwise hold against it.
func (q *queue) queuedBefore(ino uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.old[ino] > 0
}

// enqueue makes c's writes durable on local disk and queues their commit
// (non-blocking and write-back modes). c's file becomes the queued data:
// the next write to c copies it first (prepareWrite). If the kernel may
// still write the file without the mount seeing it (passthrough: a
// writer's open, or a writable mapping: held.go), the queue gets a copy
// of it instead, made now.
func (n *node) enqueue(ctx context.Context, c *content) error {
	m := n.m
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	dirty, size, mtime, ctime, ptw := c.dirty, c.size, c.mtime, c.ctime, c.ptw
	unseen := ptw && (c.writers > 0 || c.held)
	c.mu.Unlock()
	if !dirty {
		return nil
	}
	// No rename of the file on this mount runs from here until its
	// record is queued: a rename rewrites the queued records (queue.moved).
	n.placeMu.Lock()
	defer n.placeMu.Unlock()
	name, parent, ok := n.place()
	if !ok {
		m.log.Info("a file removed while open was closed: its unsaved writes are dropped", "ino", n.ino)
		c.mu.Lock()
		c.dirty, c.gone = false, true // descriptors still open keep reading it
		c.mu.Unlock()
		m.queue.dropFsynced(ctx, n.ino)
		return nil
	}
	dir, errno := parent.dirEntry()
	if errno != 0 {
		return errno
	}
	f := c.file()
	m.cache.mu.Lock()
	data, named := c.path, c.named
	m.cache.mu.Unlock()
	if unseen {
		sf, sp, err := m.cache.copyFile(data, c.ino, size)
		if err != nil {
			return err
		}
		defer sf.Close()
		f, data, named = sf, sp, false
	}
	// Write-back mode makes nothing durable at a close, as a local disk
	// does not: the record carries the data's checksum instead. A copy
	// the kernel writes itself (passthrough) keeps the checksum of what
	// is queued, as a commit does (content.sum): a writable mapping's
	// release (held.go) then commits it again only if it changed since.
	var crc *uint32
	var sum uint32
	if m.mode == WriteBack || ptw {
		var err error
		if sum, err = dataCRC(f, size); err != nil {
			return cairn.E("close", cairn.IO, n.path(""), err)
		}
	}
	if m.mode == WriteBack {
		crc = &sum
	} else if err := f.Sync(); err != nil {
		return cairn.E("close", cairn.IO, n.path(""), err)
	}
	if !strings.HasPrefix(data, filepath.Join(m.cache.dir, "work")+"/") {
		return cairn.E("close", cairn.IO, data, errors.New("a written copy outside work/ (bug)"))
	}
	if !named && crc == nil {
		if err := durable.SyncDir(filepath.Dir(data)); err != nil {
			return cairn.E("close", cairn.IO, data, err)
		}
		if !unseen {
			m.cache.mu.Lock()
			c.named = c.path == data
			m.cache.mu.Unlock()
		}
	}
	n.mu.Lock()
	last := n.last
	n.mu.Unlock()
	j := &job{n: n, c: c, rec: queueRecord{Ino: n.ino, Name: name, Dir: dir.Ino, DirParent: dir.Parent, DirName: dir.Name,
		Path: volPath(parent, name), Data: filepath.Base(data), Size: size, Mtime: mtime.UnixNano(), Mode: last.Mode, UID: last.UID, GID: last.GID,
		CRC32C: crc, Ctime: later(ctime, time.Unix(0, last.Ctime)).UnixNano(), Alt: n.linkPlaces()}}
	n.holdLock()
	c.mu.Lock()
	c.frozen = c.frozen || !unseen
	c.dirty, c.truncOnly = false, false
	c.pending++
	sumWas, sumOKWas := c.sum, c.sumOK
	if ptw {
		c.sum, c.sumOK = sum, true
	}
	c.mu.Unlock()
	if err := m.queue.add(ctx, j); err != nil {
		c.mu.Lock()
		c.frozen, c.dirty = false, true
		c.pending--
		c.sum, c.sumOK = sumWas, sumOKWas
		c.mu.Unlock()
		n.unlockWrite(ctx)
		if unseen {
			os.Remove(data)
		}
		return err
	}
	m.queue.dropFsynced(ctx, n.ino)
	return nil
}

// fsyncRecord, in write-back mode, gives the writes of file n made since
// its last queued close, fsynced in c's copy, a record in the queue's
// journal (queueRecord.Fsync), fsynced: a kill of the mount before the
// file's close queues its commit leaves the next mount that record to
// commit, instead of an entry the fsync made empty and the writes in
// unsaved/. c.wmu is held.
func (n *node) fsyncRecord(ctx context.Context, c *content) error {
	m := n.m
	c.mu.Lock()
	ptw := c.ptw
	c.mu.Unlock()
	if ptw {
		// What the kernel wrote to the copy itself (passthrough) counts.
		if err := m.harvest(c); err != nil {
			return err
		}
	}
	c.mu.Lock()
	dirty, mtime, ctime := c.dirty, c.mtime, c.ctime
	c.mu.Unlock()
	if !dirty {
		return nil
	}
	n.placeMu.Lock()
	defer n.placeMu.Unlock()
	name, parent, ok := n.place()
	if !ok {
		return nil
	}
	dir, errno := parent.dirEntry()
	if errno != 0 {
		return nil // the file's directory is not in the metadata: nothing to commit onto
	}
	m.cache.mu.Lock()
	data := c.path
	m.cache.mu.Unlock()
	if !strings.HasPrefix(data, filepath.Join(m.cache.dir, "work")+"/") {
		return nil
	}
	n.mu.Lock()
	last := n.last
	n.mu.Unlock()
	return m.queue.fsynced(ctx, &job{rec: queueRecord{Ino: n.ino, Name: name, Dir: dir.Ino, DirParent: dir.Parent, DirName: dir.Name,
		Path: volPath(parent, name), Data: filepath.Base(data), Mtime: mtime.UnixNano(), Mode: last.Mode, UID: last.UID, GID: last.GID,
		Ctime: later(ctime, time.Unix(0, last.Ctime)).UnixNano(), Alt: n.linkPlaces()}})
}

// linked adds place p, a new name of inode ino made by link(2), to the
// records of its queued commits and fsync records (written again).
func (q *queue) linked(ino uint64, p queuePlace) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, j := range q.withProv() {
		if j.rec.Ino != ino {
			continue
		}
		j.rec.Alt = append(j.rec.Alt, p)
		if err := q.write(context.Background(), j); err != nil {
			q.m.log.Warn("could not write a queued commit's record again with the file's new name", "seq", j.jseq, "path", p.Path, "err", err)
		}
	}
}

// copyOut, with c.wmu held, gives the queued commits whose data is c's
// file (c is frozen) a copy of it under the name they know, so that the
// file itself may be written: where the kernel writes copies itself
// (passthrough), the file may be the kernel's backing file of the inode,
// which it cannot be given another of while any open of the file lasts.
// A commit reading the data meanwhile is waited for (qmu); one that ends
// meanwhile leaves nothing to copy.
func (m *Mount) copyOut(c *content) error {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	c.mu.Lock()
	frozen := c.frozen
	c.mu.Unlock()
	if !frozen {
		return nil
	}
	if err := m.cache.copyOut(c); err != nil {
		return err
	}
	c.mu.Lock()
	c.frozen = false
	c.mu.Unlock()
	return nil
}
