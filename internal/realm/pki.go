package realm

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// Where a device keeps its certificates, under its home:
//
//	pki/ca/      the realm CA (ca.crt, ca.key): only on the device that made the realm
//	pki/node/    this machine's credentials (node.crt, node.key, ca.crt)
//	pki/tokens.json  the join tokens issued here (0600)
const (
	pkiDir     = "pki"
	caDir      = "ca"
	nodeDir    = "node"
	tokensFile = "tokens.json"
)

// CADir is where the realm CA lives in home (only on the device holding it).
func CADir(home string) string { return filepath.Join(home, pkiDir, caDir) }

// CredentialsDir is where this machine's node credentials live in home.
func CredentialsDir(home string) string { return filepath.Join(home, pkiDir, nodeDir) }

// TokensPath is the token list of the join authority in home.
func TokensPath(home string) string { return filepath.Join(home, pkiDir, tokensFile) }

// DefaultNodeName is this machine's host name made into a valid node name
// (lowercase; characters outside a-z 0-9 . _ - become '-'), else "device".
func DefaultNodeName() string {
	h, _ := os.Hostname()
	h = strings.ToLower(h)
	var b strings.Builder
	for _, c := range h {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	n := strings.TrimLeft(b.String(), "._-")
	if len(n) > 63 {
		n = n[:63]
	}
	if pki.ValidName(n) != nil {
		return "device"
	}
	return n
}

// createCA makes the realm CA and this device's credentials, records the CA
// in the metadata (refused if the realm already has one) and registers the
// device in the node registry.
func (r *Realm) createCA(ctx context.Context, name string) (*pki.CA, error) {
	if name == "" {
		name = DefaultNodeName()
	}
	if err := pki.ValidName(name); err != nil {
		return nil, err
	}
	if rec, err := r.Meta.CA(ctx); err == nil {
		return nil, cairn.E("create ca", cairn.Exist, rec.Holder, errors.New("the realm's CA is held by device "+rec.Holder+": run this there"))
	} else if !errors.Is(err, cairn.ErrNotFound) {
		return nil, err
	}
	ca, err := pki.CreateCA(CADir(r.Home), r.Config.RealmID)
	if err != nil {
		return nil, err
	}
	fp := ca.Fingerprint()
	if err = r.Meta.SetCA(ctx, meta.CARecord{Fingerprint: hex.EncodeToString(fp[:]), Holder: name, Created: time.Now().UnixNano()}); err != nil {
		// Another machine won: ours must not be used.
		_ = os.RemoveAll(CADir(r.Home))
		return nil, err
	}
	creds, err := ca.NewCredentials(pki.NodeIdentity{Realm: ca.Realm, Name: name, Role: pki.Device}, pki.IssueOptions{})
	if err != nil {
		return nil, err
	}
	if err := creds.Save(CredentialsDir(r.Home)); err != nil {
		return nil, err
	}
	if err := r.Meta.PutNode(ctx, meta.NodeRecord{Name: name, Role: string(pki.Device), Serials: []string{creds.Leaf.SerialNumber.Text(16)}}); err != nil {
		return nil, err
	}
	return ca, nil
}

// CA returns the realm CA if this device holds it: Kind NotFound if it does
// not. A realm made before cairn had a CA gets one here, on first need
// (invite, node serve), provided no other device of the realm made one
// already (the CA is recorded in the metadata, pki/ca): the realm's
// devices could not have joined without it, so this device is the realm's
// only one.
func (r *Realm) CA(ctx context.Context) (*pki.CA, error) {
	ca, err := pki.LoadCA(CADir(r.Home))
	if err == nil {
		return ca, nil
	}
	if !errors.Is(err, cairn.ErrNotFound) {
		return nil, err
	}
	if _, cerr := pki.LoadCredentials(CredentialsDir(r.Home)); cerr == nil {
		// A device that joined: the CA is elsewhere.
		holder := "the device that made the realm"
		if rec, err := r.Meta.CA(ctx); err == nil {
			holder = "device " + rec.Holder
		}
		return nil, cairn.E("realm ca", cairn.NotFound, r.Home, errors.New("this device does not hold the realm's CA: run this on "+holder))
	}
	r.log.Info("this realm predates the realm CA: creating it now", "home", r.Home)
	return r.createCA(ctx, r.opts.NodeName)
}

// Credentials returns this machine's node credentials, creating the realm
// CA first in a realm made before cairn had one (see CA).
func (r *Realm) Credentials(ctx context.Context) (*pki.Credentials, error) {
	c, err := pki.LoadCredentials(CredentialsDir(r.Home))
	if err == nil {
		if c.Identity.Realm != r.Config.RealmID {
			return nil, cairn.E("credentials", cairn.Invalid, CredentialsDir(r.Home), errors.New("the credentials belong to realm "+c.Identity.Realm))
		}
		return c, nil
	}
	if !errors.Is(err, cairn.ErrNotFound) {
		return nil, err
	}
	if _, err := r.CA(ctx); err != nil {
		return nil, err
	}
	return pki.LoadCredentials(CredentialsDir(r.Home))
}
