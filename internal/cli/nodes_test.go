package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

// init makes the realm CA and this device's credentials, named --name.
func TestInitMakesCA(t *testing.T) {
	r := newRealm(t, "--no-passphrase", "--name", "desk")
	ca, err := pki.LoadCA(realm.CADir(r.home))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.LoadCredentials(realm.CredentialsDir(r.home))
	if err != nil {
		t.Fatal(err)
	}
	if c.Identity.Name != "desk" || c.Identity.Role != pki.Device || c.Identity.Realm != ca.Realm || pki.Fingerprint(c.CA) != ca.Fingerprint() {
		t.Fatalf("credentials: %+v", c.Identity)
	}
	if fi, err := os.Stat(filepath.Join(realm.CADir(r.home), pki.CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v %v", fi, err)
	}
	// A bad name is refused before anything is made.
	bad := &realmT{t: t, home: filepath.Join(t.TempDir(), "bad")}
	bad.env = append(os.Environ(), "CAIRN_TEST_RUN_CLI=1", "CAIRN_HOME="+bad.home)
	if res := bad.fails(2, "init", "--no-passphrase", "--name", "Not A Name"); !strings.Contains(res.stderr, "node name") {
		t.Fatalf("stderr: %s", res.stderr)
	}
	if _, err := os.Stat(filepath.Join(bad.home, "realm.json")); err == nil {
		t.Fatal("a realm was made with a bad name")
	}
}
