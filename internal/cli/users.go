package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/meta"
)

func (e *env) userCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "user",
		Short: "The realm's users: people, each with a key pair and devices",
		Long: `A user is a person: an X25519 key pair, whose private key is kept, sealed by
the passphrase, in the keyrings of the user's devices, and whose public key is in
the realm's metadata. The first user added owns the realm (and this device
becomes theirs); the owner's devices hold every volume key. Another user's
devices open only the volumes shared with them ('cairn share'). A user's device
joins with a token from 'cairn invite --role device --user NAME'.`,
	}
	add := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a user (the first one owns the realm)",
		Args:  exactArgs(1, "a user name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			u, err := r.AddUser(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if u.Owner {
				fmt.Fprintf(e.stdout, "added user %s, the realm's owner; this device is theirs\n", u.Name)
			} else {
				fmt.Fprintf(e.stdout, "added user %s; give them a device with 'cairn invite --role device --user %s', and volumes with 'cairn share VOLUME %s --read'\n", u.Name, u.Name, u.Name)
			}
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the realm's users",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			users, err := r.Users(cmd.Context())
			if err != nil {
				return err
			}
			devs, err := r.UserDevices(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tROLE\tADDED\tDEVICES\tPUBLIC KEY")
			for _, u := range users {
				role := "member"
				if u.Owner {
					role = "owner"
				}
				d := strings.Join(devs[u.Name], ",")
				if d == "" {
					d = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%x\n", u.Name, role, time.Unix(0, u.Added).Format(time.DateTime), d, u.Public)
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a user, unsharing (and rotating) every volume shared with them; their devices stay ('cairn node remove')",
		Args:  exactArgs(1, "a user name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if err := r.RemoveUser(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed user %s\n", args[0])
			return nil
		},
	}
	c.AddCommand(add, ls, rm)
	return c
}

func (e *env) shareCmd() *cobra.Command {
	var read, write bool
	c := &cobra.Command{
		Use:   "share VOLUME USER --read|--write",
		Short: "Give a user's devices a volume: its key wrapped to the user's public key",
		Long: `Wrap VOLUME's key to USER's public key and record the grant in the realm's
metadata: every device of USER, also one that joins later, opens the volume
with no other device awake. --read or --write records the access asked for
(not yet enforced on writes: see doc/threat-model.md).`,
		Args: exactArgs(2, "a volume and a user"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if read == write {
				return withCode(ExitUsage, errors.New("share: give one of --read or --write"))
			}
			access := meta.Read
			if write {
				access = meta.Write
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if err := r.Share(cmd.Context(), args[0], args[1], access); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "shared volume %s with user %s (%s)\n", args[0], args[1], access)
			return nil
		},
	}
	c.Flags().BoolVar(&read, "read", false, "the user may read")
	c.Flags().BoolVar(&write, "write", false, "the user may read and write")
	return c
}

func (e *env) unshareCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unshare VOLUME USER",
		Short: "Take a volume back from a user, rotating its key for later data",
		Long: `Remove USER's grant of VOLUME and rotate the volume's key for what is written
from now on, re-wrapping it for the remaining members: cairn on the user's
devices can no longer open the volume, and a device that kept the old keys
cannot decrypt what is written afterwards. What was written before stays
readable to whoever could read it (doc/threat-model.md). A mount or WebDAV
gateway already running keeps the old key until restarted.`,
		Args: exactArgs(2, "a volume and a user"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if err := r.Unshare(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "unshared volume %s from user %s; its key is rotated for data written from now on\n", args[0], args[1])
			return nil
		},
	}
}
