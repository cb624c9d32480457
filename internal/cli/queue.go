package cli

// The upload queue: `put --background` stages files in a spool on this
// device and returns; a drainer uploads and commits them. The format and
// the rules that keep it safe (crashes, gc) are in doc/format.md, "Upload
// queue".

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/vpath"
)

// queueFormat is the version of the queue's records (doc/format.md):
// 2 keeps them in a journal (internal/journal), one per put directory;
// 1 kept them in files.jsonl and done.jsonl (migrated at the first drain,
// legacyQueueFormat).
const queueFormat = 2

// legacyQueueFormat is the format of files.jsonl records, read only to
// migrate them (migrateLegacy).
const legacyQueueFormat = 1

// QueueFormat is queueFormat, for the test that doc/format.md says it.
const QueueFormat = queueFormat

// EnvNoAutoDrain, when "1", stops cairn from starting a background
// drainer after put --background or any other command: the queue is then
// drained only by 'cairn queue run'.
const EnvNoAutoDrain = "CAIRN_NO_AUTODRAIN"

// queueRecord is one staged file: the payload of a record of its put's
// journal (JSON, with format 2), or one JSON line of a put's files.jsonl
// (format 1, before the journal).
type queueRecord struct {
	Format  int          `json:"format"`
	Seq     int          `json:"seq"`     // unique within the put, from 0
	Volume  string       `json:"volume"`  // volume name
	Path    string       `json:"path"`    // "/dir/name" in the volume
	Mode    uint32       `json:"mode"`    // permission bits
	UID     uint32       `json:"uid"`     // owner
	GID     uint32       `json:"gid"`     // group
	Version meta.Version `json:"version"` // manifest, size, mtime, chunks, source, digest
	Base    uint64       `json:"base"`    // the file's current version number when queued (0: none)
	Queued  int64        `json:"queued"`  // unix ns

	jseq uint64 // its sequence number in the put's journal (0: a legacy record)
}

// encodeQueueRecord is a journal record's payload for rec.
func encodeQueueRecord(rec queueRecord) ([]byte, error) {
	rec.Format = queueFormat
	return json.Marshal(rec)
}

// decodeQueueRecord reads a journal record's payload. A record of
// another format is an error of Kind Invalid naming it (the drainer then
// leaves the put alone).
func decodeQueueRecord(b []byte) (queueRecord, error) {
	var rec queueRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, cairn.E("queue", cairn.Invalid, "", fmt.Errorf("a queue record that cannot be read: %v", err))
	}
	if rec.Format != queueFormat {
		return rec, cairn.E("queue", cairn.Invalid, "", fmt.Errorf("queue record format %d; this cairn reads %d", rec.Format, queueFormat))
	}
	if rec.Volume == "" || !strings.HasPrefix(rec.Path, "/") || rec.Seq < 0 {
		return rec, cairn.E("queue", cairn.Invalid, "", fmt.Errorf("a queue record without a volume or path (%q, %q)", rec.Volume, rec.Path))
	}
	return rec, nil
}

// doneRecord marks a record committed: one JSON line of a legacy put's
// done.jsonl (format 1).
type doneRecord struct {
	Seq     int  `json:"seq"`
	Dropped bool `json:"dropped,omitempty"` // by 'queue drop', not committed
}

// putJournal is where a put directory keeps its records.
func putJournal(dir string) string { return filepath.Join(dir, "journal") }

func queueDir(home string) string { return filepath.Join(home, "queue") }

// flockFile and lockedByOther are the journal's locks.
var (
	flockFile     = journal.Lock
	lockedByOther = journal.LockedByOther
)

// spool is one put --background's queue directory while it stages.
type spool struct {
	dir   string
	lock  *os.File
	store *localstore.Store
	vol   *fs.Volume
	mu    sync.Mutex
	recs  *journal.Journal
	seq   int
}

