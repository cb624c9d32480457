// Package mount serves an open volume as a FUSE file system (go-fuse v2)
// with close-to-open consistency (DESIGN.md decision 4): an open of a
// regular file finds the file's current version in the metadata and serves
// reads and writes from a whole-file copy of it on local disk; closing a
// descriptor that wrote commits the copy as a new version with
// fs.Volume.WriteFile (chunks to the store, then compare-and-swap in etcd),
// so any later open, here or on another device, sees it.
//
//   - cache.go: the copies persist in an LRU-bounded cache per volume,
//     named by the version they hold, across unmounts.
//   - entries.go: namespace records are cached and kept current by an
//     etcd watch, so an open of an unchanged cached file costs no request
//     at all (the window this opens is written there).
//   - lock.go: an open for writing holds the file's writer lock until the
//     commit of its last close; another device's open for writing gets
//     EBUSY meanwhile.
//   - queue.go: in non-blocking mode a close returns once the writes are
//     durable on local disk, and a persistent queue commits them.
//   - xattr.go: user.* extended attributes, in the metadata.
//
// Hard links of regular files (meta record format 2's links), FIFOs,
// sockets and device nodes are kept. Not supported: hard links of
// symlinks and special files (EPERM), RENAME_EXCHANGE (EINVAL). Writes
// not yet closed (nor, in write-back mode, fsync'd) when the mount is
// killed are not committed: the next mount keeps them in the cache's
// unsaved/ directory and logs where.
package mount

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// DefaultAttrTimeout is how long the kernel may keep a file's attributes
// and a name's lookup before asking again: long enough to absorb a burst
// of stat calls (ls -l, a build's dependency scan), short enough that a
// change made on another device shows within it.
const DefaultAttrTimeout = 500 * time.Millisecond

// NoAttrCache, as Options.AttrTimeout, makes the kernel ask every time.
const NoAttrCache = -1

// maxWrite is the largest WRITE request the kernel sends: 1 MiB doubled
// sequential write speed over go-fuse's 128 KiB default (TOOLING.md).
const maxWrite = 1 << 20

// Options configure a mount. The zero value is usable.
type Options struct {
	// AttrTimeout bounds the kernel's attribute and lookup cache. Zero
	// means DefaultAttrTimeout; NoAttrCache (or any negative value)
	// disables it.
	AttrTimeout time.Duration
	// CacheDir holds the whole-file cache, a directory per volume (by
	// volume ID) kept across mounts; one mount at a time uses a volume's.
	// Default: a "cairn-mount" directory in os.TempDir().
	CacheDir string
	// CacheSize bounds the clean copies the cache keeps; zero means
	// DefaultCacheSize of CacheDir. Copies open or not yet committed are
	// never evicted and come on top.
	CacheSize int64
	// Mode is Blocking (a close commits), NonBlocking (a close queues
	// the commit once the writes are durable locally) or WriteBack (as
	// NonBlocking, and namespace changes are written in batches).
	Mode Mode
	// LockWait is how long an open for writing waits for a writer lock
	// held by another device before failing with EBUSY; zero means
	// DefaultLockWait.
	LockWait time.Duration
	// Passthrough lets the kernel read and write open copies directly
	// (PassthroughAuto, the default: when the kernel offers it and the
	// mount runs as root, in blocking and write-back modes;
	// passthrough.go, held.go).
	Passthrough Passthrough
	// QueueDelay holds each queued commit (non-blocking mode) back this
	// long after its close. Zero: at once. Tests use it to kill a mount
	// with commits queued.
	QueueDelay time.Duration
	// Logger receives what cannot be returned to a caller: a commit that
	// failed at the last close, a file removed while being written.
	Logger *slog.Logger
	// Debug logs every FUSE request and reply (go-fuse's debug output, to
	// standard error).
	Debug bool
	// AllowOther lets users other than the one that mounts use the mount
	// (FUSE allow_other): the kernel then checks their access by the
	// files' modes and owners, as on a local disk; without it, it refuses
	// them everything (EACCES). A mount by a user other than root needs
	// user_allow_other in /etc/fuse.conf (CheckAllowOther).
	AllowOther bool
	// Devices lets device nodes on the mount be opened as devices (the
	// mount option dev; root only). Without it the mount is nodev, as
	// fusermount3 makes every FUSE mount by default: device nodes are
	// kept and shown, and an open of one fails with EACCES, so that a
	// node made on another device, or restored by get, opens no disk here.
	Devices bool
	// LocalCopyDir holds this device's local copies of the namespaces
	// of the volumes it mounts, a file per volume ID (doc/offline.md):
	// what the mount serves while the metadata service cannot be
	// reached. Default: CacheDir's "offline" subdirectory.
	LocalCopyDir string
	// Device names this device in the names of conflict copies its
	// offline changes make (NAME.conflict-DEVICE-...). Default: the
	// host name.
	Device string
}

