package realm

// ACLs inside a volume (issue 22, item 3; meta/acl.go). The realm sets the
// principal its metadata Service acts for (this device's user and node
// name), so that every namespace change and read it makes is decided by
// the volume's ACLs; and it changes ACLs, on the owner's devices only,
// logging every grant and revocation with who made it.

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// principal is who this device's processes act for: its user (empty: the
// owner) and its node name (empty: a device without credentials yet).
func principal(home string, cfg Config) meta.Principal {
	p := meta.Principal{User: cfg.User}
	if c, err := pki.LoadCredentials(CredentialsDir(home)); err == nil && c.Identity.Realm == cfg.RealmID {
		p.Device = c.Identity.Name
	}
	return p
}

// SetACL gives who (user:NAME or device:NAME) access perm at path of
// volume volName. Only a device of the realm's owner may.
func (r *Realm) SetACL(ctx context.Context, volName, path, who string, perm meta.Perm) error {
	const op = "acl set"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	v, err := r.Meta.Open(ctx, volName)
	if err != nil {
		return err
	}
	dev := r.deviceName(ctx)
	if err := v.SetACL(ctx, path, who, perm, dev); err != nil {
		return err
	}
	r.audit().Info("acl: granted", slog.String("volume", volName), slog.String("path", path),
		slog.String("principal", who), slog.String("perm", string(perm)),
		slog.String("by_user", r.Config.User), slog.String("by_device", dev))
	return nil
}

// RemoveACL removes who's entry at path of volume volName: its access
// there is inherited again. Only a device of the realm's owner may.
func (r *Realm) RemoveACL(ctx context.Context, volName, path, who string) error {
	const op = "acl remove"
	if err := r.ownerDevice(ctx, op); err != nil {
		return err
	}
	v, err := r.Meta.Open(ctx, volName)
	if err != nil {
		return err
	}
	if err := meta.CheckPrincipal(who); err != nil {
		return err
	}
	if err := v.RemoveACL(ctx, path, who); err != nil {
		return err
	}
	dev := r.deviceName(ctx)
	r.audit().Info("acl: revoked", slog.String("volume", volName), slog.String("path", path),
		slog.String("principal", who), slog.String("by_user", r.Config.User), slog.String("by_device", dev))
	return nil
}

// ACLAccess is one principal's access at a path, and why.
type ACLAccess struct {
	Principal string    `json:"principal"`
	Perm      meta.Perm `json:"perm"`
	Why       string    `json:"why"`
}

// ACLReport is what `cairn acl get` shows for a path.
type ACLReport struct {
	Volume string `json:"volume"`
	Path   string `json:"path"`
	// Entries are the ACL records on the path and its ancestors, nearest
	// first.
	Records []meta.ACLRecord `json:"records"`
	// Access is what every user, and every device an ACL names, may do
	// at the path (a device: as its user, capped by the device's entry).
	Access []ACLAccess `json:"access"`
}

// ACL returns who can do what at path of volume volName.
func (r *Realm) ACL(ctx context.Context, volName, path string) (*ACLReport, error) {
	path, err := meta.CleanACLPath(path)
	if err != nil {
		return nil, err
	}
	v, err := r.Meta.Open(ctx, volName)
	if err != nil {
		return nil, err
	}
	w, err := v.ACLView(ctx)
	if err != nil {
		return nil, err
	}
	if p := r.Meta.Principal(); p != nil {
		// Who can do what at a path is for those who may read it.
		if have, why := w.Access(p.User, p.Device, path); !have.Allows(meta.PermRead) {
			return nil, cairn.E("acl get", cairn.Permission, volName+":"+path, fmt.Errorf("access %s (%s)", have, why))
		}
	}
	users, err := r.Meta.Users(ctx)
	if err != nil {
		return nil, err
	}
	devUser, err := r.Meta.DeviceUsers(ctx)
	if err != nil {
		return nil, err
	}
	rep := &ACLReport{Volume: volName, Path: path, Records: []meta.ACLRecord{}}
	for p := path; ; {
		if rec := w.Recs[p]; rec != nil {
			rep.Records = append(rep.Records, *rec)
		}
		if p == "/" {
			break
		}
		if i := strings.LastIndexByte(p, '/'); i == 0 {
			p = "/"
		} else {
			p = p[:i]
		}
	}
	names := map[string]bool{}
	for _, u := range users {
		names["user:"+u.Name] = true
	}
	if len(users) == 0 {
		names["user:"+w.Owner] = w.Owner != ""
	}
	for _, rec := range w.Recs {
		for _, e := range rec.Entries {
			names[e.Who] = true
		}
	}
	var ps []string
	for n, ok := range names {
		if ok {
			ps = append(ps, n)
		}
	}
	sort.Strings(ps)
	for _, n := range ps {
		kind, name, _ := strings.Cut(n, ":")
		var perm meta.Perm
		var why string
		if kind == "user" {
			perm, why = w.Access(name, "", path)
		} else {
			user := devUser[name]
			perm, why = w.Access(user, name, path)
			if user == "" {
				user = w.Owner
			}
			why += " (device of " + user + ")"
		}
		rep.Access = append(rep.Access, ACLAccess{Principal: n, Perm: perm, Why: why})
	}
	return rep, nil
}

// audit is the logger grants, revocations and refusals go to.
func (r *Realm) audit() *slog.Logger {
	if r.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.log
}
