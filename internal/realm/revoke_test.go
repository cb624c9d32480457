package realm

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"cairn.dev/cairn/internal/pki"
)

func leafOf(t *testing.T, home string) *x509.Certificate {
	t.Helper()
	c, err := pki.LoadCredentials(CredentialsDir(home))
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf
}

// Removal revokes the certificates issued at join, by serial: the
// remover's clock, skewed either way against the CA host's, revokes the
// removed node's certificate and not that of a node invited again under
// the same name.
func TestRemovalRevokesTheJoinCertificate(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	rev, err := a.revocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitRevoked := func(c *x509.Certificate) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			if ok, err := rev.Revoked(c); err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("certificate %s of %s not revoked", c.SerialNumber.Text(16), c.Subject.CommonName)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The join recorded the serial.
	old := leafOf(t, joinAs(t, a, pki.Benefactor, "donor"))
	st, err := a.Meta.Node(ctx, "donor")
	if err != nil || !slices.Equal(st.Serials, []string{old.SerialNumber.Text(16)}) {
		t.Fatalf("record after join: %+v %v", st, err)
	}
	// The remover's clock is an hour behind the CA host's.
	if err := a.Meta.RemoveNode(ctx, "donor", time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitRevoked(old)

	// Invited again under its name, by a remover an hour ahead.
	again := leafOf(t, joinAs(t, a, pki.Benefactor, "donor"))
	if err := a.Meta.RemoveNode(ctx, "donor", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitRevoked(again)
	third := leafOf(t, joinAs(t, a, pki.Benefactor, "donor"))
	// The removals before it are in the list (again is revoked): the
	// third certificate must not be.
	if ok, err := rev.Revoked(third); ok || err != nil {
		t.Fatalf("a certificate issued after the removal is revoked: %v %v", ok, err)
	}
	if ok, _ := rev.Revoked(leafOf(t, a.Home)); ok {
		t.Fatal("the remover's own certificate is revoked")
	}
}