// FuseConf is the configuration file fusermount3 reads.
const FuseConf = "/etc/fuse.conf"

// CheckAllowOther reports whether a mount with AllowOther may be made:
// by root always; by another user only if confPath (FuseConf) has a
// user_allow_other line as fusermount3 reads it (a comment from '#' on,
// blanks around it; a line counts only once ended by a newline).
// Otherwise a Permission error says what to add.
func CheckAllowOther(confPath string) error {
	if os.Geteuid() == 0 {
		return nil
	}
	return checkAllowOther(confPath)
}

func checkAllowOther(confPath string) error {
	const op = "mount --allow-other"
	advice := fmt.Sprintf("only root may mount with --allow-other unless %s has a line user_allow_other: add it (as root), or mount without --allow-other", confPath)
	b, err := os.ReadFile(confPath)
	if errors.Is(err, os.ErrNotExist) {
		return cairn.E(op, cairn.Permission, confPath, errors.New("no such file: "+advice))
	}
	if err != nil {
		return cairn.E(op, cairn.Permission, confPath, fmt.Errorf("%w: %s", err, advice))
	}
	lines := strings.Split(string(b), "\n")
	for _, l := range lines[:len(lines)-1] { // the last is not ended by a newline
		if i := strings.IndexByte(l, '#'); i >= 0 {
			l = l[:i]
		}
		if strings.TrimSpace(l) == "user_allow_other" {
			return nil
		}
	}
	if last := lines[len(lines)-1]; strings.TrimSpace(strings.SplitN(last, "#", 2)[0]) == "user_allow_other" {
		return cairn.E(op, cairn.Permission, confPath, errors.New("its user_allow_other line has no newline at its end (fusermount3 ignores it): add one"))
	}
	return cairn.E(op, cairn.Permission, confPath, errors.New(advice))
}