// newSpool creates the queue directory of a put to volume and takes its
// lock (held until close: a drainer leaves the put alone until then).
func (e *env) newSpool(ctx context.Context, volume string) (*spool, error) {
	r, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	q := queueDir(e.home)
	if err = os.MkdirAll(q, 0o700); err != nil {
		return nil, cairn.E("put", cairn.IO, q, err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := fmt.Sprintf("%s-%d-%s", time.Now().UTC().Format("20060102T150405.000000000"), os.Getpid(), hex.EncodeToString(rnd[:]))
	// Made under a name drainers skip, locked, then renamed: a drainer
	// never finds it before its lock is held.
	tmp := filepath.Join(q, ".new-"+name)
	sp := &spool{dir: tmp}
	if err = os.Mkdir(tmp, 0o700); err != nil {
		return nil, cairn.E("put", cairn.IO, tmp, err)
	}
	fail := func(err error) (*spool, error) {
		sp.close(context.WithoutCancel(ctx))
		os.RemoveAll(sp.dir)
		return nil, err
	}
	lock, ok, err := flockFile(filepath.Join(tmp, "lock"))
	if err != nil || !ok {
		return fail(cmp(err, errors.New("queue directory locked")))
	}
	sp.lock = lock
	if err = os.Rename(tmp, filepath.Join(q, name)); err != nil {
		return fail(cairn.E("put", cairn.IO, tmp, err))
	}
	sp.dir = filepath.Join(q, name)
	if sp.store, err = localstore.Open(ctx, filepath.Join(sp.dir, "store"), localstore.Options{Logger: e.log, TrustIDs: true}); err != nil {
		return fail(err)
	}
	if sp.vol, err = r.SpoolVolume(ctx, volume, sp.store); err != nil {
		return fail(err)
	}
	if sp.recs, err = journal.Open(ctx, putJournal(sp.dir), journal.Options{}); err != nil {
		return fail(err)
	}
	// The directory entries must survive a crash too.
	if err := durable.SyncDir(q); err != nil {
		return fail(cairn.E("put", cairn.IO, q, err))
	}
	return sp, nil
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// add appends a staged file's record. Its objects are durable already
// (the local store's Put returns after fsync); the record is made durable
// by close, before the put returns.
func (sp *spool) add(ctx context.Context, rec queueRecord) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	rec.Seq = sp.seq
	b, err := encodeQueueRecord(rec)
	if err != nil {
		return err
	}
	if _, err := sp.recs.Append(ctx, b); err != nil {
		return err
	}
	sp.seq++
	return nil
}

// close makes the records durable and releases the lock; a spool with no
// record is removed. It returns how many files it queued.
func (sp *spool) close(ctx context.Context) (int, error) {
	var first error
	if sp.recs != nil {
		if err := sp.recs.Sync(ctx); err != nil {
			first = err
		}
		sp.recs.Close()
		if err := durable.SyncDir(sp.dir); err != nil && first == nil { // the journal's entry
			first = cairn.E("put", cairn.IO, sp.dir, err)
		}
	}
	if sp.vol != nil {
		sp.vol.Close()
	}
	if sp.store != nil {
		if err := sp.store.Close(); err != nil && first == nil {
			first = err
		}
	}
	if sp.seq == 0 {
		os.RemoveAll(sp.dir)
	}
	if sp.lock != nil {
		sp.lock.Close()
	}
	return sp.seq, first
}

// stageFile is putFile for put --background: the file is stored in the
// spool and queued, not committed.
func (st *putState) stageFile(ctx context.Context, j putJob, open func() (io.ReadCloser, error), a fs.Attrs) error {
	var base uint64
	if kids, err := st.children(ctx, j.dir); err == nil {
		if old, ok := kids[j.name]; ok && old.Type == meta.TypeFile {
			if cur := old.Current(); cur != nil {
				base = cur.N
			}
		}
	}
	ver, ws, err := st.spool.vol.Stage(ctx, open, a)
	if err == nil {
		err = st.spool.add(ctx, queueRecord{Volume: st.v.Name(), Path: strings.TrimPrefix(j.dst, st.volPre),
			Mode: a.Mode, UID: a.UID, GID: a.GID, Version: ver, Base: base, Queued: time.Now().UnixNano()})
	}
	return st.settle(ctx, j.dst, ws, err)
}

// queuedPut is one put's queue directory as a drainer or ls reads it.
type queuedPut struct {
	name    string
	dir     string
	recs    []queueRecord
	done    map[int]bool
	pending []queueRecord
}

// readQueuedPut reads a put's pending records, from its journal, or from
// files.jsonl and done.jsonl if it was queued by a cairn before the
// journal and not migrated yet (the journal wins once it exists: a
// migration renames it into place before it removes the old files). It
// changes nothing: a put or a drainer may hold the directory.
func readQueuedPut(dir string) (*queuedPut, error) {
	jd := putJournal(dir)
	if _, err := os.Stat(jd); err == nil {
		recs, err := journal.Read(jd)
		if err != nil {
			return nil, err
		}
		qp := &queuedPut{name: filepath.Base(dir), dir: dir, done: map[int]bool{}}
		for _, r := range recs {
			rec, err := decodeQueueRecord(r.Payload)
			if err != nil {
				return nil, cairn.E("queue", cairn.Invalid, dir, err)
			}
			rec.jseq = r.Seq
			qp.recs = append(qp.recs, rec)
			qp.pending = append(qp.pending, rec)
		}
		return qp, nil
	}
	return readLegacyPut(dir)
}

// readLegacyPut reads a put directory of format 1 (files.jsonl,
// done.jsonl). A torn last line (a put killed while appending) is
// ignored: that file's put never returned.
func readLegacyPut(dir string) (*queuedPut, error) {
	qp := &queuedPut{name: filepath.Base(dir), dir: dir, done: map[int]bool{}}
	b, err := os.ReadFile(filepath.Join(dir, "files.jsonl"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, cairn.E("queue", cairn.IO, dir, err)
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		var rec queueRecord
		if len(line) == 0 || json.Unmarshal(line, &rec) != nil {
			continue
		}
		if rec.Format != legacyQueueFormat {
			return nil, cairn.E("queue", cairn.Invalid, dir, fmt.Errorf("queue record format %d in files.jsonl; this cairn reads %d there", rec.Format, legacyQueueFormat))
		}
		qp.recs = append(qp.recs, rec)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "done.jsonl")); err == nil {
		for _, line := range bytes.Split(b, []byte("\n")) {
			var d doneRecord
			if len(line) > 0 && json.Unmarshal(line, &d) == nil {
				qp.done[d.Seq] = true
			}
		}
	}
	for _, rec := range qp.recs {
		if !qp.done[rec.Seq] {
			qp.pending = append(qp.pending, rec)
		}
	}
	return qp, nil
}

// migrateLegacy moves the pending records of a format 1 put directory
// (files.jsonl, done.jsonl) into its journal; the caller holds the put's
// lock. The journal is written beside (journal.new), fsynced, and renamed
// into place, the directory fsynced; only then are the old files removed.
// A kill at any point leaves either the old files alone (the next drain
// migrates again from scratch) or the journal in place (which wins; the
// old files are removed then): nothing is lost or queued twice.
func migrateLegacy(ctx context.Context, dir string) error {
	old := []string{filepath.Join(dir, "files.jsonl"), filepath.Join(dir, "done.jsonl")}
	if _, err := os.Stat(old[0]); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	jd := putJournal(dir)
	if _, serr := os.Stat(jd); serr != nil {
		qp, err := readLegacyPut(dir)
		if err != nil {
			return err
		}
		tmp := jd + ".new"
		if err = os.RemoveAll(tmp); err != nil {
			return cairn.E("queue migrate", cairn.IO, tmp, err)
		}
		j, err := journal.Open(ctx, tmp, journal.Options{})
		if err != nil {
			return err
		}
		for _, rec := range qp.pending {
			var b []byte
			b, err = encodeQueueRecord(rec)
			if err == nil {
				_, err = j.Append(ctx, b)
			}
			if err != nil {
				j.Close()
				return err
			}
		}
		err = j.Sync(ctx)
		j.Close()
		if err != nil {
			return err
		}
		if err := os.Rename(tmp, jd); err != nil {
			return cairn.E("queue migrate", cairn.IO, tmp, err)
		}
		if err := durable.SyncDir(dir); err != nil {
			return cairn.E("queue migrate", cairn.IO, dir, err)
		}
	}
	for _, p := range old {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return cairn.E("queue migrate", cairn.IO, p, err)
		}
	}
	return durable.SyncDir(dir)
}

// queuedPuts lists the put directories of the queue, oldest first.
func queuedPuts(home string) ([]string, error) {
	q := queueDir(home)
	ents, err := os.ReadDir(q)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cairn.E("queue", cairn.IO, q, err)
	}
	var out []string
	for _, de := range ents {
		if de.IsDir() && !strings.HasPrefix(de.Name(), ".") {
			out = append(out, filepath.Join(q, de.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// removeQueuedPut removes a drained put's directory: renamed first, so a
// crash never leaves a half-removed directory that reads as a queue.
func removeQueuedPut(dir string) error {
	gone := filepath.Join(filepath.Dir(dir), ".gone-"+filepath.Base(dir))
	if err := os.Rename(dir, gone); err != nil {
		return cairn.E("queue", cairn.IO, dir, err)
	}
	_ = durable.SyncDir(filepath.Dir(dir))
	return os.RemoveAll(gone)
}

// QueueItem is one file waiting in the upload queue (queue ls --json).
type QueueItem struct {
	Put    string    `json:"put"`  // the put's queue directory
	Seq    int       `json:"seq"`  // the file's number in it
	Path   string    `json:"path"` // VOLUME:/path
	Size   int64     `json:"size"`
	Queued time.Time `json:"queued"`
	// Busy: a put is still queueing into this directory or a drainer is
	// uploading it.
	Busy bool `json:"busy"`
}

// QueueList is what `queue ls --json` prints.
type QueueList struct {
	Files    int         `json:"files"`
	Bytes    int64       `json:"bytes"`
	Draining bool        `json:"draining"`              // a drainer runs now
	PID      int         `json:"drainer_pid,omitempty"` // its process ID
	Pending  []QueueItem `json:"pending"`
}

func (e *env) queueList() (*QueueList, error) {
	dirs, err := queuedPuts(e.home)
	if err != nil {
		return nil, err
	}
	dl := filepath.Join(queueDir(e.home), "drain.lock")
	ql := &QueueList{Pending: []QueueItem{}, Draining: lockedByOther(dl)}
	if b, err := os.ReadFile(dl); err == nil && ql.Draining {
		fmt.Sscanf(string(b), "pid %d", &ql.PID)
	}
	for _, d := range dirs {
		qp, err := readQueuedPut(d)
		if err != nil {
			return nil, err
		}
		busy := lockedByOther(filepath.Join(d, "lock"))
		for _, rec := range qp.pending {
			ql.Pending = append(ql.Pending, QueueItem{Put: qp.name, Seq: rec.Seq, Path: rec.Volume + ":" + rec.Path,
				Size: rec.Version.Size, Queued: time.Unix(0, rec.Queued), Busy: busy})
			ql.Files++
			ql.Bytes += rec.Version.Size
		}
	}
	return ql, nil
}

// DrainSummary is what `queue run --json` prints.
type DrainSummary struct {
	Committed     int64    `json:"committed"`      // files committed now
	Already       int64    `json:"already"`        // files found committed (by a drainer that died after committing)
	Failed        int64    `json:"failed"`         // files left in the queue with an error
	Uploaded      int64    `json:"uploaded"`       // objects sent to the stores
	UploadedBytes int64    `json:"uploaded_bytes"` // their bytes
	Present       int64    `json:"present"`        // objects the stores held already
	Busy          int      `json:"busy"`           // put directories left alone (a put still queueing into them)
	Seconds       float64  `json:"seconds"`
	Errors        []string `json:"errors,omitempty"`
}

// drainBatch bounds the files (and their bytes) one CommitStaged gets.
const (
	drainBatchFiles = 256
	drainBatchBytes = 64 << 20
)

// drain uploads and commits every queued file it can. With wait it waits
// for another drainer to finish first; without, it returns at once
// (ran false) if one runs.
//
// retryFor > 0 makes each put's drain retry, with backoff, for that long
// while a store or the metadata service is unreachable (the background
// drainer); 0 stops at the first such error (queue run).
func (e *env) drain(ctx context.Context, wait bool, prog *progress, retryFor time.Duration) (sum *DrainSummary, ran bool, err error) {
	start := time.Now()
	sum = &DrainSummary{}
	q := queueDir(e.home)
	lock, ok, err := lockDrain(ctx, q, wait, prog)
	if err != nil || !ok {
		return sum, false, err
	}
	defer lock.Close()
	defer func() { sum.Seconds = time.Since(start).Seconds() }()
	// Leftovers of a drainer killed while removing a drained put, or of a
	// put killed before its directory got its name.
	if ents, err := os.ReadDir(q); err == nil {
		for _, de := range ents {
			n := de.Name()
			stale := false
			if strings.HasPrefix(n, ".new-") {
				// Not while its put may be about to lock it.
				info, err := de.Info()
				stale = err == nil && time.Since(info.ModTime()) > time.Hour && !lockedByOther(filepath.Join(q, n, "lock"))
			}
			if strings.HasPrefix(n, ".gone-") || stale {
				_ = os.RemoveAll(filepath.Join(q, n))
			}
		}
	}
	// Passes until one finds nothing more to do: a put may queue more
	// while this one drains.
	tried := map[string]bool{}
	deadline := time.Now().Add(retryFor)
	for {
		dirs, err := queuedPuts(e.home)
		if err != nil {
			return sum, true, err
		}
		progressed := false
		sum.Busy = 0
		for _, d := range dirs {
			if tried[d] {
				continue
			}
			err = e.drainPut(ctx, d, sum, prog, time.Until(deadline))
			if errors.Is(err, journal.ErrBusy) {
				sum.Busy++
				continue
			}
			if errors.Is(err, os.ErrNotExist) {
				if _, serr := os.Stat(d); errors.Is(serr, os.ErrNotExist) {
					continue // a put that queued nothing removed it
				}
			}
			tried[d] = true
			progressed = true
			if cairn.KindOf(err) == cairn.Invalid {
				// A record this cairn cannot read: leave the put alone.
				msg := fmt.Sprintf("%s: %v", d, err)
				sum.Failed++
				sum.Errors = append(sum.Errors, msg)
				prog.println("cairn: " + msg)
				continue
			}
			if err != nil {
				return sum, true, err
			}
		}
		if !progressed {
			return sum, true, nil
		}
	}
}

// lockDrain takes the queue's drain lock, waiting (with a message) for
// the drainer that holds it if wait, else returning ok false at once.
// The holder's pid is written in the lock file.
func lockDrain(ctx context.Context, q string, wait bool, prog *progress) (lock *os.File, ok bool, err error) {
	if err = os.MkdirAll(q, 0o700); err != nil {
		return nil, false, cairn.E("queue", cairn.IO, q, err)
	}
	lock, ok, err = flockFile(filepath.Join(q, "drain.lock"))
	if err == nil && !ok && wait {
		pid := 0
		if b, rerr := os.ReadFile(filepath.Join(q, "drain.lock")); rerr == nil {
			fmt.Sscanf(string(b), "pid %d", &pid)
		}
		prog.println(fmt.Sprintf("cairn: waiting for the drainer running (pid %d) to finish", pid))
		// Polled, so that an interrupt still ends the wait.
		for err == nil && !ok {
			select {
			case <-ctx.Done():
				return nil, false, cairn.E("queue", cairn.Canceled, "", ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
			lock, ok, err = flockFile(filepath.Join(q, "drain.lock"))
		}
	}
	if err != nil || !ok {
		return nil, false, err
	}
	if lock.Truncate(0) == nil {
		fmt.Fprintf(lock, "pid %d\n", os.Getpid())
	}
	return lock, true, nil
}

// drainPut drains one put's directory with the journal's drainer, under
// the put's lock (an error wrapping journal.ErrBusy if a put still
// queues into it or another process drains it). A put directory of
// format 1 is migrated into a journal first. retryFor > 0: retry while
// a store or the metadata service is unreachable (drain).
func (e *env) drainPut(ctx context.Context, dir string, sum *DrainSummary, prog *progress, retryFor time.Duration) error {
	var src *localstore.Store
	defer func() {
		if src != nil {
			src.Close()
		}
	}()
	var left atomic.Int64 // records of this put not yet acked: cairn_upload_queue_length
	defer metrics.Default().TrackUploadQueue(func() int { return int(left.Load()) })()
	d := &journal.Drainer{
		Apply: func(ctx context.Context, jrecs []journal.Record, ack0 func(...uint64) error) error {
			left.Store(int64(len(jrecs)))
			ack := func(seqs ...uint64) error {
				err := ack0(seqs...)
				if err == nil {
					left.Add(-int64(len(seqs)))
				}
				return err
			}
			var pending []queueRecord
			for _, r := range jrecs {
				rec, err := decodeQueueRecord(r.Payload)
				if err != nil {
					return cairn.E("queue", cairn.Invalid, dir, err)
				}
				rec.jseq = r.Seq
				pending = append(pending, rec)
			}
			if src == nil {
				var err error
				if src, err = localstore.Open(ctx, filepath.Join(dir, "store"), localstore.Options{Logger: e.log}); err != nil {
					return err
				}
			}
			return e.drainRecords(ctx, pending, src, ack, sum, prog)
		},
	}
	if retryFor > 0 {
		d.RetryFor = retryFor
		d.Retry = func(err error) bool { return cairn.KindOf(err) == cairn.Unavailable }
		d.OnRetry = func(err error, wait time.Duration) {
			fmt.Fprintf(e.stderr, "%s cairn drainer[%d]: %v; retrying in %v\n", time.Now().Format(time.RFC3339), os.Getpid(), err, wait)
		}
	}
	return d.DrainDir(ctx, putJournal(dir), filepath.Join(dir, "lock"), journal.Options{}, journal.DirHooks{
		Before: func() error { return migrateLegacy(ctx, dir) },
		Damage: func(errs []error) {
			// Records lost to damage (not to a crash): said once, by
			// the drain that found it; the damaged segment is kept as
			// *.corrupt.
			for _, err := range errs {
				sum.Failed++
				sum.Errors = append(sum.Errors, err.Error())
				prog.println("cairn: " + err.Error())
			}
		},
		After: func(left int) error {
			if left > 0 {
				return nil
			}
			return removeQueuedPut(dir)
		},
	})
}

// drainRecords commits a put's pending records, per volume and policy,
// in batches, acking each batch's committed records.
func (e *env) drainRecords(ctx context.Context, pending []queueRecord, src *localstore.Store, ack func(...uint64) error, sum *DrainSummary, prog *progress) error {
	r, err := e.open(ctx)
	if err != nil {
		return err
	}
	// Per volume, per policy handle, in batches.
	byVol := map[string][]queueRecord{}
	var vols []string
	for _, rec := range pending {
		if _, ok := byVol[rec.Volume]; !ok {
			vols = append(vols, rec.Volume)
		}
		byVol[rec.Volume] = append(byVol[rec.Volume], rec)
	}
	for _, name := range vols {
		v, err := r.Volume(ctx, name)
		if err != nil {
			return err
		}
		volFor, err := e.policyVolumes(ctx, v, vpath.Path{Volume: name})
		if err != nil {
			return err
		}
		dirs := map[string]*meta.Entry{}
		byHandle := map[*fs.Volume][]queueRecord{}
		var handles []*fs.Volume
		for _, rec := range byVol[name] {
			h := volFor(rec.Path)
			if _, ok := byHandle[h]; !ok {
				handles = append(handles, h)
			}
			byHandle[h] = append(byHandle[h], rec)
		}
		for _, h := range handles {
			recs := byHandle[h]
			for len(recs) > 0 {
				n, bytes := 0, int64(0)
				for n < len(recs) && n < drainBatchFiles && (n == 0 || bytes+recs[n].Version.Size <= drainBatchBytes) {
					bytes += recs[n].Version.Size
					n++
				}
				batch := recs[:n]
				recs = recs[n:]
				if _, err := e.drainBatch(ctx, v, h, src, batch, dirs, ack, sum, prog); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// drainBatch commits a batch of records with one CommitStaged and acks
// those committed; it returns how many failed (left queued).
func (e *env) drainBatch(ctx context.Context, v, h *fs.Volume, src *localstore.Store, batch []queueRecord,
	dirs map[string]*meta.Entry, ack func(...uint64) error, sum *DrainSummary, prog *progress) (int, error) {
	failed := 0
	fail := func(rec queueRecord, err error) {
		failed++
		sum.Failed++
		msg := fmt.Sprintf("%s:%s: %v", rec.Volume, rec.Path, err)
		if len(sum.Errors) < 1000 {
			sum.Errors = append(sum.Errors, msg)
		}
		prog.println("cairn: " + msg + " (left in the queue)")
	}
	var files []fs.StagedFile
	var recs []queueRecord
	for _, rec := range batch {
		parts, err := vpath.SplitClean(rec.Path)
		if err != nil || len(parts) == 0 {
			fail(rec, cmp(err, errors.New("bad path in the queue record")))
			continue
		}
		dp := strings.Join(parts[:len(parts)-1], "/")
		d, ok := dirs[dp]
		if !ok {
			// The directory put made may have gone since: make it again.
			d, err = v.Meta.MkdirAll(ctx, parts[:len(parts)-1], 0o755, uint32(os.Getuid()), uint32(os.Getgid()))
			if err != nil {
				if cairn.KindOf(err) == cairn.Unavailable {
					return failed, err
				}
				fail(rec, err)
				continue
			}
			dirs[dp] = d
		}
		files = append(files, fs.StagedFile{Dir: d, Name: parts[len(parts)-1], Version: rec.Version,
			Attrs: fs.Attrs{Mode: rec.Mode, UID: rec.UID, GID: rec.GID}, Check: newerSince(rec)})
		recs = append(recs, rec)
	}
	if len(files) == 0 {
		return failed, nil
	}
	upload := func(n int64) { prog.add(0, n, 0) }
	res, cs, err := h.CommitStaged(ctx, src, files, upload)
	// Those that lost to a newer version committed since they were
	// queued, or whose name is now a directory or a symlink: committed
	// under a conflict name beside it.
	var cfiles []fs.StagedFile
	var cidx []int
	for i, r := range res {
		k := cairn.KindOf(r.Err)
		if err == nil && r.Err != nil && (errors.Is(r.Err, errNewerVersion) || k == cairn.IsDir || k == cairn.Exist) {
			f := files[i]
			f.Name, f.Check = conflictName(f.Name, recs[i].Queued), nil
			cfiles, cidx = append(cfiles, f), append(cidx, i)
		}
	}
	if len(cfiles) > 0 {
		res0 := make([]error, len(res))
		for i := range res {
			res0[i] = res[i].Err
		}
		cres, ccs, cerr := h.CommitStaged(ctx, src, cfiles, upload)
		cs.Objects, cs.Bytes, cs.Present = cs.Objects+ccs.Objects, cs.Bytes+ccs.Bytes, cs.Present+ccs.Present
		for j, r := range cres {
			i := cidx[j]
			res[i] = r
			if r.Err == nil && r.Entry != nil {
				rec := recs[i]
				why := "a newer version was committed after it was queued"
				if !errors.Is(res0[i], errNewerVersion) {
					why = "the name is taken by a directory or symlink now"
				}
				prog.println(fmt.Sprintf("cairn: %s:%s: %s; the queued one is %s", rec.Volume, rec.Path, why, cfiles[j].Name))
			}
		}
		err = cerr
	}
	sum.Uploaded += cs.Objects
	sum.UploadedBytes += cs.Bytes
	sum.Present += cs.Present
	var acks []uint64
	for i, r := range res {
		rec := recs[i]
		if r.Err != nil || r.Entry == nil {
			switch k := cairn.KindOf(r.Err); {
			case err != nil:
			case k == cairn.Unavailable || k == cairn.Canceled:
				// Not this file's fault: the drain stops and is retried.
				err = r.Err
			default:
				fail(rec, cmp(r.Err, errors.New("not committed")))
			}
			continue
		}
		if r.Already {
			sum.Already++
		} else {
			sum.Committed++
		}
		prog.add(1, 0, 0)
		acks = append(acks, rec.jseq)
	}
	if len(acks) > 0 {
		if aerr := ack(acks...); aerr != nil {
			return failed, aerr
		}
	}
	if err != nil {
		for _, r := range res {
			if r.Err != nil || r.Entry == nil {
				failed++
				sum.Failed++
			}
		}
	}
	return failed, err
}

// errNewerVersion is newerSince's verdict.
var errNewerVersion = errors.New("a newer version was committed after this one was queued")

// newerSince is the rule for a file committed by another writer between
// its queueing and its drain (its current version is no longer the one
// current when it was queued, rec.Base): if that version's mtime is newer
// than the queued one's, the queued one is not made current but committed
// beside it under a conflict name (conflictName); otherwise it becomes
// current as usual, the other kept in the file's history. Versions this
// device queued one after another of the same file are committed in order.
func newerSince(rec queueRecord) func(cur *meta.Entry) error {
	return func(cur *meta.Entry) error {
		if cur == nil || cur.Type != meta.TypeFile {
			return nil
		}
		c := cur.Current()
		if c == nil || c.N == rec.Base || c.Mtime <= rec.Version.Mtime {
			return nil
		}
		return cairn.E("commit", cairn.Conflict, rec.Volume+":"+rec.Path, errNewerVersion)
	}
}

// conflictName is the name a queued file that lost to a newer version is
// committed under: NAME.queued-conflict-YYYYMMDD-HHMMSS (its queueing
// time, UTC).
func conflictName(name string, queued int64) string {
	return name + ".queued-conflict-" + time.Unix(0, queued).UTC().Format("20060102-150405")
}

func (e *env) queueCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "queue",
		Short: "Show or drain the uploads that 'put --background' queued",
		Long: `'cairn put --background' stores files on this device and queues them: their
upload to the stores the placement policy names, and their commit, happen in
the background. A queued file is not visible in cairn until it is committed.

A drainer runs in the background after each put --background and, while files
wait, after any other cairn command (set CAIRN_NO_AUTODRAIN=1 to drain only with
'cairn queue run'). A killed drainer loses nothing: the next one finishes its
work. If another writer committed a newer version of a queued file (by mtime)
before the drain, the queued one is committed beside it as
NAME.queued-conflict-YYYYMMDD-HHMMSS.`,
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the files waiting for upload",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ql, err := e.queueList()
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(ql)
			}
			for _, it := range ql.Pending {
				busy := ""
				if it.Busy {
					busy = "  (busy)"
				}
				fmt.Fprintf(e.stdout, "%s  %10s  %s%s\n", it.Queued.Format("2006-01-02 15:04:05"), apitypes.IBytes(it.Size), it.Path, busy)
			}
			state := ""
			if ql.Draining {
				state = fmt.Sprintf("; a drainer is running (pid %d)", ql.PID)
			}
			fmt.Fprintf(e.stderr, "%d file(s), %s waiting%s\n", ql.Files, apitypes.IBytes(ql.Bytes), state)
			return nil
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var runJSON, detached bool
	run := &cobra.Command{
		Use:   "run [--json]",
		Short: "Upload and commit every queued file now, with progress",
		Long: `Upload the queued files to the stores their placement policy names and commit
them, then exit. If a background drainer is running, wait for it first. Files
that fail (a store or the metadata service unreachable) stay queued; the exit
code is then 1, or 6 when a store or the metadata service is unreachable.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if detached {
				return e.drainDetached(cmd.Context())
			}
			human := !runJSON
			var totalFiles, totalBytes int64
			if ql, err := e.queueList(); err == nil {
				totalFiles, totalBytes = int64(ql.Files), ql.Bytes
			}
			showBar := human && !e.quiet && isTerminal(e.stderr)
			prog := newProgress(e.stderr, showBar, totalFiles, totalBytes)
			sum, _, err := e.drain(cmd.Context(), true, prog, 0)
			prog.finish()
			if runJSON {
				if jerr := e.printJSON(sum); err == nil {
					err = jerr
				}
			} else {
				fmt.Fprintf(e.stderr, "committed %d file(s) (%d found committed already), uploaded %d object(s), %s, in %.2fs\n",
					sum.Committed, sum.Already, sum.Uploaded, apitypes.IBytes(sum.UploadedBytes), sum.Seconds)
				if sum.Busy > 0 {
					fmt.Fprintf(e.stderr, "%d put(s) still queueing were left for later\n", sum.Busy)
				}
			}
			if err == nil && sum.Failed > 0 {
				err = withCode(ExitError, fmt.Errorf("queue run: %d file(s) left in the queue", sum.Failed))
			}
			return err
		},
	}
	run.Flags().BoolVar(&runJSON, "json", false, "print a JSON summary on stdout")
	run.Flags().BoolVar(&detached, "detached", false, "run as the background drainer (retries while stores are unreachable)")
	_ = run.Flags().MarkHidden("detached")
	var dropAll bool
	drop := &cobra.Command{
		Use:   "drop [--all] VOLUME:/PATH...",
		Short: "Remove files from the upload queue without committing them",
		Long: `Remove queued files, named as 'cairn queue ls' shows them (or all with --all),
from the queue: they are never committed and their data on this device is
deleted. For a file that cannot be committed (its directory's path is a file
now), or that you no longer want uploaded. Waits for a running drainer.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dropAll == (len(args) > 0) {
				return withCode(ExitUsage, errors.New("queue drop: name the queued files, or --all"))
			}
			dropped, err := e.dropQueued(cmd.Context(), dropAll, args)
			for _, p := range dropped {
				fmt.Fprintf(e.stdout, "dropped %s\n", p)
			}
			return err
		},
	}
	drop.Flags().BoolVar(&dropAll, "all", false, "drop every queued file")
	c.AddCommand(ls, run, drop)
	return c
}

// dropQueued removes pending records from the queue without committing
// them: all of them, or those whose VOLUME:/path is in paths. It returns
// the paths dropped; a path of paths that is not queued is an error (Kind
// NotFound), as is one in a put that is busy (Conflict).
func (e *env) dropQueued(ctx context.Context, all bool, paths []string) ([]string, error) {
	q := queueDir(e.home)
	lock, _, err := lockDrain(ctx, q, true, newProgress(e.stderr, false, 0, 0))
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	want := map[string]bool{}
	for _, p := range paths {
		want[p] = true
	}
	dirs, err := queuedPuts(e.home)
	if err != nil {
		return nil, err
	}
	var dropped []string
	found := map[string]bool{}
	for _, d := range dirs {
		qp, err := readQueuedPut(d)
		if err != nil {
			return dropped, err
		}
		var drop []queueRecord
		for _, rec := range qp.pending {
			if p := rec.Volume + ":" + rec.Path; all || want[p] {
				drop = append(drop, rec)
				found[p] = true
			}
		}
		if len(drop) == 0 {
			continue
		}
		drop, err = e.dropFromPut(ctx, d, func(rec queueRecord) bool { return all || want[rec.Volume+":"+rec.Path] })
		if err != nil {
			return dropped, err
		}
		for _, rec := range drop {
			dropped = append(dropped, rec.Volume+":"+rec.Path)
		}
	}
	for _, p := range paths {
		if !found[p] {
			return dropped, cairn.E("queue drop", cairn.NotFound, p, errors.New("not in the upload queue"))
		}
	}
	return dropped, nil
}

// dropFromPut acks, under the put's lock, the records of put directory d
// that match (migrating a format 1 directory first), and removes the
// directory if none is left. It returns those dropped.
func (e *env) dropFromPut(ctx context.Context, d string, match func(queueRecord) bool) ([]queueRecord, error) {
	var drop []queueRecord
	dr := &journal.Drainer{Apply: func(ctx context.Context, jrecs []journal.Record, ack func(...uint64) error) error {
		var seqs []uint64
		for _, r := range jrecs {
			rec, err := decodeQueueRecord(r.Payload)
			if err != nil {
				return cairn.E("queue drop", cairn.Invalid, d, err)
			}
			if match(rec) {
				drop, seqs = append(drop, rec), append(seqs, r.Seq)
			}
		}
		if len(seqs) == 0 {
			return nil
		}
		return ack(seqs...)
	}}
	err := dr.DrainDir(ctx, putJournal(d), filepath.Join(d, "lock"), journal.Options{}, journal.DirHooks{
		Before: func() error { return migrateLegacy(ctx, d) },
		After: func(left int) error {
			if left > 0 {
				return nil
			}
			return removeQueuedPut(d)
		},
	})
	if errors.Is(err, journal.ErrBusy) {
		return nil, cairn.E("queue drop", cairn.Conflict, d, errors.New("a put is still queueing there; try again when it is done"))
	}
	return drop, err
}

// drainRetryFor is how long a background drainer keeps retrying while a
// store or the metadata service is unreachable; then it exits and a later
// command starts another.
const drainRetryFor = 10 * time.Minute

// drainDetached is the background drainer: drain, each put retrying
// with backoff while stores are unreachable (journal.Drainer), for
// drainRetryFor at most. It exits at once if another drainer runs.
func (e *env) drainDetached(ctx context.Context) error {
	prog := newProgress(e.stderr, false, 0, 0)
	sum, _, err := e.drain(ctx, false, prog, drainRetryFor)
	if err == nil && sum.Failed > 0 {
		// Errors of those files, not of the stores: retrying now
		// would not help.
		return fmt.Errorf("queue: %d file(s) left in the queue: %s", sum.Failed, strings.Join(sum.Errors, "; "))
	}
	return err
}

// startDrainer starts a background drainer if files are queued, none
// runs and CAIRN_NO_AUTODRAIN is not set. It does not wait for it.
func (e *env) startDrainer() {
	if e.home == "" || os.Getenv(EnvNoAutoDrain) == "1" {
		return
	}
	dirs, err := queuedPuts(e.home)
	if err != nil || len(dirs) == 0 {
		return
	}
	q := queueDir(e.home)
	if lockedByOther(filepath.Join(q, "drain.lock")) {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	logf, err := os.OpenFile(filepath.Join(q, "drain.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer logf.Close()
	args := []string{"--home", e.home, "-q", "queue", "run", "--detached"}
	if e.etcd != "" {
		args = append(args, "--etcd", e.etcd)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = os.Environ()
	if _, ok := os.LookupEnv("CAIRN_PASSPHRASE"); !ok && e.pass != nil {
		// The drainer has no terminal to ask on: it gets the passphrase
		// this command was given (see doc/threat-model.md).
		cmd.Env = append(cmd.Env, "CAIRN_PASSPHRASE="+string(e.pass))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		e.log.Warn("could not start the upload drainer", "err", err)
		return
	}
	_ = cmd.Process.Release()
}

// drainWhileServing starts a background drainer, if files wait and none
// runs, now and then once a minute until ctx ends: a device's node serve
// finishes the queue without another command.
func (e *env) drainWhileServing(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		e.startDrainer()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// logQueued tells a put --background's user what happens next.
func (e *env) logQueued(n int) {
	msg := "run 'cairn queue run' to upload them"
	if os.Getenv(EnvNoAutoDrain) != "1" {
		msg = "they upload in the background ('cairn queue ls' shows what waits)"
	}
	fmt.Fprintf(e.stderr, "queued %d file(s); %s\n", n, msg)
}
