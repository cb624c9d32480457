package meta

// Users and volume grants (issue 22). A user is a person: a name, an
// X25519 public key (its private key lives only in its devices' keyrings),
// and whether they own the realm. A grant gives one user one volume: its
// master key wrapped to the user's public key (userkey stanza), and the
// access asked for. Records at user/<name> and grant/<volID>/<name>.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// UserRecordFormat is the version of user and grant records.
const UserRecordFormat = 1

// UserRecord is a user's entry at user/<name>.
type UserRecord struct {
	Format int    `json:"format"`
	Name   string `json:"name"`
	// Public is the user's X25519 public key (32 bytes).
	Public []byte `json:"public"`
	// Owner is set on the realm's first user: it holds the realm.
	Owner   bool   `json:"owner,omitempty"`
	Added   int64  `json:"added"`
	AddedBy string `json:"added_by,omitempty"`
}

// Access is what a grant allows.
type Access string

// The accesses a grant gives.
const (
	Read  Access = "read"
	Write Access = "write"
)

// GrantRecord is one user's grant of one volume, at grant/<volID>/<user>.
type GrantRecord struct {
	Format int    `json:"format"`
	User   string `json:"user"`
	Access Access `json:"access"`
	// Stanzas wrap the volume's keys to the user's public key
	// (doc/format.md, "Key stanza"), one per key epoch: Stanzas[0] the
	// master key, Stanzas[i] the key of epoch i.
	Stanzas   [][]byte `json:"stanzas"`
	Granted   int64    `json:"granted"`
	GrantedBy string   `json:"granted_by,omitempty"`
}

var userNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckUserName says whether name can name a user: 1 to 63 of a-z 0-9 . _
// -, starting with a letter or digit.
func CheckUserName(name string) error {
	if !userNameRE.MatchString(name) {
		return cairn.E("user name", cairn.Invalid, name, errors.New("a user name is 1 to 63 characters of a-z, 0-9, '.', '_', '-', starting with a letter or digit"))
	}
	return nil
}

// AddUser records a new user (Exist if the name is taken). An owner is
// recorded only with the key owner, written once: a realm has one owner.
func (s *Service) AddUser(ctx context.Context, rec UserRecord) error {
	const op = "add user"
	if err := CheckUserName(rec.Name); err != nil {
		return err
	}
	rec.Format = UserRecordFormat
	b, _ := json.Marshal(rec)
	k, ok := s.key("user", rec.Name), s.key("owner")
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}
	ops := []clientv3.Op{clientv3.OpPut(k, string(b))}
	if rec.Owner {
		// owner is written once, with the first user: one owner.
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(ok), "=", 0))
		ops = append(ops, clientv3.OpPut(ok, rec.Name))
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(conds...).Then(ops...).Commit()
	if err != nil {
		return etcdErr(op, rec.Name, err)
	}
	if !resp.Succeeded {
		if _, err := s.User(ctx, rec.Name); err == nil {
			return cairn.E(op, cairn.Exist, rec.Name, errors.New("the realm already has a user of this name"))
		}
		return cairn.E(op, cairn.Exist, rec.Name, errors.New("the realm already has an owner"))
	}
	return nil
}

func decodeUser(op, name string, b []byte) (*UserRecord, error) {
	var rec UserRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, name, err)
	}
	if rec.Format != UserRecordFormat {
		return nil, cairn.E(op, cairn.Corrupt, name, fmt.Errorf("user record format %d, this cairn reads %d (upgrade cairn on this device)", rec.Format, UserRecordFormat))
	}
	if len(rec.Public) != 32 {
		return nil, cairn.E(op, cairn.Corrupt, name, fmt.Errorf("public key of %d bytes", len(rec.Public)))
	}
	return &rec, nil
}

// User returns user name's record (NotFound if none).
func (s *Service) User(ctx context.Context, name string) (*UserRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("user", name))
	if err != nil {
		return nil, etcdErr("user", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("user", cairn.NotFound, name, errors.New("no such user in the realm (see 'cairn user ls')"))
	}
	return decodeUser("user", name, resp.Kvs[0].Value)
}

