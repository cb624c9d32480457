package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
)

// envMountChild marks the process 'cairn mount' starts in the background:
// file descriptor 3 is a pipe on which it reports "ready" or "error MSG",
// and a passphrase the parent asked for arrives on its standard input.
const envMountChild = "CAIRN_MOUNT_CHILD"

// mountReadyTimeout bounds how long 'cairn mount' waits for its
// background process to mount.
const mountReadyTimeout = 2 * time.Minute

// envQueueDelay holds each queued commit of a non-blocking mount back
// (a duration): for tests that kill a mount with commits queued.
const envQueueDelay = "CAIRN_MOUNT_QUEUE_DELAY"

func (e *env) mountCmds() []*cobra.Command {
	var foreground, debug, allowOther, devices bool
	var attrTimeout time.Duration
	var cacheSize, mode, passthrough, metricsAddr string
	m := &cobra.Command{
		Use:   "mount [--foreground] [--mode blocking|non-blocking|write-back] [--passthrough auto|off] [--cache-size SIZE] [--allow-other] [--dev] VOLUME MOUNTPOINT",
		Short: "Mount a volume as a directory (FUSE)",
		Long: `Mount VOLUME (for example 'home') on the directory MOUNTPOINT, so unmodified
programs read and write it. It runs in the background (log: $CAIRN_HOME/mount.log)
until 'cairn umount MOUNTPOINT'; --foreground stays attached and unmounts on
Ctrl-C or SIGTERM. A mount point left broken by a killed mount is repaired first.

Three modes say what a close waits for (doc/durability.md has the whole table).

--mode write-back (the default): close waits for nothing the network does. A
file's new version is committed once the last descriptor open for writing on
this device is closed (the kernel's release, just after close returns; the close
only has the mount count the file as pending, one round trip), and
creates, mkdirs, symlinks, special files (mknod) and attribute changes this
mount can decide alone (a new name in a directory whose every entry it knows) return at once and are
written to the metadata in batches, many per transaction: tar x and git clone
wait for no round trip per file. That work starts once the mount has had no
request for 20 ms, at the latest 2 s (changes) and 5 s (commits) after it was
made; other devices see it then, and a new file only with its first content
(its create and first version are one transaction). fsync of a file or
directory writes it at once, as on a local disk; 'cairn status' shows what is
still pending and 'cairn umount' waits for it. A name made here and on another
device at once is kept under both (this device's as NAME.conflict-XXXXXXXX,
logged). A mount killed before a batch is written loses the changes fsync did
not cover (its closed files' contents are kept: the next mount commits them
under the file's last name, or keeps them in unsaved/ and logs why).

--mode blocking: close-to-open consistency: every close of a descriptor that
wrote commits the copy as a new version (close returns the commit's error),
which any later open on any device sees.

--mode non-blocking (experimental): close returns once the writes are durable
on local disk and a queue on disk commits them in the background (in order; a
mount killed or unmounted with commits queued leaves them for the next mount
of the volume); other devices see the new version once it is committed.

In every mode an open serves the file's current version from a copy on local
disk. Copies are kept in a cache per volume ($CAIRN_HOME/mountcache/VOLUME-ID)
across mounts, least recently used evicted past --cache-size (default: a tenth
of the free disk, at most 4GiB); a watch on the metadata keeps this mount's
view current, so opening an unchanged cached file asks no server anything (a
change made on another device is seen once the watch reports it: normally
milliseconds, at most 6 s if the watch stalls). Attributes are cached by the
kernel for --attr-timeout (0 disables). Earlier versions stay in 'cairn
versions'.

Passthrough (--passthrough auto, the default): the kernel reads and writes open
files' local copies itself, at local-disk speed (FUSE passthrough: Linux 6.9 or
later, running as root, blocking or write-back mode, file leases on the cache's disk;
elsewise the log says why and the mount serves reads and writes itself, as
--passthrough off always does). Descriptors
still open on a file see another device's new version replace its bytes in
place when this device opens it again. Stores through a shared writable
mapping (mmap) after its descriptor's close are not seen at the close: the mount holds such a copy until a file lease shows the
mapping gone, then commits it again as a new version if it changed (logged).
Meanwhile opens on this device read it; other devices read the version
committed at the close. A copy still held when the mount ends is kept in the
cache's unsaved/ directory.

An open for writing takes the file's writer lock, held until the last writer on
this device has closed and its commit is done; another device's open for writing
fails meanwhile with "Device or resource busy" (EBUSY), and its mount log names
the file. The lock of a mount that was killed lapses with its lease
(CAIRN_LOCK_TTL, default 15s).

Only the user who mounts may use the mount (the kernel refuses others: EACCES).
With --allow-other, other users may too, and the kernel checks their access by
the files' modes and owners as on a local disk (owner, group, other bits; sticky
directories; set-ID bits cleared by a write of another user and by chown). A
user other than root may mount with --allow-other only if /etc/fuse.conf has a
line user_allow_other (fusermount3 requires it): add it as root; 'cairn mount'
checks for it and says so before mounting. Owners are numeric IDs, the same on
every device.

Extended attributes of the user.* namespace are kept (other namespaces:
EOPNOTSUPP). FIFOs, unix sockets and device nodes are kept (type, mode, owner,
device number) and seen by every device; the kernel serves a FIFO's data and a
socket's connections on the machine that opens them. Device nodes open as
devices only with --dev (root; otherwise the mount is nodev and an open of one
fails with EACCES). Hard links of regular files work (at most 64 names; of a
symlink or special file: EPERM). Not supported: RENAME_EXCHANGE (EINVAL); atime
reads as mtime. Writes not yet closed when the mount is killed are not
committed (in write-back mode, an fsync'd file is: the next mount commits what
the fsync made durable): the next mount keeps them in the cache's unsaved/
directory and logs where. A volume is mounted once per device.`,
		Args: exactArgs(2, "VOLUME and MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			// A mount starts offline from the volume's local copy when
			// the metadata service cannot be reached (doc/offline.md).
			e.allowOffline = true
			name, err := mountVolumeName(args[0])
			if err != nil {
				return err
			}
			dir, err := filepath.Abs(args[1])
			if err != nil {
				return cairn.E("mount", cairn.Invalid, args[1], err)
			}
			if attrTimeout < 0 {
				return withCode(ExitUsage, errors.New("mount: --attr-timeout must not be negative"))
			}
			o := mount.Options{AttrTimeout: attrTimeout, Debug: debug, CacheDir: filepath.Join(e.home, "mountcache"), LocalCopyDir: filepath.Join(e.home, "offline"), AllowOther: allowOther, Devices: devices}
			if devices && os.Geteuid() != 0 {
				return withCode(ExitUsage, errors.New("mount: --dev needs root (fusermount3 mounts every other user's FUSE mount nodev)"))
			}
			if allowOther {
				if err = mount.CheckAllowOther(mount.FuseConf); err != nil {
					return err
				}
			}
			if attrTimeout == 0 {
				o.AttrTimeout = mount.NoAttrCache
			}
			if o.Mode, err = mount.ParseMode(mode); err != nil {
				return withCode(ExitUsage, err)
			}
			if o.Passthrough, err = mount.ParsePassthrough(passthrough); err != nil {
				return withCode(ExitUsage, err)
			}
			if cacheSize != "" {
				if o.CacheSize, err = parseSize(cacheSize); err != nil || o.CacheSize <= 0 {
					return withCode(ExitUsage, fmt.Errorf("mount: --cache-size %q: want a size such as 512MiB or 4GiB", cacheSize))
				}
			}
			if s := os.Getenv(envQueueDelay); s != "" {
				if o.QueueDelay, err = time.ParseDuration(s); err != nil {
					return withCode(ExitUsage, fmt.Errorf("mount: %s=%q: %v", envQueueDelay, s, err))
				}
			}
			var extra []string // flags the background mount process is given
			if foreground || os.Getenv(envMountChild) != "" {
				if err := e.serveMetrics(cmd.Context(), metricsAddr); err != nil {
					return err
				}
				return e.mountHere(cmd.Context(), name, dir, o)
			}
			if metricsAddr != "" {
				extra = append(extra, "--metrics", metricsAddr)
			}
			if cacheSize != "" {
				extra = append(extra, "--cache-size", cacheSize)
			}
			extra = append(extra, "--mode", o.Mode.String())
			extra = append(extra, "--passthrough", o.Passthrough.String())
			if allowOther {
				extra = append(extra, "--allow-other")
			}
			if devices {
				extra = append(extra, "--dev")
			}
			return e.mountBackground(cmd.Context(), name, dir, o.Mode, attrTimeout, debug, extra)
		},
	}
	e.wakeFlag(m)
	m.Flags().BoolVar(&foreground, "foreground", false, "stay in the foreground; Ctrl-C or SIGTERM unmounts")
	m.Flags().DurationVar(&attrTimeout, "attr-timeout", mount.DefaultAttrTimeout, "how long the kernel caches attributes and names (0: not at all)")
	m.Flags().BoolVar(&debug, "debug", false, "log every FUSE request (to the log, or stderr with --foreground)")
	m.Flags().StringVar(&mode, "mode", "write-back", "write-back: close returns at once, the last writer's close queues the commit, and creates, mkdirs and attribute changes are written in batches (fsync writes at once); blocking: close commits; non-blocking (experimental): close returns once the writes are durable locally, a queue commits them")
	m.Flags().StringVar(&passthrough, "passthrough", "auto", "auto: the kernel reads and writes open files' local copies itself where it can (FUSE passthrough: Linux 6.9+, root, blocking or write-back mode, file leases on the cache's disk; elsewise the log says why and the mount serves them); off: always through the mount")
	m.Flags().BoolVar(&allowOther, "allow-other", false, "let other users use the mount, their access checked by the files' modes and owners (not root: needs user_allow_other in /etc/fuse.conf)")
	m.Flags().BoolVar(&devices, "dev", false, "let device nodes on the mount be opened as devices (root only; default: nodev, an open of one fails with EACCES)")
	metricsFlag(m, &metricsAddr)
	m.Flags().StringVar(&cacheSize, "cache-size", "", "bound of the whole-file cache, such as 2GiB (default: a tenth of the free disk, at most 4GiB)")

	var lazy bool
	u := &cobra.Command{
		Use:   "umount [--lazy] MOUNTPOINT",
		Short: "Unmount a volume mounted with 'cairn mount'",
		Long: `Unmount MOUNTPOINT (fusermount3 -u). In blocking mode every close has already
committed its file. In non-blocking and write-back modes, the mount's process
commits its queued files before it exits, and 'cairn umount' waits for that,
saying on stderr how many commits it is waiting for; it returns once the
process has exited, and says how many (if any) it left queued for the next
mount of the volume (a commit that failed: the mount log says why). Ctrl-C
stops the waiting, not the commits.

It fails while a file there is open or a process works in it; --lazy detaches
it at once and lets them finish, and returns without waiting: the mount's
process finishes its queue in the background and exits (its log says when).
A mount point left broken by a killed mount is unmounted too.`,
		Args: exactArgs(1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.umount(cmd.Context(), args[0], lazy)
		},
	}
	u.Flags().BoolVar(&lazy, "lazy", false, "detach now even if busy (fusermount3 -u -z), and let the mount's process finish its queued commits in the background")
	return []*cobra.Command{m, u}
}

