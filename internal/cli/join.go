package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

func (e *env) inviteCmd() *cobra.Command {
	var role, name, user string
	var ttl time.Duration
	c := &cobra.Command{
		Use:   "invite --role device|benefactor|surrogate [--name N] [--user U] [--ttl 1h]",
		Short: "Print a one-time token with which another machine joins the realm",
		Long: `Print a one-time, expiring join token; on the new machine run 'cairn join TOKEN'.
It works on the device holding the realm CA, while 'cairn node serve' runs
there (it serves the join endpoint the token points to).

A device (your own machine) receives with its certificate the realm's
configuration and the volume keys, sealed end to end under the token: treat
the token like a password. A benefactor (donated space) or a surrogate (a
nearby untrusted machine) receives a certificate only: no key, no metadata.
A device of --user U (see 'cairn user') receives U's private key; unless U owns
the realm, no volume key: it opens the volumes shared with U.`,
		Args: exactArgs(0, "no arguments (--role is a flag)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if role == "" {
				return withCode(ExitUsage, errors.New("invite: --role device|benefactor|surrogate is required"))
			}
			ro, err := pki.ParseRole(role)
			if err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			tok, err := r.Invite(cmd.Context(), realm.InviteOptions{Role: ro, Name: name, TTL: ttl, User: user})
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, tok)
			who := "the new " + role
			if name != "" {
				who = "the " + role + " " + name
			}
			fmt.Fprintf(e.stderr, "valid once, for %s, until %s: on %s, run 'cairn join TOKEN'\n", ttl, time.Now().Add(ttl).Format(time.DateTime), who)
			return nil
		},
	}
	c.Flags().StringVar(&role, "role", "", "device, benefactor or surrogate")
	c.Flags().StringVar(&name, "name", "", "the new node's name (default: the joiner proposes its host name)")
	c.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid (at most 720h)")
	c.Flags().StringVar(&user, "user", "", "the user a device belongs to (default: this device's)")
	return c
}

func (e *env) joinCmd() *cobra.Command {
	var noPass bool
	var name string
	c := &cobra.Command{
		Use:   "join TOKEN",
		Short: "Join a realm with a token from 'cairn invite'",
		Long: `Join the realm that issued TOKEN ('cairn invite' on its first device). This
home ($CAIRN_HOME) gets a certificate; a device also gets the realm's
configuration and volume keys, kept in a keyring sealed with a passphrase
(CAIRN_PASSPHRASE or a prompt), or unsealed with --no-passphrase.`,
		Args: exactArgs(1, "a join token"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !noPass {
				// Fail before the token is used up if no passphrase can be had.
				if _, ok := os.LookupEnv("CAIRN_PASSPHRASE"); !ok && !term.IsTerminal(int(os.Stdin.Fd())) {
					return cairn.E("join", cairn.Permission, "", errors.New("a passphrase is needed for the keyring: set CAIRN_PASSPHRASE, run on a terminal, or use --no-passphrase"))
				}
			}
			if name == "" {
				name = realm.DefaultNodeName()
			}
			creds, err := realm.Join(cmd.Context(), e.home, strings.TrimSpace(args[0]), realm.JoinOptions{Name: name, NoPassphrase: noPass, Passphrase: e.passphrase(true)})
			if creds != nil {
				fmt.Fprintf(e.stdout, "joined realm %s as %s %s\n", creds.Identity.Realm, creds.Identity.Role, creds.Identity.Name)
			}
			if err != nil {
				return err
			}
			if u := realm.HomeUser(e.home); creds.Identity.Role == pki.Device && u != "" {
				fmt.Fprintf(e.stdout, "this device belongs to user %s: if they own the realm, it holds every volume key; else it opens what is shared with them ('cairn share')\n", u)
			} else if creds.Identity.Role == pki.Device {
				fmt.Fprintf(e.stdout, "this device holds the realm's volume keys: try 'cairn ls home:/'\n")
				if noPass {
					fmt.Fprintf(e.stdout, "warning: volume keys are NOT protected by a passphrase; anyone who can read %s/keyring can read your files\n", e.home)
				}
			} else {
				fmt.Fprintf(e.stdout, "a %s holds no key and no metadata access; its certificate is in %s\n", creds.Identity.Role, realm.CredentialsDir(e.home))
			}
			return nil
		},
	}
	c.Flags().BoolVar(&noPass, "no-passphrase", false, "keep volume keys unsealed in a 0600 file")
	c.Flags().StringVar(&name, "name", "", "the node name to propose if the token names none (default: the host name)")
	return c
}
