package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/filescache"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/vpath"
)

// PutSummary is what `put --json` prints.
type PutSummary struct {
	Files         int64    `json:"files"`         // regular files stored (new versions), or queued with --background
	Queued        int64    `json:"queued"`        // of those, files queued for upload (--background), not committed yet
	Skipped       int64    `json:"skipped"`       // unchanged files not read
	CacheHits     int64    `json:"cache_hits"`    // of those, found unchanged by the files cache alone (no entry read)
	ReadFiles     int64    `json:"read_files"`    // local files opened to be read
	ReadBytes     int64    `json:"read_bytes"`    // bytes read from local files
	Dirs          int64    `json:"dirs"`          // directories created
	Symlinks      int64    `json:"symlinks"`      // symlinks created or updated
	Specials      int64    `json:"specials"`      // FIFOs, sockets and device nodes created or updated
	Links         int64    `json:"links"`         // hard links made: a further name of a file stored once
	Failed        int64    `json:"failed"`        // items that could not be stored
	Denied        int64    `json:"denied"`        // of those, items refused (the volume's ACLs, a missing key)
	Bytes         int64    `json:"bytes"`         // logical bytes of the files stored
	NewBytes      int64    `json:"new_bytes"`     // bytes added to the store (chunks and manifests)
	NewChunks     int64    `json:"new_chunks"`    // chunks added to the store
	DupBytes      int64    `json:"dup_bytes"`     // plaintext bytes not stored again thanks to dedup
	Chunks        int64    `json:"chunks"`        // chunks in the files stored
	HealedChunks  int64    `json:"healed_chunks"` // stored chunks found damaged (--force) and written afresh
	Seconds       float64  `json:"seconds"`       // wall time
	MBPerSec      float64  `json:"mb_per_s"`      // Bytes / Seconds / 1e6
	FilesPerSec   float64  `json:"files_per_s"`   // (Files+Skipped) / Seconds
	WorkersUsed   int      `json:"workers"`       // files written in parallel
	ScannedSource int64    `json:"scanned_bytes"` // bytes found in the sources
	Errors        []string `json:"errors,omitempty"`
}

func (e *env) putCmd() *cobra.Command {
	var force, asJSON, background bool
	var workers int
	var metricsAddr string
	c := &cobra.Command{
		Use:   "put [flags] SRC... VOLUME:/DIR",
		Short: "Store local files and directories (recursively) into a cairn directory",
		Long: `Store local files and directories into VOLUME:/DIR, which is created if needed.
Each SRC lands in DIR under its own name (like 'cp -r SRC... DIR'). Only chunks the
store does not already hold are written. A file whose size, mtime and inode match
the version already stored is skipped unless --force: this device keeps a files
cache per destination (under CAIRN_HOME/cache/files) of each file's size, mtime,
ctime, inode and device and of the volume record that holds it, and a file
found there unchanged, its record unchanged too, is skipped without reading it
or its record; one the cache knows whose ctime (or size or mtime) changed is
read again. With --force, when the
data goes to this device's own store, every chunk the store says it holds is
read back and verified, and one that is damaged is written afresh from the
file (healing every version that names it); a remote node or cloud store is
trusted (checking would mean downloading: see 'cairn fsck --repair').
Each file is committed
atomically: readers see its previous version until the new one is complete.
Files that cannot be read are reported and skipped; the exit code is then 1.
FIFOs, unix sockets and device nodes are stored as entries of their type (mode,
owner, mtime, device number; no data), and 'cairn get' makes them again.

With --background, put returns once the files are stored on this device: their
upload to the stores the placement policy names, and their commit, are queued
and happen in the background (see 'cairn queue'). Until its commit a file is
not visible in cairn; directories, symlinks and special files are created at once. A crash or
kill loses nothing queued: the next drainer finishes the work.`,
		Example: `  cairn put ~/Documents home:/
  cairn put --json photo.jpg notes.txt home:/inbox
  cairn put --background ~/Videos home:/videos && cairn queue ls`,
		Args: usageArgs(2, "one or more sources and a destination VOLUME:/DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcs, dst := args[:len(args)-1], args[len(args)-1]
			if !vpath.IsRemote(dst) {
				return withCode(ExitUsage, fmt.Errorf("put: the destination %q is not a cairn path (VOLUME:/DIR)", dst))
			}
			for _, s := range srcs {
				if vpath.IsRemote(s) {
					return withCode(ExitUsage, fmt.Errorf("put: source %q is a cairn path; use 'cairn get' to copy out of cairn (or write ./%s for a local name with a colon)", s, s))
				}
			}
			if background && e.target != "" {
				return withCode(ExitUsage, errors.New("put: --background and --store cannot be combined"))
			}
			if err := e.serveMetrics(cmd.Context(), metricsAddr); err != nil {
				return err
			}
			sum, err := e.put(cmd.Context(), srcs, dst, force, background, workers, !asJSON)
			if sum != nil && asJSON {
				if jerr := e.printJSON(sum); err == nil {
					err = jerr
				}
			}
			if err == nil && sum != nil && sum.Failed > 0 {
				code := ExitError
				if sum.Denied == sum.Failed {
					code = ExitPermission // every failure a refusal: exit 4
				}
				return withCode(code, fmt.Errorf("put: %d item(s) could not be stored", sum.Failed))
			}
			return err
		},
	}
	c.Flags().StringVar(&e.offloadTo, "offload-to", "auto", "with --store: where the data goes while that device is not awake (a node or store; auto: this device; off: fail instead); 'cairn offload ls' shows it until it is moved home")
	c.Flags().StringVar(&e.target, "store", "", "store the data on this node (see 'cairn devices') or store (see 'cairn store ls') instead of this device; only chunks it lacks are sent")
	c.Flags().BoolVar(&force, "force", false, "store files even when unchanged, verifying the chunks this device's store already holds (writes damaged ones afresh)")
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON summary on stdout")
	c.Flags().BoolVar(&background, "background", false, "return once the data is stored on this device; upload and commit in the background (see 'cairn queue')")
	c.Flags().IntVar(&workers, "workers", 0, "files written in parallel (default 32 per core; memory is bounded separately)")
	metricsFlag(c, &metricsAddr)
	return c
}

