package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
)

// TestExternalEtcdCluster runs a realm on a real 3-member etcd cluster
// (separate processes), kills one member, and keeps working.
func TestExternalEtcdCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a 3-member etcd cluster; run without -short")
	}
	c := etcdtest.Cluster(t, 3)
	eps := strings.Join(c.Endpoints(), ",")
	home := filepath.Join(t.TempDir(), "realm")
	r := &realmT{t: t, home: home, env: append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+home, "CAIRN_ETCD="+eps)}
	r.ok("init", "--no-passphrase")
	if _, err := os.Stat(filepath.Join(home, "etcd")); err == nil {
		t.Fatal("an external-etcd realm started an embedded etcd")
	}
	src := filepath.Join(t.TempDir(), "f.bin")
	data := randBytes(500 << 10)
	writeFile(t, src, data, 0o644)
	putJSON(t, r, src, "home:/before")

	c.KillMember(0)

	// Reads and writes go on with 2 of 3 members.
	if got := r.ok("cat", "home:/before/f.bin"); !bytes.Equal([]byte(got), data) {
		t.Fatal("read after member kill differs")
	}
	writeFile(t, src, append(data, 'x'), 0o644)
	putJSON(t, r, src, "home:/after")
	if got := r.ok("cat", "home:/after/f.bin"); len(got) != len(data)+1 {
		t.Fatalf("write after member kill: read %d bytes", len(got))
	}
	// Without CAIRN_ETCD the realm still uses its recorded endpoints.
	r2 := &realmT{t: t, home: home, env: append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+home)}
	if out := r2.ok("ls", "home:/"); out != "after/\nbefore/\n" {
		t.Fatalf("ls = %q", out)
	}
	r.ok("fsck", "--read-data")
}
