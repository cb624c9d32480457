package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// Files in a CA directory and in a node's credentials directory.
const (
	CACertFile   = "ca.crt"   // PEM certificate of the realm CA (public)
	CAKeyFile    = "ca.key"   // PEM PKCS#8 key of the realm CA, mode 0600
	NodeCertFile = "node.crt" // PEM certificate of this node
	NodeKeyFile  = "node.key" // PEM PKCS#8 key of this node, mode 0600
)

const (
	// CAValidity is how long a realm CA is valid. A realm outlives its
	// machines; re-keying the CA means every node joins again.
	CAValidity = 25 * 365 * 24 * time.Hour
	// NodeValidity is the default validity of a node certificate. Nodes are
	// retired by revocation, not by expiry.
	NodeValidity = 10 * 365 * 24 * time.Hour
	// Backdate is subtracted from NotBefore so that peers whose clocks lag
	// the CA's accept a fresh certificate at once. The issue time of a node
	// certificate is therefore NotBefore + Backdate.
	Backdate = 5 * time.Minute
)

// CA is the realm's certificate authority.
type CA struct {
	Realm string
	Cert  *x509.Certificate
	key   crypto.Signer
}

// Fingerprint is the SHA-256 of a certificate's DER bytes (what
// `openssl x509 -fingerprint -sha256` prints). Join tokens pin the CA by it.
func Fingerprint(cert *x509.Certificate) [32]byte { return sha256.Sum256(cert.Raw) }

// Fingerprint of the CA certificate.
func (ca *CA) Fingerprint() [32]byte { return Fingerprint(ca.Cert) }

// Pool returns a pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool { return caPool(ca.Cert) }

func caPool(c *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c)
	return p
}

func realmURI(realm string) *url.URL {
	return &url.URL{Scheme: "cairn", Host: "realm", Path: "/" + realm}
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func newSerial() (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	b[0] &= 0x7f
	b[0] |= 0x40 // 127 significant bits, never zero, never negative
	return new(big.Int).SetBytes(b), nil
}

// CreateCA makes a new realm CA (ECDSA P-256, self-signed, valid
// CAValidity) and writes it to dir (created 0700 if missing): CACertFile and
// CAKeyFile (0600). It refuses (Kind Exist) if dir already holds a CA.
func CreateCA(dir, realm string) (*CA, error) {
	const op = "create ca"
	if err := ValidRealm(realm); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	for _, f := range []string{CACertFile, CAKeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return nil, cairn.E(op, cairn.Exist, filepath.Join(dir, f), errors.New("a CA already exists here"))
		}
	}
	key, err := newKey()
	if err != nil {
		return nil, cairn.E(op, cairn.Other, dir, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, cairn.E(op, cairn.Other, dir, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "cairn realm " + realm + " CA"},
		NotBefore:             now.Add(-Backdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{realmURI(realm)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, dir, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, dir, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, cairn.E(op, cairn.Other, dir, err)
	}
	// Key first: a crash between the two leaves no certificate without key.
	if err := durable.ReplaceFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	if err := durable.ReplaceFile(filepath.Join(dir, CACertFile), encodeCert(cert), 0o644); err != nil {
		return nil, cairn.E(op, cairn.IO, dir, err)
	}
	return &CA{Realm: realm, Cert: cert, key: key}, nil
}

// LoadCA reads the CA that CreateCA wrote to dir and checks that the key
// matches the certificate.
func LoadCA(dir string) (*CA, error) {
	const op = "load ca"
	cert, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	key, err := readKey(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	if !publicKeyEqual(key.Public(), cert.PublicKey) {
		return nil, cairn.E(op, cairn.Corrupt, dir, errors.New("CA key does not match the CA certificate"))
	}
	realm, err := caRealm(cert)
	if err != nil {
		return nil, cairn.E(op, cairn.Corrupt, dir, err)
	}
	return &CA{Realm: realm, Cert: cert, key: key}, nil
}

// caRealm reads the realm ID from a CA certificate.
func caRealm(cert *x509.Certificate) (string, error) {
	if !cert.IsCA {
		return "", errors.New("not a CA certificate")
	}
	for _, u := range cert.URIs {
		if u.Scheme == "cairn" && u.Host == "realm" && u.RawQuery == "" && len(u.Path) > 1 {
			realm := u.Path[1:]
			if err := ValidRealm(realm); err != nil {
				return "", err
			}
			return realm, nil
		}
	}
	return "", errors.New("CA certificate names no cairn realm")
}

// IssueOptions tune Issue.
type IssueOptions struct {
	// Hosts are DNS names or IP addresses put in the certificate's SANs, for
	// clients that verify a server by host name (etcd's). The node service
	// itself verifies peers by identity, not by host.
	Hosts []string
	// Validity defaults to NodeValidity.
	Validity time.Duration
}

// Issue signs a node certificate for pub naming id (which must be of this
// CA's realm). The certificate is good for both TLS server and client use.
func (ca *CA) Issue(pub crypto.PublicKey, id NodeIdentity, o IssueOptions) (*x509.Certificate, error) {
	const op = "issue certificate"
	if err := id.Validate(); err != nil {
		return nil, err
	}
	if id.Realm != ca.Realm {
		return nil, cairn.E(op, cairn.Invalid, id.Name, fmt.Errorf("realm %s is not this CA's (%s)", id.Realm, ca.Realm))
	}
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, cairn.E(op, cairn.Invalid, id.Name, fmt.Errorf("ECDSA key on %s, want P-256", k.Curve.Params().Name))
		}
	case ed25519.PublicKey:
	default:
		return nil, cairn.E(op, cairn.Invalid, id.Name, fmt.Errorf("unsupported public key type %T", pub))
	}
	if o.Validity == 0 {
		o.Validity = NodeValidity
	}
	serial, err := newSerial()
	if err != nil {
		return nil, cairn.E(op, cairn.Other, id.Name, err)
	}
	now := time.Now()
	notAfter := now.Add(o.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.Name},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, id.Name, err)
	}
	return x509.ParseCertificate(der)
}

