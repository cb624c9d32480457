package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
)

func (e *env) offloadCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "offload",
		Short: "What was written elsewhere because its device slept, and moving it home",
		Long: `A write meant for a device that is not awake ('put --store desktop' with
the desktop in standby) never waits for a wake: it goes to an awake offload
target (this device, unless put --offload-to names another node or store),
and the realm records an offload entry: the version, where it was meant to
go (its home) and where it is now. Reads find it where it is now, without
waking the home. When the home is awake again its node daemon reclaims it
(on resume, and every minute while awake): it copies home what the home
lacks, records the version there and deletes the offloaded copy.

A move ('cairn move') is recorded the same way: one entry per version to
move, its destination as home, shown with "(move)".`,
	}
	c.AddCommand(e.offloadLsCmd(), e.offloadReclaimCmd())
	return c
}

// offloadRow is one line of 'cairn offload ls'.
type offloadRow struct {
	Volume   string    `json:"volume"`
	Path     string    `json:"path"`
	Version  uint64    `json:"version"`
	Home     string    `json:"home"`
	Now      string    `json:"now"`
	Bytes    int64     `json:"bytes"`
	Chunks   int       `json:"chunks"`
	Since    time.Time `json:"since"`
	Manifest string    `json:"manifest"`
	// Move: the path of the move ('cairn move') the entry is part of.
	Move string `json:"move,omitempty"`
}

func (e *env) offloadLsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the offloaded versions that wait for reclaim",
		Long: `List every offload entry, oldest first: the file (VOLUME:path) and its
version, the home it was meant for, the node or store that holds it now,
its size and since when it waits.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			r, err := e.open(ctx)
			if err != nil {
				return err
			}
			list, err := r.Offloads(ctx)
			if err != nil {
				return err
			}
			paths := map[string]map[uint64]string{} // by volume, by ino
			out := []offloadRow{}
			for _, o := range list {
				out = append(out, offloadRow{Volume: o.Vol, Path: e.offloadPath(cmd, r, paths, o), Version: o.N, Home: o.Home, Now: o.Now,
					Bytes: o.Bytes, Chunks: o.Chunks, Since: time.Unix(0, o.Since).UTC(), Manifest: o.Manifest.String(), Move: o.Move})
			}
			if asJSON {
				return e.printJSON(out)
			}
			if len(out) == 0 {
				fmt.Fprintln(e.stdout, "nothing waits for reclaim")
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PATH\tVERSION\tHOME\tNOW ON\tSIZE\tSINCE")
			for _, o := range out {
				home := o.Home
				if o.Move != "" {
					home += " (move)"
				}
				fmt.Fprintf(tw, "%s:%s\t%d\t%s\t%s\t%s\t%s\n", o.Volume, o.Path, o.Version, home, o.Now, apitypes.IBytes(o.Bytes), o.Since.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// offloadPath is the path of o's file now (by its inode), or, if it
// cannot be found, the name it was committed under.
func (e *env) offloadPath(cmd *cobra.Command, r *realm.Realm, paths map[string]map[uint64]string, o *meta.Offload) string {
	m, ok := paths[o.VolID]
	if !ok {
		m = map[uint64]string{}
		paths[o.VolID] = m
		if v, err := r.Volume(cmd.Context(), o.Vol); err == nil && v.Meta.V.ID == o.VolID {
			_ = v.Walk(cmd.Context(), func(p string, en *meta.Entry, trashed bool) error {
				if !trashed && en.Type == meta.TypeFile {
					m[en.Ino] = strings.TrimPrefix(p, o.Vol+":")
				}
				return nil
			})
		}
	}
	if p, ok := m[o.Ino]; ok {
		return p
	}
	return o.Name
}

func (e *env) offloadReclaimCmd() *cobra.Command {
	var home string
	var asJSON bool
	c := &cobra.Command{
		Use:   "reclaim [--home NODE] [--json]",
		Short: "Move offloaded versions home now, for every home that is awake",
		Long: `Reclaim by hand what the node daemons reclaim by themselves: for each
offload entry whose home is awake (or only those of --home), copy to the
home the chunks it lacks, record the version there, and delete the
offloaded copy (the chunks no other version held there references).
Entries whose home is not awake wait. Safe to run at any time, and again
after an interruption: only what is missing is sent.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			r, err := e.open(ctx)
			if err != nil {
				return err
			}
			o := realm.ReclaimOptions{Home: home}
			if !asJSON && !e.quiet {
				o.Progress = func(en *meta.Offload, outcome string) {
					fmt.Fprintf(e.stdout, "%s:%s v%d: %s\n", en.Vol, en.Name, en.N, outcome)
				}
			}
			rep, err := r.Reclaim(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				if err := e.printJSON(rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(e.stdout, "%d reclaimed (%d objects, %s sent, %d deleted from offload targets), %d dropped, %d waiting, %d failed\n",
					rep.Reclaimed, rep.Copied, apitypes.IBytes(rep.Sent), rep.Deleted, rep.Dropped, rep.Waiting, len(rep.Errors))
			}
			if len(rep.Errors) > 0 {
				return fmt.Errorf("%d offload entries could not be reclaimed (they stay; run again): %s", len(rep.Errors), rep.Errors[0])
			}
			return nil
		},
	}
	c.Flags().StringVar(&home, "home", "", "only what waits for this node or store")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
