// Command cairn is the command line of cairn, a file system for the data a
// person or a team keeps across many machines. See 'cairn --help'.
package main

import (
	"os"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
)

func main() {
	etcdsvc.RunDaemonIfRequested()
	os.Exit(cli.Main(os.Args[1:]))
}