// Users lists every user, by name.
func (s *Service) Users(ctx context.Context) ([]UserRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("user") + "/"
	resp, err := s.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("list users", "", err)
	}
	out := make([]UserRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		rec, err := decodeUser("list users", strings.TrimPrefix(string(kv.Key), p), kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, *rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveUser deletes a user and every grant it holds, in one transaction
// (NotFound if no such user). The owner is not removed (Permission).
func (s *Service) RemoveUser(ctx context.Context, name string) error {
	const op = "remove user"
	vols, err := s.Volumes(ctx)
	if err != nil {
		return err
	}
	u, err := s.User(ctx, name)
	if err != nil {
		return err
	}
	if u.Owner {
		return cairn.E(op, cairn.Permission, name, errors.New("the realm's owner cannot be removed"))
	}
	k := s.key("user", name)
	ops := []clientv3.Op{clientv3.OpDelete(k)}
	for _, v := range vols {
		ops = append(ops, clientv3.OpDelete(s.key("grant", v.ID, name)))
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).Then(ops...).Commit()
	if err != nil {
		return etcdErr(op, name, err)
	}
	if !resp.Succeeded {
		return cairn.E(op, cairn.NotFound, name, errors.New("no such user in the realm (see 'cairn user ls')"))
	}
	return nil
}

// PutGrant records (or replaces) a user's grant of volume volID, while the
// user exists.
func (s *Service) PutGrant(ctx context.Context, volID string, g GrantRecord) error {
	const op = "share volume"
	g.Format = UserRecordFormat
	if g.Access != Read && g.Access != Write {
		return cairn.E(op, cairn.Invalid, g.User, fmt.Errorf("access %q, want read or write", g.Access))
	}
	b, _ := json.Marshal(g)
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.key("user", g.User)), ">", 0)).
		Then(clientv3.OpPut(s.key("grant", volID, g.User), string(b))).Commit()
	if err != nil {
		return etcdErr(op, g.User, err)
	}
	if !resp.Succeeded {
		return cairn.E(op, cairn.NotFound, g.User, errors.New("no such user in the realm (see 'cairn user ls')"))
	}
	return nil
}

// DecodeGrant parses a grant record.
func DecodeGrant(b []byte) (*GrantRecord, error) {
	var g GrantRecord
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, cairn.E("grant", cairn.Corrupt, "", err)
	}
	if g.Format != UserRecordFormat {
		return nil, cairn.E("grant", cairn.Corrupt, g.User, fmt.Errorf("grant record format %d, this cairn reads %d (upgrade cairn on this device)", g.Format, UserRecordFormat))
	}
	if g.Access != Read && g.Access != Write {
		return nil, cairn.E("grant", cairn.Corrupt, g.User, fmt.Errorf("access %q", g.Access))
	}
	if len(g.Stanzas) == 0 {
		return nil, cairn.E("grant", cairn.Corrupt, g.User, errors.New("no key stanza"))
	}
	return &g, nil
}

// Grant returns user's grant of volume volID (NotFound if none).
func (s *Service) Grant(ctx context.Context, volID, user string) (*GrantRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("grant", volID, user))
	if err != nil {
		return nil, etcdErr("grant", user, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, cairn.E("grant", cairn.NotFound, user, errors.New("the volume is not shared with this user"))
	}
	return DecodeGrant(resp.Kvs[0].Value)
}

// Grants lists the grants of volume volID, by user.
func (s *Service) Grants(ctx context.Context, volID string) ([]GrantRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("grant", volID)+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("list grants", volID, err)
	}
	out := make([]GrantRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		g, err := DecodeGrant(kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].User < out[j].User })
	return out, nil
}

// DeleteGrant removes user's grant of volume volID (NotFound if none).
func (s *Service) DeleteGrant(ctx context.Context, volID, user string) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Delete(ctx, s.key("grant", volID, user))
	if err != nil {
		return etcdErr("unshare volume", user, err)
	}
	if resp.Deleted == 0 {
		return cairn.E("unshare volume", cairn.NotFound, user, errors.New("the volume is not shared with this user"))
	}
	return nil
}

// epochKey is where key epoch n (1, 2, ...) of volume volID is recorded.
func (s *Service) epochKey(volID string, n int) string {
	return s.key("keyepoch", volID, fmt.Sprintf("%08x", n))
}

