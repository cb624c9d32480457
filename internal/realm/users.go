package realm

// Users and sharing (issue 22, doc/format.md "Users and grants"). A user
// is a person with an X25519 key pair: the public key in the metadata
// (user/<name>), the private key in the keyrings of the user's devices
// (under userKeyID), sealed by their passphrase. The realm's first user
// owns it: the owner's devices hold the realm's device key and so every
// volume key. Any other user's device holds no device key and no volume
// key: it opens a volume through the grant that wraps the volume's key to
// its user's public key (grant/<volID>/<user>), so a member's new device
// reads what was shared with the member as soon as it joins, with no other
// device of the member awake.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/userkey"
	"cairn.dev/cairn/internal/volkey"
)

// userKeyID is the keyring ID of user name's private key.
func userKeyID(name string) string { return "user:" + name }

// saveConfig rewrites realm.json from r.Config.
func (r *Realm) saveConfig() error {
	b, _ := json.MarshalIndent(r.Config, "", "  ")
	return durable.ReplaceFile(configPath(r.Home), b, 0o600)
}

// deviceName is this device's node name ("" if it has no credentials).
func (r *Realm) deviceName(ctx context.Context) string {
	if c, err := r.Credentials(ctx); err == nil {
		return c.Identity.Name
	}
	return ""
}

// ownerDevice checks this device belongs to the realm's owner: a device
// that names no user (made before users) or names the owner.
func (r *Realm) ownerDevice(ctx context.Context, op string) error {
	if r.Config.User == "" {
		return nil
	}
	u, err := r.Meta.User(ctx, r.Config.User)
	if err != nil {
		return err
	}
	if !u.Owner {
		return cairn.E(op, cairn.Permission, r.Config.User, errors.New("only a device of the realm's owner may do this"))
	}
	return nil
}

// AddUser makes user name: a fresh X25519 key pair, the private key kept
// in this device's keyring (to hand to the user's devices when invited),
// the public key recorded. The realm's first user is its owner, and this
// device (which had no user: a realm made before users) becomes theirs.
// Only an owner's device adds users.
func (r *Realm) AddUser(ctx context.Context, name string) (*meta.UserRecord, error) {
	const op = "add user"
	if err := meta.CheckUserName(name); err != nil {
		return nil, err
	}
	if err := r.ownerDevice(ctx, op); err != nil {
		return nil, err
	}
	users, err := r.Meta.Users(ctx)
	if err != nil {
		return nil, err
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		if u.Name == name {
			return nil, cairn.E(op, cairn.Exist, name, errors.New("the realm already has a user of this name"))
		}
	}
	priv, pub := userkey.Generate()
	rec := meta.UserRecord{Name: name, Public: pub[:], Owner: len(users) == 0, Added: time.Now().UnixNano(), AddedBy: r.deviceName(ctx)}
	if rec.Owner && r.Config.User != "" {
		return nil, cairn.E(op, cairn.Invalid, name, fmt.Errorf("this device names user %s, who is not in the realm", r.Config.User))
	}
	// Kept before it is recorded: a crash in between leaves an unused
	// key, never a user whose key no device holds. A refused record puts
	// back the key it replaced (a user of that name added meanwhile, here
	// or by another owner's device).
	old, oldErr := kr.Key(userKeyID(name), name)
	undo := func() {
		if oldErr == nil {
			kr.Add(userKeyID(name), old)
		} else {
			kr.Remove(userKeyID(name))
		}
	}
	kr.Add(userKeyID(name), volkey.Master(priv))
	if err := kr.Save(); err != nil {
		undo()
		return nil, err
	}
	if err := r.Meta.AddUser(ctx, rec); err != nil {
		undo()
		if serr := kr.Save(); serr != nil {
			r.log.Warn("drop an unused user key", "err", serr)
		}
		return nil, err
	}
	if rec.Owner {
		r.Config.User = name
		if err := r.saveConfig(); err != nil {
			return &rec, err
		}
		// The owner's devices hold the device key: make sure it exists.
		if _, err := r.deviceKey(ctx); err != nil {
			return &rec, err
		}
	}
	r.log.Info("user added", "user", name, "owner", rec.Owner, "device", rec.AddedBy)
	return &rec, nil
}

// Users lists the realm's users.
func (r *Realm) Users(ctx context.Context) ([]meta.UserRecord, error) {
	return r.Meta.Users(ctx)
}

