package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/realm"
)

func (e *env) surrogateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "surrogate",
		Short: "Nearby untrusted machines that stage your chunks: add, list, remove",
		Long: `A surrogate is a machine near this device (a lab's spare box, a friend's NAS,
a small always-on server) that joined the realm with a surrogate invitation
('cairn invite --role surrogate') and serves with 'cairn node serve': it
offers space, under a lease, where this device can stage the encrypted
chunks it will read next, and reads them back at one-hop latency. It is
trusted with nothing: it sees ciphertext named by hash, keeps it as soft
state only, and every chunk read from it is verified (doc/surrogate.md).

'surrogate add HOST:PORT' measures a surrogate and keeps it in this device's
list ($CAIRN_HOME/surrogates.json); 'surrogate ls' shows the list;
'surrogate remove HOST:PORT' forgets one.`,
	}
	c.AddCommand(e.surrogateAddCmd(), e.surrogateLsCmd(), e.surrogateRemoveCmd())
	return c
}

func (e *env) surrogateAddCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "add HOST:PORT",
		Short: "Measure a surrogate (round trip, rates) and add it to this device's list",
		Long: `Connect to the surrogate at HOST:PORT (its 'cairn node serve' address) over
mutual TLS with this device's certificate: it must be a surrogate of this
realm, not revoked. Measure its round trip (median of 5 info requests) and
its rates (a 1 MiB probe chunk staged and read back in a session of its
own, deregistered after), and keep it with what it offers in this device's
list. Adding one again measures it again. A surrogate that answers but has
no room for the probe is added with its round trip and the reason.`,
		Args: exactArgs(1, "a surrogate's address HOST:PORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			ent, err := r.AddSurrogate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "added surrogate %s (%s): round trip %v, up %s/s, down %s/s, offers %s, quota %s, lease %v\n",
				ent.Addr, ent.Name, time.Duration(ent.RTT).Round(10*time.Microsecond), humanLS(int64(ent.Up)), humanLS(int64(ent.Down)),
				humanLS(ent.Offer), humanLS(ent.Quota), time.Duration(ent.Lease)*time.Millisecond)
			if ent.Error != "" {
				fmt.Fprintf(e.stdout, "warning: no rate measured: %s\n", ent.Error)
			}
			return nil
		},
	}
}

// surrogateRow is one line of 'cairn surrogate ls'.
type surrogateRow struct {
	realm.SurrogateEntry
	// Live: what it answers now (Reachable false: Unreachable says why).
	Reachable   bool   `json:"reachable"`
	Unreachable string `json:"unreachable,omitempty"`
	Free        int64  `json:"free"`
	Clients     int    `json:"clients"`
	LiveRTT     int64  `json:"live_rtt_ns,omitempty"`
}

func (e *env) surrogateLsCmd() *cobra.Command {
	var asJSON bool
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the surrogates this device knows, what was measured and what they offer now",
		Long: `List this device's surrogates: address, node name, the round trip and
rates measured by 'surrogate add', and what each answers now (asked once,
within --timeout): the space it has not granted yet, how many sessions it
holds, and the round trip of that request. --json prints the same as a
JSON array (sizes in bytes, rates in bytes per second, durations in ns).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			list, err := realm.LoadSurrogates(e.home)
			if err != nil {
				return err
			}
			rows := []surrogateRow{}
			var r *realm.Realm
			if len(list) > 0 {
				if r, err = e.open(ctx); err != nil {
					return err
				}
			}
			for _, s := range list {
				row := surrogateRow{SurrogateEntry: s}
				e.surrogateLive(ctx, r, &row, timeout)
				rows = append(rows, row)
			}
			if asJSON {
				return e.printJSON(rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(e.stdout, "no surrogate: add one with 'cairn surrogate add HOST:PORT'")
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ADDRESS\tNAME\tRTT\tUP/S\tDOWN/S\tOFFER\tFREE\tLEASE\tSESSIONS\tNOW")
			for _, s := range rows {
				now := "ok"
				if !s.Reachable {
					now = "unreachable: " + s.Unreachable
				}
				fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\t%s\t%v\t%d\t%s\n", s.Addr, s.Name, time.Duration(s.RTT).Round(10*time.Microsecond),
					humanLS(int64(s.Up)), humanLS(int64(s.Down)), humanLS(s.Offer), humanLS(s.Free), time.Duration(s.Lease)*time.Millisecond, s.Clients, now)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long to wait for each surrogate's answer")
	return c
}

// surrogateLive asks the surrogate what it offers now.
func (e *env) surrogateLive(ctx context.Context, r *realm.Realm, row *surrogateRow, timeout time.Duration) {
	c, err := r.SurrogateClient(ctx, row.Addr)
	if err != nil {
		row.Unreachable = err.Error()
		return
	}
	defer c.Close()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t0 := time.Now()
	in, err := c.Info(tctx)
	if err != nil {
		row.Unreachable = err.Error()
		return
	}
	row.Reachable, row.Free, row.Clients, row.LiveRTT = true, in.Free, in.Clients, int64(time.Since(t0))
	row.Offer, row.Quota, row.Lease = in.Offer, in.Quota, in.Lease
}

func (e *env) surrogateRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove HOST:PORT",
		Short: "Forget a surrogate: this device no longer uses it",
		Long: `Remove HOST:PORT from this device's list of surrogates. What this device
staged there is deleted by the surrogate when its session's lease ends.`,
		Args: exactArgs(1, "a surrogate's address HOST:PORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := realm.RemoveSurrogate(e.home, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed surrogate %s\n", args[0])
			return nil
		},
	}
}
