package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/realm"
)

func (e *env) storeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "store",
		Short: "Add, list and remove the stores the realm keeps data in (cloud buckets, directories)",
		Long: `A store keeps encrypted chunks and manifests: an S3 or S3-compatible bucket,
a Google Cloud Storage bucket, an Azure Blob container, a directory, or a
node of the realm. Stores see no plaintext and no file names.

Credentials come from each cloud's standard environment variables and files
on every device (never from a URL or the command line):
  s3://      AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN),
             or ~/.aws/credentials (AWS_PROFILE), or the machine's IAM role
  gs://      Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS)
  azblob://  AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT and
             AZURE_STORAGE_KEY

Write to a store with 'cairn put --store NAME'.`,
	}
	add := &cobra.Command{
		Use:   "add NAME URL",
		Short: "Check that a store works from this device and add it to the realm",
		Long: `Add a store to the realm under NAME. URL is one of
  s3://BUCKET/PREFIX?endpoint=HOST:PORT&region=REGION&insecure=1
      (endpoint, region and insecure are optional; no endpoint is Amazon S3)
  gs://BUCKET/PREFIX
  azblob://CONTAINER/PREFIX
  file:///ABSOLUTE/DIRECTORY
  node://NODE
A test object is written, read back and deleted first: a store that does not
work from this device is not added.`,
		Args: exactArgs(2, "a store name and a URL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			rec, err := r.AddStore(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "added store %s (%s)\n", rec.Name, rec.URL)
			return nil
		},
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the realm's stores: health, objects, bytes, requests made, estimated cost",
		Long: `List every store of the realm as this device sees it: whether it answers
(and how fast), how many objects and bytes it holds (a listing of the store),
the requests every device has made to it, and an estimate of its monthly
storage cost and of the requests so far, from list prices of each provider's
standard class (stores at a custom endpoint, directories and nodes have none).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			infos, err := r.StoreInfos(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if infos == nil {
					infos = []realm.StoreInfo{}
				}
				return e.printJSON(infos)
			}
			if len(infos) == 0 {
				fmt.Fprintln(e.stdout, "no stores: add one with 'cairn store add NAME URL'")
				return nil
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tURL\tHEALTH\tOBJECTS\tSIZE\tREQUESTS\tCOST/MONTH\tREQUESTS COST")
			for _, s := range infos {
				health := s.Health
				if health == "ok" {
					health = fmt.Sprintf("ok (%s)", s.Latency.Round(time.Millisecond))
				}
				if s.Draining {
					health += ", draining"
				}
				var n int64
				for _, c := range s.Requests {
					n += c
				}
				cost, rcost := "-", "-"
				if s.Price != nil {
					cost, rcost = fmt.Sprintf("$%.4f", s.MonthlyCost), fmt.Sprintf("$%.4f", s.RequestsCost)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", s.Name, s.URL, health, s.Objects, apitypes.IBytes(s.Bytes), n, cost, rcost)
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var to string
	remove := &cobra.Command{
		Use:   "remove NAME [--to STORE]",
		Short: "Move a store's data away, then remove it from the realm",
		Long: `Remove a store from the realm without losing data. First the store is marked
as draining (nothing new goes to it); then every file version whose data is
only there is copied to this device's own store (or to --to STORE) and
recorded there; versions also held elsewhere just stop naming it. Only then
is the store removed from the realm. If versions in the trash hold data only
in the store, nothing is removed: restore them or purge the trash first. The
objects in the store itself are left in place: delete the bucket yourself
once you no longer want them.`,
		Args: exactArgs(1, "a store name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := r.RemoveStore(cmd.Context(), args[0], to, nil)
			fmt.Fprintf(e.stdout, "%d version(s) named %s; %d moved: %d object(s), %s copied\n",
				rep.Versions, args[0], rep.Moved, rep.Objects, apitypes.IBytes(rep.Bytes))
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed store %s\n", args[0])
			return nil
		},
	}
	remove.Flags().StringVar(&to, "to", "", "copy the store's data to this registered store instead of this device's own")
	c.AddCommand(add, ls, remove)
	return c
}
