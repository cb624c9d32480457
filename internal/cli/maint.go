package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/realm"
)

func uid() uint32 { return uint32(os.Getuid()) }
func gid() uint32 { return uint32(os.Getgid()) }

// openAll opens the realm, every volume and the store: what the jobs that
// walk everything (gc, fsck, stats) need.
func (e *env) openAll(ctx context.Context) (*realm.Realm, []*fs.Volume, cairn.Store, error) {
	r, err := e.open(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	vols, err := r.AllVolumes(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err := r.Store(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return r, vols, st, nil
}

func (e *env) gcCmd() *cobra.Command {
	var dry, asJSON bool
	c := &cobra.Command{
		Use:   "gc [--dry-run] [--json]",
		Short: "Purge expired trash and delete chunks nothing references any more",
		Long: `Purge trash entries older than their volume's trash time, then delete every
object that no kept version and no trash entry references from this device's
store, every registered store (cloud buckets: packs mostly garbage are
rewritten) and every other awake node's store, and compact them to give the
space back. A node that is not awake (in standby or offline) is never
contacted, so gc wakes no sleeping device: its store is skipped and named
("skipped: node NAME is standby since ..."), as is an unreachable store; a
later gc, or the node daemon's schedule ('cairn node serve --maint-every'),
collects it once it is awake. gc records per store when it last collected
it. Writers are fenced while it runs:
a file being written during gc is written again, never lost. gc stops without
deleting anything if it cannot read a manifest. --dry-run reports what it
would free and changes nothing.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			r, err := e.open(ctx)
			if err != nil {
				return err
			}
			bar := newCountBar(e.stderr, !asJSON && !e.quiet && isTerminal(e.stderr), "marking versions")
			rep, unreachable, err := r.GC(ctx, realm.GCOptions{DryRun: dry, Progress: bar.set})
			bar.finish()
			for _, err := range unreachable {
				if sk, ok := realm.AsSkipped(err); ok {
					fmt.Fprintf(e.stderr, "cairn: gc: %v\n", sk)
					continue
				}
				fmt.Fprintf(e.stderr, "cairn: gc: skipping a store: %v\n", err)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(rep)
			}
			verb := "freed"
			if dry {
				verb = "would free"
			}
			fmt.Fprintf(e.stdout, "%s %s in %d objects (%d live objects, %d versions kept", verb, apitypes.IBytes(rep.FreedBytes), rep.DeletedObjects, rep.LiveObjects, rep.Versions)
			if !dry {
				fmt.Fprintf(e.stdout, ", %d trash entries purged, %s of disk reclaimed", rep.TrashPurged, apitypes.IBytes(rep.CompactedBytes))
			}
			fmt.Fprintln(e.stdout, ")")
			for _, s := range rep.Stores {
				if s.Error != "" {
					fmt.Fprintf(e.stdout, "  store %s: %s in %d objects, then failed: %s\n", s.Name, apitypes.IBytes(s.FreedBytes), s.DeletedObjects, s.Error)
					continue
				}
				fmt.Fprintf(e.stdout, "  store %s: %s in %d objects, %s repacked away\n", s.Name, apitypes.IBytes(s.FreedBytes), s.DeletedObjects, apitypes.IBytes(s.CompactedBytes))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&dry, "dry-run", false, "report only; change nothing")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func (e *env) fsckCmd() *cobra.Command {
	var readData, repair, asJSON bool
	var sources []string
	c := &cobra.Command{
		Use:   "fsck [--read-data [--repair [--source PATH]...]] [--json]",
		Short: "Check every file's manifest and chunks; exit 5 naming each damaged file",
		Long: `Check every kept version of every file (trash included): its manifest must be
present, decrypt and authenticate, and list chunks the store holds. With
--read-data every chunk is read and verified (hash and authentication tag), and
the store checks every object it holds against its name. Exits 5 and names each
damaged file and version on any problem. A chunk found damaged is quarantined:
the store never again counts it as present, so a later 'cairn put' of the
original data writes it afresh (put --force also re-reads what the store
claims to hold).

With --repair (implies --read-data), what is damaged or missing is healed:
from a good copy in any registered store or other device's store, or by
cutting the files under each --source PATH (the original files: a chunk is
found again wherever its data is). Every version that names a healed chunk
reads again. Then everything is checked again: each file and version that
stays unreadable is printed as UNREADABLE and the exit status is 5.

It counts each distinct chunk once (delta bases included), as 'cairn stats'
does; the two differ only by the versions whose data other nodes hold, which
are checked on those nodes and counted in the line fsck prints. With --json,
"damaged" is [] when all is well.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(sources) > 0 && !repair {
				return withCode(ExitUsage, fmt.Errorf("fsck: --source needs --repair"))
			}
			for _, s := range sources {
				if _, err := os.Stat(s); err != nil {
					return withCode(ExitUsage, fmt.Errorf("fsck: --source %s: %w", s, err))
				}
			}
			r, vols, st, err := e.openAll(ctx)
			if err != nil {
				return err
			}
			if repair {
				return e.fsckRepair(ctx, r, vols, st, sources, asJSON)
			}
			bar := newCountBar(e.stderr, !asJSON && !e.quiet && isTerminal(e.stderr), "checking versions")
			rep, err := fs.Fsck(ctx, vols, st, readData, bar.set)
			bar.finish()
			if err != nil {
				return err
			}
			if asJSON {
				if err := e.printJSON(rep); err != nil {
					return err
				}
			} else {
				for _, d := range rep.Damaged {
					fmt.Fprintf(e.stdout, "DAMAGED %s version %d: %s\n", d.Path, d.Version, d.Problem)
				}
				for _, d := range rep.StoreErrors {
					fmt.Fprintf(e.stdout, "STORE %s: %s\n", d.Object, d.Problem)
				}
				fmt.Fprintf(e.stdout, "checked %d files, %d versions, %d chunks", rep.Files, rep.Versions, rep.Chunks)
				if readData {
					fmt.Fprintf(e.stdout, ", read %s", apitypes.IBytes(rep.BytesRead))
				}
				if rep.Elsewhere > 0 {
					fmt.Fprintf(e.stdout, " (%d versions whose data other nodes hold were not checked here)", rep.Elsewhere)
				}
				fmt.Fprintln(e.stdout)
			}
			if !rep.OK() {
				files := map[string]bool{}
				for _, d := range rep.Damaged {
					files[d.Path] = true
				}
				return withCode(ExitDamaged, fmt.Errorf("fsck: %d damaged file(s), %d bad store object(s)", len(files), len(rep.StoreErrors)))
			}
			if !asJSON {
				fmt.Fprintln(e.stdout, "no problems found")
			}
			return nil
		},
	}
	c.Flags().BoolVar(&readData, "read-data", false, "read and verify every chunk's bytes")
	c.Flags().BoolVar(&repair, "repair", false, "heal damaged or missing chunks from other stores and --source files (implies --read-data)")
	c.Flags().StringArrayVar(&sources, "source", nil, "a file or directory holding original data to heal from (with --repair; repeatable)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// fsckRepair is fsck --repair.
func (e *env) fsckRepair(ctx context.Context, r *realm.Realm, vols []*fs.Volume, st cairn.Store, sources []string, asJSON bool) error {
	others, unreachable, closeOthers, err := r.GCStores(ctx)
	defer closeOthers()
	if err != nil {
		return err
	}
	for _, err := range unreachable {
		fmt.Fprintf(e.stderr, "cairn: fsck: cannot heal from a store: %v\n", err)
	}
	bar := newCountBar(e.stderr, !asJSON && !e.quiet && isTerminal(e.stderr), "checking versions")
	rep, err := fs.FsckRepair(ctx, vols, st, fs.RepairOptions{Others: others, Sources: sources, Progress: bar.set})
	bar.finish()
	if err != nil {
		return err
	}
	if asJSON {
		if err := e.printJSON(rep); err != nil {
			return err
		}
	} else {
		for _, d := range rep.Found.Damaged {
			fmt.Fprintf(e.stdout, "DAMAGED %s version %d: %s\n", d.Path, d.Version, d.Problem)
		}
		for _, d := range rep.Found.StoreErrors {
			fmt.Fprintf(e.stdout, "STORE %s: %s (quarantined)\n", d.Object, d.Problem)
		}
		for _, s := range rep.Errors {
			fmt.Fprintf(e.stdout, "ERROR %s\n", s)
		}
		fmt.Fprintf(e.stdout, "checked %d files, %d versions, %d chunks, read %s\n", rep.Found.Files, rep.Found.Versions, rep.Found.Chunks, apitypes.IBytes(rep.Found.BytesRead))
		if rep.Needed > 0 {
			fmt.Fprintf(e.stdout, "%d damaged or missing objects: healed %d from other stores, %d from %d source files\n", rep.Needed, rep.FromStores, rep.FromSources, rep.SourceFiles)
		}
		for _, d := range rep.After.Damaged {
			fmt.Fprintf(e.stdout, "UNREADABLE %s version %d: %s\n", d.Path, d.Version, d.Problem)
		}
	}
	if !rep.OK() {
		files := map[string]bool{}
		for _, d := range rep.After.Damaged {
			files[d.Path] = true
		}
		if len(files) == 0 {
			return withCode(ExitDamaged, fmt.Errorf("fsck: every file reads, but the store holds %d bad object(s) (quarantined)", len(rep.After.StoreErrors)))
		}
		return withCode(ExitDamaged, fmt.Errorf("fsck: %d file(s) stay damaged (give the original files with --source, or bring a store holding a copy online)", len(files)))
	}
	if !asJSON {
		if rep.Needed > 0 {
			fmt.Fprintln(e.stdout, "repaired: every file reads")
		} else {
			fmt.Fprintln(e.stdout, "no problems found")
		}
	}
	return nil
}

func (e *env) statsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "stats [--json]",
		Short: "Files, logical and stored bytes, chunks, dedup and compression ratios",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			_, vols, st, err := e.openAll(ctx)
			if err != nil {
				return err
			}
			s, err := fs.ComputeStats(ctx, vols, st)
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(s)
			}
			fmt.Fprintf(e.stdout, "volumes:            %d\n", s.Volumes)
			fmt.Fprintf(e.stdout, "files:              %d (%d dirs, %d symlinks, %d FIFOs, sockets and devices, %d in trash)\n", s.Files, s.Dirs, s.Symlinks, s.Specials, s.TrashItems)
			fmt.Fprintf(e.stdout, "logical bytes:      %s (current versions)\n", apitypes.IBytes(s.LogicalBytes))
			fmt.Fprintf(e.stdout, "versions kept:      %d (%s)\n", s.Versions, apitypes.IBytes(s.VersionBytes))
			fmt.Fprintf(e.stdout, "chunks:             %d (%s before compression)\n", s.Chunks, apitypes.IBytes(s.UniqueBytes))
			fmt.Fprintf(e.stdout, "stored bytes:       %s in %d objects (%s on disk)\n", apitypes.IBytes(s.StoredBytes), s.StoreObjects, apitypes.IBytes(s.DiskBytes))
			fmt.Fprintf(e.stdout, "dedup ratio:        %.2f\n", s.DedupRatio)
			fmt.Fprintf(e.stdout, "compression ratio:  %.2f\n", s.CompressRatio)
			if s.ManifestErrors > 0 {
				fmt.Fprintf(e.stdout, "unreadable manifests: %d (run 'cairn fsck')\n", s.ManifestErrors)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
