package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/meta"
)

// parseACLEntry parses USER:PERM, user:USER:PERM or device:NAME:PERM.
func parseACLEntry(s string) (string, meta.Perm, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", withCode(ExitUsage, fmt.Errorf("acl: %q: give USER:PERM or device:NAME:PERM (PERM r, rw or none)", s))
	}
	who, perm := s[:i], s[i+1:]
	p, err := meta.ParsePerm(perm)
	if err != nil {
		return "", "", err
	}
	who = principalName(who)
	if err := meta.CheckPrincipal(who); err != nil {
		return "", "", err
	}
	return who, p, nil
}

// principalName makes a bare user name user:NAME.
func principalName(who string) string {
	if !strings.HasPrefix(who, "user:") && !strings.HasPrefix(who, "device:") {
		return "user:" + who
	}
	return who
}

func (e *env) aclCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "acl",
		Short: "Who may read or change what inside a volume: per-path access for users and devices",
		Long: `An ACL gives a user or a device an access on a path of a volume: r (read),
rw (read and write) or none. Without one, a user has what the volume's share
gives: the realm's owner rw, a member shared --write rw, --read r, anyone
else nothing. The nearest ACL on the path or above it that names a user
replaces that; the nearest that names a device caps what its user has there
(device:phone:none keeps a subtree off the phone whoever uses it).

A denied path is invisible in listings, and reading or changing it fails
(exit 4, EACCES in a mount, 403 over WebDAV). ACLs follow paths, not
directories: renaming a directory leaves its ACLs on the old path, and moving
a path needs rw on it and on every path with an ACL below it. Every cairn
process decides by them before each change commits; a device holding raw
credentials of the metadata service is not held by them (doc/threat-model.md).`,
	}
	var asJSON bool
	get := &cobra.Command{
		Use:   "get [--json] VOLUME:/PATH",
		Short: "Show the ACLs on a path and above it, and what every user and named device may do there",
		Args:  exactArgs(1, "a VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, p, err := e.parseOpen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			rep, err := r.ACL(cmd.Context(), p.Volume, p.Slash())
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(rep)
			}
			fmt.Fprintf(e.stdout, "%s:%s\n", rep.Volume, rep.Path)
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PRINCIPAL\tACCESS\tWHY")
			for _, a := range rep.Access {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", a.Principal, a.Perm, a.Why)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, rec := range rep.Records {
				for _, en := range rec.Entries {
					fmt.Fprintf(e.stdout, "acl %s %s:%s (set by %s)\n", rec.Path, en.Who, en.Perm, orDash(en.SetBy))
				}
			}
			return nil
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	set := &cobra.Command{
		Use:   "set VOLUME:/PATH USER:PERM|device:NAME:PERM",
		Short: "Give a user or a device r, rw or none on a path (owner's devices only)",
		Example: `  cairn acl set home:/ bob:r
  cairn acl set home:/shared bob:rw
  cairn acl set home:/private bob:none
  cairn acl set home:/private device:phone:none`,
		Args: exactArgs(2, "a VOLUME:/PATH and USER:PERM or device:NAME:PERM"),
		RunE: func(cmd *cobra.Command, args []string) error {
			who, perm, err := parseACLEntry(args[1])
			if err != nil {
				return err
			}
			r, p, err := e.parseOpen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := r.SetACL(cmd.Context(), p.Volume, p.Slash(), who, perm); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: %s %s\n", p, who, perm)
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm VOLUME:/PATH USER|device:NAME",
		Short: "Remove a user's or a device's ACL entry on a path (its access is inherited again)",
		Args:  exactArgs(2, "a VOLUME:/PATH and USER or device:NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.Count(args[1], ":") > 1 || (strings.Contains(args[1], ":") && !strings.HasPrefix(args[1], "user:") && !strings.HasPrefix(args[1], "device:")) {
				return withCode(ExitUsage, errors.New("acl rm: give USER or device:NAME, no access"))
			}
			r, p, err := e.parseOpen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			who := principalName(args[1])
			if err := r.RemoveACL(cmd.Context(), p.Volume, p.Slash(), who); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: removed %s\n", p, who)
			return nil
		},
	}
	c.AddCommand(get, set, rm)
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
