package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/vpath"
)

func (e *env) getCmd() *cobra.Command {
	var version uint64
	var workers int
	c := &cobra.Command{
		Use:   "get [flags] VOLUME:/PATH DEST",
		Short: "Copy a file or directory (recursively) out of cairn",
		Long: `Copy VOLUME:/PATH to the local DEST, restoring modes, mtimes and symlinks.
If DEST is an existing directory, PATH lands inside it under its own name.
Every byte is verified (hash and authentication tag) before it is written.
Files are written to a temporary name and renamed into place, so an
interrupted get never leaves a half-written file under the real name.
Nothing is written through a symlink below DEST: a file, symlink or
directory replaces a symlink in its way. Records that do not check out
(a name that differs from the record's key, '..', a '/') are reported and
skipped; the rest is restored and get exits 1.
A file made on some device and still being written there for the first time
(no content committed yet, its writer lock held) is skipped and named on
stderr, and get exits 1: get it again later ('cairn ls' does not list it).
FIFOs and unix sockets are made as such (mknod, as tar and rsync do), with
their mode and mtime. Device nodes are made when get may (root, CAP_MKNOD);
otherwise each is skipped with a warning on stderr, a count follows at the
end, and get exits 0 for them (as rsync does: the rest is restored).`,
		Example: `  cairn get home:/Documents ~/restore
  cairn get --version 3 home:/notes.txt ./notes-v3.txt`,
		Args: exactArgs(2, "VOLUME:/PATH and a local DEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			e.allowOffline = true
			if !vpath.IsRemote(args[0]) {
				return withCode(ExitUsage, fmt.Errorf("get: %q is not a cairn path (VOLUME:/PATH)", args[0]))
			}
			v, p, err := e.vol(ctx, args[0])
			if err != nil {
				return err
			}
			ent, err := v.Meta.Lookup(ctx, p.Parts)
			if err != nil {
				return err
			}
			dest := args[1]
			if st, serr := os.Stat(dest); serr == nil && st.IsDir() {
				if !p.IsRoot() {
					dest = filepath.Join(dest, p.Base())
				}
			}
			var ver *meta.Version
			if version != 0 {
				if ver, err = findVersion(ent, p.String(), version); err != nil {
					return err
				}
			}
			if workers <= 0 {
				workers = 2 * runtime.GOMAXPROCS(0)
			}
			err = e.get(ctx, v, ent, p.String(), dest, ver, workers)
			if nh := notHere("get", p.String(), err); nh != nil {
				return nh
			}
			return err
		},
	}
	c.Flags().Uint64Var(&version, "version", 0, "version number of a file to get (see 'cairn versions')")
	c.Flags().BoolVar(&e.noCache, "no-cache", false, "read from the stores that hold the data, bypassing this device's chunk cache (to check the remote copies)")
	c.Flags().IntVar(&workers, "workers", 0, "files read in parallel (default 2 per core)")
	e.wakeFlag(c)
	return c
}

func findVersion(e *meta.Entry, path string, n uint64) (*meta.Version, error) {
	for i := range e.Versions {
		if e.Versions[i].N == n {
			return &e.Versions[i], nil
		}
	}
	return nil, cairn.E("version", cairn.NotFound, path, fmt.Errorf("no version %d (see 'cairn versions %s')", n, path))
}

type getJob struct {
	ent  *meta.Entry
	path string
	dir  *localDir
	name string
}

type dirTime struct {
	dir   *localDir
	mode  os.FileMode
	mtime time.Time
}