// putWindow is the most memory one file's write holds (the pipeline's
// window), and putBudget the most all files in flight hold together.
const (
	putWindow = 16 << 20
	putBudget = 96 << 20
)

// putJob is one regular file to store.
type putJob struct {
	src  string
	dir  *meta.Entry
	name string
	info iofs.FileInfo
	dst  string
}

type putState struct {
	e *env
	v *fs.Volume
	// volFor returns the handle of v that writes under the placement
	// policy in force for a path of the volume (policy.go).
	volFor func(path string) *fs.Volume
	volPre string // "VOLUME:", cut from destinations to get that path
	force  bool
	start  time.Time // when the put began
	sum    PutSummary
	prog   *progress
	mu     sync.Mutex
	// existing caches the entries of destination directories that existed
	// before this put, for the unchanged-file check (one range read each),
	// and as each file's entry when it is written (fs.Attrs.Listed): each
	// was read after the GC generation gen.
	existing map[uint64]map[string]*meta.Entry
	gen      int64
	reads    singleflight.Group
	// groups holds, per volume handle whose store buffers writes (a
	// cloud store), the files prepared but not committed yet (see
	// putGroup).
	groupMu sync.Mutex
	groups  map[*fs.Volume]*putGroup
	// spool, with --background, is where files are staged and queued
	// instead of written and committed (queue.go).
	spool *spool
	// fc is the files cache (nil: none, e.g. offline), revs the
	// ModRevisions of the destination directories' entries it is
	// compared with (meta.Vol.EntryRevs: one keys-only read each).
	fc      *filescache.Cache
	fcPath  string
	cwd     string // for the cache's keys: absolute local paths
	revMu   sync.Mutex
	revs    map[uint64]map[string]int64
	revRead singleflight.Group
	// The walk asks for each directory's revisions ahead of the workers
	// (prefetchRevs): revWait holds a channel per directory asked for and
	// not read yet, closed once it is; revAsk the directories to read,
	// many per etcd transaction (meta.Vol.EntryRevsOf).
	revWait map[uint64]chan struct{}
	revAsk  []uint64
	revKick chan struct{}
	// stopRevs ends readRevs.
	stopRevs context.CancelFunc
	// Hard links (walk; one goroutine): the first name met of each local
	// file with several names (by device and inode), and the further
	// names, made links of it once every file is committed (makeLinks).
	firstNames map[devIno]putJob
	links      []hardLink
}

// devIno identifies a local file.
type devIno struct{ dev, ino uint64 }

// hardLink is a further name (dir, name, dst) of a local file stored
// under first.
type hardLink struct {
	first          putJob
	dir            *meta.Entry
	name, dst, src string
}

