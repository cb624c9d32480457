package realm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/userkey"
	"cairn.dev/cairn/internal/volkey"
)

// devicePayloadFormat is the version of the device payload.
const devicePayloadFormat = 1

// devicePayload is what a joining device receives, sealed end to end by
// its join token (pki): what it needs to be a device of the realm.
type devicePayload struct {
	Format  int    `json:"format"`
	RealmID string `json:"realm_id"`
	// Etcd is where the realm's metadata service answers: an external
	// cluster's endpoints. Empty when Gateway is set.
	Etcd []string `json:"etcd"`
	// Gateway lists the metadata gateways of the realm's embedded etcd
	// (host:port, mutual TLS with the device's node certificate).
	Gateway []string `json:"gateway,omitempty"`
	// GatewayNode is the node name the gateways' certificate carries.
	GatewayNode string `json:"gateway_node,omitempty"`
	// Keys maps volume ID to the volume's master key.
	Keys map[string][]byte `json:"keys"`
	// DeviceKey is the realm's device key (keys.go): with it the device
	// learns the keys of volumes made after it joined.
	DeviceKey []byte `json:"device_key,omitempty"`
	// User is the user the device belongs to, UserKey that user's X25519
	// private key (users.go). A device of a user other than the owner
	// gets no Keys and no DeviceKey: it opens what is shared with its user.
	User    string `json:"user,omitempty"`
	UserKey []byte `json:"user_key,omitempty"`
}

// InviteOptions tune Invite.
type InviteOptions struct {
	Role pki.Role
	// Name is the node name the joiner gets; empty lets it propose one.
	Name string
	// TTL is how long the token can be used (default 1 h).
	TTL time.Duration
	// Addr is the join endpoint put in the token. Default: this device's
	// node address from the registry (it must be serving: 'cairn node
	// serve' serves the join endpoint).
	Addr string
	// User is the user a device belongs to (default: this device's).
	User string
}

// Invite returns a one-time join token for a new node. A device's token
// carries, sealed, the realm's configuration (realm ID, etcd endpoints) and
// every volume key this device holds; a benefactor's or surrogate's carries
// nothing. Only the device holding the realm CA invites.
func (r *Realm) Invite(ctx context.Context, o InviteOptions) (string, error) {
	const op = "invite"
	if _, err := pki.ParseRole(string(o.Role)); err != nil {
		return "", err
	}
	if o.TTL == 0 {
		o.TTL = time.Hour
	}
	ca, err := r.CA(ctx)
	if err != nil {
		return "", err
	}
	creds, err := r.Credentials(ctx)
	if err != nil {
		return "", err
	}
	if o.Name != "" {
		if err = pki.ValidName(o.Name); err != nil {
			return "", err
		}
		if st, nerr := r.Meta.Node(ctx, o.Name); nerr == nil && st.Removed == 0 {
			return "", cairn.E(op, cairn.Exist, o.Name, fmt.Errorf("the realm already has a %s named %s (remove it first: 'cairn node remove %s')", st.Role, o.Name, o.Name))
		}
		// Versions name stores and nodes in one list: one name, one thing.
		if _, serr := r.Meta.Store(ctx, o.Name); serr == nil {
			return "", cairn.E(op, cairn.Exist, o.Name, fmt.Errorf("the realm has a store named %s (see 'cairn store ls'): choose another name", o.Name))
		}
	}
	if o.Addr == "" {
		st, nerr := r.Meta.Node(ctx, creds.Identity.Name)
		if nerr != nil && !errors.Is(nerr, cairn.ErrNotFound) {
			return "", nerr
		}
		if nerr != nil || st.State != meta.NodeOnline || st.Addr == "" {
			return "", cairn.E(op, cairn.Unavailable, creds.Identity.Name, errors.New("this device serves no join endpoint: start 'cairn node serve' here first"))
		}
		o.Addr = st.Addr
	}
	var payload []byte
	if o.User != "" && o.Role != pki.Device {
		return "", cairn.E(op, cairn.Invalid, o.User, fmt.Errorf("a %s belongs to no user: --user is for devices", o.Role))
	}
	if o.Role == pki.Device {
		if o.User == "" {
			o.User = r.Config.User
		}
		if err = r.ownerDevice(ctx, op); err != nil {
			return "", err
		}
		p := devicePayload{Format: devicePayloadFormat, RealmID: r.Config.RealmID, Etcd: r.Config.Etcd,
			Gateway: r.Config.Gateway, GatewayNode: r.Config.GatewayNode, Keys: map[string][]byte{}}
		if len(p.Etcd) == 0 && len(p.Gateway) == 0 {
			// The embedded etcd, reached through the metadata gateway
			// of the device serving it: this one.
			gw, gerr := r.gateway1(ctx)
			if gerr != nil {
				return "", gerr
			}
			p.Gateway, p.GatewayNode = []string{gw}, creds.Identity.Name
		}
		kr, perr := r.Keyring()
		if perr != nil {
			return "", perr
		}
		member := false
		if o.User != "" {
			u, uerr := r.Meta.User(ctx, o.User)
			if uerr != nil {
				return "", uerr
			}
			priv, kerr := kr.Key(userKeyID(o.User), "user "+o.User)
			if kerr != nil {
				return "", cairn.E(op, cairn.Permission, o.User, errors.New("this device does not hold the user's private key (invite from the device that added the user)"))
			}
			p.User, p.UserKey, member = o.User, priv[:], !u.Owner
		}
		if !member {
			if perr = r.ownerPayload(ctx, &p); perr != nil {
				return "", perr
			}
		} else {
			// What is shared with the user reaches the device
			// through the grants: no volume key, no device key.
			r.log.Info("invite a member's device", "user", o.User, "name", o.Name)
		}
		if payload, perr = json.Marshal(p); perr != nil {
			return "", cairn.E(op, cairn.Other, "", perr)
		}
	}
	tokens, err := pki.OpenTokenList(TokensPath(r.Home))
	if err != nil {
		return "", err
	}
	auth := &pki.Authority{CA: ca, Tokens: tokens, Addr: o.Addr, Logger: r.log}
	return auth.NewToken(ctx, o.Role, o.Name, o.TTL, payload)
}

