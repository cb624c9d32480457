package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
)

// PinJSON is one line of 'pin ls --json'.
type PinJSON struct {
	Path      string     `json:"path"`
	VolumeID  string     `json:"volume_id"`
	Priority  int        `json:"priority"`
	Added     *time.Time `json:"added,omitempty"`
	Files     int        `json:"files"`
	Bytes     int64      `json:"bytes"`
	HereBytes int64      `json:"here_bytes"`
	Missing   int        `json:"missing_files"`
	Complete  bool       `json:"complete"`
	Error     string     `json:"error,omitempty"`
}

func (e *env) pinCmd() *cobra.Command {
	var prio int
	var wait bool
	c := &cobra.Command{
		Use:   "pin VOLUME:/PATH [--priority N] [--wait] | pin ls [--json]",
		Short: "Keep a subtree's data on this device, for use offline",
		Long: `Pin a directory (or a file) of a volume: this device keeps the current data
of everything under it, fetched in the background by this device's node
('cairn node serve', which must be running) and kept up to date as other
devices change it, so that it can be read offline (doc/offline.md, "Pins").
The volume's namespace is then kept in this device's local copy too, even
if the volume is never mounted here. Pins are this device's own: they are
recorded in $CAIRN_HOME/pins.json and survive restarts.

--priority N orders the fetching: higher first (default 0). Pinning a path
already pinned changes its priority when --priority is given. --wait fetches now, in the
foreground, with a progress bar on a terminal, and fails (exit 6) if some
data could not be fetched. Pinned data is never evicted from this device;
'cairn unpin' hands it back to the chunk cache.`,
		Example: `  cairn pin home:/projects --priority 10
  cairn pin home:/photos/2026 --wait
  cairn pin ls`,
		Args: exactArgs(1, "one VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			r, p, err := e.parseOpen(ctx, args[0])
			if err != nil {
				return err
			}
			var setPrio *int
			if cmd.Flags().Changed("priority") {
				setPrio = &prio
			}
			pin, updated, err := r.Pin(ctx, p, setPrio)
			if err != nil {
				return err
			}
			verb := "pinned"
			if updated {
				verb = "pin updated:"
			}
			fmt.Fprintf(e.stdout, "%s %s (priority %d)\n", verb, pin.Path, pin.Priority)
			if !wait {
				return nil
			}
			bar := newCountBar(e.stderr, !e.quiet && isTerminal(e.stderr), "fetching pinned files")
			pass, err := r.SyncPins(ctx, func(pp realm.PinProgress) { bar.set(pp.FilesDone, pp.Files) })
			bar.finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "fetched %d objects (%s) for %d files\n", pass.Fetched, apitypes.IBytes(pass.Bytes), pass.Files)
			for _, f := range pass.Failed {
				fmt.Fprintf(e.stderr, "cairn: pin: %v\n", f)
			}
			if len(pass.Failed) > 0 {
				return withCode(ExitUnavailable, fmt.Errorf("pin: %d files could not be fetched (the node keeps trying)", len(pass.Failed)))
			}
			return nil
		},
	}
	c.Flags().IntVar(&prio, "priority", 0, "fetch order among pins: higher first")
	c.Flags().BoolVar(&wait, "wait", false, "fetch the pinned data now, in the foreground")
	c.AddCommand(e.pinLsCmd())
	return c
}

func (e *env) pinLsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List this device's pins and how much of each is here",
		Long: `List this device's pins, highest priority first: each pin's path, priority,
its files' bytes and how much of them is on this device for good (in its
store or its pinned data), and how many files are not wholly here, as in
"3.2 MiB of 4.0 MiB here, 12 files missing". It fetches nothing, and works
offline from the local copy of the namespace.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			e.allowOffline = true
			r, err := e.open(ctx)
			if err != nil {
				return err
			}
			states, err := r.PinStates(ctx)
			if err != nil {
				return err
			}
			out := make([]PinJSON, len(states))
			for i, s := range states {
				out[i] = PinJSON{Path: s.Path, VolumeID: s.VolumeID, Priority: s.Priority, Files: s.Files, Bytes: s.Bytes,
					HereBytes: s.HereBytes, Missing: s.Missing, Complete: s.Err == "" && s.Missing == 0, Error: s.Err}
				if s.Added != 0 {
					t := time.Unix(0, s.Added)
					out[i].Added = &t
				}
			}
			if asJSON {
				return e.printJSON(out)
			}
			if len(out) == 0 {
				fmt.Fprintln(e.stdout, "no pins")
				return nil
			}
			for _, p := range out {
				line := fmt.Sprintf("%s  priority %d  %d files, %s of %s here", p.Path, p.Priority, p.Files, apitypes.IBytes(p.HereBytes), apitypes.IBytes(p.Bytes))
				if p.Missing > 0 {
					line += fmt.Sprintf(", %d files missing", p.Missing)
				}
				if p.Error != "" {
					line += "  (" + p.Error + ")"
				}
				fmt.Fprintln(e.stdout, line)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func (e *env) unpinCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unpin VOLUME:/PATH",
		Short: "Stop keeping a pinned subtree on this device",
		Long: `Remove a pin ('cairn pin'). Its data is handed back to the chunk cache at the
node's next pass (within moments while 'cairn node serve' runs), where it is
evicted as anything read; data another pin still covers stays. Works
offline.`,
		Args: exactArgs(1, "one VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := vpath.Parse(args[0])
			if err != nil {
				return err
			}
			if err := realm.Unpin(e.home, p); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "unpinned %s\n", p)
			return nil
		},
	}
}

// keepPins runs this device's pin keeper (realm.KeepPins) until ctx ends,
// on a realm handle of its own: the node's background work opens volumes
// through the node's handle, whose volume map and keyring are not made for
// use from two goroutines. The function returned stops the keeper, waits
// for it and closes its handle.
func (e *env) keepPins(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	r, err := realm.Open(ctx, e.home, e.options())
	if err != nil {
		cancel()
		e.log.Warn("pins: not kept: the realm did not open", "err", err)
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.KeepPins(ctx, 0)
	}()
	return func() {
		cancel()
		<-done
		r.Close()
	}
}
