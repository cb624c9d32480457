package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable/durabletest"
)

func TestCreateLoadCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := CreateCA(dir, "realm-1")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	if !ca.Cert.IsCA || ca.Cert.NotAfter.Sub(ca.Cert.NotBefore) < 20*365*24*time.Hour {
		t.Fatalf("CA certificate: IsCA %v, valid %v", ca.Cert.IsCA, ca.Cert.NotAfter.Sub(ca.Cert.NotBefore))
	}
	got, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Realm != "realm-1" || got.Fingerprint() != ca.Fingerprint() {
		t.Fatalf("LoadCA: realm %q fingerprint %x; want realm-1 %x", got.Realm, got.Fingerprint(), ca.Fingerprint())
	}
	if _, err := CreateCA(dir, "realm-1"); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("second CreateCA: %v, want Exist", err)
	}
	if _, err := LoadCA(t.TempDir()); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("LoadCA of an empty dir: %v, want NotFound", err)
	}
	// A key that does not match the certificate.
	other := newCA(t, "realm-1")
	b, _ := encodeKey(other.key)
	if err := os.WriteFile(filepath.Join(dir, CAKeyFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("LoadCA with a foreign key: %v, want Corrupt", err)
	}
	if err := os.Chmod(filepath.Join(dir, CAKeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("LoadCA with a world-readable key: %v, want Permission", err)
	}
	if _, err := CreateCA(t.TempDir(), "Bad Realm"); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("CreateCA with a bad realm ID: %v, want Invalid", err)
	}
}

func TestIssueAndIdentity(t *testing.T) {
	ca := newCA(t, "r1")
	for _, role := range []Role{Device, Benefactor, Surrogate} {
		c, err := ca.NewCredentials(NodeIdentity{Realm: "r1", Name: "box-" + string(role), Role: role}, IssueOptions{Hosts: []string{"box.lan", "10.0.0.7"}})
		if err != nil {
			t.Fatal(err)
		}
		id, err := IdentityOf(c.Leaf)
		if err != nil {
			t.Fatal(err)
		}
		want := NodeIdentity{Realm: "r1", Name: "box-" + string(role), Role: role}
		if id != want {
			t.Fatalf("IdentityOf = %+v, want %+v", id, want)
		}
		if got := c.Leaf.URIs[0].String(); got != "cairn://realm/r1/node/box-"+string(role)+"?role="+string(role) {
			t.Fatalf("URI SAN = %s", got)
		}
		if len(c.Leaf.DNSNames) != 1 || len(c.Leaf.IPAddresses) != 1 {
			t.Fatalf("hosts: DNS %v IP %v", c.Leaf.DNSNames, c.Leaf.IPAddresses)
		}
		dir := t.TempDir()
		if serr := c.Save(dir); serr != nil {
			t.Fatal(serr)
		}
		back, err := LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		if back.Identity != want || !back.Leaf.Equal(c.Leaf) || !back.CA.Equal(ca.Cert) {
			t.Fatalf("LoadCredentials = %+v", back.Identity)
		}
	}
	bad := []NodeIdentity{
		{Realm: "r2", Name: "x", Role: Device},          // another realm
		{Realm: "r1", Name: "Has Space", Role: Device},  // bad name
		{Realm: "r1", Name: "x", Role: "admin"},         // bad role
		{Realm: "r1", Name: "../etc", Role: Benefactor}, // bad name
	}
	for _, id := range bad {
		if _, err := ca.NewCredentials(id, IssueOptions{}); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("NewCredentials(%+v): %v, want Invalid", id, err)
		}
	}
	if _, err := LoadCredentials(t.TempDir()); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("LoadCredentials of an empty dir: %v, want NotFound", err)
	}
}

func TestLoadCredentialsRefusesForeignCA(t *testing.T) {
	ca, other := newCA(t, "r1"), newCA(t, "r1")
	c := creds(t, ca, "n1", Device)
	c.CA = other.Cert
	dir := t.TempDir()
	if err := c.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCredentials(dir); !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("LoadCredentials with a certificate of another CA: %v, want Corrupt", err)
	}
}