// ownerPayload adds to an owner's device's payload the device key and
// every volume key this device holds.
func (r *Realm) ownerPayload(ctx context.Context, p *devicePayload) error {
	kr, err := r.Keyring()
	if err != nil {
		return err
	}
	dk, err := r.deviceKey(ctx)
	if err != nil {
		return err
	}
	p.DeviceKey = dk[:]
	vols, err := r.Meta.Volumes(ctx)
	if err != nil {
		return err
	}
	for _, v := range vols {
		k, kerr := kr.Key(v.ID, v.Name)
		if kerr != nil {
			r.log.Warn("invite: this device holds no key for a volume; the new device will not either", "volume", v.Name)
			continue
		}
		p.Keys[v.ID] = k[:]
	}
	return nil
}

// JoinOptions tune Join.
type JoinOptions struct {
	// Name is the node name proposed (used if the token names none).
	// Default DefaultNodeName().
	Name string
	// Passphrase seals the keyring of a joining device, unless
	// NoPassphrase. Asked only once the device has its payload.
	Passphrase   func() ([]byte, error)
	NoPassphrase bool
}

// Join makes home a node of the realm that issued token: it redeems the
// token at the join endpoint the token names and saves the credentials. A
// device also receives the realm's configuration and volume keys: Join
// writes realm.json and the keyring and creates the local store, so the
// home works like the first device's. A benefactor or surrogate receives
// no key and no metadata access: home holds only its credentials.
func Join(ctx context.Context, home, token string, o JoinOptions) (*pki.Credentials, error) {
	const op = "join"
	if o.Name == "" {
		o.Name = DefaultNodeName()
	}
	if _, err := os.Stat(configPath(home)); err == nil {
		return nil, cairn.E(op, cairn.Exist, home, errors.New("a realm already exists here"))
	}
	if _, err := pki.LoadCredentials(CredentialsDir(home)); err == nil {
		return nil, cairn.E(op, cairn.Exist, home, errors.New("this home already joined a realm"))
	}
	made, err := mkdirAll(home)
	if err != nil {
		return nil, cairn.E(op, cairn.IO, home, err)
	}
	creds, payload, err := pki.Join(ctx, token, pki.JoinOptions{Name: o.Name})
	if err != nil {
		// Nothing was written: leave no empty home behind (only the
		// directories made here, and only while empty).
		removeEmpty(made)
		return nil, err
	}
	if creds.Identity.Role != pki.Device {
		if len(payload) != 0 {
			return nil, cairn.E(op, cairn.Permission, "", fmt.Errorf("a %s must receive no payload", creds.Identity.Role))
		}
		if err = creds.Save(CredentialsDir(home)); err != nil {
			return creds, err
		}
		// It reports to a registrar (ServeStandalone): at first the
		// device that admitted it, at the join address.
		t, perr := pki.ParseToken(token)
		if perr != nil {
			return creds, perr
		}
		return creds, (&registrarState{Format: registrarFormat, Registrars: []string{t.Addr}}).save(home)
	}
	var p devicePayload
	if err = json.Unmarshal(payload, &p); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, "", fmt.Errorf("device payload: %w", err))
	}
	if p.Format != devicePayloadFormat || p.RealmID != creds.Identity.Realm || len(p.Etcd)+len(p.Gateway) == 0 {
		return nil, cairn.E(op, cairn.Corrupt, "", fmt.Errorf("device payload: format %d, realm %q, %d etcd endpoints, %d gateways", p.Format, p.RealmID, len(p.Etcd), len(p.Gateway)))
	}
	// The credentials first: a failure below leaves a home that can be
	// given a new invitation after 'rm -r'.
	if err = creds.Save(CredentialsDir(home)); err != nil {
		return nil, err
	}
	var pass []byte
	if !o.NoPassphrase {
		if o.Passphrase == nil {
			return nil, cairn.E(op, cairn.Permission, "", errors.New("a passphrase is needed for the keyring"))
		}
		if pass, err = o.Passphrase(); err != nil {
			return nil, err
		}
		if len(pass) == 0 {
			return nil, cairn.E(op, cairn.Invalid, "", errors.New("empty passphrase (use --no-passphrase to keep keys unprotected)"))
		}
	}
	kr, err := keyring.Create(keyringPath(home), pass)
	if err != nil {
		return nil, err
	}
	for id, k := range p.Keys {
		if len(k) != volkey.Size {
			return nil, cairn.E(op, cairn.Corrupt, id, fmt.Errorf("volume key of %d bytes", len(k)))
		}
		kr.Add(id, volkey.Master(k))
	}
	if len(p.DeviceKey) != 0 {
		if len(p.DeviceKey) != volkey.Size {
			return nil, cairn.E(op, cairn.Corrupt, "", fmt.Errorf("device key of %d bytes", len(p.DeviceKey)))
		}
		kr.Add(deviceKeyID, volkey.Master(p.DeviceKey))
	}
	if p.User != "" {
		if len(p.UserKey) != userkey.Size {
			return nil, cairn.E(op, cairn.Corrupt, p.User, fmt.Errorf("user key of %d bytes", len(p.UserKey)))
		}
		kr.Add(userKeyID(p.User), volkey.Master(p.UserKey))
	}
	if err = kr.Save(); err != nil {
		return nil, err
	}
	cfg := Config{Format: ConfigVersion, RealmID: p.RealmID, Created: time.Now().UTC(), Etcd: p.Etcd, Gateway: p.Gateway, GatewayNode: p.GatewayNode, StorePath: "store", User: p.User}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err = durable.ReplaceFile(configPath(home), b, 0o600); err != nil {
		return nil, err
	}
	// Check the metadata service answers for this realm, and make the
	// local store.
	r, err := Open(ctx, home, Options{NoPassphrase: o.NoPassphrase})
	if err != nil {
		return creds, err
	}
	defer r.Close()
	if _, err := r.Store(ctx); err != nil {
		return creds, err
	}
	if p.User != "" {
		if err := r.Meta.PutDeviceUser(ctx, creds.Identity.Name, p.User); err != nil {
			return creds, err
		}
	}
	return creds, nil
}

// mkdirAll makes dir and its missing parents (mode 0700) and returns the
// directories it made, deepest first.
func mkdirAll(dir string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, os.ErrNotExist) {
			break
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return missing, nil
}

// removeEmpty removes the directories dirs (deepest first) that are empty.
func removeEmpty(dirs []string) {
	for _, d := range dirs {
		if os.Remove(d) != nil {
			return
		}
	}
}