// Mount is a mounted volume.
type Mount struct {
	// readCalls counts the reads the kernel asked of this mount (what its
	// page cache did not serve).
	readCalls atomic.Int64
	// writeCalls counts the writes the kernel asked of this mount (none
	// on a copy the kernel writes directly: passthrough).
	writeCalls atomic.Int64
	// flushCalls and getattrCalls count the FLUSH and GETATTR requests
	// the kernel made (tests: what the open flags and attribute
	// timeouts spare).
	flushCalls atomic.Int64
	// releaseWaitsOut counts fsyncs that waited releaseWait in full for
	// other writers' releases (waitReleases).
	releaseWaitsOut atomic.Int64
	getattrCalls    atomic.Int64
	// writeHandles counts the handles open for writing the kernel has
	// not released; releasing, the last writers' releases still saving.
	writeHandles atomic.Int64
	releasing    atomic.Int64
	// closed counts copies a writer's close left with writes not queued
	// yet (write-back mode: markClosed); saving, the commits blocking
	// mode makes at a close; commitsDone and commitsFailed, the commits
	// finished (Status).
	closed        atomic.Int64
	saving        atomic.Int64
	commitsDone   atomic.Int64
	commitsFailed atomic.Int64
	// statusLn are the status sockets served (status.go).
	statusMu sync.Mutex
	statusLn []net.Listener
	// activity is when the kernel last made a request (unix ns; write-back
	// mode only: quiet.go).
	activity atomic.Int64
	// quietTime is quietTime, but for tests.
	quietTime atomic.Int64

	dir      string
	vol      *fs.Volume
	server   *fuse.Server
	root     *node
	log      *slog.Logger
	mode     Mode
	lockWait time.Duration
	cache    *diskCache
	ents     *entryCache
	queue    *queue
	// attrTimeout is how long the kernel may keep attributes (zero: not
	// at all): Getattr's replies get it from go-fuse, Setattr's here.
	attrTimeout time.Duration
	// wb writes the pending namespace changes of write-back mode (nil
	// in the other modes; writeback.go).
	wb *writeBack
	// pt follows the kernel's backing files when passthrough may be used
	// (nil otherwise; passthrough.go).
	pt *backing
	// held are the copies a writable mapping may still store into after
	// their last writer's release, with their nodes (held.go); the
	// watcher that settles them runs while passthrough is on.
	heldMu       sync.Mutex
	held         map[*content]*node
	heldKick     chan struct{}
	heldStop     chan struct{}
	heldStopOnce sync.Once
	heldDone     chan struct{}

	// The watch that keeps ents current (watchLoop).
	stopWatch context.CancelFunc
	watchDone chan struct{}
	watchMu   sync.Mutex
	curWatch  *meta.EntryWatch
	watchHold chan struct{} // tests: hold a new watch until closed

	// lc is the volume's local copy, kept by keepCopy (offline.go).
	lc       *meta.LocalCopy
	copyStop chan struct{}
	copyDone chan struct{}
	copyKick chan struct{}
	// offLog is the volume's offline log (nil: none, offline writes are
	// refused); replayMu serializes its replays, replayStop ends them.
	offLog     *meta.OfflineLog
	replayMu   sync.Mutex
	replayStop chan struct{}
	// refusedOnce is set once a write was refused offline (logged once).
	refusedOnce atomic.Bool
	// releaseHold, for tests, holds each RELEASE request until closed
	// (HoldRelease): the kernel's release late after the close.
	releaseHold atomic.Pointer[chan struct{}]

	// dirTimes are when this mount last changed each directory's
	// entries (dirtimes.go).
	dirTimes dirTimes

	// states are the inodes' node states (node.go, stateFor).
	statesMu sync.Mutex
	states   map[uint64]weak.Pointer[nodeState]

	// locked are the nodes holding writer-lock references (lock.go).
	lockedMu sync.Mutex
	locked   map[*node]struct{}

	// busy counts commits in progress, so Wait returns only after the
	// last one (go-fuse does not wait for its request goroutines).
	busyMu sync.Mutex
	busyN  int
	idle   *sync.Cond

	doneOnce sync.Once
}

