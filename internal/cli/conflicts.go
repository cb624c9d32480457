package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// conflictsCmd is 'cairn conflicts': the conflicts replays of offline
// changes made (doc/offline.md, "Conflicts"), and their resolution.
func (e *env) conflictsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "conflicts [--json] [VOLUME]",
		Short: "List the conflicts the replay of offline changes made",
		Long: `List the conflicts that the replay of a device's offline changes made in VOLUME
(default home): what each kept at the name ("theirs", made elsewhere) and where
this device's side landed (NAME.conflict-DEVICE-YYYYMMDD-HHMMSS), with each side's
device, time and size. 'cairn conflicts resolve' settles one.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mv, err := e.volumeArg(cmd.Context(), args)
			if err != nil {
				return err
			}
			cs, err := mv.Conflicts(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if cs == nil {
					cs = []meta.Conflict{}
				}
				return e.printJSON(cs)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tPATH\tTHEIRS\tMINE\tCOPY")
			side := func(s meta.ConflictSide) string {
				dev := s.Device
				if dev == "" {
					dev = "?"
				}
				t := "-"
				if s.Time != 0 {
					t = time.Unix(0, s.Time).Local().Format(time.DateTime)
				}
				return fmt.Sprintf("%s %s %dB", dev, t, s.Size)
			}
			for _, c := range cs {
				cp := c.Copy
				if cp == "" {
					cp = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Kind, c.Path, side(c.Theirs), side(c.Mine), cp)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(e.conflictsResolveCmd())
	return c
}

func (e *env) conflictsResolveCmd() *cobra.Command {
	var keep string
	c := &cobra.Command{
		Use:   "resolve VOLUME:PATH --keep mine|theirs|both",
		Short: "Settle a conflict: keep this device's side, the other's, or both",
		Long: `Settle the conflict recorded for PATH (the name, or this device's conflict copy).
--keep mine: this device's copy takes the name (the other version stays in the
file's history), or this device's removal is made; --keep theirs: this device's copy
goes to the trash, or the removal made elsewhere is made; --keep both: both stay as
they are. The conflict's record goes in each case.`,
		Args: exactArgs(1, "VOLUME:PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch keep {
			case meta.KeepMine, meta.KeepTheirs, meta.KeepBoth:
			case "":
				return withCode(ExitUsage, errors.New("conflicts resolve: --keep mine|theirs|both is required"))
			default:
				return withCode(ExitUsage, fmt.Errorf("conflicts resolve: --keep %q: mine, theirs or both", keep))
			}
			mv, p, err := e.metaVol(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if p.IsRoot() {
				return cairn.E("conflicts resolve", cairn.Invalid, args[0], errors.New("a path in the volume"))
			}
			c, err := mv.ResolveConflict(cmd.Context(), p.Slash(), keep)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "resolved %s (%s): kept %s\n", c.Path, c.Kind, keep)
			return nil
		},
	}
	c.Flags().StringVar(&keep, "keep", "", "the side to keep: mine, theirs or both")
	return c
}
