package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// TLSOptions tune ServerTLS and ClientTLS.
type TLSOptions struct {
	// Revocations is consulted on every handshake, for the peer's
	// certificate. Required: pass NoRevocations{} to revoke nothing.
	Revocations Revocations

	// RequireClientCert (ServerTLS only) refuses, during the handshake, a
	// client that presents no certificate. Without it a client may connect
	// anonymously (a certificate it does present is verified all the same),
	// and the server must refuse anonymous requests itself, which lets one
	// listener also serve the health check and the join exchange.
	RequireClientCert bool

	// Peer, if set, is a further check of the verified peer: an expected
	// node name (a client dialing node X), or allowed roles (RequireRole).
	Peer func(NodeIdentity) error
}

// ALPN is the only application protocol cairn's TLS configurations offer:
// HTTP/2.
const ALPN = "h2"

// ServerTLS returns the TLS configuration of a node's server: TLS 1.3 only,
// HTTP/2, presenting c's certificate chain; a client certificate must chain
// to the realm CA, name a node of the realm, not be revoked and pass o.Peer.
func ServerTLS(c *Credentials, o TLSOptions) (*tls.Config, error) {
	if err := o.check(c); err != nil {
		return nil, err
	}
	auth := tls.VerifyClientCertIfGiven
	if o.RequireClientCert {
		auth = tls.RequireAndVerifyClientCert
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{ALPN},
		Certificates: []tls.Certificate{c.TLSCertificate()},
		ClientAuth:   auth,
		ClientCAs:    caPool(c.CA),
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				if o.RequireClientCert {
					return errors.New("cairn: client certificate required")
				}
				return nil
			}
			// crypto/tls has verified the chain against ClientCAs
			// (also on resumption) and filled VerifiedChains.
			if len(cs.VerifiedChains) == 0 {
				return errors.New("cairn: client certificate not verified")
			}
			_, err := o.admit(c.Identity.Realm, cs.VerifiedChains[0][0])
			return err
		},
	}, nil
}

// ClientTLS returns the TLS configuration of a node dialing another: TLS 1.3
// only, HTTP/2, presenting c's certificate chain; the server's certificate
// must chain to the realm CA (server use), name a node of the realm, not be
// revoked and pass o.Peer. Servers are identified by their certificate's
// node identity, not by host name: node addresses change (DHCP, a laptop
// moving), identities do not.
func ClientTLS(c *Credentials, o TLSOptions) (*tls.Config, error) {
	if err := o.check(c); err != nil {
		return nil, err
	}
	if o.RequireClientCert {
		return nil, cairn.E("client tls", cairn.Invalid, "", errors.New("RequireClientCert is a server option"))
	}
	roots := caPool(c.CA)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{ALPN},
		Certificates: []tls.Certificate{c.TLSCertificate()},
		// Verification is done by VerifyConnection below, against the
		// realm CA and by identity instead of host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("cairn: server presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{
				Roots:       roots,
				CurrentTime: time.Now(),
				KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				return fmt.Errorf("cairn: server certificate: %w", err)
			}
			_, err := o.admit(c.Identity.Realm, leaf)
			return err
		},
	}, nil
}

func (o TLSOptions) check(c *Credentials) error {
	if c == nil || c.Leaf == nil || c.CA == nil || c.Key == nil {
		return cairn.E("tls config", cairn.Invalid, "", errors.New("incomplete credentials"))
	}
	if o.Revocations == nil {
		return cairn.E("tls config", cairn.Invalid, "", errors.New("no revocation list (pass pki.NoRevocations{} to revoke nothing)"))
	}
	return nil
}

// admit checks a verified peer certificate: identity, realm, revocation, and
// o.Peer.
func (o TLSOptions) admit(realm string, leaf *x509.Certificate) (NodeIdentity, error) {
	id, err := Admit(realm, leaf, o.Revocations)
	if err != nil {
		return id, err
	}
	if o.Peer != nil {
		if err := o.Peer(id); err != nil {
			return id, err
		}
	}
	return id, nil
}

// Admit checks a peer certificate that already chains to the realm CA: it
// names a node of realm and is not revoked. Errors have Kind Permission
// (revoked, foreign) or the revocation source's kind.
func Admit(realm string, leaf *x509.Certificate, rev Revocations) (NodeIdentity, error) {
	id, err := IdentityOf(leaf)
	if err != nil {
		return id, err
	}
	if id.Realm != realm {
		return id, cairn.E("admit", cairn.Permission, id.Name, fmt.Errorf("node of realm %s, this is realm %s", id.Realm, realm))
	}
	revoked, err := rev.Revoked(leaf)
	if err != nil {
		return id, cairn.E("admit", cairn.KindOf(err), id.Name, fmt.Errorf("revocation check: %w", err))
	}
	if revoked {
		return id, cairn.E("admit", cairn.Permission, id.Name, fmt.Errorf("certificate %s of node %s is revoked", leaf.SerialNumber.Text(16), id.Name))
	}
	return id, nil
}

// PeerIdentity returns the identity and certificate of the verified client
// of a server connection made with ServerTLS (from VerifiedChains only, so a
// certificate crypto/tls did not verify is never believed). Kind Permission
// if the client presented no certificate. A client learns its server's
// identity through TLSOptions.Peer.
func PeerIdentity(cs *tls.ConnectionState) (NodeIdentity, *x509.Certificate, error) {
	if cs == nil {
		return NodeIdentity{}, nil, cairn.E("peer identity", cairn.Permission, "", errors.New("not a TLS connection"))
	}
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return NodeIdentity{}, nil, cairn.E("peer identity", cairn.Permission, "", errors.New("no verified client certificate"))
	}
	leaf := cs.VerifiedChains[0][0]
	id, err := IdentityOf(leaf)
	return id, leaf, err
}

// RequireRole returns a TLSOptions.Peer check that admits only the roles.
func RequireRole(roles ...Role) func(NodeIdentity) error {
	return func(id NodeIdentity) error {
		if id.HasRole(roles...) {
			return nil
		}
		return cairn.E("admit", cairn.Permission, id.Name, fmt.Errorf("role %s not allowed here", id.Role))
	}
}

// RequireNode returns a TLSOptions.Peer check that admits only the node
// named name (a client that knows whom it dials).
func RequireNode(name string) func(NodeIdentity) error {
	return func(id NodeIdentity) error {
		if id.Name == name {
			return nil
		}
		return cairn.E("admit", cairn.Permission, id.Name, fmt.Errorf("expected node %s", name))
	}
}