// Start mounts volume v on dir, an existing directory, and serves it
// until it is unmounted (Unmount, 'cairn umount', fusermount3 -u). A
// mount point left broken by a killed server is repaired first (Repair);
// one with a live mount on it gives Kind Exist. It returns once the
// kernel has the mount.
func Start(ctx context.Context, v *fs.Volume, dir string, o Options) (*Mount, error) {
	const op = "mount"
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.AttrTimeout == 0:
		o.AttrTimeout = DefaultAttrTimeout
	case o.AttrTimeout < 0:
		o.AttrTimeout = 0
	}
	if o.CacheDir == "" {
		o.CacheDir = filepath.Join(os.TempDir(), "cairn-mount")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, dir, err)
	}
	dir = abs
	if repaired, rerr := Repair(dir); rerr != nil {
		return nil, rerr
	} else if repaired {
		o.Logger.Warn("repaired a mount point left broken by a killed mount", "mountpoint", dir)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		kind := cairn.IO
		if errors.Is(err, os.ErrNotExist) {
			kind = cairn.NotFound
		}
		return nil, cairn.E(op, kind, dir, err)
	}
	if !fi.IsDir() {
		return nil, cairn.E(op, cairn.NotDir, dir, errors.New("the mount point must be a directory"))
	}
	if mounted, ierr := IsMounted(dir); ierr != nil {
		return nil, cairn.E(op, cairn.IO, dir, ierr)
	} else if mounted {
		return nil, cairn.E(op, cairn.Exist, dir, errors.New("something is already mounted there (cairn umount it first)"))
	}
	if o.AllowOther {
		if err = CheckAllowOther(FuseConf); err != nil {
			return nil, err
		}
	}
	if _, err = os.Stat("/dev/fuse"); err != nil {
		return nil, cairn.E(op, cairn.Unavailable, "/dev/fuse", errors.New("no FUSE device: load the fuse module or install fuse3"))
	}
	if err = os.MkdirAll(o.CacheDir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, o.CacheDir, err)
	}
	sweep(o.CacheDir, o.Logger)
	if o.CacheSize <= 0 {
		o.CacheSize = DefaultCacheSize(o.CacheDir)
	}
	if o.LockWait <= 0 {
		o.LockWait = DefaultLockWait
	}
	m := &Mount{dir: dir, vol: v, log: o.Logger.With("volume", v.Name(), "mountpoint", dir), mode: o.Mode, lockWait: o.LockWait, attrTimeout: o.AttrTimeout,
		ents: newEntryCache(v.Meta), locked: map[*node]struct{}{}, states: map[uint64]weak.Pointer[nodeState]{},
		held: map[*content]*node{}, heldKick: make(chan struct{}, 1)}
	m.idle = sync.NewCond(&m.busyMu)
	m.quietTime.Store(int64(quietTime))
	cache, err := openCache(filepath.Join(o.CacheDir, v.Meta.V.ID), o.CacheSize, m.log)
	if err != nil {
		return nil, err
	}
	m.cache = cache
	// The lock file names the mount point too: 'cairn umount' finds the
	// mount's queue by it (Serving).
	fmt.Fprintf(cache.lockf, "mountpoint %s\n", dir)
	q, queued, err := loadQueue(ctx, m, filepath.Join(cache.dir, "queue"), o.QueueDelay)
	if err != nil {
		cache.close()
		return nil, cairn.E(op, cairn.IO, cache.dir, err)
	}
	m.queue = q
	cache.unsavedLeftovers(queued)
	if o.Mode == WriteBack {
		m.wb = newWriteBack(m)
		m.ents.wb = m.wb
		go m.wb.run()
	}
	m.startCopy(o)
	// The watch first, then the root: a volume the metadata service
	// cannot serve fails the mount instead of its first request.
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.stopWatch, m.watchDone = stop, make(chan struct{})
	var first *meta.EntryWatch
	if _, off := v.Meta.Service().Offline(); off {
		// Started offline (from the local copy): the watch loop
		// watches once the service is back, without holding the start.
		err = cairn.E("watch", cairn.Unavailable, v.Name(), errors.New("offline"))
	} else {
		first, err = v.Meta.WatchEntries(wctx)
	}
	if err != nil {
		m.log.Warn("no watch on the volume: every open asks the metadata service until there is one", "err", err)
		if cairn.KindOf(err) == cairn.Unavailable {
			v.Meta.Service().MarkUnreachable(err)
		}
	} else {
		m.ents.established(first.Start)
		m.resyncCopy()
	}
	go m.watchLoop(wctx, first)
	go q.run(wctx)
	rootEnt, err := m.ents.get(ctx, 0, "", false)
	if err != nil {
		m.shutdown()
		return nil, err
	}
	m.root = &node{m: m, ino: meta.RootIno, typ: meta.TypeDir, nodeState: m.stateFor(meta.RootIno)}
	m.root.remember(rootEnt)
	timeout := o.AttrTimeout
	opts := &gofs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		// The root keeps its cairn inode number: every other node's is
		// its entry's Ino (random, top bit clear, never 1).
		RootStableAttr:  &gofs.StableAttr{Ino: meta.RootIno},
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			FsName:   "cairn:" + v.Name(),
			Name:     "cairn",
			MaxWrite: maxWrite,
			// The kernel checks modes and owners as on a local disk.
			Options: []string{"default_permissions"},
			// user.* extended attributes are kept (xattr.go). The kernel
			// asks for security.capability before every write and ls for
			// the ACL names: go-fuse answers those "none" itself.
			IgnoreSecurityLabels: true,
			// open(O_TRUNC) arrives as a flag on open, so the old content
			// is not fetched only to be thrown away. The mount clears
			// set-ID bits itself on chown, truncate and an unprivileged
			// open for writing (node.killPriv): otherwise the kernel
			// asks for the attributes before every chown.
			ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_HANDLE_KILLPRIV,
			// The page cache is dropped at an open of another copy (no
			// FOPEN_KEEP_CACHE: node.opened), not whenever a file's mtime
			// moves: so what a program wrote stays cached for its reads
			// after the close (the kernel cached it as it was written),
			// as on a local disk.
			ExplicitDataCacheControl: true,
			Debug:                    o.Debug,
			// Other users' access is checked by the kernel
			// (default_permissions).
			AllowOther: o.AllowOther,
		},
	}
	if o.Devices {
		opts.MountOptions.Options = append(opts.MountOptions.Options, "dev")
	}
	var b *backing
	// Not in non-blocking mode: its close queues the commit while the
	// handle is still open, and the kernel could write the queued copy
	// through another descriptor of the same open without the mount
	// seeing it. Write-back mode queues at the last writer's release
	// (passthrough.go, "Queued commits").
	if o.Passthrough == PassthroughAuto && o.Mode != NonBlocking {
		b = &backing{log: m.log, ids: map[int32]*node{}}
		opts.ServerCallbacks = b
		// The kernel's limit on stacked file systems under a backing
		// file: 2 (its most) lets the cache live on an overlay.
		opts.MaxStackDepth = 2
		m.pt = b // off (b.on) until the probe below
	}
	raw := gofs.NewNodeFS(m.root, opts)
	if b != nil {
		raw = &rawFS{RawFileSystem: raw, b: b}
	}
	if o.Mode == WriteBack {
		raw = &busyFS{RawFileSystem: raw, m: m}
	}

	server, err := fuse.NewServer(raw, dir, &opts.MountOptions)
	if err == nil {
		go server.Serve()
		err = server.WaitMount()
	}
	if err != nil {
		m.shutdown()
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	m.server = server
	pt := "off"
	if b != nil {
		if err := probePassthrough(server, cache.dir); err != nil {
			m.log.Info("passthrough not available (it needs Linux 6.9 or later, root, and file leases on the cache's disk): reads and writes go through the mount", "err", err)
		} else {
			b.on.Store(true)
			pt = "on"
			m.heldStop, m.heldDone = make(chan struct{}), make(chan struct{})
			go m.watchHeld(m.heldStop, m.heldDone)
		}
	}
	m.log.Info("mounted", "mode", o.Mode.String(), "passthrough", pt, "cache", cache.dir, "cache_size", o.CacheSize)
	return m, nil
}

