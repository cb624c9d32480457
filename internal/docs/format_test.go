// Package docs holds tests that keep doc/ in step with the code.
package docs

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/dav"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/filescache"
	"cairn.dev/cairn/internal/journal"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/store/ecstore"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/objstore"
	"cairn.dev/cairn/internal/store/packstore"
	"cairn.dev/cairn/internal/surrogate"
	"cairn.dev/cairn/internal/userkey"
)

// one is the version shared by formats that one row of the table lists
// together; if they differ, the row must be split.
func one(t *testing.T, row string, vs ...int) string {
	t.Helper()
	for _, v := range vs[1:] {
		if v != vs[0] {
			t.Errorf("row %q: its formats are at versions %v in the code: give each its own row", row, vs)
		}
	}
	return fmt.Sprint(vs[0])
}

// TestFormatVersionTable checks the table at the top of doc/format.md
// against the version constants in the code: a format whose version
// changes without the table failing here was changed without its
// documentation.
func TestFormatVersionTable(t *testing.T) {
	want := map[string]string{
		"chunk object":                                    fmt.Sprint(pipeline.ChunkVersion),
		"manifest object":                                 fmt.Sprintf("%d, %d", manifest.Version, manifest.VersionDelta),
		"local store (packs and index)":                   one(t, "local store", localstore.PackVersion, localstore.IndexVersion),
		"cloud store object names":                        fmt.Sprint(objstore.KeyVersion),
		"pack objects, local pack index":                  one(t, "pack objects", packstore.PackVersion, packstore.LogVersion),
		"metadata keys and records":                       fmt.Sprintf("%s (records: 1, %d)", one(t, "metadata", meta.FormatVersion, realm.SealedKeyFormat), meta.RecordFormat),
		"embedded etcd's files (endpoint, locks, socket)": fmt.Sprint(etcdsvc.HomeFormat),
		"mount cache and commit queue":                    fmt.Sprintf("%d (queue records: %d)", mount.CacheVersion, mount.QueueVersion),
		"upload queue (`put --background`)":               fmt.Sprint(cli.QueueFormat),
		"files cache (`put`)":                             fmt.Sprint(filescache.Format),
		"journal (work accepted locally, finished later)": fmt.Sprint(journal.Version),
		"mount status socket":                             fmt.Sprint(mount.StatusVersion),
		"local copy of a volume's namespace":              fmt.Sprint(meta.LocalCopyVersion),
		"pins (subtrees kept on this device)":             fmt.Sprint(realm.PinsVersion),
		"offline log (changes made offline)":              fmt.Sprint(meta.OfflineRecordVersion),
		"keyring":                                         fmt.Sprint(keyring.FormatVersion),
		"realm config":                                    one(t, "realm config", realm.ConfigVersion, realm.DevicePayloadFormat),
		"WebDAV app passwords":                            fmt.Sprint(dav.UsersFormat),
		"node registry records":                           fmt.Sprint(meta.NodeRecordFormat),
		"ACL records":                                     fmt.Sprint(meta.ACLRecordFormat),
		"primary records":                                 fmt.Sprint(meta.PrimaryRecordFormat),
		"offload entries":                                 fmt.Sprint(meta.OffloadFormat),
		"users, volume grants and key stanzas":            one(t, "users", meta.UserRecordFormat, userkey.StanzaFormat),
		"node control socket":                             fmt.Sprint(realm.ControlVersion),
		"web JSON API (`cairn web`)":                      fmt.Sprint(apitypes.Version),
		"wake request (`POST /v1/wake` of the node wire)": fmt.Sprint(wire.WakeVersion),
		"node wire protocol, join token, revocation and token lists, registrar state": one(t, "node wire protocol",
			wire.Version, pki.JoinFormat, pki.TokenListFormat, pki.RevocationFormat, realm.RegistrarFormat),
		"erasure-coded shards and shard maps, repair queue, shard-map cache": fmt.Sprint(ecstore.Version),
		"surrogate staging API, surrogate list":                              one(t, "surrogate", surrogate.Version, realm.SurrogateListFormat),
	}
	b, err := os.ReadFile("../../doc/format.md")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	inTable := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| format | version |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("format.md: malformed row %q", line)
		}
		got[strings.TrimSpace(cells[1])] = strings.TrimSpace(cells[2])
	}
	if len(got) == 0 {
		t.Fatal("format.md: no version table (a row beginning '| format | version |')")
	}
	for row, v := range want {
		g, ok := got[row]
		switch {
		case !ok:
			t.Errorf("format.md: no row %q in the version table (the code is at version %s)", row, v)
		case g != v:
			t.Errorf("format.md: %q is at version %q in the table, %q in the code", row, g, v)
		}
	}
	for row := range got {
		if _, ok := want[row]; !ok {
			t.Errorf("format.md: row %q of the version table has no constant checked here: add it to this test", row)
		}
	}
	// The mount's queue record table names the version it writes.
	if !strings.Contains(string(b), fmt.Sprintf("| `v` | %d;", mount.QueueVersion)) {
		t.Errorf("format.md: the queue record table's `v` row does not say version %d", mount.QueueVersion)
	}
}
