package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
)

func (e *env) moveCmd() *cobra.Command {
	var to string
	var wait, asJSON bool
	c := &cobra.Command{
		Use:   "move VOLUME:/PATH --to DEVICE|STORE [--wait] [--json]",
		Short: "Move the data of a file or directory to another device or store, without blocking it",
		Example: `  cairn move home:/videos/talk.mp4 --to desktop
  cairn move home:/archive --to s3 --wait
  cairn move ls`,
		Long: `Move the data of the files under a path to one device (node) or registered
store, in the background. The files stay readable and writable throughout:
reads use the old copy until the new one is recorded; a version written
meanwhile is offloaded (kept on this device, as for a device that sleeps)
and moved to the new place once the copy is done. The old copies are
deleted only after the new place is recorded. New versions written after
the move go to the new place (the policy copies:1@DEVICE is set on the path).

The move is recorded as offload entries in the metadata service ('cairn
offload ls', 'cairn move ls'), one per version to move; the copy is done by
the node daemon of the destination (or of the device that holds the data,
for a move to a store), by 'cairn offload reclaim', or here with --wait. It
is idempotent and survives a kill at any point: what was copied is not
sent again. This command returns once the move is recorded; with --wait it
copies and returns when the data is there.

Versions under a copies or ec policy are not moved by this command (change
the policy and run 'cairn repair'). Not to be confused with 'cairn meta
move', which moves the metadata service.`,
		Args: exactArgs(1, "a VOLUME:/PATH (and --to DEVICE|STORE)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if to == "" {
				return withCode(ExitUsage, errors.New("move: --to DEVICE|STORE is required: where the data goes"))
			}
			r, p, err := e.parseOpen(ctx, args[0])
			if err != nil {
				return err
			}
			o := realm.MoveOptions{}
			if !asJSON && !e.quiet {
				o.Progress = func(line string) { fmt.Fprintln(e.stdout, line) }
			}
			rep, err := r.Move(ctx, p.Volume, p.Slash(), to, o)
			if err != nil {
				return err
			}
			if !asJSON {
				for _, s := range rep.Skipped {
					fmt.Fprintf(e.stderr, "not moved: %s\n", s)
				}
			}
			if wait {
				v, err := r.Volume(ctx, p.Volume)
				if err != nil {
					return err
				}
				if err := e.waitMove(cmd, r, v.Meta.V.ID, rep, asJSON); err != nil {
					return err
				}
			}
			if asJSON {
				return e.printJSON(rep)
			}
			if !wait && !e.quiet {
				fmt.Fprintf(e.stdout, "the copy runs in the background: 'cairn move ls' shows what is left\n")
			}
			return nil
		},
	}
	c.Flags().StringVar(&to, "to", "", "the device (node) or registered store the data goes to")
	c.Flags().BoolVar(&wait, "wait", false, "copy now and return when the data is at its new place")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON (what was recorded)")
	c.AddCommand(e.moveLsCmd())
	return c
}

// waitMove reclaims the entries of the move rep recorded (of volume
// volID) until none is left, then the versions of the volume offloaded
// for its destination meanwhile.
func (e *env) waitMove(cmd *cobra.Command, r *realm.Realm, volID string, rep *realm.MoveReport, quiet bool) error {
	ctx := cmd.Context()
	mine := func(o *meta.Offload) bool { return o.VolID == volID && o.Move == rep.Path && o.Home == rep.To }
	progress := func(en *meta.Offload, outcome string) {
		if !quiet && !e.quiet {
			fmt.Fprintf(e.stdout, "%s:%s v%d: %s\n", en.Vol, en.Name, en.N, outcome)
		}
	}
	for round := 0; ; round++ {
		list, err := r.Offloads(ctx)
		if err != nil {
			return err
		}
		left := 0
		for _, o := range list {
			if mine(o) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if round > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		res, err := r.Reclaim(ctx, realm.ReclaimOptions{Match: mine, Progress: progress})
		if err != nil {
			return err
		}
		if len(res.Errors) > 0 && !quiet {
			fmt.Fprintf(e.stderr, "%d versions wait (tried again in a second): %s\n", len(res.Errors), res.Errors[0])
		}
	}
	// What was written meanwhile and offloaded for the destination.
	if _, err := r.Reclaim(ctx, realm.ReclaimOptions{Match: func(o *meta.Offload) bool { return o.VolID == volID && o.Home == rep.To }, Progress: progress}); err != nil {
		return err
	}
	if !quiet && !e.quiet {
		fmt.Fprintf(e.stdout, "moved %s:%s to %s\n", rep.Vol, rep.Path, rep.To)
	}
	return nil
}

func (e *env) moveLsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the moves in progress: what is left to copy",
		Long: `List every move whose copy is not done: the path moved, where to, how
many versions and bytes are left and where they are now. A move is done
when it is no longer listed.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			list, err := r.Moves(cmd.Context())
			if err != nil {
				return err
			}
			if list == nil {
				list = []realm.MoveStatus{}
			}
			if asJSON {
				return e.printJSON(list)
			}
			if len(list) == 0 {
				fmt.Fprintln(e.stdout, "no move in progress")
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PATH\tTO\tVERSIONS LEFT\tSIZE LEFT\tNOW ON\tSINCE")
			for _, m := range list {
				fmt.Fprintf(tw, "%s:%s\t%s\t%d\t%s\t%s\t%s\n", m.Vol, m.Path, m.To, m.Versions, apitypes.IBytes(m.Bytes), strings.Join(m.From, ","), m.Since.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