// shutdown stops what Start started besides the server: the queue (after
// the commits it can finish), the watch, the cache.
func (m *Mount) shutdown() {
	// The queue first: its commits make the new files whose creation
	// waits for them (write-back), and write what else is pending before
	// them; then the rest of what is pending.
	m.queue.stop()
	m.wb.stop()
	m.unlockAll(context.Background())
	m.stopWatch()
	<-m.watchDone
	m.stopOfflineLog()
	m.stopCopy()
	m.cache.close()
}

// watchLoop keeps the entry cache current: it applies what the watch
// reports, asks it for progress every watchProgress (entries.go), and
// when it ends, empties the cache and watches again.
func (m *Mount) watchLoop(ctx context.Context, w *meta.EntryWatch) {
	defer close(m.watchDone)
	backoff := 100 * time.Millisecond
	down := w == nil
	for {
		if w == nil {
			m.watchMu.Lock()
			hold := m.watchHold
			m.watchMu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-ctx.Done():
					return
				}
			}
			var err error
			if w, err = m.vol.Meta.WatchEntries(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				if !down {
					m.log.Warn("cannot watch the volume: every open asks the metadata service until the watch is back", "err", err)
					down = true
				}
				if cairn.KindOf(err) == cairn.Unavailable {
					m.vol.Meta.Service().MarkUnreachable(err)
				}
				select {
				case <-time.After(backoff):
				case <-ctx.Done():
					return
				}
				backoff = min(2*backoff, 5*time.Second)
				continue
			}
			if down {
				m.log.Info("watching the volume again")
			}
			down, backoff = false, 100*time.Millisecond
			m.ents.established(w.Start)
			m.resyncCopy()
		}
		m.watchMu.Lock()
		m.curWatch = w
		m.watchMu.Unlock()
		stop := make(chan struct{})
		go func(w *meta.EntryWatch) {
			for {
				select {
				case <-time.After(m.ents.progressEvery()):
					w.RequestProgress()
					if m.ents.silent() {
						// The watch stopped answering: etcd (or the way
						// to it) is gone, or too slow to serve.
						m.vol.Meta.Service().MarkUnreachable(cairn.E("watch", cairn.Unavailable, m.vol.Name(), errWatchSilent))
					}
				case <-stop:
					return
				}
			}
		}(w)
		var err error
		for {
			var ev meta.EntryEvents
			if ev, err = w.Next(); err != nil {
				break
			}
			m.ents.apply(ev)
			m.lc.Apply(ev)
		}
		close(stop)
		w.Close()
		m.ents.broken()
		w = nil
		if ctx.Err() != nil {
			return
		}
		m.log.Warn("the watch on the volume ended: every open asks the metadata service until it is back", "err", err)
		down = true
	}
}