// EpochKeys returns the sealed keys of volume volID's epochs 1..n, in order
// (none: the volume was never rotated).
func (s *Service) EpochKeys(ctx context.Context, volID string) ([][]byte, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("keyepoch", volID) + "/"
	resp, err := s.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, etcdErr("key epochs", volID, err)
	}
	out := make([][]byte, 0, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		if want := s.epochKey(volID, i+1); string(kv.Key) != want {
			return nil, cairn.E("key epochs", cairn.Corrupt, volID, fmt.Errorf("key epoch %s where %s was expected", kv.Key, want))
		}
		out = append(out, kv.Value)
	}
	return out, nil
}

// Rotate records key epoch n of volume volID (sealed for the owner's
// devices), deletes the grant of the user removed, and replaces the grants
// of the remaining members (each with a stanza for every epoch up to n), in
// one transaction: only if epoch n is not recorded yet, the removed grant
// exists, and no remaining grant changed since it was read (Conflict
// otherwise: read again and retry).
func (s *Service) Rotate(ctx context.Context, volID, removed string, n int, sealed []byte, keep []GrantRecord, keepRevs []int64) error {
	const op = "rotate volume key"
	if err := s.UseFormat(ctx, 3); err != nil {
		return err
	}
	conds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.epochKey(volID, n)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(s.key("grant", volID, removed)), ">", 0),
	}
	if n > 1 {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.epochKey(volID, n-1)), ">", 0))
	}
	ops := []clientv3.Op{clientv3.OpPut(s.epochKey(volID, n), string(sealed)), clientv3.OpDelete(s.key("grant", volID, removed))}
	for i, g := range keep {
		g.Format = UserRecordFormat
		if len(g.Stanzas) != n+1 {
			return cairn.E(op, cairn.Invalid, g.User, fmt.Errorf("%d stanzas for %d epochs", len(g.Stanzas), n+1))
		}
		b, _ := json.Marshal(g)
		k := s.key("grant", volID, g.User)
		conds = append(conds, clientv3.Compare(clientv3.ModRevision(k), "=", keepRevs[i]))
		ops = append(ops, clientv3.OpPut(k, string(b)))
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(conds...).Then(ops...).Commit()
	if err != nil {
		return etcdErr(op, volID, err)
	}
	if !resp.Succeeded {
		return cairn.E(op, cairn.Conflict, removed, errors.New("the volume's grants or keys changed meanwhile (or it is not shared with this user): try again"))
	}
	return nil
}

// GrantsRev lists the grants of volume volID with each record's
// ModRevision (for Rotate).
func (s *Service) GrantsRev(ctx context.Context, volID string) ([]GrantRecord, []int64, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("grant", volID)+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, nil, etcdErr("list grants", volID, err)
	}
	var gs []GrantRecord
	var revs []int64
	for _, kv := range resp.Kvs {
		g, err := DecodeGrant(kv.Value)
		if err != nil {
			return nil, nil, err
		}
		gs, revs = append(gs, *g), append(revs, kv.ModRevision)
	}
	return gs, revs, nil
}

// DeviceUser is the record at userdev/<device>: which user a device
// belongs to. A device with none is the owner's (a realm made before
// users).
type DeviceUser struct {
	Format int    `json:"format"`
	User   string `json:"user"`
	Since  int64  `json:"since"`
}

// PutDeviceUser records that device belongs to user.
func (s *Service) PutDeviceUser(ctx context.Context, device, user string) error {
	b, _ := json.Marshal(DeviceUser{Format: UserRecordFormat, User: user, Since: time.Now().UnixNano()})
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	if _, err := s.cli.Put(ctx, s.key("userdev", device), string(b)); err != nil {
		return etcdErr("record device user", device, err)
	}
	return nil
}

// DeviceUsers maps each device that records a user to that user.
func (s *Service) DeviceUsers(ctx context.Context) (map[string]string, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("userdev") + "/"
	resp, err := s.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("device users", "", err)
	}
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var d DeviceUser
		dev := strings.TrimPrefix(string(kv.Key), p)
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			return nil, cairn.E("device users", cairn.Corrupt, dev, err)
		}
		out[dev] = d.User
	}
	return out, nil
}