// RemoveUser deletes user name and its grants, and forgets its private
// key here. Its devices are not removed ('cairn node remove' does that),
// and what they learned stays learned: see doc/threat-model.md.
func (r *Realm) RemoveUser(ctx context.Context, name string) error {
	if err := r.ownerDevice(ctx, "remove user"); err != nil {
		return err
	}
	if err := r.Meta.RemoveUser(ctx, name); err != nil {
		return err
	}
	kr, err := r.Keyring()
	if err != nil {
		return err
	}
	kr.Remove(userKeyID(name))
	r.log.Info("user removed", "user", name, "device", r.deviceName(ctx))
	return kr.Save()
}

// volumeKey returns the master key of a volume this device can open.
func (r *Realm) volumeKey(ctx context.Context, name string) (*meta.Volume, volkey.Master, error) {
	mv, err := r.Meta.Open(ctx, name)
	if err != nil {
		return nil, volkey.Master{}, err
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, volkey.Master{}, err
	}
	m, err := kr.Key(mv.V.ID, name)
	if err != nil {
		m, err = r.learnKey(ctx, &mv.V)
	}
	return &mv.V, m, err
}

// Share wraps volume volName's key to user's public key and records the
// grant (replacing an earlier one: to change read to write).
func (r *Realm) Share(ctx context.Context, volName, user string, access meta.Access) error {
	const op = "share volume"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	v, m, err := r.volumeKey(ctx, volName)
	if err != nil {
		return err
	}
	u, err := r.Meta.User(ctx, user)
	if err != nil {
		return err
	}
	stanza, err := userkey.Seal(userkey.Public(u.Public), r.Config.RealmID, v.ID, m)
	if err != nil {
		return err
	}
	g := meta.GrantRecord{User: user, Access: access, Stanza: stanza, Granted: time.Now().UnixNano(), GrantedBy: r.deviceName(ctx)}
	if err := r.Meta.PutGrant(ctx, v.ID, g); err != nil {
		return err
	}
	r.log.Info("volume shared", "volume", volName, "user", user, "access", access, "device", g.GrantedBy)
	return nil
}

// Unshare removes user's grant of volume volName. The volume's key is not
// rotated (yet): a device of the user that kept the key can still read
// what is written afterwards. cairn itself keeps no key learned from a
// grant, so an unmodified cairn on the user's devices loses access at once.
func (r *Realm) Unshare(ctx context.Context, volName, user string) error {
	const op = "unshare volume"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	mv, err := r.Meta.Open(ctx, volName)
	if err != nil {
		return err
	}
	if err := r.Meta.DeleteGrant(ctx, mv.V.ID, user); err != nil {
		return err
	}
	r.log.Info("volume unshared", "volume", volName, "user", user, "device", r.deviceName(ctx))
	return nil
}

// Grants lists who volume volName is shared with.
func (r *Realm) Grants(ctx context.Context, volName string) ([]meta.GrantRecord, error) {
	mv, err := r.Meta.Open(ctx, volName)
	if err != nil {
		return nil, err
	}
	return r.Meta.Grants(ctx, mv.V.ID)
}

// learnGrantedKey opens volume v's key through this device's user's grant.
// The key is not kept in the keyring: each open reads the grant again, so
// an unshare takes effect at this device's next command.
func (r *Realm) learnGrantedKey(ctx context.Context, v *meta.Volume) (volkey.Master, error) {
	const op = "volume key"
	user := r.Config.User
	kr, err := r.Keyring()
	if err != nil {
		return volkey.Master{}, err
	}
	priv, err := kr.Key(userKeyID(user), "user "+user)
	if err != nil {
		return priv, cairn.E(op, cairn.Permission, v.Name, fmt.Errorf("this device belongs to user %s but holds no key of theirs (join again with a new invitation)", user))
	}
	g, err := r.Meta.Grant(ctx, v.ID, user)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return volkey.Master{}, cairn.E(op, cairn.Permission, v.Name, fmt.Errorf("volume %s is not shared with user %s (its owner can run 'cairn share %s %s --read')", v.Name, user, v.Name, user))
		}
		return volkey.Master{}, err
	}
	m, err := userkey.Open(userkey.Private(priv), r.Config.RealmID, v.ID, g.Stanza)
	if err != nil {
		return m, err
	}
	if v.KeyCheck != "" && v.KeyCheck != fs.KeyCheck(m) {
		return m, cairn.E(op, cairn.Permission, v.Name, errors.New("the shared key does not open the volume"))
	}
	return m, nil
}
