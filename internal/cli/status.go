package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/mount"
)

// runDir holds the sockets of the realm's running processes
// ($CAIRN_HOME/run): the mounts' status sockets.
func runDir(home string) string { return filepath.Join(home, "run") }

// statusPoll is how often --wait-idle asks the mounts again.
const statusPoll = 50 * time.Millisecond

func (e *env) statusCmd() *cobra.Command {
	var asJSON, waitIdle bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "status [--json] [--wait-idle [--timeout D]]",
		Short: "This device and the realm on one screen: state, what is pending, what is wrong",
		Long: `Show this device and the realm on one screen:

  device    this device's name and role
  metadata  whether the metadata service answers, and where it lives
  realm     the nodes by power state (and which are asleep), stores, volumes
  pending   work accepted and not finished: files on this device's mounts,
            its upload queue ('cairn put --background'), and the realm's
            offloaded versions that wait for their home ('cairn offload ls')
  problems  what needs attention: a node offline without announcing it, a
            store that does not answer, a mount that works offline or whose
            commits failed, an unhealthy metadata member

then this device's running mounts ('cairn mount'), each with what it has
accepted and not finished:

  closed     files written and closed whose commit is not queued yet (write-back
             mode queues a file's commit when the kernel releases it, after the
             close has returned: counted from the close)
  queued     commits queued or running (a file's new version not yet in the
             metadata service)
  namespace  creations, renames, removals and attribute changes not yet written
             to the metadata service (write-back mode's batches)
  done/failed  commits finished since the mount started

A store on a node that is not awake is not asked (status never wakes a
device); other stores are asked once, with a short deadline.

Each mount answers on a unix socket, $CAIRN_HOME/run/mount-VOLUME-PID.sock
(mode 0600, removed at unmount; a socket left by a killed mount is removed here).
--wait-idle waits until no mount has anything pending (every file closed on them
is committed, every namespace change written), then prints the status; it fails
(exit 1) after --timeout with what is still pending.

A mount that cannot reach the metadata service says so below the table:
since when, and the local copy of the namespace it serves meanwhile (its
revision and when it was saved; doc/offline.md). --json: one object
(doc/api.md, "Status"), its mounts' "offline".

Exit status: 0, also when there are problems (they are listed); 1 when
--wait-idle timed out.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if waitIdle && timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			all, err := e.mountStatus(ctx, waitIdle)
			if err != nil {
				return err
			}
			st := e.statusReport(cmd.Context(), all)
			if asJSON {
				return e.printJSON(st)
			}
			e.printStatus(st)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (doc/api.md, \"Status\"); its mounts as doc/format.md, \"Mount status socket\" says")
	c.Flags().BoolVar(&waitIdle, "wait-idle", false, "wait until every mount has nothing pending")
	c.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "with --wait-idle: give up after this long (0: wait for ever)")
	return c
}

// mountStatus returns the running mounts' status; with idle, once none
// has anything pending (or ctx ends: an error naming what is pending).
func (e *env) mountStatus(ctx context.Context, idle bool) ([]mount.Status, error) {
	for {
		all, err := mount.Running(ctx, runDir(e.home))
		if err != nil && ctx.Err() == nil {
			return nil, err
		}
		busy := ""
		for _, s := range all {
			if s.Pending > 0 {
				busy += fmt.Sprintf("; %s: %d pending (%d closed, %d queued, %d namespace)", s.Mountpoint, s.Pending, s.Closed, s.Queued, s.Namespace)
			}
		}
		if !idle || (err == nil && busy == "") {
			return all, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, cairn.E("status --wait-idle", cairn.Unavailable, "", fmt.Errorf("timed out with work still pending%s", busy))
			}
			return nil, ctx.Err()
		case <-time.After(statusPoll):
		}
	}
}

// offlineLine says that a mount (or this device) works without the
// metadata service, and what it serves meanwhile.
func offlineLine(who string, o *apitypes.Offline) string {
	l := fmt.Sprintf("%s: offline since %s (metadata service unreachable)", who, o.Since.Format(time.RFC3339))
	if o.Serving {
		l += fmt.Sprintf("; serving the local copy from %s, revision %d", o.CopySaved.Format(time.RFC3339), o.CopyRev)
	} else {
		l += "; no local copy of the namespace to serve"
	}
	return l
}