// Files are committed in groups: each is prepared (its data and manifest
// stored, deferred over a store that buffers, without a writer lock: the
// commit succeeds only while nobody else holds it, and is otherwise made
// again under it), and a group of up to groupFiles files or groupBytes
// bytes is committed by fs.CommitGroup, many files per etcd transaction:
// one round trip and one write of etcd's log per few dozen small files
// instead of three round trips (lock, read, commit) per file. Over a store
// that buffers (a cloud store's packs), the group is first made durable by
// one Flush of the store, so that its small files share packs: about one
// PUT per group instead of one per few files. A group older than
// groupLinger is committed even if not full. A large file fills its group
// by itself: over a store that buffers, its chunks then go into full
// packs, several stored at once, while the file is read (written with Puts
// that each wait for their pack, a 1 GiB file made ~1 MiB packs, as many
// as the pipeline's window let wait at once: 0.44x rclone's put).
//
// A put killed before a group's commit loses that group's files (their
// data stays in the store until a garbage collection); a transaction
// commits each of its files whole, or none.
const (
	groupFiles  = 256
	groupBytes  = 16 << 20
	groupLinger = 500 * time.Millisecond
)

// putGroup is a group of prepared files of one volume handle.
type putGroup struct {
	items []groupItem
	bytes int64
	since time.Time
}

type groupItem struct {
	p *fs.PendingWrite
	j putJob
}

// addToGroup adds a prepared file to its volume's group and, when the
// group is full, commits it.
func (st *putState) addToGroup(ctx context.Context, v *fs.Volume, p *fs.PendingWrite, j putJob) error {
	st.groupMu.Lock()
	g := st.groups[v]
	if g == nil {
		g = &putGroup{since: time.Now()}
		st.groups[v] = g
	}
	g.items = append(g.items, groupItem{p: p, j: j})
	g.bytes += p.Size()
	if len(g.items) < groupFiles && g.bytes < groupBytes {
		st.groupMu.Unlock()
		return nil
	}
	delete(st.groups, v)
	st.groupMu.Unlock()
	return st.commitGroup(ctx, v, g.items)
}

