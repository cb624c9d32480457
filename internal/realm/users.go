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
	"os"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
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
	if errors.Is(err, cairn.ErrNotFound) {
		return cairn.E(op, cairn.Permission, r.Config.User, fmt.Errorf("this device belongs to user %s, who is no longer in the realm", r.Config.User))
	}
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
		if dev := r.deviceName(ctx); dev != "" {
			if err := r.Meta.PutDeviceUser(ctx, dev, name); err != nil {
				return &rec, err
			}
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

// UserDevices maps each user to the devices (not removed) that belong to
// them, by name; a device that records no user is the owner's.
func (r *Realm) UserDevices(ctx context.Context) (map[string][]string, error) {
	owner := ""
	users, err := r.Meta.Users(ctx)
	if err != nil {
		return nil, err
	}
	for _, u := range users {
		if u.Owner {
			owner = u.Name
		}
	}
	du, err := r.Meta.DeviceUsers(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := r.Meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, n := range nodes {
		if n.Role != string(pki.Device) || n.Removed != 0 {
			continue
		}
		u, ok := du[n.Name]
		if !ok {
			u = owner
		}
		out[u] = append(out[u], n.Name)
	}
	return out, nil
}

// RemoveUser unshares every volume shared with user name (rotating each
// one's key), deletes the user, and forgets its private key here. Its
// devices are not removed ('cairn node remove' does that), and what they
// learned stays learned: see doc/threat-model.md.
func (r *Realm) RemoveUser(ctx context.Context, name string) error {
	if err := r.ownerDevice(ctx, "remove user"); err != nil {
		return err
	}
	u, err := r.Meta.User(ctx, name)
	if err != nil {
		return err
	}
	if u.Owner {
		return cairn.E("remove user", cairn.Permission, name, errors.New("the realm's owner cannot be removed"))
	}
	vols, err := r.Meta.Volumes(ctx)
	if err != nil {
		return err
	}
	for _, v := range vols {
		if _, gerr := r.Meta.Grant(ctx, v.ID, name); gerr == nil {
			if err = r.Unshare(ctx, v.Name, name); err != nil {
				return err
			}
		} else if !errors.Is(gerr, cairn.ErrNotFound) {
			return gerr
		}
	}
	if err = r.Meta.RemoveUser(ctx, name); err != nil {
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

// epochID names key epoch n of volume volID in the AD of its sealed key.
func epochID(volID string, n int) string { return fmt.Sprintf("%s/epoch/%d", volID, n) }

// member reports whether this device is a member's: it names a user and
// holds no device key (the owner's devices hold it).
func (r *Realm) member() (bool, error) {
	if r.Config.User == "" {
		return false, nil
	}
	kr, err := r.Keyring()
	if err != nil {
		return false, err
	}
	_, err = kr.Key(deviceKeyID, "realm device key")
	return err != nil, nil
}

// volumeKeys returns volume v's master key and the keys of its later
// epochs, oldest first (doc/format.md, "Key epochs"): on an owner's device
// from the keyring and the records sealed with the device key, on a
// member's from the member's grant.
func (r *Realm) volumeKeys(ctx context.Context, v *meta.Volume) (volkey.Master, []volkey.Master, error) {
	if m, err := r.member(); err != nil {
		return volkey.Master{}, nil, err
	} else if m {
		return r.learnGrantedKey(ctx, v)
	}
	kr, err := r.Keyring()
	if err != nil {
		return volkey.Master{}, nil, err
	}
	master, err := kr.Key(v.ID, v.Name)
	if err != nil {
		if master, err = r.learnKey(ctx, v); err != nil {
			return master, nil, err
		}
	}
	if r.Offline() {
		// The records of later key epochs are in the service: offline,
		// a file written with a rotated key does not read (its key
		// error says so), the others do.
		return master, nil, nil
	}
	sealed, err := r.Meta.EpochKeys(ctx, v.ID)
	if err != nil || len(sealed) == 0 {
		return master, nil, err
	}
	dk, err := kr.Key(deviceKeyID, "realm device key")
	if err != nil {
		return master, nil, cairn.E("volume key", cairn.Permission, v.Name, errors.New("the volume's key was rotated and this device holds no realm device key to open the new one (join again with a new invitation)"))
	}
	epochs := make([]volkey.Master, len(sealed))
	for i, b := range sealed {
		if epochs[i], err = openVolumeKey(dk, r.Config.RealmID, epochID(v.ID, i+1), b); err != nil {
			return master, nil, err
		}
	}
	return master, epochs, nil
}

// volumeKeysByName opens volume name's record and returns it with its keys.
func (r *Realm) volumeKeysByName(ctx context.Context, name string) (*meta.Volume, []volkey.Master, error) {
	mv, err := r.Meta.Open(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	master, epochs, err := r.volumeKeys(ctx, &mv.V)
	if err != nil {
		return nil, nil, err
	}
	return &mv.V, append([]volkey.Master{master}, epochs...), nil
}

// stanzas wraps every key of keys to public key pub.
func (r *Realm) stanzas(pub []byte, volID string, keys []volkey.Master) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		var err error
		if out[i], err = userkey.Seal(userkey.Public(pub), r.Config.RealmID, volID, k); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Share wraps volume volName's key to user's public key and records the
// grant (replacing an earlier one: to change read to write).
func (r *Realm) Share(ctx context.Context, volName, user string, access meta.Access) error {
	const op = "share volume"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	v, keys, err := r.volumeKeysByName(ctx, volName)
	if err != nil {
		return err
	}
	u, err := r.Meta.User(ctx, user)
	if err != nil {
		return err
	}
	stanzas, err := r.stanzas(u.Public, v.ID, keys)
	if err != nil {
		return err
	}
	g := meta.GrantRecord{User: user, Access: access, Stanzas: stanzas, Granted: time.Now().UnixNano(), GrantedBy: r.deviceName(ctx)}
	if err := r.Meta.PutGrant(ctx, v.ID, g); err != nil {
		return err
	}
	r.log.Info("volume shared", "volume", volName, "user", user, "access", access, "by_user", r.Config.User, "device", g.GrantedBy)
	return nil
}

// Unshare removes user's grant of volume volName and rotates the volume's
// key for what is written afterwards: a new key epoch, sealed for the
// owner's devices and wrapped to each remaining member, all in one
// transaction. Manifests written from then on are wrapped with the new
// epoch's key, which the removed user never had; what was written before
// stays readable with the keys they had (doc/threat-model.md).
func (r *Realm) Unshare(ctx context.Context, volName, user string) error {
	const op = "unshare volume"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	v, keys, err := r.volumeKeysByName(ctx, volName)
	if err != nil {
		return err
	}
	dk, err := r.deviceKey(ctx)
	if err != nil {
		return err
	}
	grants, revs, err := r.Meta.GrantsRev(ctx, v.ID)
	if err != nil {
		return err
	}
	next := keyring.NewMaster()
	keys = append(keys, next)
	n := len(keys) - 1
	var keep []meta.GrantRecord
	var keepRevs []int64
	found := false
	for i, g := range grants {
		if g.User == user {
			found = true
			continue
		}
		u, err := r.Meta.User(ctx, g.User)
		if err != nil {
			return err
		}
		if g.Stanzas, err = r.stanzas(u.Public, v.ID, keys); err != nil {
			return err
		}
		keep, keepRevs = append(keep, g), append(keepRevs, revs[i])
	}
	if !found {
		return cairn.E(op, cairn.NotFound, user, fmt.Errorf("volume %s is not shared with user %s", volName, user))
	}
	sealed := sealVolumeKey(dk, r.Config.RealmID, epochID(v.ID, n), next)
	if err := r.Meta.Rotate(ctx, v.ID, user, n, sealed, keep, keepRevs); err != nil {
		return err
	}
	r.log.Info("volume unshared, key rotated", "volume", volName, "user", user, "epoch", n, "members", len(keep), "by_user", r.Config.User, "device", r.deviceName(ctx))
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

// learnGrantedKey opens volume v's keys through this device's user's
// grant. They are not kept in the keyring: each open reads the grant again,
// so an unshare takes effect at this device's next command.
func (r *Realm) learnGrantedKey(ctx context.Context, v *meta.Volume) (volkey.Master, []volkey.Master, error) {
	const op = "volume key"
	user := r.Config.User
	kr, err := r.Keyring()
	if err != nil {
		return volkey.Master{}, nil, err
	}
	priv, err := kr.Key(userKeyID(user), "user "+user)
	if err != nil {
		return priv, nil, cairn.E(op, cairn.Permission, v.Name, fmt.Errorf("this device belongs to user %s but holds no key of theirs (join again with a new invitation)", user))
	}
	g, err := r.Meta.Grant(ctx, v.ID, user)
	if err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return volkey.Master{}, nil, cairn.E(op, cairn.Permission, v.Name, fmt.Errorf("volume %s is not shared with user %s (its owner can run 'cairn share %s %s --read')", v.Name, user, v.Name, user))
		}
		return volkey.Master{}, nil, err
	}
	keys := make([]volkey.Master, len(g.Stanzas))
	for i, st := range g.Stanzas {
		if keys[i], err = userkey.Open(userkey.Private(priv), r.Config.RealmID, v.ID, st); err != nil {
			return volkey.Master{}, nil, err
		}
	}
	if v.KeyCheck != "" && v.KeyCheck != fs.KeyCheck(keys[0]) {
		return keys[0], nil, cairn.E(op, cairn.Permission, v.Name, errors.New("the shared key does not open the volume"))
	}
	return keys[0], keys[1:], nil
}

// HomeUser returns the user the device in home belongs to ("" if it
// names none, or has no readable realm.json).
func HomeUser(home string) string {
	b, err := os.ReadFile(configPath(home))
	if err != nil {
		return ""
	}
	var cfg Config
	if json.Unmarshal(b, &cfg) != nil {
		return ""
	}
	return cfg.User
}