// mountVolumeName accepts "home", "home:" and "home:/".
func mountVolumeName(s string) (string, error) {
	name, rest, hasColon := strings.Cut(s, ":")
	if hasColon && strings.Trim(rest, "/") != "" {
		return "", cairn.E("mount", cairn.Invalid, s, errors.New("mounting a directory inside a volume is not supported yet: give the volume name"))
	}
	if err := vpath.ValidVolume(name); err != nil {
		return "", cairn.E("mount", cairn.Invalid, s, err)
	}
	return name, nil
}

// mountOpen opens the realm for a mount. In the background process a
// passphrase, if the keyring needs one and CAIRN_PASSPHRASE is unset,
// comes from the parent on standard input.
func (e *env) mountOpen(ctx context.Context, ask func() ([]byte, error)) (*realm.Realm, error) {
	o := e.options()
	if ask != nil {
		o.Passphrase = ask
	}
	r, err := realm.Open(ctx, e.home, o)
	if err != nil {
		return nil, err
	}
	e.realm = r
	return r, nil
}

// mountHere mounts in this process and serves until the file system is
// unmounted, from outside or by SIGINT/SIGTERM (ctx).
func (e *env) mountHere(ctx context.Context, name, dir string, o mount.Options) error {
	var ready *os.File
	var ask func() ([]byte, error)
	if os.Getenv(envMountChild) != "" {
		ready = os.NewFile(3, "ready")
		syscall.CloseOnExec(3) // not for fusermount3
		if _, ok := os.LookupEnv("CAIRN_PASSPHRASE"); !ok {
			ask = func() ([]byte, error) {
				p, err := io.ReadAll(e.stdin)
				if err != nil || len(p) == 0 {
					return nil, cairn.E("passphrase", cairn.Permission, "", errors.New("the keyring is sealed and no passphrase was passed to the mount"))
				}
				return p, nil
			}
		}
	}
	report := func(err error) error {
		if ready != nil {
			if err != nil {
				fmt.Fprintf(ready, "error %d %s\n", ExitCode(err), strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				fmt.Fprintln(ready, "ready")
			}
			ready.Close()
			ready = nil
		}
		return err
	}
	r, err := e.mountOpen(ctx, ask)
	if err != nil {
		return report(err)
	}
	v, err := r.Volume(ctx, name)
	if err != nil {
		return report(err)
	}
	v.SetPlacement(r.Placement(name))
	o.Logger = e.log
	m, err := mount.Start(ctx, v, dir, o)
	if err != nil {
		return report(err)
	}
	// 'cairn status' asks it what it has pending (status.go).
	if err := m.ServeStatus(mount.StatusSocket(runDir(e.home), name, os.Getpid())); err != nil {
		e.log.Warn("no status socket: 'cairn status' will not list this mount", "err", err)
	}
	fmt.Fprintf(e.stdout, "mounted %s at %s (%s; pid %d)\n", name, dir, o.Mode, os.Getpid())
	report(nil)
	done := make(chan struct{})
	go func() { m.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	// SIGINT or SIGTERM: unmount; if a file is still open there, detach
	// now and serve the open files until they are closed.
	if err := m.Unmount(); err != nil {
		fmt.Fprintf(e.stderr, "cairn: %v: detaching now; open files are served until they are closed\n", err)
		if err := mount.Unmount(dir, true); err != nil {
			return err
		}
	}
	<-done
	fmt.Fprintf(e.stdout, "unmounted %s\n", dir)
	return nil
}

// mountBackground checks what can be checked here (realm, volume, key,
// mount point), then starts this program again, detached, to serve the
// mount, and returns once it reports the mount ready.
func (e *env) mountBackground(ctx context.Context, name, dir string, mode mount.Mode, attrTimeout time.Duration, debug bool, extra []string) error {
	var pass []byte
	ask := e.passphrase(false)
	r, err := e.mountOpen(ctx, func() ([]byte, error) {
		p, err := ask()
		pass = p
		return p, err
	})
	if err != nil {
		return err
	}
	if _, err = r.Volume(ctx, name); err != nil {
		return err
	}
	if repaired, rerr := mount.Repair(dir); rerr != nil {
		return rerr
	} else if repaired {
		fmt.Fprintf(e.stderr, "cairn: repaired %s, left broken by a mount that was killed\n", dir)
	}
	if fi, serr := os.Stat(dir); serr != nil {
		return cairn.E("mount", cairn.NotFound, dir, errors.New("no such directory"))
	} else if !fi.IsDir() {
		return cairn.E("mount", cairn.NotDir, dir, errors.New("the mount point must be a directory"))
	}
	if mounted, ierr := mount.IsMounted(dir); ierr == nil && mounted {
		return cairn.E("mount", cairn.Exist, dir, errors.New("something is already mounted there (cairn umount it first)"))
	}

	exe, err := os.Executable()
	if err != nil {
		return cairn.E("mount", cairn.IO, "", err)
	}
	args := []string{"--home", e.home}
	if e.etcd != "" {
		args = append(args, "--etcd", e.etcd)
	}
	if e.verbose {
		args = append(args, "--verbose")
	}
	args = append(args, "mount", "--attr-timeout", attrTimeout.String())
	if debug {
		args = append(args, "--debug")
	}
	args = append(args, extra...)
	args = append(args, name, dir)
	logPath := filepath.Join(e.home, "mount.log")
	if fi, serr := os.Stat(logPath); serr == nil && fi.Size() > 1<<20 {
		_ = os.Rename(logPath, logPath+".old")
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return cairn.E("mount", cairn.IO, logPath, err)
	}
	defer logf.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return cairn.E("mount", cairn.IO, "", err)
	}
	defer readyR.Close()
	passR, passW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return cairn.E("mount", cairn.IO, "", err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), envMountChild+"=1")
	cmd.Dir = "/" // do not pin the caller's working directory
	cmd.Stdin, cmd.Stdout, cmd.Stderr = passR, logf, logf
	cmd.ExtraFiles = []*os.File{readyW} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	passR.Close()
	if err != nil {
		passW.Close()
		return cairn.E("mount", cairn.IO, exe, err)
	}
	passW.Write(pass) // empty when none was asked for
	passW.Close()

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(readyR).ReadString('\n')
		line <- strings.TrimSuffix(s, "\n")
	}()
	var msg string
	select {
	case msg = <-line:
	case <-ctx.Done():
		cmd.Process.Kill()
		cmd.Wait()
		return ctx.Err()
	case <-time.After(mountReadyTimeout):
		cmd.Process.Kill()
		cmd.Wait()
		return cairn.E("mount", cairn.Unavailable, dir, fmt.Errorf("the mount did not come up within %v (log: %s)", mountReadyTimeout, logPath))
	}
	if msg == "ready" {
		fmt.Fprintf(e.stdout, "mounted %s at %s (%s; pid %d, log %s); 'cairn umount %s' unmounts it\n", name, dir, mode, cmd.Process.Pid, logPath, dir)
		cmd.Process.Release()
		return nil
	}
	cmd.Wait()
	if code, text, ok := parseMountError(msg); ok {
		fmt.Fprintf(e.stderr, "cairn: %s\n", text)
		return withCode(code, errQuiet)
	}
	return cairn.E("mount", cairn.IO, dir, fmt.Errorf("the mount process exited without mounting (log: %s)", logPath))
}