// sweep removes the empty cache directories of mounts whose process is
// gone (killed), and names the ones that still hold copies: they may hold
// writes that were never committed.
func sweep(cacheDir string, log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(cacheDir, "mount-*-*"))
	for _, d := range dirs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(d), "mount-%d-", &pid); err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // alive (or not ours to judge)
		}
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("a mount that ended without unmounting left copies of open files (possibly unsaved writes)", "dir", d)
		}
	}
}

// Dir returns the mount point (absolute).
func (m *Mount) Dir() string { return m.dir }

// Unmount asks the kernel to unmount. It fails with Kind Conflict while a
// file on the mount is open or a process has its working directory there.
// Wait still has to be called.
func (m *Mount) Unmount() error {
	if err := m.server.Unmount(); err != nil {
		return unmountErr(m.dir, err.Error())
	}
	return nil
}

// Wait returns once the file system is unmounted, every commit begun by
// a close has finished, and the queue of non-blocking mode has committed
// what it could (what it could not stays queued on disk for the next
// mount). Copies the kernel never released are closed; any with writes
// never committed go to the cache's unsaved/ directory (logged).
func (m *Mount) Wait() {
	m.server.Wait()
	m.busyMu.Lock()
	for m.busyN > 0 {
		m.idle.Wait()
	}
	m.busyMu.Unlock()
	m.doneOnce.Do(func() {
		m.stopHeldWatch() // before the copies it may be settling are closed
		for _, c := range m.cache.openContents() {
			c.mu.Lock()
			ptw := c.ptw
			c.mu.Unlock()
			var err error
			if ptw {
				// The kernel's own writes (passthrough) are only in the
				// file: taken into c (dirty) before it is judged, as at a
				// last writer's release.
				err = m.settlePT(c)
			}
			c.mu.Lock()
			if c.dirty || err != nil {
				c.keep = true
			}
			c.mu.Unlock()
			m.cache.forceClose(c)
		}
		m.endHeld()
		m.shutdown()
		m.stopStatus()
		m.log.Info("unmounted")
	})
}

// Pending returns how many commits the queue of non-blocking and
// write-back modes has still to do, counting the files closed in
// write-back mode whose commit is not queued yet (it is queued at the
// kernel's release, after the close returns) and the last writers'
// releases queueing one. Status also counts write-back's pending
// namespace changes.
func (m *Mount) Pending() int {
	return int(m.closed.Load()) + m.queue.len() + int(m.releasing.Load())
}

// WriteHandles returns how many handles open for writing the kernel has
// not released yet.
func (m *Mount) WriteHandles() int { return int(m.writeHandles.Load()) }

func (m *Mount) begin() {
	m.busyMu.Lock()
	m.busyN++
	m.busyMu.Unlock()
}

func (m *Mount) end() {
	m.busyMu.Lock()
	m.busyN--
	if m.busyN == 0 {
		m.idle.Broadcast()
	}
	m.busyMu.Unlock()
}

// Available reports why this machine cannot mount (Kind Unavailable), or
// nil: /dev/fuse must open and fusermount3 (Debian's fuse3) be installed.
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return cairn.E("mount", cairn.Unavailable, "/dev/fuse", fmt.Errorf("no usable /dev/fuse: %w", err))
	}
	f.Close()
	_, err = fusermount()
	return err
}