// certWith signs a leaf with arbitrary URIs and CN.
func certWith(t *testing.T, ca *CA, cn string, uris ...string) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func TestIdentityOfRefuses(t *testing.T) {
	ca := newCA(t, "r1")
	for _, tc := range []struct {
		cn   string
		uris []string
	}{
		{"n", nil},
		{"n", []string{"cairn://realm/r1/node/n?role=device", "cairn://realm/r1/node/n?role=benefactor"}},
		{"other", []string{"cairn://realm/r1/node/n?role=device"}},
		{"n", []string{"cairn://realm/r1/node/n?role=root"}},
		{"n", []string{"cairn://realm/r1/node/n?role=device&role=device"}},
		{"n", []string{"cairn://realm/r1/node/n/x?role=device"}},
		{"n", []string{"cairn://evil/r1/node/n?role=device"}},
		{"n", []string{"cairn://realm/R1/node/n?role=device"}},
	} {
		c := certWith(t, ca, tc.cn, tc.uris...)
		if id, err := IdentityOf(c); !errors.Is(err, cairn.ErrPermission) {
			t.Errorf("IdentityOf(CN %s, %v) = %+v, %v; want Permission", tc.cn, tc.uris, id, err)
		}
	}
	// Other URI schemes are ignored.
	c := certWith(t, ca, "n", "https://example.com/", "cairn://realm/r1/node/n?role=surrogate")
	if id, err := IdentityOf(c); err != nil || id.Role != Surrogate {
		t.Fatalf("IdentityOf with an extra https URI = %+v, %v", id, err)
	}
}

func TestRevocationList(t *testing.T) {
	ca := newCA(t, "r1")
	a, b := creds(t, ca, "a", Benefactor), creds(t, ca, "b", Device)
	path := filepath.Join(t.TempDir(), "revoked.json")
	l1, err := OpenRevocationList(path)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := OpenRevocationList(path) // another process's view
	if err != nil {
		t.Fatal(err)
	}
	check := func(l *RevocationList, c *Credentials, want bool) {
		t.Helper()
		got, rerr := l.Revoked(c.Leaf)
		if rerr != nil || got != want {
			t.Fatalf("Revoked(%s) = %v, %v; want %v", c.Identity.Name, got, rerr, want)
		}
	}
	check(l1, a, false)
	check(l2, a, false)
	if rerr := l1.RevokeSerial(a.Leaf.SerialNumber); rerr != nil {
		t.Fatal(rerr)
	}
	check(l1, a, true)
	check(l1, b, false)
	// l2 sees the change once RecheckInterval has passed.
	clock := time.Now()
	l2.now = func() time.Time { return clock }
	clock = clock.Add(RecheckInterval)
	check(l2, a, true)
	// Both writers' revocations survive (read-modify-write under the lock).
	if rerr := l2.RevokeName("b"); rerr != nil {
		t.Fatal(rerr)
	}
	l1.now = func() time.Time { return clock.Add(2 * RecheckInterval) }
	check(l1, b, true)
	check(l1, a, true)
	names, err := l1.RevokedNames()
	if err != nil || len(names) != 1 {
		t.Fatalf("RevokedNames = %v, %v", names, err)
	}

	// A name revocation spares certificates issued after it.
	mem := NewRevocationList()
	old := creds(t, ca, "c", Device)
	mem.now = func() time.Time { return time.Now().Add(Backdate + 2*time.Second) }
	if err := mem.RevokeName("c"); err != nil {
		t.Fatal(err)
	}
	check(mem, old, true)
	newer := creds(t, ca, "c", Device)
	newer.Leaf.NotBefore = time.Now().Add(10 * time.Second) // as if issued later
	check(mem, newer, false)

	// A damaged file fails closed.
	if err := os.WriteFile(path, []byte("{nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	l1.now = func() time.Time { return clock.Add(time.Hour) }
	if got, err := l1.Revoked(b.Leaf); err == nil || !got {
		t.Fatalf("Revoked with a damaged list = %v, %v; want true and an error", got, err)
	}
}

// TestCredentialsSaveFullDisk saves new credentials over good ones on a
// full file system: Save fails and the old credentials still load.
func TestCredentialsSaveFullDisk(t *testing.T) {
	dir := durabletest.SmallTmpfs(t)
	ca := newCA(t, "r1")
	old := creds(t, ca, "n1", Device)
	credDir := filepath.Join(dir, "pki")
	if err := old.Save(credDir); err != nil {
		t.Fatal(err)
	}
	durabletest.Fill(t, dir)
	if err := creds(t, ca, "n1", Device).Save(credDir); !errors.Is(err, cairn.ErrIO) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full disk = %v, want an IO error wrapping ENOSPC", err)
	}
	back, err := LoadCredentials(credDir)
	if err != nil {
		t.Fatalf("the credentials saved before the full disk do not load: %v", err)
	}
	if !back.Leaf.Equal(old.Leaf) {
		t.Fatal("the node certificate is not the one saved before")
	}
	fi, err := os.Stat(filepath.Join(credDir, NodeKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node key: %v %v; want mode 0600", err, fi)
	}
}
