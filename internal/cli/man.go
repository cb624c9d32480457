package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"cairn.dev/cairn/internal/cairn"
)

// manCmd writes the manual pages, one per command, from the same help
// text --help prints, so that the two cannot drift apart.
// scripts/install.sh installs them.
func (e *env) manCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write the manual pages (man 1 cairn, cairn-put, ...) into DIR",
		Long: `Write one manual page per command into DIR (created if missing), made from
the same text as --help: cairn.1, cairn-put.1, cairn-node-serve.1, ...
scripts/install.sh installs them; to read one without installing:

  cairn man /tmp/cairn-man && man /tmp/cairn-man/cairn-put.1`,
		Args: usageArgs(1, "the directory to write into"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return cairn.E("man", cairn.IO, dir, err)
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // the same pages for the same binary
			hdr := &doc.GenManHeader{Section: "1", Source: "cairn " + VersionString(), Manual: "cairn manual"}
			if err := doc.GenManTree(root, hdr, dir); err != nil {
				return cairn.E("man", cairn.IO, dir, err)
			}
			n, _ := filepath.Glob(filepath.Join(dir, "*.1"))
			fmt.Fprintf(e.stdout, "wrote %d manual pages to %s\n", len(n), dir)
			return nil
		},
	}
}