// fusermount is the helper that unmounts without privileges (Debian's
// fuse3 package).
func fusermount() (string, error) {
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	for _, p := range []string{"/bin/fusermount3", "/usr/bin/fusermount3"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", cairn.E("unmount", cairn.Unavailable, "fusermount3", errors.New("fusermount3 not found: install Debian's fuse3"))
}

// Unmount unmounts the FUSE file system at dir with fusermount3 -u (with
// lazy: -z, detaching it now and letting open files finish). Errors: Kind
// NotFound when nothing is mounted there, Kind Conflict when it is busy.
func Unmount(dir string, lazy bool) error {
	bin, err := fusermount()
	if err != nil {
		return err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return cairn.E("unmount", cairn.Invalid, dir, err)
	}
	if mounted, ierr := IsMounted(abs); ierr == nil && !mounted {
		return cairn.E("unmount", cairn.NotFound, abs, errors.New("nothing is mounted there"))
	}
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	out, err := exec.Command(bin, append(args, "--", abs)...).CombinedOutput()
	if err != nil {
		return unmountErr(abs, strings.TrimSpace(string(out))+" ("+err.Error()+")")
	}
	return nil
}

func unmountErr(dir, msg string) error {
	switch {
	case strings.Contains(msg, "not found in") || strings.Contains(msg, "not mounted"):
		return cairn.E("unmount", cairn.NotFound, dir, errors.New("nothing is mounted there"))
	case strings.Contains(msg, "busy"):
		return cairn.E("unmount", cairn.Conflict, dir, errors.New("busy: a file there is open or a process works in it (--lazy detaches it now)"))
	}
	return cairn.E("unmount", cairn.IO, dir, errors.New(msg))
}

// Repair unmounts dir if it is a FUSE mount point whose server is gone (a
// killed mount: every access fails with ENOTCONN until it is unmounted),
// and reports whether it did. Any other state of dir is left alone.
func Repair(dir string) (bool, error) {
	if _, err := os.Stat(dir); !errors.Is(err, syscall.ENOTCONN) {
		return false, nil
	}
	if err := Unmount(dir, false); err != nil {
		// Something still holds it (a process with its working directory
		// there): detach it; the kernel drops it when they let go.
		if err := Unmount(dir, true); err != nil {
			return false, err
		}
	}
	if _, err := os.Stat(dir); errors.Is(err, syscall.ENOTCONN) {
		return false, cairn.E("repair mount point", cairn.IO, dir, errors.New("still not connected after fusermount3 -u"))
	}
	return true, nil
}

// IsMounted reports whether a FUSE file system is mounted on dir
// (absolute), from /proc/self/mountinfo.
func IsMounted(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	if real, err := filepath.EvalSymlinks(filepath.Dir(dir)); err == nil {
		dir = filepath.Join(real, filepath.Base(dir))
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source ...
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != dir {
			continue
		}
		if _, rest, ok := strings.Cut(line, " - "); ok && strings.HasPrefix(rest, "fuse") {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) of
// a path in /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			ok := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					ok = false
					break
				}
				c = c*8 + byte(d-'0')
			}
			if ok {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// errno turns an error of the layers below into what a system call
// returns. Errors that mean "the system failed" (not "the request was
// wrong") are logged: the caller only ever sees EIO.
func (m *Mount) errno(op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	if errors.Is(err, meta.ErrOfflineWrites) {
		return syscall.EROFS
	}
	switch cairn.KindOf(err) {
	case cairn.NotFound:
		return syscall.ENOENT
	case cairn.Exist:
		return syscall.EEXIST
	case cairn.Invalid:
		return syscall.EINVAL
	case cairn.Permission:
		return syscall.EACCES
	case cairn.IsDir:
		return syscall.EISDIR
	case cairn.NotDir:
		return syscall.ENOTDIR
	case cairn.NotEmpty:
		return syscall.ENOTEMPTY
	case cairn.Conflict:
		m.log.Warn(op+" failed", "path", path, "err", err)
		return syscall.EBUSY
	case cairn.Canceled:
		return syscall.EINTR
	}
	m.log.Error(op+" failed", "path", path, "err", err)
	return syscall.EIO
}

// String describes the mount for logs.
func (m *Mount) String() string { return fmt.Sprintf("%s on %s", m.vol.Name(), m.dir) }

// Serving returns the cache directory (under cacheRoot, Options.CacheDir)
// held by the mount process serving mount point dir, or "" if none is
// found: the directory whose lock file names dir and is locked.
func Serving(cacheRoot, dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	locks, _ := filepath.Glob(filepath.Join(cacheRoot, "*", "lock"))
	for _, l := range locks {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(line, "mountpoint "); ok && p == abs {
				if busy, _ := CacheState(filepath.Dir(l)); busy {
					return filepath.Dir(l)
				}
			}
		}
	}
	return ""
}

// CacheState reports whether a mount process still holds cache directory
// dir (it lets it go last, once its queue has committed what it could),
// and how many commits are queued in it.
func CacheState(dir string) (busy bool, queued int) {
	queued = queuedIn(filepath.Join(dir, "queue"))
	f, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		return false, queued
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK), queued
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false, queued
}
