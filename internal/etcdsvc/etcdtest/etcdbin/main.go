// Command etcdbin is a real etcd server built from the module version that
// cairn links, for tests that need separate etcd processes (etcdtest.Cluster).
// Debian's etcd is 3.4, too old to match client/v3 v3.7.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