// NewCredentials makes a key pair and a certificate for id, for a node on the
// machine that holds the CA (the realm's first device, or tests).
func (ca *CA) NewCredentials(id NodeIdentity, o IssueOptions) (*Credentials, error) {
	key, err := newKey()
	if err != nil {
		return nil, cairn.E("new credentials", cairn.Other, id.Name, err)
	}
	cert, err := ca.Issue(&key.PublicKey, id, o)
	if err != nil {
		return nil, err
	}
	return &Credentials{Identity: id, Leaf: cert, CA: ca.Cert, Key: key}, nil
}

// Credentials are what a node holds: its key, its certificate and the realm
// CA's certificate.
type Credentials struct {
	Identity NodeIdentity
	Leaf     *x509.Certificate
	CA       *x509.Certificate
	Key      crypto.Signer
}

// TLSCertificate returns the node's certificate chain (leaf, then CA) with
// its key, as TLS presents it.
func (c *Credentials) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.Leaf.Raw, c.CA.Raw}, PrivateKey: c.Key, Leaf: c.Leaf}
}

// Save writes NodeCertFile, NodeKeyFile (0600) and CACertFile to dir
// (created 0700 if missing), each atomically.
func (c *Credentials) Save(dir string) error {
	const op = "save credentials"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cairn.E(op, cairn.IO, dir, err)
	}
	keyPEM, err := encodeKey(c.Key)
	if err != nil {
		return cairn.E(op, cairn.Invalid, dir, err)
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{CACertFile, encodeCert(c.CA), 0o644},
		{NodeKeyFile, keyPEM, 0o600},
		{NodeCertFile, encodeCert(c.Leaf), 0o644},
	} {
		if err := durable.ReplaceFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return cairn.E(op, cairn.IO, dir, err)
		}
	}
	return nil
}

// LoadCredentials reads what Save wrote and checks it: the key matches the
// certificate, the certificate chains to the CA and names a node of the CA's
// realm. Kind NotFound if dir holds no credentials.
func LoadCredentials(dir string) (*Credentials, error) {
	const op = "load credentials"
	ca, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	leaf, err := readCert(filepath.Join(dir, NodeCertFile))
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	key, err := readKey(filepath.Join(dir, NodeKeyFile))
	if err != nil {
		return nil, cairn.E(op, cairn.KindOf(err), dir, err)
	}
	c := &Credentials{Leaf: leaf, CA: ca, Key: key}
	if err := c.check(); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, dir, err)
	}
	return c, nil
}

// check validates c and fills in c.Identity.
func (c *Credentials) check() error {
	if !publicKeyEqual(c.Key.Public(), c.Leaf.PublicKey) {
		return errors.New("key does not match the certificate")
	}
	realm, err := caRealm(c.CA)
	if err != nil {
		return err
	}
	if _, err = c.Leaf.Verify(x509.VerifyOptions{Roots: caPool(c.CA), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("certificate does not chain to the CA: %w", err)
	}
	id, err := IdentityOf(c.Leaf)
	if err != nil {
		return err
	}
	if id.Realm != realm {
		return fmt.Errorf("certificate names realm %s, the CA is realm %s's", id.Realm, realm)
	}
	c.Identity = id
	return nil
}
