package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
)

// metaVol opens only a volume's namespace: no key (and no passphrase) needed.
func (e *env) metaVol(ctx context.Context, s string) (*meta.Vol, vpath.Path, error) {
	r, p, err := e.parseOpen(ctx, s)
	if err != nil {
		return nil, p, err
	}
	mv, err := r.Meta.Open(ctx, p.Volume)
	return mv, p, err
}

func (e *env) initCmd() *cobra.Command {
	var noPass bool
	var chunkAvg, keep int
	var trashTTL time.Duration
	var name string
	c := &cobra.Command{
		Use:   "init",
		Short: "Create a realm: keyring, metadata service, local store and the volume 'home'",
		Long: `Create a realm in $CAIRN_HOME (default ~/.local/share/cairn).
The volume keys are sealed with a passphrase (from CAIRN_PASSPHRASE or a prompt);
--no-passphrase keeps them in a file readable only by you instead.
Without --etcd the realm uses an embedded metadata service that starts on demand.
init also creates the realm's certificate authority (in $CAIRN_HOME/pki/ca: keep
it private, it admits machines to the realm) and this device's own certificate,
named --name (default: the host name).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := e.options()
			opts.NoPassphrase = noPass
			opts.Passphrase = e.passphrase(true)
			opts.ChunkAvg, opts.KeepVersions, opts.TrashTTL = chunkAvg, keep, trashTTL
			opts.NodeName = name
			r, err := realm.Init(cmd.Context(), e.home, opts)
			if err != nil {
				return err
			}
			e.realm = r
			fmt.Fprintf(e.stdout, "created realm %s in %s\n", r.Config.RealmID, e.home)
			if noPass {
				fmt.Fprintf(e.stdout, "warning: volume keys are NOT protected by a passphrase; anyone who can read %s/keyring can read your files\n", e.home)
			}
			where := "embedded metadata service (starts on demand)"
			if len(r.Config.Etcd) > 0 {
				where = "etcd at " + strings.Join(r.Config.Etcd, ",")
			}
			fmt.Fprintf(e.stdout, "metadata: %s\n", where)
			if c, err := r.Credentials(cmd.Context()); err == nil {
				fmt.Fprintf(e.stdout, "this device: %s (realm CA in %s)\n", c.Identity.Name, realm.CADir(e.home))
			}
			fmt.Fprintf(e.stdout, "volume 'home' is ready: try 'cairn put FILE home:/'\n")
			return nil
		},
	}
	c.Flags().BoolVar(&noPass, "no-passphrase", false, "keep volume keys unsealed in a 0600 file")
	c.Flags().StringVar(&name, "name", "", "this device's node name (default: the host name)")
	c.Flags().IntVar(&chunkAvg, "chunk-avg", realm.DefaultChunkAvg, "average chunk size in bytes of the 'home' volume (power of two)")
	c.Flags().IntVar(&keep, "keep", realm.DefaultKeepVersions, "versions kept per file")
	c.Flags().DurationVar(&trashTTL, "trash-ttl", realm.DefaultTrashTTL, "how long removed files stay restorable")
	return c
}

func (e *env) volumeCmd() *cobra.Command {
	c := &cobra.Command{Use: "volume", Short: "Create and list volumes"}
	var chunkAvg, keep int
	var trashTTL time.Duration
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume with its own key and chunking parameters",
		Args:  exactArgs(1, "a volume name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			v, err := r.CreateVolume(cmd.Context(), args[0], chunkAvg, keep, trashTTL)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "created volume %s (chunks %d/%d/%d bytes, keep %d versions, trash %s)\n", v.Name, v.ChunkMin, v.ChunkAvg, v.ChunkMax, v.KeepVersions, v.TrashTTL)
			return nil
		},
	}
	create.Flags().IntVar(&chunkAvg, "chunk-avg", realm.DefaultChunkAvg, "average chunk size in bytes (power of two; min = avg/4, max = avg*8)")
	create.Flags().IntVar(&keep, "keep", realm.DefaultKeepVersions, "versions kept per file")
	create.Flags().DurationVar(&trashTTL, "trash-ttl", realm.DefaultTrashTTL, "how long removed files stay restorable")
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List volumes",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			vols, err := r.Meta.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(vols)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tCHUNK AVG\tKEEP\tTRASH TTL\tCREATED")
			for _, v := range vols {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", v.Name, v.ChunkAvg, v.KeepVersions, v.TrashTTL, time.Unix(0, v.Created).Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(create, ls)
	return c
}

// lsEntry is what `ls --json` prints per entry.
type lsEntry struct {
	Name     string    `json:"name"`
	Path     string    `json:"path"`
	Type     string    `json:"type"`
	Mode     string    `json:"mode"`
	Size     int64     `json:"size"`
	Mtime    time.Time `json:"mtime"`
	UID      uint32    `json:"uid"`
	GID      uint32    `json:"gid"`
	Target   string    `json:"target,omitempty"`
	Device   string    `json:"device,omitempty"` // a device node's "major,minor"
	Version  uint64    `json:"version,omitempty"`
	Versions int       `json:"versions,omitempty"`
}

func typeName(t meta.Type) string {
	switch t {
	case meta.TypeDir:
		return "dir"
	case meta.TypeSymlink:
		return "symlink"
	case meta.TypeFIFO:
		return "fifo"
	case meta.TypeSocket:
		return "socket"
	case meta.TypeChar:
		return "char-device"
	case meta.TypeBlock:
		return "block-device"
	}
	return "file"
}

func modeString(e *meta.Entry) string {
	m := fs.FileMode(e.Mode & 0o777)
	switch e.Type {
	case meta.TypeDir:
		m |= fs.ModeDir
	case meta.TypeSymlink:
		m |= fs.ModeSymlink
	case meta.TypeFIFO:
		m |= fs.ModeNamedPipe
	case meta.TypeSocket:
		m |= fs.ModeSocket
	case meta.TypeChar:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case meta.TypeBlock:
		m |= fs.ModeDevice
	}
	return m.String()
}

func (e *env) lsCmd() *cobra.Command {
	var long, humanSizes, recursive, asJSON, help bool
	c := &cobra.Command{
		Use:   "ls [-lhR] [--json] [VOLUME:/PATH...]",
		Short: "List a directory (default home:/)",
		Long: `List directories and files (default home:/). As in ls(1), -l prints mode,
size and mtime, -h prints sizes as 1.5K, 3.0M, ... and -R lists the
subdirectories too. --help (not -h) prints this help.`,
		Example: `  cairn ls -lh home:/photos
  cairn ls -R --json home:/projects`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			e.allowOffline = true
			if len(args) == 0 {
				args = []string{realm.DefaultVolume + ":/"}
			}
			l := &lister{w: bufio.NewWriter(e.stdout), stderr: e.stderr, long: long, human: humanSizes, recursive: recursive, asJSON: asJSON, headers: len(args) > 1 || recursive}
			defer l.w.Flush()
			for _, a := range args {
				mv, p, err := e.metaVol(ctx, a)
				if err != nil {
					return err
				}
				ent, err := mv.Lookup(ctx, p.Parts)
				if err != nil {
					return err
				}
				if !ent.IsDir() {
					l.print([]meta.Entry{*ent}, p.Dir())
					continue
				}
				if err := l.dir(ctx, mv, ent, p); err != nil {
					return err
				}
			}
			if asJSON {
				if l.all == nil {
					l.all = []lsEntry{}
				}
				l.w.Flush()
				return e.printJSON(l.all)
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&long, "long", "l", false, "mode, size, mtime")
	c.Flags().BoolVarP(&humanSizes, "human-readable", "h", false, "with -l, sizes as 1.5K, 3.0M, ... (powers of 1024)")
	c.Flags().BoolVarP(&recursive, "recursive", "R", false, "list subdirectories recursively")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON (with -R: every entry below, each with its path)")
	// -h is --human-readable here, as in ls(1): help is --help only.
	c.Flags().BoolVar(&help, "help", false, "help for ls")
	return c
}

// lister prints what ls finds.
type lister struct {
	w                              *bufio.Writer
	stderr                         io.Writer
	long, human, recursive, asJSON bool
	headers                        bool // print "PATH:" above each directory's entries
	blocks                         int  // blocks printed so far (a blank line separates them)
	all                            []lsEntry
}

// dir lists the directory ent at p, and with -R the directories below it.
func (l *lister) dir(ctx context.Context, mv *meta.Vol, ent *meta.Entry, p vpath.Path) error {
	all, err := mv.ReadDir(ctx, ent.Ino)
	if err != nil {
		return err
	}
	list := all[:0]
	for i := range all {
		// A file being written for the first time on some device (no
		// content committed yet) is not listed: it is not there yet.
		if pending, perr := firstWritePending(ctx, mv, &all[i]); perr != nil {
			return perr
		} else if pending {
			fmt.Fprintf(l.stderr, "cairn: %s: not listed: its first content is not committed yet (a writer on some device holds it)\n", p.Join(all[i].Name))
			continue
		}
		list = append(list, all[i])
	}
	if l.headers && !l.asJSON {
		if l.blocks > 0 {
			fmt.Fprintln(l.w)
		}
		fmt.Fprintf(l.w, "%s:\n", p)
	}
	l.print(list, p)
	if !l.recursive {
		return nil
	}
	for i := range list {
		if list[i].IsDir() {
			if err := l.dir(ctx, mv, &list[i], p.Join(list[i].Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *lister) print(list []meta.Entry, base vpath.Path) {
	l.blocks++
	for j := range list {
		le := toLS(&list[j], base)
		if l.asJSON {
			l.all = append(l.all, le)
			continue
		}
		name := le.Name
		if le.Type == "dir" {
			name += "/"
		}
		if !l.long {
			fmt.Fprintln(l.w, name)
			continue
		}
		if le.Target != "" {
			name += " -> " + le.Target
		}
		size := strconv.FormatInt(le.Size, 10)
		if l.human {
			size = humanLS(le.Size)
		}
		if le.Device != "" {
			size = strings.Replace(le.Device, ",", ", ", 1) // as ls(1): major, minor
		}
		fmt.Fprintf(l.w, "%s %10s %s %s\n", le.Mode, size, le.Mtime.Local().Format("2006-01-02 15:04"), name)
	}
}

// humanLS writes a size as ls -h does: 999, 1.5K, 12M (powers of 1024,
// rounded up, one decimal below 10).
func humanLS(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10)
	}
	v, i := float64(n), -1
	for v >= 1024 && i < 5 {
		v /= 1024
		i++
	}
	unit := "KMGTPE"[i]
	if v < 10 {
		if r := math.Ceil(v*10) / 10; r < 10 {
			return fmt.Sprintf("%.1f%c", r, unit)
		}
	}
	r := math.Ceil(v)
	if r >= 1024 && i < 5 {
		return fmt.Sprintf("1.0%c", "KMGTPE"[i+1])
	}
	return fmt.Sprintf("%.0f%c", r, unit)
}

func toLS(ent *meta.Entry, dir vpath.Path) lsEntry {
	le := lsEntry{Name: ent.Name, Path: dir.Join(ent.Name).String(), Type: typeName(ent.Type), Mode: modeString(ent), Size: ent.Size,
		Mtime: time.Unix(0, ent.Mtime).UTC(), UID: ent.UID, GID: ent.GID, Target: ent.Target, Versions: len(ent.Versions)}
	if ent.Name == "" {
		le.Path = dir.String()
	}
	if ent.Type == meta.TypeChar || ent.Type == meta.TypeBlock {
		le.Device = fmt.Sprintf("%d,%d", unix.Major(ent.Rdev), unix.Minor(ent.Rdev))
	}
	if cur := ent.Current(); cur != nil {
		le.Version = cur.N
	}
	return le
}

func (e *env) catCmd() *cobra.Command {
	var version uint64
	c := &cobra.Command{
		Use:   "cat [--version N] VOLUME:/PATH...",
		Short: "Write files to standard output",
		Args:  usageArgs(1, "one or more VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			e.allowOffline = true
			w := bufio.NewWriterSize(e.stdout, 1<<20)
			defer w.Flush()
			for _, a := range args {
				v, p, err := e.vol(ctx, a)
				if err != nil {
					return err
				}
				ent, err := v.Meta.Lookup(ctx, p.Parts)
				if err != nil {
					return err
				}
				if ent.Type != meta.TypeFile {
					return cairn.E("cat", cairn.IsDir, p.String(), errors.New("not a regular file"))
				}
				var ver *meta.Version
				if version != 0 {
					if ver, err = findVersion(ent, p.String(), version); err != nil {
						return err
					}
				}
				if err := v.ReadFile(ctx, ent, ver, w); err != nil {
					if nh := notHere("cat", p.String(), err); nh != nil {
						return nh
					}
					return fmt.Errorf("%s: %w", p, err)
				}
			}
			return nil
		},
	}
	c.Flags().Uint64Var(&version, "version", 0, "version number to print")
	e.wakeFlag(c)
	c.Flags().BoolVar(&e.noCache, "no-cache", false, "read from the stores that hold the data, bypassing this device's chunk cache (to check the remote copies)")
	return c
}

func (e *env) mkdirCmd() *cobra.Command {
	var parents bool
	c := &cobra.Command{
		Use:   "mkdir [-p] VOLUME:/DIR...",
		Short: "Make directories",
		Args:  usageArgs(1, "one or more VOLUME:/DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			for _, a := range args {
				mv, p, err := e.metaVol(ctx, a)
				if err != nil {
					return err
				}
				if p.IsRoot() {
					if parents {
						continue
					}
					return cairn.E("mkdir", cairn.Exist, p.String(), nil)
				}
				if parents {
					if _, err = mv.MkdirAll(ctx, p.Parts, 0o755, uid(), gid()); err != nil {
						return err
					}
					continue
				}
				parent, err := mv.Lookup(ctx, p.Dir().Parts)
				if err != nil {
					return err
				}
				if _, err := mv.Create(ctx, parent, meta.Entry{Name: p.Base(), Type: meta.TypeDir, Mode: 0o755, UID: uid(), GID: gid()}); err != nil {
					return relabel(err, p.String())
				}
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&parents, "parents", "p", false, "make parent directories as needed; no error if it exists")
	return c
}

func relabel(err error, p string) error {
	var ce *cairn.Error
	if errors.As(err, &ce) {
		return cairn.E(ce.Op, ce.Kind, p, ce.Err)
	}
	return err
}

func (e *env) rmCmd() *cobra.Command {
	var recursive bool
	c := &cobra.Command{
		Use:   "rm [-r] VOLUME:/PATH...",
		Short: "Move files and directories to the trash",
		Long: `Move files and directories to the trash. They stay restorable
('cairn restore --from-trash PATH') until the volume's trash time has passed and
'cairn gc' runs. A non-empty directory needs -r.`,
		Args: usageArgs(1, "one or more VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			for _, a := range args {
				mv, p, err := e.metaVol(ctx, a)
				if err != nil {
					return err
				}
				if p.IsRoot() {
					return cairn.E("rm", cairn.Invalid, p.String(), errors.New("cannot remove a volume's root"))
				}
				parent, err := mv.Lookup(ctx, p.Dir().Parts)
				if err != nil {
					return err
				}
				if _, err := mv.Remove(ctx, parent, p.Base(), p.String(), recursive); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return c
}

func (e *env) mvCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mv VOLUME:/SRC VOLUME:/DST",
		Short: "Move or rename a file or directory",
		Long: `Move or rename SRC to DST within one volume. If DST is an existing directory,
SRC moves into it. A file replaced by the move goes to the trash.`,
		Args: exactArgs(2, "VOLUME:/SRC and VOLUME:/DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			mv, src, err := e.metaVol(ctx, args[0])
			if err != nil {
				return err
			}
			dst, err := vpath.Parse(args[1])
			if err != nil {
				return err
			}
			if dst.Volume != src.Volume {
				return cairn.E("mv", cairn.Invalid, dst.String(), errors.New("cannot move between volumes (they have different keys): use get and put"))
			}
			if src.IsRoot() {
				return cairn.E("mv", cairn.Invalid, src.String(), errors.New("cannot move a volume's root"))
			}
			if d, lerr := mv.Lookup(ctx, dst.Parts); lerr == nil && d.IsDir() {
				dst = dst.Join(src.Base())
			}
			if isPrefix(src.Parts, dst.Parts) {
				return cairn.E("mv", cairn.Invalid, dst.String(), errors.New("cannot move a directory into itself"))
			}
			sp, err := mv.Lookup(ctx, src.Dir().Parts)
			if err != nil {
				return err
			}
			dp, err := mv.Lookup(ctx, dst.Dir().Parts)
			if err != nil {
				return err
			}
			return mv.Rename(ctx, sp, src.Base(), dp, dst.Base(), dst.String())
		},
	}
}

func isPrefix(a, b []string) bool {
	if len(a) > len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// versionJSON is what `versions --json` prints per version (shared with 'cairn web').
type versionJSON = apitypes.FileVersion

// versionsOf lists a file's kept versions, oldest first.
func versionsOf(ent *meta.Entry) []versionJSON {
	out := make([]versionJSON, 0, len(ent.Versions))
	for i, v := range ent.Versions {
		out = append(out, versionJSON{N: v.N, Size: v.Size, Mtime: time.Unix(0, v.Mtime).UTC(), Committed: time.Unix(0, v.Committed).UTC(),
			Manifest: v.Manifest.String(), Chunks: v.Chunks, Stores: v.Stores, Current: i == len(ent.Versions)-1})
	}
	return out
}

// trashOf is what `trash --json` prints (shared with 'cairn web').
func trashOf(mv *meta.Vol, items []meta.TrashItem) []apitypes.TrashItem {
	out := []apitypes.TrashItem{}
	for _, it := range items {
		d := time.Unix(0, it.Deleted).UTC()
		out = append(out, apitypes.TrashItem{Path: it.Path, Type: typeName(it.Entry.Type), Size: it.Entry.Size, Deleted: d, Expires: d.Add(mv.V.TrashTTL)})
	}
	return out
}

func (e *env) versionsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "versions [--json] VOLUME:/PATH",
		Short: "List the kept versions of a file",
		Args:  exactArgs(1, "one VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mv, p, err := e.metaVol(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			ent, err := mv.Lookup(cmd.Context(), p.Parts)
			if err != nil {
				return err
			}
			if ent.Type != meta.TypeFile {
				return cairn.E("versions", cairn.IsDir, p.String(), errors.New("not a regular file"))
			}
			out := versionsOf(ent)
			if asJSON {
				return e.printJSON(out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tSIZE\tMODIFIED\tSTORED AT\t")
			for i := len(out) - 1; i >= 0; i-- {
				v := out[i]
				cur := ""
				if v.Current {
					cur = "(current)"
				}
				fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", v.N, v.Size, v.Mtime.Local().Format(time.DateTime), v.Committed.Local().Format(time.DateTime), cur)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func (e *env) restoreCmd() *cobra.Command {
	var version uint64
	var fromTrash bool
	var to string
	c := &cobra.Command{
		Use:   "restore VOLUME:/PATH (--version N | --from-trash) [--to VOLUME:/PATH]",
		Short: "Make an old version current again, or bring a removed file back",
		Long: `With --version N, make version N of a file its current version (as a new
version: nothing is lost). With --from-trash, put back the most recently removed
entry that was at PATH (directories come back with their contents), at PATH or
at --to.`,
		Args: exactArgs(1, "one VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if (version == 0) == !fromTrash {
				return withCode(ExitUsage, errors.New("restore: give exactly one of --version N and --from-trash"))
			}
			mv, p, err := e.metaVol(ctx, args[0])
			if err != nil {
				return err
			}
			if p.IsRoot() {
				return cairn.E("restore", cairn.Invalid, p.String(), errors.New("not a file"))
			}
			if fromTrash {
				dst := p
				if to != "" {
					var terr error
					if dst, terr = vpath.Parse(to); terr != nil {
						return terr
					}
					if dst.Volume != p.Volume || dst.IsRoot() {
						return cairn.E("restore", cairn.Invalid, to, errors.New("--to must be a path in the same volume"))
					}
				}
				removed, terr := restoreFromTrash(ctx, mv, p, dst)
				if terr != nil {
					return terr
				}
				fmt.Fprintf(e.stdout, "restored %s from the trash (removed %s)\n", dst, removed.Local().Format(time.DateTime))
				return nil
			}
			n, err := e.restoreVersion(ctx, mv, p, version)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: version %d is now current (as version %d)\n", p, version, n)
			return nil
		},
	}
	c.Flags().Uint64Var(&version, "version", 0, "the version to make current")
	c.Flags().BoolVar(&fromTrash, "from-trash", false, "restore the most recently removed entry from this path")
	c.Flags().StringVar(&to, "to", "", "with --from-trash: restore to this path instead")
	return c
}

// restoreFromTrash puts back the most recently removed entry that was at
// p, at dst (a path of the same volume), and returns when it was removed.
func restoreFromTrash(ctx context.Context, mv *meta.Vol, p, dst vpath.Path) (time.Time, error) {
	items, err := mv.Trash(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var item *meta.TrashItem
	for i := range items {
		if items[i].Path == p.String() {
			item = &items[i]
		}
	}
	if item == nil {
		return time.Time{}, cairn.E("restore", cairn.NotFound, p.String(), errors.New("nothing removed from there is in the trash (see 'cairn trash')"))
	}
	parent, err := mv.Lookup(ctx, dst.Dir().Parts)
	if err != nil {
		return time.Time{}, err
	}
	if _, err = mv.RestoreTrash(ctx, item.ID, parent, dst.Base()); err != nil {
		return time.Time{}, relabel(err, dst.String())
	}
	return time.Unix(0, item.Deleted), nil
}

// restoreVersion makes version n of the file at p current again, as a
// new version (nothing is lost), and returns the new version's number.
func (e *env) restoreVersion(ctx context.Context, mv *meta.Vol, p vpath.Path, n uint64) (uint64, error) {
	ent, err := mv.Lookup(ctx, p.Parts)
	if err != nil {
		return 0, err
	}
	ver, err := findVersion(ent, p.String(), n)
	if err != nil {
		return 0, err
	}
	parent, err := mv.Lookup(ctx, p.Dir().Parts)
	if err != nil {
		return 0, err
	}
	r, err := e.open(ctx)
	if err != nil {
		return 0, err
	}
	gen, err := r.Meta.WriteGen(ctx)
	if err != nil {
		return 0, err
	}
	nv := *ver
	nv.Committed = 0
	ne, _, err := mv.CommitVersion(ctx, parent, p.Base(), meta.Commit{Version: nv, Mode: ent.Mode, UID: ent.UID, GID: ent.GID, Gen: gen})
	if err != nil {
		return 0, err
	}
	return ne.Current().N, nil
}

// volumeArg opens the volume a command's optional VOLUME argument names
// ("home", "home:" and "home:/" alike), else the default volume.
func (e *env) volumeArg(ctx context.Context, args []string) (*meta.Vol, error) {
	name := realm.DefaultVolume
	if len(args) == 1 {
		name = strings.TrimSuffix(strings.TrimSuffix(args[0], "/"), ":")
	}
	mv, _, err := e.metaVol(ctx, name+":/")
	return mv, err
}

func (e *env) trashCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "trash [--json] [VOLUME]",
		Short: "List removed files and directories that can still be restored",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mv, err := e.volumeArg(cmd.Context(), args)
			if err != nil {
				return err
			}
			items, err := mv.Trash(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(trashOf(mv, items))
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REMOVED\tEXPIRES\tSIZE\tPATH")
			for _, it := range items {
				d := time.Unix(0, it.Deleted)
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", d.Local().Format(time.DateTime), d.Add(mv.V.TrashTTL).Local().Format(time.DateTime), it.Entry.Size, it.Path)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
