package cli

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store/storeset"
	"cairn.dev/cairn/internal/vpath"
)

func (e *env) policyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "Set and show where files' data goes: this device, copies, or erasure coding across stores",
		Long: `A placement policy says where the data (chunks and manifests) of new file
versions goes, for a whole volume or a directory path:

  local                        this device's own store (the default)
  copies:N@STORE,STORE,...     N whole copies, on N of the stores named
  ec:K+M@STORE1,...,STOREn     Reed-Solomon: each object cut into K data and
                               M parity shards, shard i on STOREi (n = K+M);
                               any K stores give it back, storage is n/K
  stripe:W[,greedy]            donated space: chunks packed into ~1 MiB
                               morsels, spread round-robin over the W
                               benefactors with the most free space (fewer
                               when fewer have room); the space is reserved
                               first ('put' reserves the whole dataset: all or
                               nothing); versions record the benefactors used
                               (stripe:W,greedy@B1,...); one copy only

STOREs are stores added with 'cairn store add' or nodes of the realm. The
policy in force for a file is the one set on the longest prefix of its path.
Policies follow paths, not directories: after renaming a directory, its
policy stays with the old path (set it again on the new one). A policy
applies to versions written after it is set; each version remembers where it
went, so changing a policy never makes older versions unreadable.

'cairn put', the mount and the WebDAV gateway follow policies ('put --store'
overrides them); a running mount or gateway reads the policies again at most
every 2 seconds. A file is placed by where it is when its version is
committed (its last close).`,
	}
	var primary string
	set := &cobra.Command{
		Use:   "set [--primary DEVICE] VOLUME:/PATH POLICY",
		Short: "Set the placement policy of a volume or a directory path",
		Example: `  cairn policy set home:/ copies:2@laptop,s3
  cairn policy set home:/photos ec:2+2@s3a,s3b,gcs,az
  cairn policy set home:/photos/scratch local
  cairn policy set --primary desktop home:/music copies:2@laptop,desktop`,
		Long: `Set the placement policy of a volume or a directory path. A copies policy's
replica set has a primary device, the copy other devices read first: the
device given with --primary, else this device if the policy names it, else
the first device the policy names. The primary is recorded per replica set
(the policy string): every path set to the same copies policy shares it. A
primary that announces standby ('cairn node standby', or a suspend) hands
the role to an awake replica; it does not take it back when it wakes (set
it again with --primary).`,
		Args: exactArgs(2, "a VOLUME:/PATH and a policy"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, p, err := e.parseOpen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			pol, err := r.SetPolicyPrimary(cmd.Context(), p.Volume, p.Slash(), args[1], primary)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: %s\n", p, pol)
			if prims, err := r.Primaries(cmd.Context()); err == nil && prims[pol].Primary != "" {
				fmt.Fprintf(e.stdout, "primary: %s\n", prims[pol].Primary)
			}
			return nil
		},
	}
	set.Flags().StringVar(&primary, "primary", "", "copies policies: the device other devices read first (default: this device, if the policy names it)")
	unset := &cobra.Command{
		Use:   "unset VOLUME:/PATH",
		Short: "Remove the policy set on a path (the one of its parent applies again)",
		Args:  exactArgs(1, "a VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, p, err := e.vol(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := v.Meta.DeletePolicy(cmd.Context(), p.Slash()); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: policy unset\n", p)
			return nil
		},
	}
	var asJSON bool
	get := &cobra.Command{
		Use:   "get [--json] VOLUME:/PATH",
		Short: "Show the policy in force for a path and where each file's data is",
		Long: `Show the policy in force for VOLUME:/PATH (and the path it is set on), the
policies set below it, and for every file at or under it the stores its
current version went to. For copies and ec policies, each file's manifest
is looked for (no data is read), and the health of each of their stores is
shown: up or down, latency, copies or shards found missing or damaged, and
repairs waiting ('cairn repair' makes them).`,
		Args: exactArgs(1, "a VOLUME:/PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, p, err := e.parseOpen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			rep, err := r.PolicyReport(cmd.Context(), p.Volume, p.Parts)
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(rep)
			}
			from := "default"
			if rep.From != "" {
				from = "set on " + rep.From
			}
			fmt.Fprintf(e.stdout, "%s: %s (%s)\n", p, rep.InForce, from)
			if rep.Primary != "" {
				fmt.Fprintf(e.stdout, "primary: %s\n", rep.Primary)
			}
			for _, s := range rep.Set {
				if s.Path != rep.From {
					fmt.Fprintf(e.stdout, "  below: %s %s\n", s.Path, s.Policy)
				}
			}
			if len(rep.Files) > 0 {
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "FILE\tSIZE\tVERSION\tSTORED IN\tREADABLE")
				for _, f := range rep.Files {
					rd := f.Readable
					if rd == "" {
						rd = "-"
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.Path, apitypes.IBytes(f.Size), f.Version, strings.Join(f.Stores, " "), rd)
				}
				tw.Flush()
			}
			for pol, hs := range rep.Health {
				fmt.Fprintf(e.stdout, "stores of %s:\n", pol)
				printHealth(e, hs)
			}
			return nil
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var lsJSON bool
	ls := &cobra.Command{
		Use:   "ls [--json] VOLUME",
		Short: "List the policies set in a volume",
		Args:  exactArgs(1, "a volume name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			vol := strings.TrimSuffix(strings.TrimSuffix(args[0], ":/"), ":")
			recs, err := r.Policies(cmd.Context(), vol)
			if err != nil {
				return err
			}
			prims, err := r.Primaries(cmd.Context())
			if err != nil {
				return err
			}
			type listed struct {
				meta.PolicyRecord
				Primary string `json:"primary,omitempty"` // of a copies policy's replica set
			}
			out := make([]listed, len(recs))
			for i, rec := range recs {
				out[i] = listed{rec, prims[rec.Policy].Primary}
			}
			if lsJSON {
				return e.printJSON(out)
			}
			if len(recs) == 0 {
				fmt.Fprintf(e.stdout, "no policy set in %s: everything is local\n", vol)
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PATH\tPOLICY\tPRIMARY\tSET\tBY")
			for _, rec := range out {
				prim := rec.Primary
				if prim == "" {
					prim = "-"
				}
				fmt.Fprintf(tw, "%s:%s\t%s\t%s\t%s\t%s\n", vol, rec.Path, rec.Policy, prim, time.Unix(0, rec.Set).Format(time.DateTime), rec.SetBy)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print JSON")
	c.AddCommand(set, unset, get, ls)
	return c
}

// printHealth prints a policy's stores' health.
func printHealth(e *env, hs []storeset.Health) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  STORE\tSTATE\tLATENCY\tMISSING\tDAMAGED\tREPAIRED\tQUEUED\tLAST ERROR")
	for _, h := range hs {
		state := "up"
		if !h.Up {
			state = "down since " + h.DownSince.Format(time.TimeOnly)
		}
		lat := "-"
		if h.Latency > 0 {
			lat = h.Latency.Round(time.Millisecond / 10).String()
		}
		last := h.LastError
		if len(last) > 120 {
			last = last[:120] + "..."
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\n", h.Name, state, lat, h.Missing, h.Corrupt, h.Repaired, h.Queued, last)
	}
	tw.Flush()
}

func (e *env) repairCmd() *cobra.Command {
	var storeName string
	var scrub, asJSON bool
	c := &cobra.Command{
		Use:   "repair [--store NAME] [--scrub] [--json]",
		Short: "Rebuild missing or damaged copies and shards of copies and ec policies",
		Long: `For every copies and ec policy in use (named by file versions of any volume,
or set on a path), retry the repairs queued when a write could not reach
every store, then check every object: each store must hold its copy or shard
(from the stores' listings; with --scrub every copy and shard is read and
verified, so damaged ones are found too). What is missing or damaged is
rebuilt from the good copies or shards onto its store. --store restricts the
repair to that store's copies and shards. This device's own store (and
every file's chunks wherever they are) is checked and healed by 'cairn fsck
--read-data --repair', which can also heal from the original files.

A store on a node that is not awake is never contacted (repair wakes no
sleeping device): its copies and shards are skipped and named ("skipped:
node NAME is standby since ..."), its queued repairs kept; a later repair,
or the node daemon's schedule ('cairn node serve --maint-every'), catches
it up once it is awake. A store skipped because its node is in standby is
no failure; one whose node is offline is (exit 6). Repair records per store
when it last repaired (or, with --scrub, scrubbed) it.

Exit status: 0 when everything is whole; 5 if some object has too few good
copies or shards left to rebuild it (data lost unless a store comes back);
6 if some repairs could not be made now (a store is down: run again later).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			show := !asJSON && !e.quiet && isTerminal(e.stderr)
			var bar *countBar
			barPolicy := ""
			walk := func(policy string, done, total int) {
				if bar == nil || barPolicy != policy {
					if bar != nil {
						bar.finish()
					}
					bar, barPolicy = newCountBar(e.stderr, show, "checking "+policy+": objects"), policy
				}
				bar.set(done, total)
			}
			res, err := r.Repair(cmd.Context(), storeName, scrub, func(rr realm.RepairResult) {
				if bar != nil {
					bar.finish()
					bar = nil
				}
				if asJSON {
					return
				}
				fmt.Fprintf(e.stdout, "%s: %s\n", rr.Policy, rr.Report)
				for _, h := range rr.Health {
					if h.Missing+h.Corrupt+h.Repaired > 0 || h.Queued > 0 || !h.Up {
						state := "up"
						if !h.Up {
							state = "down: " + h.LastError
						}
						fmt.Fprintf(e.stdout, "  %s: %d missing, %d damaged, %d rebuilt, %d queued (%s)\n", h.Name, h.Missing, h.Corrupt, h.Repaired, h.Queued, state)
					}
				}
				for _, sk := range rr.Skipped {
					fmt.Fprintf(e.stdout, "  %s\n", sk)
				}
				if rr.Error != "" {
					fmt.Fprintf(e.stdout, "  stopped: %s\n", rr.Error)
				}
			}, walk)
			if err != nil {
				return err
			}
			if asJSON {
				if res == nil {
					res = []realm.RepairResult{}
				}
				if err := e.printJSON(res); err != nil {
					return err
				}
			} else if len(res) == 0 {
				fmt.Fprintln(e.stdout, "no copies or ec policy in use: nothing to repair here ('cairn fsck --read-data --repair' checks and heals this device's store)")
			}
			var lost, failed int64
			for _, rr := range res {
				lost += rr.Report.Unrecoverable
				failed += rr.Report.Failed
				if rr.Error != "" {
					failed++
				}
				failed += int64(rr.Offline)
			}
			switch {
			case lost > 0:
				return withCode(ExitDamaged, fmt.Errorf("repair: %d object(s) have too few good copies or shards to rebuild", lost))
			case failed > 0:
				return withCode(ExitUnavailable, fmt.Errorf("repair: %d repair(s) could not be made now (a store is unreachable?): run again later", failed))
			}
			return nil
		},
	}
	c.Flags().StringVar(&storeName, "store", "", "repair only this store's copies and shards")
	c.Flags().BoolVar(&scrub, "scrub", false, "read and verify every copy and shard (finds damaged ones; reads all the data)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// policyVolumes returns, for paths of the volume v under p, the handle of
// v that writes under the policy in force there; the handles of every
// policy set on p, its parents or below it are opened now (so a policy
// naming a store that cannot be opened fails the command before anything
// is written). With put --store, always v.
func (e *env) policyVolumes(ctx context.Context, v *fs.Volume, p vpath.Path) (func(path string) *fs.Volume, error) {
	if e.target != "" {
		return func(string) *fs.Volume { return v }, nil
	}
	recs, err := v.Meta.Policies(ctx)
	if err != nil {
		return nil, err
	}
	r, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	moves, err := r.VolumeMoves(ctx, p.Volume)
	if err != nil {
		return nil, err
	}
	root := p.Slash()
	vols := map[string]*fs.Volume{}
	for _, rec := range recs {
		if rec.Path == "/" || root == "/" || rec.Path == root || strings.HasPrefix(root, rec.Path+"/") || strings.HasPrefix(rec.Path, root+"/") {
			if _, ok := vols[rec.Policy]; ok {
				continue
			}
			pv, err := r.PolicyVolume(ctx, p.Volume, rec.Policy)
			if err != nil {
				return nil, fmt.Errorf("policy %s of %s:%s: %w", rec.Policy, p.Volume, rec.Path, err)
			}
			vols[rec.Policy] = pv
		}
	}
	// Files being moved (cairn move) are offloaded until the move's copy
	// is done (doc/director.md, "Moves").
	for _, m := range moves {
		overlaps := m.Path == "/" || root == "/" || m.Path == root || strings.HasPrefix(root, m.Path+"/") || strings.HasPrefix(m.Path, root+"/")
		if _, ok := vols["move\x00"+m.To]; ok || !overlaps {
			continue
		}
		mv, err := r.MoveVolume(ctx, p.Volume, m.To)
		if err != nil {
			return nil, fmt.Errorf("moving %s:%s to %s: %w", p.Volume, m.Path, m.To, err)
		}
		vols["move\x00"+m.To] = mv
	}
	return func(path string) *fs.Volume {
		if to := realm.MovingTo(moves, path); to != "" {
			return vols["move\x00"+to]
		}
		if rec := meta.PolicyFor(recs, path); rec != nil {
			if pv := vols[rec.Policy]; pv != nil {
				return pv
			}
		}
		return v
	}, nil
}