// commitOld commits the groups older than age (all of them for 0).
func (st *putState) commitOld(ctx context.Context, age time.Duration) error {
	st.groupMu.Lock()
	var vs []*fs.Volume
	var gs []*putGroup
	for v, g := range st.groups {
		if time.Since(g.since) >= age {
			vs, gs = append(vs, v), append(gs, g)
			delete(st.groups, v)
		}
	}
	st.groupMu.Unlock()
	var first error
	for i, v := range vs {
		if err := st.commitGroup(ctx, v, gs[i].items); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// commitGroup flushes and commits a group, and accounts for each file. A
// file that failed is reported; an error that stops the put (the store or
// the metadata service is unavailable, or the put was canceled) is
// returned after every file of the group was reported.
func (st *putState) commitGroup(ctx context.Context, v *fs.Volume, items []groupItem) error {
	ps := make([]*fs.PendingWrite, len(items))
	for i, it := range items {
		ps[i] = it.p
	}
	var fatal error
	res := v.CommitGroup(ctx, ps)
	var interrupted context.Context // the checks' shared deadline
	for i, r := range res {
		if r.Err != nil && ctx.Err() != nil {
			// Interrupted as the commit went through (its reply lost to
			// the cancellation): the file is stored.
			if interrupted == nil {
				c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				interrupted = c
			}
			if st.committed(interrupted, items[i].j, sourceOf(items[i].j.info)) {
				r.Err = nil
			}
		}
		if r.Err != nil {
			st.fail(items[i].j.dst, r.Err)
			switch cairn.KindOf(r.Err) {
			case cairn.Unavailable, cairn.Canceled:
				if fatal == nil {
					fatal = r.Err
				}
			}
			continue
		}
		st.account(r.Stats)
		st.remember(items[i].j, r.Entry)
	}
	if fatal == nil && ctx.Err() != nil {
		fatal = ctx.Err()
	}
	return fatal
}

// account counts a file stored.
func (st *putState) account(ws fs.WriteStats) {
	atomic.AddInt64(&st.sum.Files, 1)
	atomic.AddInt64(&st.sum.Bytes, ws.LogicalBytes)
	atomic.AddInt64(&st.sum.NewBytes, ws.NewStoredBytes)
	atomic.AddInt64(&st.sum.NewChunks, int64(ws.NewChunks))
	atomic.AddInt64(&st.sum.DupBytes, ws.DupBytes)
	atomic.AddInt64(&st.sum.Chunks, int64(ws.Chunks))
	atomic.AddInt64(&st.sum.HealedChunks, int64(ws.HealedChunks))
	st.prog.add(1, 0, ws.DupBytes)
}

func (st *putState) fail(path string, err error) {
	atomic.AddInt64(&st.sum.Failed, 1)
	if cairn.KindOf(err) == cairn.Permission {
		atomic.AddInt64(&st.sum.Denied, 1)
	}
	st.mu.Lock()
	if len(st.sum.Errors) < 1000 {
		st.sum.Errors = append(st.sum.Errors, fmt.Sprintf("%s: %v", path, err))
	}
	st.mu.Unlock()
	st.prog.println(fmt.Sprintf("cairn: %s: %v", path, err))
}

func (e *env) put(ctx context.Context, srcs []string, dst string, force, background bool, workers int, human bool) (_ *PutSummary, err error) {
	start := time.Now()
	if force {
		// The store's "I have it" is a hint (LBFS): have a local store
		// check what it claims and write afresh what fails, healing
		// every version that names it.
		ctx = store.WithCheckPresent(ctx)
	}
	v, p, err := e.vol(ctx, dst)
	if err != nil {
		return nil, err
	}
	for _, s := range srcs {
		if _, err = os.Lstat(s); err != nil {
			return nil, cairn.E("put", cairn.NotFound, s, errors.New("no such local file or directory"))
		}
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	dir, err := v.Meta.MkdirAll(ctx, p.Parts, 0o755, uid, gid)
	if err != nil {
		return nil, err
	}
	if workers <= 0 {
		// Small files are latency-bound (a metadata commit and a store
		// fsync each, both batched across concurrent writers), so many run
		// at once; memory is bounded by the byte budget below instead.
		workers = 32 * runtime.GOMAXPROCS(0)
	}
	// Count what there is, so the bar can show a total, and so that a
	// stripe policy reserves the whole dataset on donated space before
	// anything is written (doc/director.md, "Striping").
	showBar := human && !e.quiet && isTerminal(e.stderr)
	var totalFiles, totalBytes int64
	for _, s := range srcs {
		_ = filepath.WalkDir(s, func(path string, d iofs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					totalFiles++
					totalBytes += info.Size()
				}
			}
			return nil
		})
	}
	ctx = realm.WithDatasetSize(ctx, totalBytes)
	var volFor func(string) *fs.Volume
	var sp *spool
	if background {
		// The policy's stores are not needed (nor need they be reachable)
		// until the queue is drained.
		if sp, err = e.newSpool(ctx, p.Volume); err != nil {
			return nil, err
		}
		defer func() {
			if _, cerr := sp.close(context.WithoutCancel(ctx)); err == nil {
				err = cerr
			}
		}()
	} else if volFor, err = e.policyVolumes(ctx, v, p); err != nil {
		return nil, err
	}
	st := &putState{e: e, v: v, volFor: volFor, volPre: p.Volume + ":", force: force, start: start, existing: map[uint64]map[string]*meta.Entry{},
		groups: map[*fs.Volume]*putGroup{}, spool: sp, firstNames: map[devIno]putJob{}}
	// Read before any listing, so that the listings' entries can stand
	// for the files' as they are written (fs.Attrs.Listed).
	if st.gen, err = v.Gen(ctx); err != nil {
		return nil, err
	}
	st.sum.WorkersUsed = workers
	st.prog = newProgress(e.stderr, showBar, totalFiles, totalBytes)
	if sp == nil {
		st.loadCache(ctx, v, dir, p)
	}
	defer st.prog.finish()

	jobs := make(chan putJob, 4*workers)
	// Each file in flight holds up to one pipeline window of memory; the
	// budget keeps a tree of large files from holding many windows at once.
	budget := semaphore.NewWeighted(putBudget)
	g, gctx := errgroup.WithContext(ctx)
	for i := 0; i < workers; i++ {
		g.Go(func() error {
			for j := range jobs {
				w := min(j.info.Size(), putWindow) + 64<<10
				if aerr := budget.Acquire(gctx, w); aerr != nil {
					return aerr
				}
				perr := st.putFile(gctx, j)
				budget.Release(w)
				if perr != nil {
					return perr
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(jobs)
		for _, s := range srcs {
			if werr := st.walk(gctx, s, dir, p.String(), jobs); werr != nil {
				return werr
			}
		}
		return nil
	})
	// Groups that linger are committed (see putGroup).
	stopTick := make(chan struct{})
	tickDone := make(chan error, 1)
	go func() {
		t := time.NewTicker(groupLinger / 4)
		defer t.Stop()
		var first error
		for {
			select {
			case <-stopTick:
				tickDone <- first
				return
			case <-t.C:
				// ctx, not gctx: Wait cancels gctx as it returns,
				// and a group may be committing then.
				if cerr := st.commitOld(ctx, groupLinger); cerr != nil && first == nil {
					first = cerr
				}
			}
		}
	}()
	err = g.Wait()
	close(stopTick)
	if terr := <-tickDone; err == nil {
		err = terr
	}
	// The last groups: committed if the put went well, and otherwise
	// reported (ctx is canceled, so their Flush fails and nothing is
	// committed) with their locks released.
	cctx := ctx
	if err != nil {
		c, cancel := context.WithCancel(ctx)
		cancel()
		cctx = c
	}
	if cerr := st.commitOld(cctx, 0); err == nil {
		err = cerr
	}
	if err == nil {
		err = st.makeLinks(ctx)
	}
	st.saveCache(srcs, err == nil)
	st.prog.finish()
	sum := &st.sum
	sum.Seconds = time.Since(start).Seconds()
	if sum.Seconds > 0 {
		sum.MBPerSec = float64(sum.Bytes) / sum.Seconds / 1e6
		sum.FilesPerSec = float64(sum.Files+sum.Skipped) / sum.Seconds
	}
	if sp != nil {
		sum.Queued = sum.Files
	}
	if human && sp != nil {
		fmt.Fprintf(e.stderr, "stored %d files (%s) on this device, skipped %d unchanged, %d dirs, %d symlinks%s in %.2fs\n",
			sum.Files, apitypes.IBytes(sum.Bytes), sum.Skipped, sum.Dirs, sum.Symlinks, specialsNote(sum.Specials), sum.Seconds)
		if sum.Files > 0 {
			e.logQueued(int(sum.Files))
		}
	} else if human {
		if errors.Is(err, context.Canceled) {
			fmt.Fprint(e.stderr, "interrupted: ")
		}
		fmt.Fprintf(e.stderr, "stored %d files (%s), skipped %d unchanged, %d dirs, %d symlinks%s in %.2fs (%.1f MB/s, %.0f files/s)\n",
			sum.Files, apitypes.IBytes(sum.Bytes), sum.Skipped, sum.Dirs, sum.Symlinks, specialsNote(sum.Specials), sum.Seconds, sum.MBPerSec, sum.FilesPerSec)
		fmt.Fprintf(e.stderr, "added %s to the store in %d new chunks; dedup saved %s\n", apitypes.IBytes(sum.NewBytes), sum.NewChunks, apitypes.IBytes(sum.DupBytes))
		if sum.HealedChunks > 0 {
			fmt.Fprintf(e.stderr, "healed %d stored chunk(s) that failed verification (written afresh)\n", sum.HealedChunks)
		}
		if sum.Failed > 0 {
			fmt.Fprintf(e.stderr, "%d item(s) failed\n", sum.Failed)
		}
	}
	return sum, err
}

// walk sends the files below src to jobs, creating directories and
// symlinks itself (in order, so parents exist before children).
func (st *putState) walk(ctx context.Context, src string, into *meta.Entry, intoPath string, jobs chan<- putJob) error {
	info, err := os.Lstat(src)
	if err != nil {
		st.fail(src, err)
		return nil
	}
	name := filepath.Base(filepath.Clean(src))
	if name == "/" || name == "." || name == ".." {
		abs, err := filepath.Abs(src)
		if err == nil {
			name = filepath.Base(abs)
		}
	}
	if err := vpath.ValidName(name); err != nil {
		st.fail(src, err)
		return nil
	}
	dstPath := joinPath(intoPath, name)
	switch {
	case info.Mode().IsRegular():
		if sys, ok := info.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 && st.spool == nil {
			// A hard link (as tar and rsync -H keep them): the first name
			// met is stored, the others become its names.
			k := devIno{uint64(sys.Dev), sys.Ino}
			if first, ok := st.firstNames[k]; ok {
				st.links = append(st.links, hardLink{first: first, dir: into, name: name, dst: dstPath, src: src})
				return nil
			}
			st.firstNames[k] = putJob{src: src, dir: into, name: name, info: info, dst: dstPath}
		}
		select {
		case jobs <- putJob{src: src, dir: into, name: name, info: info, dst: dstPath}:
		case <-ctx.Done():
			return ctx.Err()
		}
	case info.Mode()&os.ModeSymlink != 0:
		st.putSymlink(ctx, src, into, name, info, dstPath)
	case info.IsDir():
		d, err := st.mkdir(ctx, into, name, info)
		if err != nil {
			if cairn.KindOf(err) == cairn.Unavailable {
				return err
			}
			st.fail(dstPath, err)
			return nil
		}
		st.prefetchRevs(d.Ino)
		ents, err := os.ReadDir(src)
		if err != nil {
			st.fail(src, err)
			return nil
		}
		for _, de := range ents {
			if err := st.walk(ctx, filepath.Join(src, de.Name()), d, dstPath, jobs); err != nil {
				return err
			}
		}
	default:
		if typ, ok := specialType(info.Mode()); ok {
			st.putSpecial(ctx, typ, into, name, info, dstPath)
			return nil
		}
		st.prog.println(fmt.Sprintf("cairn: skipping %s: not a regular file, directory, symlink, FIFO, socket or device", src))
	}
	return nil
}

// specialType is the entry type of a FIFO, socket or device node.
func specialType(m iofs.FileMode) (meta.Type, bool) {
	switch {
	case m&iofs.ModeNamedPipe != 0:
		return meta.TypeFIFO, true
	case m&iofs.ModeSocket != 0:
		return meta.TypeSocket, true
	case m&iofs.ModeCharDevice != 0:
		return meta.TypeChar, true
	case m&iofs.ModeDevice != 0:
		return meta.TypeBlock, true
	}
	return "", false
}

func specialsNote(n int64) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d FIFOs, sockets and devices", n)
}

// putSpecial stores a FIFO, socket or device node as an entry of its type
// with its mode, owner, mtime and (devices) device number: there is no
// data to store. One already stored alike is left as it is.
func (st *putState) putSpecial(ctx context.Context, typ meta.Type, dir *meta.Entry, name string, info iofs.FileInfo, dstPath string) {
	kids, err := st.children(ctx, dir)
	if err != nil {
		st.fail(dstPath, err)
		return
	}
	uid, gid := owner(info)
	var rdev uint64
	if sys, ok := info.Sys().(*syscall.Stat_t); ok && (typ == meta.TypeChar || typ == meta.TypeBlock) {
		rdev = uint64(sys.Rdev)
	}
	want := meta.Entry{Name: name, Type: typ, Mode: uint32(info.Mode().Perm() | setIDBits(info.Mode())), UID: uid, GID: gid, Rdev: rdev, Mtime: info.ModTime().UnixNano()}
	if old, ok := kids[name]; ok {
		if old.Type != typ {
			st.fail(dstPath, fmt.Errorf("a %s of that name is in the way", typeName(old.Type)))
			return
		}
		if old.Mode == want.Mode && old.UID == uid && old.GID == gid && old.Rdev == rdev && old.Mtime == want.Mtime {
			return
		}
		n := *old
		n.Mode, n.UID, n.GID, n.Rdev, n.Mtime = want.Mode, uid, gid, rdev, want.Mtime
		if _, err := st.v.Meta.Update(ctx, &n); err != nil {
			st.fail(dstPath, err)
			return
		}
	} else if _, err := st.v.Meta.Create(ctx, dir, want); err != nil {
		st.fail(dstPath, err)
		return
	}
	atomic.AddInt64(&st.sum.Specials, 1)
}

// setIDBits is m's set-user-ID, set-group-ID and sticky bits as mode bits.
func setIDBits(m iofs.FileMode) iofs.FileMode {
	var b iofs.FileMode
	if m&iofs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&iofs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&iofs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

func joinPath(dir, name string) string {
	if len(dir) > 0 && dir[len(dir)-1] == '/' {
		return dir + name
	}
	return dir + "/" + name
}

func (st *putState) children(ctx context.Context, dir *meta.Entry) (map[string]*meta.Entry, error) {
	st.mu.Lock()
	m, ok := st.existing[dir.Ino]
	st.mu.Unlock()
	if ok {
		return m, nil
	}
	// Many workers ask for the same directory at once: read it once.
	v, err, _ := st.reads.Do(fmt.Sprint(dir.Ino), func() (any, error) {
		ents, err := st.v.Meta.ReadDir(ctx, dir.Ino)
		if err != nil {
			return nil, err
		}
		m := make(map[string]*meta.Entry, len(ents))
		for i := range ents {
			m[ents[i].Name] = &ents[i]
		}
		st.mu.Lock()
		st.existing[dir.Ino] = m
		st.mu.Unlock()
		return m, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(map[string]*meta.Entry), nil
}

func (st *putState) mkdir(ctx context.Context, parent *meta.Entry, name string, info iofs.FileInfo) (*meta.Entry, error) {
	kids, err := st.children(ctx, parent)
	if err != nil {
		return nil, err
	}
	if e, ok := kids[name]; ok {
		if !e.IsDir() {
			return nil, cairn.E("put", cairn.NotDir, name, errors.New("a file of that name is in the way"))
		}
		return e, nil
	}
	uid, gid := owner(info)
	e, err := st.v.Meta.Create(ctx, parent, meta.Entry{Name: name, Type: meta.TypeDir, Mode: uint32(info.Mode().Perm()), UID: uid, GID: gid, Mtime: info.ModTime().UnixNano()})
	if errors.Is(err, cairn.ErrExist) && e != nil && e.IsDir() {
		err = nil
	}
	if err != nil {
		return nil, err
	}
	atomic.AddInt64(&st.sum.Dirs, 1)
	// A new directory has no children: remember that, no need to ask.
	st.mu.Lock()
	st.existing[e.Ino] = map[string]*meta.Entry{}
	st.mu.Unlock()
	return e, nil
}

func (st *putState) putSymlink(ctx context.Context, src string, dir *meta.Entry, name string, info iofs.FileInfo, dstPath string) {
	target, err := os.Readlink(src)
	if err != nil {
		st.fail(src, err)
		return
	}
	kids, err := st.children(ctx, dir)
	if err != nil {
		st.fail(dstPath, err)
		return
	}
	uid, gid := owner(info)
	if old, ok := kids[name]; ok {
		if old.Type != meta.TypeSymlink {
			st.fail(dstPath, errors.New("a file or directory of that name is in the way"))
			return
		}
		if old.Target == target {
			return
		}
		n := *old
		n.Target, n.Mtime = target, info.ModTime().UnixNano()
		if _, err := st.v.Meta.Update(ctx, &n); err != nil {
			st.fail(dstPath, err)
			return
		}
	} else if _, err := st.v.Meta.Create(ctx, dir, meta.Entry{Name: name, Type: meta.TypeSymlink, Target: target, Mode: 0o777, UID: uid, GID: gid, Mtime: info.ModTime().UnixNano()}); err != nil {
		st.fail(dstPath, err)
		return
	}
	atomic.AddInt64(&st.sum.Symlinks, 1)
}

func sourceOf(info iofs.FileInfo) meta.Source {
	s := meta.Source{Size: info.Size(), Mtime: info.ModTime().UnixNano()}
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		s.Dev, s.Ino = uint64(sys.Dev), sys.Ino
	}
	return s
}

func owner(info iofs.FileInfo) (uint32, uint32) {
	if sys, ok := info.Sys().(*syscall.Stat_t); ok {
		return sys.Uid, sys.Gid
	}
	return uint32(os.Getuid()), uint32(os.Getgid())
}

func (st *putState) putFile(ctx context.Context, j putJob) error {
	src := sourceOf(j.info)
	// changed: the files cache knows the file, and its size, mtime, ctime,
	// inode or device moved since: read it, whatever its record says.
	changed := false
	if !st.force && st.fc != nil {
		if ce, ci := st.fc.Lookup(st.cacheKey(j)); ci >= 0 && ce.Parent == j.dir.Ino && ce.Rev > 0 {
			if ce.Stat != statOf(j.info) {
				changed = true
			} else {
				revs, err := st.entryRevs(ctx, j.dir.Ino)
				if err != nil {
					return err
				}
				if rev, ok := revs[j.name]; ok && rev == ce.Rev {
					// The very record the cache names: the file is unchanged
					// and so is its version.
					st.fc.Keep(ci)
					atomic.AddInt64(&st.sum.CacheHits, 1)
					st.skip(j)
					return nil
				}
				// The record changed (a rename, chmod or new version made
				// in the volume): the file is unchanged since the version
				// the cache names, so it is skipped if that is still the
				// current version.
				kids, err := st.children(ctx, j.dir)
				if err != nil {
					return err
				}
				if old, ok := kids[j.name]; ok && old.Type == meta.TypeFile && old.Ino == ce.Ino {
					if cur := old.Current(); cur != nil && cur.N == ce.N && cur.Manifest == ce.Manifest {
						st.remember(j, old)
						st.skip(j)
						return nil
					}
				}
			}
		}
	}
	if !st.force && !changed {
		kids, err := st.children(ctx, j.dir)
		if err != nil {
			return err
		}
		if old, ok := kids[j.name]; ok && old.Type == meta.TypeFile {
			if cur := old.Current(); cur != nil && cur.Src == src && cur.Size == src.Size {
				st.remember(j, old)
				st.skip(j)
				return nil
			}
		}
	}
	uid, gid := owner(j.info)
	a := fs.Attrs{Mode: uint32(j.info.Mode().Perm()), UID: uid, GID: gid, Mtime: j.info.ModTime(), Src: src}
	var readBytes int64
	open := func() (io.ReadCloser, error) {
		f, err := os.Open(j.src)
		if err != nil {
			return nil, err
		}
		atomic.AddInt64(&st.sum.ReadFiles, 1)
		return &countingReader{f: f, n: &readBytes, total: &st.sum.ReadBytes, prog: st.prog}, nil
	}
	if st.spool != nil {
		return st.stageFile(ctx, j, open, a)
	}
	vol := st.volFor(strings.TrimPrefix(j.dst, st.volPre))
	a.Unlocked = true
	if kids, err := st.children(ctx, j.dir); err == nil {
		a.Cur, a.Listed, a.ListedGen = kids[j.name], true, st.gen
	}
	p, err := vol.PrepareFile(ctx, j.dir, j.name, open, a)
	if err == nil {
		return st.addToGroup(ctx, vol, p, j)
	}
	return st.settle(ctx, j.dst, fs.WriteStats{}, err)
}

// committed reports whether j's file, whose commit failed as the put was
// interrupted, was committed all the same (the commit reached the metadata
// service before its reply was lost to the cancellation): the current
// version is one committed since this put began, from j's source.
func (st *putState) committed(ctx context.Context, j putJob, src meta.Source) bool {
	e, err := st.v.Meta.Get(ctx, j.dir.Ino, j.name)
	if err != nil {
		return false
	}
	cur := e.Current()
	return cur != nil && cur.Src == src && cur.Size == src.Size && cur.Committed >= st.start.UnixNano()
}

// settle ends one file's put: an error that stops the whole put (ctx
// ended, a store or the metadata service unreachable) is returned; any
// other is recorded against the file and the put goes on; a success is
// counted.
func (st *putState) settle(ctx context.Context, dst string, ws fs.WriteStats, err error) error {
	if err == nil {
		st.account(ws)
		return nil
	}
	// What reached the store counts even though the file was not
	// committed (a later put of it stores none of it again).
	atomic.AddInt64(&st.sum.NewBytes, ws.NewStoredBytes)
	atomic.AddInt64(&st.sum.NewChunks, int64(ws.NewChunks))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	switch cairn.KindOf(err) {
	case cairn.Unavailable, cairn.Canceled:
		return err
	}
	st.fail(dst, err)
	return nil
}

// countingReader reports bytes read to the progress bar as they go.
type countingReader struct {
	f     *os.File
	n     *int64
	total *int64 // all files', added to atomically
	prog  *progress
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	*c.n += int64(n)
	atomic.AddInt64(c.total, int64(n))
	c.prog.add(0, int64(n), 0)
	return n, err
}

func (c *countingReader) Close() error { return c.f.Close() }

// makeLinks gives each file stored under the first of its local names its
// other names (meta.Vol.Link), once every file is committed. A name that
// already is a name of that file is left alone (an incremental put of an
// unchanged tree changes nothing); one that holds anything else is
// replaced, the old entry going to the trash as a removal's does.
func (st *putState) makeLinks(ctx context.Context) error {
	for _, l := range st.links {
		err := st.makeLink(ctx, l)
		if err == nil {
			continue
		}
		if k := cairn.KindOf(err); k == cairn.Unavailable || k == cairn.Canceled {
			return err
		}
		st.fail(l.dst, err)
	}
	return nil
}

func (st *putState) makeLink(ctx context.Context, l hardLink) error {
	for attempt := 0; ; attempt++ {
		first, err := st.v.Meta.Get(ctx, l.first.dir.Ino, l.first.name)
		if err != nil {
			return err
		}
		old, err := st.v.Meta.Get(ctx, l.dir.Ino, l.name)
		switch {
		case err == nil && old.Ino == first.Ino:
			return nil // already a name of it
		case err == nil && old.IsDir():
			return cairn.E("put", cairn.IsDir, l.dst, errors.New("a directory has the name of a hard link"))
		case err == nil:
			if _, err = st.v.Meta.RemoveKnown(ctx, l.dir, l.name, l.dst, false, old); err != nil {
				return err
			}
		case !errors.Is(err, cairn.ErrNotFound):
			return err
		}
		_, err = st.v.Meta.Link(ctx, first, l.dir, l.name)
		if err == nil {
			atomic.AddInt64(&st.sum.Links, 1)
			return nil
		}
		if !errors.Is(err, cairn.ErrConflict) && !errors.Is(err, cairn.ErrExist) || attempt > 10 {
			return err
		}
	}
}
