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

	"cairn.dev/cairn/internal/cairn"
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
A file made on some device and still being written there for the first time
(no content committed yet, its writer lock held) is skipped and named on
stderr, and get exits 1: get it again later ('cairn ls' does not list it).`,
		Example: `  cairn get home:/Documents ~/restore
  cairn get --version 3 home:/notes.txt ./notes-v3.txt`,
		Args: exactArgs(2, "VOLUME:/PATH and a local DEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
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
			if st, err := os.Stat(dest); err == nil && st.IsDir() {
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
			return e.get(ctx, v, ent, p.String(), dest, ver, workers)
		},
	}
	c.Flags().Uint64Var(&version, "version", 0, "version number of a file to get (see 'cairn versions')")
	c.Flags().BoolVar(&e.noCache, "no-cache", false, "read from the stores that hold the data, bypassing this device's chunk cache (to check the remote copies)")
	c.Flags().IntVar(&workers, "workers", 0, "files read in parallel (default 2 per core)")
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
	dest string
}

type dirTime struct {
	dest  string
	mode  os.FileMode
	mtime time.Time
}

func (e *env) get(ctx context.Context, v *fs.Volume, root *meta.Entry, rootPath, dest string, ver *meta.Version, workers int) error {
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
	var files []getJob
	var dirs []dirTime
	var total int64
	var failed atomic.Int64
	var walk func(ent *meta.Entry, path, dest string) error
	walk = func(ent *meta.Entry, path, dest string) error {
		switch ent.Type {
		case meta.TypeDir:
			if err := os.MkdirAll(dest, 0o700); err != nil {
				return cairn.E("get", cairn.IO, dest, err)
			}
			dirs = append(dirs, dirTime{dest: dest, mode: os.FileMode(ent.Mode & 0o7777), mtime: time.Unix(0, ent.Mtime)})
			kids, err := v.Meta.ReadDir(ctx, ent.Ino)
			if err != nil {
				return err
			}
			for i := range kids {
				k := &kids[i]
				// Names come from metadata: check them again before they
				// become local paths, so nothing can climb out of dest.
				if err := vpath.ValidName(k.Name); err != nil {
					fmt.Fprintf(e.stderr, "cairn: skipping %s/%q: %v\n", path, k.Name, err)
					failed.Add(1)
					continue
				}
				if err := walk(k, joinPath(path, k.Name), filepath.Join(dest, k.Name)); err != nil {
					return err
				}
			}
		case meta.TypeSymlink:
			_ = os.Remove(dest)
			if err := os.Symlink(ent.Target, dest); err != nil {
				fmt.Fprintf(e.stderr, "cairn: %s: %v\n", dest, err)
				failed.Add(1)
				return nil
			}
			mt := time.Unix(0, ent.Mtime)
			_ = lutimes(dest, mt)
		case meta.TypeFile:
			if pending, err := firstWritePending(ctx, v.Meta, ent); err != nil {
				return err
			} else if pending {
				fmt.Fprintf(e.stderr, "cairn: skipping %s: its first content is not committed yet (a writer on some device holds it); get it again later\n", path)
				failed.Add(1)
				return nil
			}
			files = append(files, getJob{ent: ent, path: path, dest: dest})
			total += ent.Size
		}
		return nil
	}
	if err := walk(root, rootPath, dest); err != nil {
		return err
	}
	prog := newProgress(e.stderr, !e.quiet && isTerminal(e.stderr), int64(len(files)), total)
	defer prog.finish()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range files {
		j := files[i]
		g.Go(func() error {
			err := writeLocalFile(gctx, v, j.ent, j.ent.Current(), j.dest)
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
	prog.finish()
	// Directory modes and mtimes last, deepest first, once their contents are in.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Chmod(dirs[i].dest, dirs[i].mode)
		_ = os.Chtimes(dirs[i].dest, dirs[i].mtime, dirs[i].mtime)
	}
	if n := failed.Load(); n > 0 {
		return withCode(ExitError, fmt.Errorf("get: %d item(s) could not be restored", n))
	}
	return nil
}

// writeLocalFile writes one version of a file to dest through a temporary
// file in the same directory, then renames it into place.
func writeLocalFile(ctx context.Context, v *fs.Volume, ent *meta.Entry, ver *meta.Version, dest string) error {
	if st, err := os.Lstat(dest); err == nil && st.IsDir() {
		return cairn.E("get", cairn.IsDir, dest, errors.New("a local directory is in the way"))
	}
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".cairn-get-*")
	if err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if ver != nil {
		// Chunks land at their offsets as they come (the temporary file
		// is renamed into place only once all of them have).
		if err := v.ReadFileAt(ctx, ent, ver, tmp); err != nil {
			return err
		}
	}
	if err := tmp.Chmod(os.FileMode(ent.Mode & 0o7777)); err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	if err := tmp.Close(); err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	mt := time.Unix(0, ent.Mtime)
	if ver != nil {
		mt = time.Unix(0, ver.Mtime)
	}
	if err := os.Chtimes(tmp.Name(), mt, mt); err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return cairn.E("get", cairn.IO, dest, err)
	}
	ok = true
	return nil
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
