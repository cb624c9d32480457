// Package layers holds the test that keeps cairn's layering honest: a
// package may import only cairn packages of a strictly lower layer (see
// DESIGN.md: fs → director → meta → chunk pipeline → store). A new package
// must be given a layer here before the test passes.
package layers

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "cairn.dev/cairn/"

// layer ranks every package; lower numbers are lower layers.
var layer = map[string]int{
	"internal/cairn":               0, // vocabulary: no cairn imports at all
	"internal/volkey":              1,
	"internal/durable":             1, // fsynced writes of small files and directory entries
	"internal/durable/durabletest": 2, // test helper: a small tmpfs to fill
	"internal/vpath":               1,
	"internal/metrics":             1, // Prometheus metrics: one registry per process, the store wrapper, /metrics; counted into from every layer
	"internal/wol":                 1, // Wake-on-LAN magic packets: encode, parse, send (issue 17's wake proxy, the sleep rig's agent)
	"internal/filescache":          2, // put's files cache: what each local file looked like when stored (doc/format.md)
	"internal/journal":             2, // the journal of work finished later (DESIGN decision 12): below fs, mount and cli
	"internal/httpauth":            2, // app passwords, Basic authentication, loopback rule, TLS listener: shared by dav and web

	"internal/chunker":  2,
	"internal/store":    2, // optional store abilities and helpers
	"internal/manifest": 2,
	"internal/pki":      2, // realm CA, join tokens, revocation, TLS configs
	"internal/userkey":  2, // users' X25519 keys and the stanzas that wrap volume keys to them
	"internal/logind":   1, // systemd-logind's sleep inhibitor and PrepareForSleep, over D-Bus

	"internal/store/storeset": 2, // members, health, quorum writes, repair queue: shared by replicastore and ecstore

	"internal/store/objstore": 2, // a cairn.Store over any cloud bucket (s3store, gcsstore, azstore)

	"internal/pipeline":                 3,
	"internal/keyring":                  3,
	"internal/store/memstore":           3,
	"internal/store/localstore":         3,
	"internal/store/cachestore":         3, // read cache wrapped around any store
	"internal/store/packstore":          3, // packs small objects into large ones for cloud stores
	"internal/store/anchorstore":        3, // retries reads of objects a lagging store does not show yet
	"internal/store/lagstore":           4, // test helper: a store whose new objects appear late
	"internal/store/faultstore":         3, // test helper: a store wrapper that injects faults (down, slow, held, damaged objects)
	"internal/store/replicastore":       3, // copies:N over several stores
	"internal/store/ecstore":            3, // ec:K+M, Reed-Solomon shards over several stores
	"internal/store/s3store":            3, // S3 and S3-compatible buckets (minio-go)
	"internal/store/gcsstore":           3, // Google Cloud Storage buckets
	"internal/store/azstore":            3, // Azure Blob containers
	"internal/store/cloudtest":          5, // test helper: MinIO, fake-gcs-server, Azurite; runs storetest on them
	"internal/store/storetest":          4, // test helper: may use any store
	"internal/node/wire":                3, // node wire protocol v1: shared by server and client
	"internal/node":                     4, // a node's chunk service (server)
	"internal/store/remotestore":        4, // client of a node's chunk service
	"internal/surrogate":                4, // data staging's surrogate service and its client (doc/surrogate.md)
	"internal/etcdsvc":                  3,
	"internal/etcdsvc/etcdtest":         4,
	"internal/etcdsvc/etcdtest/etcdbin": 5,
	"internal/netnstest":                4, // test helper: hosts in network namespaces
	"internal/netnstest/sleeprig":       5, // test helper: hosts whose device sleeps and a wake agent (issue 16)
	"internal/metagw":                   4, // metadata gateway: mutual-TLS front of etcd, devices only

	"internal/meta": 5,

	// The director (doc/director.md): where bytes go and come from.
	// Below fs, which writes and reads through the stores it chooses;
	// the realm supplies what it needs through director.Env.
	"internal/director": 6,

	"internal/fs":       7,
	"internal/apitypes": 7, // JSON types shared by the CLI's --json outputs and the web API

	"internal/realm":    8,
	"internal/mount":    8, // FUSE mount of an fs.Volume; the CLI opens the realm for it
	"internal/dav":      8, // WebDAV gateway over an fs.Volume; the CLI opens the realm for it
	"internal/web":      8, // the web page and its JSON API over a Source; the CLI gives it one
	"internal/cli":      9,
	"cmd/cairn":         10,
	"bench/mount/fsops": 10, // a bench helper program (bench/mount.sh)
	"bench/fusert":      10, // a bench helper program (bench/fuse-rt.sh)

	"internal/layers": 11,
	"internal/docs":   11, // tests that doc/ matches the code
	"bench":           11,
	"bench/stages":    11, // benchmarks only (bench/stages.sh): each stage of put, and the whole put
}

func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "cairn.dev/cairn/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		rank, ok := layer[pkg]
		if !ok {
			t.Errorf("package %s has no layer: add it to layers_test.go", pkg)
			continue
		}
		seen++
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			r, ok := layer[dep]
			if !ok {
				continue // reported on its own line
			}
			if r >= rank {
				t.Errorf("%s (layer %d) imports %s (layer %d): lower layers must not import higher or equal ones", pkg, rank, dep, r)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("only %d packages checked; go list output looks wrong:\n%s", seen, out)
	}
}