// parseMountError reads the background process's "error CODE MESSAGE".
func parseMountError(msg string) (int, string, bool) {
	rest, ok := strings.CutPrefix(msg, "error ")
	if !ok {
		return 0, "", false
	}
	codeStr, text, _ := strings.Cut(rest, " ")
	var code int
	if _, err := fmt.Sscanf(codeStr, "%d", &code); err != nil || code == 0 {
		code = ExitError
	}
	return code, text, true
}

// umountPoll is how often 'cairn umount' looks at the queue it waits for.
const umountPoll = 100 * time.Millisecond

// umount unmounts dir and, unless lazy, waits until the mount's process
// has committed its queue (or given up on it) and exited.
func (e *env) umount(ctx context.Context, dir string, lazy bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return cairn.E("unmount", cairn.Invalid, dir, err)
	}
	cache := mount.Serving(filepath.Join(e.home, "mountcache"), abs)
	if err := mount.Unmount(abs, lazy); err != nil {
		return err
	}
	if cache == "" {
		return nil // not a mount of this realm's (or its process is gone)
	}
	busy, queued := mount.CacheState(cache)
	if lazy {
		if busy && queued > 0 {
			fmt.Fprintf(e.stderr, "cairn: detached %s; its mount process commits its %d queued %s in the background, then exits (log: %s)\n", abs, queued, plural(queued, "file", "files"), filepath.Join(e.home, "mount.log"))
		}
		return nil
	}
	most, said := queued, -1
	for busy {
		if queued != said && queued > 0 {
			fmt.Fprintf(e.stderr, "cairn: waiting for %d queued %s of %s\n", queued, plural(queued, "commit", "commits"), abs)
			said = queued
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(e.stderr, "cairn: stopped waiting; the mount's process goes on committing %d queued %s in the background\n", queued, plural(queued, "file", "files"))
			return ctx.Err()
		case <-time.After(umountPoll):
		}
		busy, queued = mount.CacheState(cache)
		most = max(most, queued)
	}
	switch {
	case queued > 0:
		fmt.Fprintf(e.stderr, "cairn: unmounted %s with %d %s still queued (the mount log says why): the next mount of the volume commits them\n", abs, queued, plural(queued, "commit", "commits"))
	case most > 0:
		fmt.Fprintf(e.stderr, "cairn: unmounted %s after its %d queued %s\n", abs, most, plural(most, "commit", "commits"))
	}
	return nil
}

// plural is one if n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
