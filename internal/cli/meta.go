package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

func (e *env) metaCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "meta",
		Short: "Where the realm's metadata service runs",
		Long: `The realm's metadata (names, directories, versions) lives in an etcd
embedded in one device's cairn; the other devices reach it through that
device's metadata gateway. The realm records where it is, and every device
follows that record.`,
	}
	var to string
	move := &cobra.Command{
		Use:   "move --to DEVICE",
		Short: "Move the realm's metadata service to another device",
		Long: `Move the realm's embedded etcd from this device, which must host it, to
DEVICE, whose node must be serving ('cairn node serve' there, with this
version of cairn). It uses etcd's own membership changes: DEVICE's node
starts a member that joins as a learner, it is promoted once it has caught
up, leadership is handed to it, the realm records DEVICE's metadata gateway
(every device's cairn follows that record: no configuration to edit), and
this device's member is removed. No committed write is lost; writes made
meanwhile on other devices pause (for about a second) rather than fail.

Afterwards this device reaches the metadata through DEVICE's gateway, like
the others, and keeps its old etcd data as etcd.moved-<time> in its realm
directory; its running node ('cairn node serve') follows the metadata to
DEVICE's gateway by itself. DEVICE's node must keep running: it now hosts
the metadata. ('cairn node standby' on the device that hosts it moves it to
an awake device the same way.)

If this device's etcd server started before its node first served, it is
restarted first (a pause of about a second, in which requests in flight
fail), so that it can take a peer.`,
		Args: exactArgs(0, "no arguments (the device goes in --to)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return cairn.E("meta move", cairn.Invalid, "", errors.New("name the device to move to with --to"))
			}
			if err := pki.ValidName(to); err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			err = r.MoveMeta(cmd.Context(), to, realm.MoveMetaOptions{Progress: func(step string) {
				if !e.quiet {
					fmt.Fprintln(e.stderr, step)
				}
			}})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "moved the metadata service to %s\n", to)
			return nil
		},
	}
	move.Flags().StringVar(&to, "to", "", "the device to move the metadata service to")
	add := &cobra.Command{
		Use:   "add DEVICE",
		Short: "Run the realm's metadata service on one more device",
		Long: `Add DEVICE as a member of the realm's embedded etcd, run from the device
that hosts it; DEVICE's node must be serving ('cairn node serve' there, with
this version of cairn). DEVICE's node starts a member that joins as a
learner and is promoted once it has caught up; the realm then records
DEVICE's metadata gateway beside the others, and every device spreads its
requests over all of them.

A realm whose three devices are usually on can run three members: the
metadata stays available, with no failed write, while any one of them is
down (two of three keep the quorum). Two members are no safer than one:
both must be up. 'cairn devices' shows the members and their health.`,
		Args: exactArgs(1, "a device name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := pki.ValidName(args[0]); err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			err = r.AddMeta(cmd.Context(), args[0], realm.MoveMetaOptions{Progress: func(step string) {
				if !e.quiet {
					fmt.Fprintln(e.stderr, step)
				}
			}})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s now serves the metadata too\n", args[0])
			return nil
		},
	}
	c.AddCommand(move, add)
	return c
}

// metaMembers finds where the realm's metadata lives and marks those
// devices in out. A realm on an external etcd cluster has no record (nil);
// a failure is printed, not fatal: the device list stands on its own.
func (e *env) metaMembers(ctx context.Context, r *realm.Realm, out []deviceJSON) []realm.MetaMemberStatus {
	ms, err := r.MetaStatus(ctx)
	if err != nil {
		if !errors.Is(err, cairn.ErrNotFound) {
			fmt.Fprintf(e.stderr, "cairn: where the metadata lives: %v\n", err)
		}
		return nil
	}
	for i := range ms {
		for j := range out {
			if out[j].Name == ms[i].Node {
				out[j].Metadata = &ms[i]
			}
		}
	}
	return ms
}

func (e *env) printMetaMembers(ms []realm.MetaMemberStatus) {
	if len(ms) == 0 {
		return
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		gw := m.Gateway
		if gw == "" {
			gw = "no gateway yet"
		}
		parts[i] = fmt.Sprintf("%s (%s, gateway %s)", m.Node, m.Health, gw)
	}
	fmt.Fprintf(e.stdout, "\nmetadata: %s\n", strings.Join(parts, ", "))
}
