// Package pki is the realm's certificate authority: it creates and keeps the
// realm CA, issues node certificates that name the node and its role, lets a
// new machine join with a one-time token, keeps the revocation list, and
// builds the TLS 1.3 configurations with which nodes authenticate each other
// (DESIGN decision 9).
//
// A node certificate carries the node's identity in a URI SAN:
//
//	cairn://realm/<realm ID>/node/<name>?role=<device|benefactor|surrogate>
//
// and its name again as the subject CN. IdentityOf reads it back from a
// certificate that chains to the realm CA. The formats (files, token, join
// exchange) are in doc/format.md, "Node wire protocol, version 1"; what they
// defend against is in doc/threat-model.md, "Transport".
package pki

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"cairn.dev/cairn/internal/cairn"
)

// Role is what a node is trusted with (DESIGN: Vocabulary, node).
type Role string

// The roles. Only a device is trusted with plaintext, keys and metadata.
const (
	Device     Role = "device"     // the owner's machine
	Benefactor Role = "benefactor" // donated space: untrusted, throttled
	Surrogate  Role = "surrogate"  // untrusted, soft state only, leased
)

// ParseRole parses one of the three role names.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case Device, Benefactor, Surrogate:
		return r, nil
	}
	return "", cairn.E("parse role", cairn.Invalid, s, fmt.Errorf("want device, benefactor or surrogate"))
}

// NodeIdentity is who a verified certificate says its holder is.
type NodeIdentity struct {
	Realm string
	Name  string
	Role  Role
}

func (id NodeIdentity) String() string {
	return fmt.Sprintf("%s (%s, realm %s)", id.Name, id.Role, id.Realm)
}

// HasRole reports whether id's role is one of roles.
func (id NodeIdentity) HasRole(roles ...Role) bool {
	for _, r := range roles {
		if id.Role == r {
			return true
		}
	}
	return false
}

// URI is the identity's URI SAN, the authoritative form in a certificate.
func (id NodeIdentity) URI() *url.URL {
	return &url.URL{
		Scheme:   "cairn",
		Host:     "realm",
		Path:     "/" + id.Realm + "/node/" + id.Name,
		RawQuery: "role=" + string(id.Role),
	}
}

// Validate checks the realm ID, the name and the role.
func (id NodeIdentity) Validate() error {
	if err := ValidRealm(id.Realm); err != nil {
		return err
	}
	if err := ValidName(id.Name); err != nil {
		return err
	}
	_, err := ParseRole(string(id.Role))
	return err
}

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	realmRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)
)

// ValidName checks a node name: 1 to 63 characters from [a-z0-9._-],
// starting with a letter or digit (a lowercase host name fits).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return cairn.E("node name", cairn.Invalid, name, fmt.Errorf("want 1-63 characters from a-z 0-9 . _ -, starting with a letter or digit"))
	}
	return nil
}

// ValidRealm checks a realm ID: 1 to 64 characters from [a-z0-9-].
func ValidRealm(realm string) error {
	if !realmRE.MatchString(realm) {
		return cairn.E("realm id", cairn.Invalid, realm, fmt.Errorf("want 1-64 characters from a-z 0-9 -"))
	}
	return nil
}

// parseNodeURI parses a node identity URI (see the package comment).
func parseNodeURI(u *url.URL) (NodeIdentity, error) {
	if u.Scheme != "cairn" || u.Host != "realm" || u.User != nil || u.Fragment != "" || u.Opaque != "" {
		return NodeIdentity{}, fmt.Errorf("not a cairn node URI: %s", u)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 3 || parts[1] != "node" {
		return NodeIdentity{}, fmt.Errorf("not a cairn node URI: %s", u)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil || len(q) != 1 || len(q["role"]) != 1 {
		return NodeIdentity{}, fmt.Errorf("node URI %s: want exactly one role", u)
	}
	id := NodeIdentity{Realm: parts[0], Name: parts[2], Role: Role(q.Get("role"))}
	if err := id.Validate(); err != nil {
		return NodeIdentity{}, err
	}
	return id, nil
}

// IdentityOf reads the node identity from a certificate. It does not verify
// the certificate: call it on a certificate that a TLS handshake (ServerTLS,
// ClientTLS) or x509.Verify has already chained to the realm CA.
func IdentityOf(cert *x509.Certificate) (NodeIdentity, error) {
	var found []NodeIdentity
	for _, u := range cert.URIs {
		if u.Scheme != "cairn" {
			continue
		}
		id, err := parseNodeURI(u)
		if err != nil {
			return NodeIdentity{}, cairn.E("node identity", cairn.Permission, cert.Subject.CommonName, err)
		}
		found = append(found, id)
	}
	if len(found) != 1 {
		return NodeIdentity{}, cairn.E("node identity", cairn.Permission, cert.Subject.CommonName,
			fmt.Errorf("certificate carries %d cairn node URIs, want 1", len(found)))
	}
	if cert.Subject.CommonName != found[0].Name {
		return NodeIdentity{}, cairn.E("node identity", cairn.Permission, cert.Subject.CommonName,
			fmt.Errorf("subject CN differs from the node name %q", found[0].Name))
	}
	return found[0], nil
}