func (e *env) get(ctx context.Context, v *fs.Volume, root *meta.Entry, rootPath, dest string, ver *meta.Version, workers int) error {
	if root.Type.Special() {
		dest = filepath.Clean(dest)
		dir, err := openTop(filepath.Dir(dest))
		if err != nil {
			return err
		}
		defer unix.Close(dir)
		made, err := makeSpecial(dir, filepath.Base(dest), dest, root)
		if err == nil && !made {
			fmt.Fprintf(e.stderr, "cairn: skipping %s: making a device node needs root (CAP_MKNOD)\n", rootPath)
		}
		return err
	}
	if !root.IsDir() {
		if ver == nil {
			ver = root.Current()
		}
		if pending, err := firstWritePending(ctx, v.Meta, root); err != nil {
			return err
		} else if pending && ver == nil {
			return cairn.E("get", cairn.Conflict, rootPath, errors.New("its first content is not committed yet (a writer on some device holds it); get it again later"))
		}
		return writeLocalFile(ctx, v, root, ver, dest)
	}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	top, err := openTop(dest)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	var files []getJob
	var dirs []dirTime
	var total int64
	var failed atomic.Int64
	var devSkipped int
	seen := map[uint64]bool{}        // directories entered: a looping record cannot recurse forever
	linkFirst := map[uint64]getJob{} // the first name met of each file with several
	var links []getLink
	// walk restores ent, whose parent directory d is open as fd (which walk
	// does not close), under name (ignored for the top).
	var walk func(ent *meta.Entry, path string, d *localDir, fd int) error
	walk = func(ent *meta.Entry, path string, d *localDir, fd int) error {
		switch ent.Type {
		case meta.TypeDir:
			if seen[ent.Ino] {
				fmt.Fprintf(e.stderr, "cairn: skipping %s: %v\n", path, cairn.E("get", cairn.Corrupt, path, errors.New("directory appears twice in the tree")))
				failed.Add(1)
				return nil
			}
			seen[ent.Ino] = true
			dfd := fd
			if d.parent != nil {
				var err error
				if dfd, err = mkdirEnter(fd, d.name, d.path); err != nil {
					fmt.Fprintf(e.stderr, "cairn: %v\n", err)
					failed.Add(1)
					return nil
				}
				defer unix.Close(dfd)
			}
			dirs = append(dirs, dirTime{dir: d, mode: os.FileMode(ent.Mode & 0o7777), mtime: time.Unix(0, ent.Mtime)})
			kids, err := v.Meta.ReadDirSkip(ctx, ent.Ino, func(err error) {
				fmt.Fprintf(e.stderr, "cairn: skipping a record in %s: %v\n", path, err)
				failed.Add(1)
			})
			if err != nil {
				return err
			}
			for i := range kids {
				k := &kids[i]
				// Names come from metadata: check them again before they
				// become local names, so nothing can climb out of dest.
				if err := vpath.ValidName(k.Name); err != nil {
					fmt.Fprintf(e.stderr, "cairn: skipping %s/%q: %v\n", path, k.Name, err)
					failed.Add(1)
					continue
				}
				kd := &localDir{parent: d, name: k.Name, path: filepath.Join(d.path, k.Name)}
				if err := walk(k, joinPath(path, k.Name), kd, dfd); err != nil {
					return err
				}
			}
		case meta.TypeSymlink:
			if err := makeSymlink(fd, d.name, ent.Target, d.path, time.Unix(0, ent.Mtime)); err != nil {
				fmt.Fprintf(e.stderr, "cairn: %v\n", err)
				failed.Add(1)
			}
		case meta.TypeFIFO, meta.TypeSocket, meta.TypeChar, meta.TypeBlock:
			made, err := makeSpecial(fd, d.name, d.path, ent)
			switch {
			case err != nil:
				fmt.Fprintf(e.stderr, "cairn: %v\n", err)
				failed.Add(1)
			case !made:
				fmt.Fprintf(e.stderr, "cairn: skipping %s: making a device node needs root (CAP_MKNOD)\n", path)
				devSkipped++
			}
		case meta.TypeFile:
			if pending, perr := firstWritePending(ctx, v.Meta, ent); perr != nil {
				return perr
			} else if pending {
				fmt.Fprintf(e.stderr, "cairn: skipping %s: its first content is not committed yet (a writer on some device holds it); get it again later\n", path)
				failed.Add(1)
				return nil
			}
			j := getJob{ent: ent, path: path, dir: d.parent, name: d.name}
			if ent.Nlink() > 1 {
				// A file with several names in the tree is written once
				// and linked to its other names (as tar and rsync -H).
				if first, ok := linkFirst[ent.Ino]; ok {
					links = append(links, getLink{first: first, to: j})
					return nil
				}
				linkFirst[ent.Ino] = j
			}
			files = append(files, j)
			total += ent.Size
		}
		return nil
	}
	if err := walk(root, rootPath, &localDir{path: dest}, top); err != nil {
		return err
	}
	prog := newProgress(e.stderr, !e.quiet && isTerminal(e.stderr), int64(len(files)), total)
	defer prog.finish()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range files {
		j := files[i]
		g.Go(func() error {
			err := func() error {
				dfd, err := j.dir.open(top)
				if err != nil {
					return err
				}
				defer unix.Close(dfd)
				return writeFileAt(gctx, v, j.ent, j.ent.Current(), dfd, j.name, filepath.Join(j.dir.path, j.name))
			}()
			if err != nil {
				if gctx.Err() != nil || cairn.KindOf(err) == cairn.Unavailable {
					return err
				}
				prog.println(fmt.Sprintf("cairn: %s: %v", j.path, err))
				failed.Add(1)
			}
			prog.add(1, j.ent.Size, 0)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for _, l := range links {
		if err := l.make(top); err != nil {
			prog.println(fmt.Sprintf("cairn: %s: %v", l.to.path, err))
			failed.Add(1)
		}
	}
	prog.finish()
	// Directory modes and mtimes last, deepest first, once their contents are in.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = setDirAttrs(top, dirs[i].dir, dirs[i].mode, dirs[i].mtime)
	}
	if devSkipped > 0 {
		fmt.Fprintf(e.stderr, "cairn: skipped %d device node(s): making them needs root (CAP_MKNOD)\n", devSkipped)
	}
	if n := failed.Load(); n > 0 {
		return withCode(ExitError, fmt.Errorf("get: %d item(s) could not be restored", n))
	}
	return nil
}

// writeLocalFile writes one version of a file to the local path dest (which
// the user named) through a temporary file in the same directory, then
// renames it into place.
func writeLocalFile(ctx context.Context, v *fs.Volume, ent *meta.Entry, ver *meta.Version, dest string) error {
	dest = filepath.Clean(dest)
	dir, err := openTop(filepath.Dir(dest))
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	return writeFileAt(ctx, v, ent, ver, dir, filepath.Base(dest), dest)
}

// firstWritePending reports whether file ent has no version yet while a
// writer holds its lock: made on some device and being written for the
// first time (a mount's create reaches the metadata before the commit of
// the close), not a file made empty. Readers skip it instead of making
// an empty copy.
func firstWritePending(ctx context.Context, mv *meta.Vol, ent *meta.Entry) (bool, error) {
	if ent.Type != meta.TypeFile || ent.Current() != nil {
		return false, nil
	}
	return mv.LockHeld(ctx, ent.Parent, ent.Name)
}

// getLink is a further name (to) of a file that get writes under first.
type getLink struct{ first, to getJob }

// make links l.to to the file written as l.first, replacing what the
// name held.
func (l getLink) make(top int) error {
	ffd, err := l.first.dir.open(top)
	if err != nil {
		return err
	}
	defer unix.Close(ffd)
	tfd, err := l.to.dir.open(top)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err = unix.Unlinkat(tfd, l.to.name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return cairn.E("get", cairn.IO, filepath.Join(l.to.dir.path, l.to.name), err)
	}
	if err = unix.Linkat(ffd, l.first.name, tfd, l.to.name, 0); err != nil {
		return cairn.E("get", cairn.IO, filepath.Join(l.to.dir.path, l.to.name), err)
	}
	return nil
}

// notHere returns, for a read that failed offline because data is not on
// this device (director.ErrNotHere), the error that says so of path
// (Kind Unavailable: exit 6); nil for any other error.
func notHere(op, path string, err error) error {
	if err == nil || !errors.Is(err, director.ErrNotHere) {
		return nil
	}
	return cairn.E(op, cairn.Unavailable, path, fmt.Errorf("offline: %s is not on this device (%w)", path, err))
}
