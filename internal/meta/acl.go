package meta

// Access control lists inside a volume (issue 22, item 3; SCFS §2.6, ZZFS
// §4.2: "which user can access that object and from what device"). An ACL
// record sits on a path of a volume, at v/<volID>/acl/<path>, and gives
// principals (user:NAME, device:NAME) an access: r, rw or none. What a
// principal may do at a path:
//
//   - the default is its user's grant of the volume: the realm's owner rw,
//     a member shared --write rw, --read r, anyone else none;
//   - the nearest ACL record (the longest path prefix, whole segments) that
//     names the user replaces that default;
//   - the nearest record that names the device caps it (a device entry
//     never gives more than the user has: "this file never on the phone").
//
// Records are keyed by path, as placement policies are: they follow paths,
// not directories (a renamed directory leaves its ACLs on the old path), and
// moving a path needs rw on it and on every path with a record below it.
//
// Every change of a record also writes v/<volID>/aclgen, and every write a
// Service with a Principal makes is decided on one snapshot of the records,
// the grant and the owner key, whose revisions its transaction compares: an
// ACL change that races a write either comes before it (the write is
// decided again) or after it, never in between. This binds processes that
// go through cairn's code; a device with raw etcd credentials is not held
// by it (doc/threat-model.md, "ACLs inside a volume").

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"encoding/json"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// ACLRecordFormat is the version of ACL records (doc/format.md, "ACL records").
const ACLRecordFormat = 1

// Perm is what an ACL entry allows.
type Perm string

// The accesses an ACL gives, weakest first.
const (
	PermNone  Perm = "none"
	PermRead  Perm = "r"
	PermWrite Perm = "rw"
)

func (p Perm) rank() int {
	switch p {
	case PermRead:
		return 1
	case PermWrite:
		return 2
	}
	return 0
}

// Allows reports whether p includes need.
func (p Perm) Allows(need Perm) bool { return p.rank() >= need.rank() }

// ParsePerm parses r, rw or none.
func ParsePerm(s string) (Perm, error) {
	switch Perm(s) {
	case PermNone, PermRead, PermWrite:
		return Perm(s), nil
	}
	return "", cairn.E("acl", cairn.Invalid, s, errors.New("an access is r, rw or none"))
}

// ACLEntry is one principal's access in an ACL record.
type ACLEntry struct {
	// Who is user:NAME or device:NAME.
	Who   string `json:"who"`
	Perm  Perm   `json:"perm"`
	Set   int64  `json:"set"` // unix ns
	SetBy string `json:"set_by,omitempty"`
}

// ACLRecord is the value at v/<volID>/acl/<path>.
type ACLRecord struct {
	Format  int        `json:"format"`
	Path    string     `json:"path"`
	Entries []ACLEntry `json:"entries"`
}

// MaxACLEntries bounds the entries of one record.
const MaxACLEntries = 256

// CheckPrincipal checks who: user:NAME (a user name) or device:NAME.
func CheckPrincipal(who string) error {
	kind, name, ok := strings.Cut(who, ":")
	if ok {
		switch kind {
		case "user":
			if CheckUserName(name) == nil {
				return nil
			}
		case "device":
			if userNameRE.MatchString(name) {
				return nil
			}
		}
	}
	return cairn.E("acl", cairn.Invalid, who, errors.New("a principal is user:NAME or device:NAME (1 to 63 of a-z 0-9 . _ -)"))
}

// CleanACLPath checks an ACL's path: "/" or "/a/b", no empty, "." or ".."
// segment, no trailing '/'.
func CleanACLPath(p string) (string, error) {
	if p == "/" {
		return p, nil
	}
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
		return "", cairn.E("acl", cairn.Invalid, p, errors.New("an ACL's path is absolute, without a trailing '/'"))
	}
	for _, s := range strings.Split(p[1:], "/") {
		if s == "" || s == "." || s == ".." || checkName(s) != nil {
			return "", cairn.E("acl", cairn.Invalid, p, errors.New("an ACL's path has no empty, '.' or '..' segment"))
		}
	}
	return p, nil
}

// DecodeACL parses and checks an ACL record (Kind Corrupt if bad).
func DecodeACL(b []byte) (*ACLRecord, error) {
	const op = "acl record"
	var r ACLRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, "", err)
	}
	if r.Format != ACLRecordFormat {
		return nil, cairn.E(op, cairn.Corrupt, r.Path, fmt.Errorf("ACL record format %d, this cairn reads %d (upgrade cairn on this device)", r.Format, ACLRecordFormat))
	}
	if _, err := CleanACLPath(r.Path); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, r.Path, err)
	}
	if len(r.Entries) == 0 || len(r.Entries) > MaxACLEntries {
		return nil, cairn.E(op, cairn.Corrupt, r.Path, fmt.Errorf("%d entries (1 to %d)", len(r.Entries), MaxACLEntries))
	}
	seen := map[string]bool{}
	for _, e := range r.Entries {
		if err := CheckPrincipal(e.Who); err != nil {
			return nil, cairn.E(op, cairn.Corrupt, r.Path, err)
		}
		if _, err := ParsePerm(string(e.Perm)); err != nil {
			return nil, cairn.E(op, cairn.Corrupt, r.Path, err)
		}
		if seen[e.Who] {
			return nil, cairn.E(op, cairn.Corrupt, r.Path, fmt.Errorf("%s named twice", e.Who))
		}
		seen[e.Who] = true
	}
	return &r, nil
}

// Principal is who a Service acts for: a user (empty: the realm's owner,
// a device made before users) and a device (its node name).
type Principal struct {
	User   string
	Device string
}

// SetPrincipal makes s decide every namespace change and read of the
// volumes it opens by the ACLs for p. A Service without one (tests, tools
// of the realm's owner) is not restricted.
func (s *Service) SetPrincipal(p Principal) { s.principal.Store(&p) }

// Principal returns what SetPrincipal set (nil: none).
func (s *Service) Principal() *Principal { return s.principal.Load() }

// ACLView is what decides access in one volume at one revision: the ACL
// records, the grants and the realm's owner.
type ACLView struct {
	Owner  string
	Grants map[string]Access
	Recs   map[string]*ACLRecord // by path
}

// pathChain returns p and its ancestors, nearest first ("/a/b", "/a", "/").
func pathChain(p string) []string {
	out := []string{p}
	for p != "/" {
		i := strings.LastIndexByte(p, '/')
		if i == 0 {
			p = "/"
		} else {
			p = p[:i]
		}
		out = append(out, p)
	}
	return out
}

// nearest returns the perm and path of the nearest record naming who at
// or above path.
func (w *ACLView) nearest(who, path string) (Perm, string, bool) {
	for _, p := range pathChain(path) {
		if r := w.Recs[p]; r != nil {
			for _, e := range r.Entries {
				if e.Who == who {
					return e.Perm, p, true
				}
			}
		}
	}
	return "", "", false
}

// Access returns what user (empty: the owner) may do at path from device
// (empty: any), and why, for people.
func (w *ACLView) Access(user, device, path string) (Perm, string) {
	if user == "" {
		user = w.Owner
	}
	perm, why := PermNone, "not shared with user "+user
	switch {
	case user == w.Owner:
		perm, why = PermWrite, "owner of the realm"
	case w.Grants[user] == Write:
		perm, why = PermWrite, "volume shared --write"
	case w.Grants[user] == Read:
		perm, why = PermRead, "volume shared --read"
	}
	if user != "" {
		if p, at, ok := w.nearest("user:"+user, path); ok {
			perm, why = p, "acl on "+at
		}
	}
	if device != "" {
		if p, at, ok := w.nearest("device:"+device, path); ok && p.rank() < perm.rank() {
			perm, why = p, "acl on "+at+" for device "+device
		}
	}
	return perm, why
}

// names reports whether some record names user or device.
func (w *ACLView) names(user, device string) bool {
	for _, r := range w.Recs {
		for _, e := range r.Entries {
			if e.Who == "user:"+user || (device != "" && e.Who == "device:"+device) {
				return true
			}
		}
	}
	return false
}

// below returns the paths with a record strictly below path.
func (w *ACLView) below(path string) []string {
	pre := path + "/"
	if path == "/" {
		pre = "/"
	}
	var out []string
	for p := range w.Recs {
		if p != path && strings.HasPrefix(p, pre) {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// aclSnap is an ACLView read at one revision, with the revisions a write
// decided on it compares.
type aclSnap struct {
	ACLView
	read                       time.Time
	genRev, grantRev, ownRev   int64
	grantKey, ownerKey, genKey string
	user                       string // the principal's user, resolved
	named                      bool   // some record names the principal
}

// aclState is a Vol's ACL cache and the paths of inodes it has seen.
type aclState struct {
	mu    sync.Mutex
	snap  *aclSnap
	paths map[uint64]string
}

// aclReadTTL is how long a read decision may use a snapshot: an ACL
// change reaches a running mount's reads within it. Writes read afresh.
const aclReadTTL = time.Second

func (v *Vol) aclst() *aclState {
	v.aclOnce.Do(func() { v.acl = &aclState{paths: map[uint64]string{RootIno: "/"}} })
	return v.acl
}

func (v *Vol) aclPrefix() string { return v.base + "acl/" }
func (v *Vol) aclGenKey() string { return v.base + "aclgen" }

// loadACL reads the volume's ACL records, grants and owner at one revision.
func (v *Vol) loadACL(ctx context.Context, p *Principal) (*aclSnap, error) {
	const op = "acl"
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	sn := &aclSnap{genKey: v.aclGenKey(), ownerKey: v.s.key("owner"), read: time.Now()}
	gp := v.s.key("grant", v.V.ID) + "/"
	resp, err := v.s.cli.Txn(ctx).Then(
		clientv3.OpGet(sn.genKey),
		clientv3.OpGet(v.aclPrefix(), clientv3.WithPrefix()),
		clientv3.OpGet(gp, clientv3.WithPrefix()),
		clientv3.OpGet(sn.ownerKey),
	).Commit()
	if err != nil {
		return nil, etcdErr(op, v.V.Name, err)
	}
	r := resp.Responses
	if kvs := r[0].GetResponseRange().Kvs; len(kvs) > 0 {
		sn.genRev = kvs[0].ModRevision
	}
	sn.Recs = map[string]*ACLRecord{}
	for _, kv := range r[1].GetResponseRange().Kvs {
		rec, err := DecodeACL(kv.Value)
		if err != nil {
			return nil, err
		}
		if string(kv.Key) != v.aclPrefix()+rec.Path {
			return nil, cairn.E(op, cairn.Corrupt, string(kv.Key), errors.New("ACL record under another path's key"))
		}
		sn.Recs[rec.Path] = rec
	}
	if kvs := r[3].GetResponseRange().Kvs; len(kvs) > 0 {
		sn.Owner, sn.ownRev = string(kvs[0].Value), kvs[0].ModRevision
	}
	sn.user = p.User
	if sn.user == "" {
		sn.user = sn.Owner
	}
	sn.grantKey = gp + sn.user
	sn.Grants = map[string]Access{}
	for _, kv := range r[2].GetResponseRange().Kvs {
		g, err := DecodeGrant(kv.Value)
		if err != nil {
			return nil, err
		}
		sn.Grants[g.User] = g.Access
		if string(kv.Key) == sn.grantKey {
			sn.grantRev = kv.ModRevision
		}
	}
	sn.named = sn.names(sn.user, p.Device)
	return sn, nil
}

// cmps are the compares that hold while the snapshot is current.
func (sn *aclSnap) cmps() []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(sn.genKey), "=", sn.genRev),
		clientv3.Compare(clientv3.ModRevision(sn.grantKey), "=", sn.grantRev),
		clientv3.Compare(clientv3.ModRevision(sn.ownerKey), "=", sn.ownRev),
	}
}

// ACLView returns the volume's ACL records, grants and owner as they are.
func (v *Vol) ACLView(ctx context.Context) (*ACLView, error) {
	sn, err := v.loadACL(ctx, &Principal{})
	if err != nil {
		return nil, err
	}
	return &sn.ACLView, nil
}

// ---- paths of inodes ----

// dirPath returns the path this Vol last saw inode ino at.
func (v *Vol) dirPath(ino uint64) (string, bool) {
	st := v.aclst()
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.paths[ino]
	return p, ok
}

// childPath is the path of name in directory parent ("" if not known).
func (v *Vol) childPath(parent uint64, name string) string {
	if parent == 0 && name == "" {
		return "/"
	}
	if d, ok := v.dirPath(parent); ok {
		return joinPath(d, name)
	}
	return ""
}

// notePath records that e is at path (nothing if path is not known).
func (v *Vol) notePath(e *Entry, path string) {
	if path == "" || e == nil {
		return
	}
	st := v.aclst()
	st.mu.Lock()
	st.paths[e.Ino] = path
	st.mu.Unlock()
}

// ---- decisions ----

// deny logs a refusal and returns its error.
func (v *Vol) deny(op, path string, p *Principal, have Perm, why string) error {
	shown := path
	if shown == "" {
		shown = "(path not known)"
	}
	v.s.opts.Logger.Warn("acl: access denied", slog.String("op", op), slog.String("volume", v.V.Name),
		slog.String("path", shown), slog.String("user", p.User), slog.String("device", p.Device),
		slog.String("have", string(have)), slog.String("why", why))
	return cairn.E(op, cairn.Permission, v.V.Name+":"+shown, fmt.Errorf("access %s (%s)", have, why))
}

// authWrite decides whether this Service's principal may change path and,
// with subtree, every path with an ACL record below it. It returns the
// compares that bind the decision to the write's transaction (nil without
// a principal).
func (v *Vol) authWrite(ctx context.Context, op, path string, subtree bool) ([]clientv3.Cmp, error) {
	p := v.s.Principal()
	if p == nil {
		return nil, nil
	}
	sn, err := v.loadACL(ctx, p)
	if err != nil {
		return nil, err
	}
	st := v.aclst()
	st.mu.Lock()
	st.snap = sn
	st.mu.Unlock()
	if err := v.decide(sn, p, op, path, PermWrite); err != nil {
		return nil, err
	}
	if subtree && path != "" {
		for _, b := range sn.below(path) {
			if err := v.decide(sn, p, op, b, PermWrite); err != nil {
				return nil, err
			}
		}
	}
	if aclDecided != nil {
		aclDecided(op, path)
	}
	return sn.cmps(), nil
}

// aclDecided, in tests, runs between a write's decision and its commit.
var aclDecided func(op, path string)

// aclStale reports whether the ACL state a write was decided on (acmps,
// from authWrite) has changed since.
func (v *Vol) aclStale(ctx context.Context, acmps []clientv3.Cmp) bool {
	if len(acmps) == 0 {
		return false
	}
	ctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Txn(ctx).If(acmps...).Commit()
	return err == nil && !resp.Succeeded
}

// authWriteMany decides each of paths (as authWrite without subtree) on
// one snapshot: errs[i] is paths[i]'s refusal; cmps bind the decisions.
func (v *Vol) authWriteMany(ctx context.Context, op string, paths []string) ([]clientv3.Cmp, []error, error) {
	p := v.s.Principal()
	errs := make([]error, len(paths))
	if p == nil {
		return nil, errs, nil
	}
	sn, err := v.loadACL(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	for i, path := range paths {
		errs[i] = v.decide(sn, p, op, path, PermWrite)
	}
	return sn.cmps(), errs, nil
}

// movePaths rewrites the noted paths below from to below to (a directory
// renamed by this Vol).
func (v *Vol) movePaths(from, to string) {
	if from == "" || to == "" || from == "/" {
		return
	}
	st := v.aclst()
	st.mu.Lock()
	defer st.mu.Unlock()
	for ino, p := range st.paths {
		if strings.HasPrefix(p, from+"/") {
			st.paths[ino] = to + p[len(from):]
		}
	}
}

// decide checks need at path on snapshot sn.
func (v *Vol) decide(sn *aclSnap, p *Principal, op, path string, need Perm) error {
	if path == "" {
		if !sn.named {
			// No record names the principal: the grant decides alone.
			if have, why := sn.Access(sn.user, p.Device, "/"); !have.Allows(need) {
				return v.deny(op, path, p, have, why)
			}
			return nil
		}
		return v.deny(op, path, p, PermNone, "the path is not known here and an ACL names this user or device")
	}
	if have, why := sn.Access(sn.user, p.Device, path); !have.Allows(need) {
		return v.deny(op, path, p, have, why)
	}
	return nil
}

// readSnap returns a snapshot at most aclReadTTL old (nil without a
// principal).
func (v *Vol) readSnap(ctx context.Context) (*aclSnap, *Principal, error) {
	p := v.s.Principal()
	if p == nil {
		return nil, nil, nil
	}
	st := v.aclst()
	st.mu.Lock()
	sn := st.snap
	st.mu.Unlock()
	if sn != nil && (time.Since(sn.read) < aclReadTTL || v.s.isOffline()) {
		// (Offline, the last snapshot decides, however old.)
		return sn, p, nil
	}
	if v.offlineCopy(ctx, nil) != nil {
		return nil, nil, nil // offline before any snapshot: see threat model
	}
	nsn, err := v.loadACL(ctx, p)
	if err != nil {
		if v.offlineCopy(ctx, err) != nil {
			return sn, p, nil
		}
		return nil, nil, err
	}
	sn = nsn
	st.mu.Lock()
	st.snap = sn
	st.mu.Unlock()
	return sn, p, nil
}

// authRead checks the principal may read path.
func (v *Vol) authRead(ctx context.Context, op, path string) error {
	sn, p, err := v.readSnap(ctx)
	if sn == nil || err != nil {
		return err
	}
	return v.decide(sn, p, op, path, PermRead)
}

// CheckRead reports (Kind Permission) whether this Service's principal
// may not read name in directory parent: for callers that answer lookups
// from a cache of their own (the mount's entry cache, kept by a watch).
// If it may and e (the entry found there, or nil) is given, e's path is
// noted, as a Get of it would.
func (v *Vol) CheckRead(ctx context.Context, parent uint64, name string, e *Entry) error {
	path := v.childPath(parent, name)
	if err := v.authRead(ctx, "lookup", path); err != nil {
		return err
	}
	v.notePath(e, path)
	return nil
}

// filterRead drops from a listing of directory ino the entries the
// principal may not read, and notes the paths of the others.
func (v *Vol) filterRead(ctx context.Context, ino uint64, es []Entry) ([]Entry, error) {
	dir, known := v.dirPath(ino)
	for i := range es {
		if known {
			v.notePath(&es[i], joinPath(dir, es[i].Name))
		}
	}
	sn, p, err := v.readSnap(ctx)
	if sn == nil || err != nil || !sn.named {
		return es, err
	}
	if !known {
		return nil, v.deny("read dir", "", p, PermNone, "the directory's path is not known here and an ACL names this user or device")
	}
	if err := v.decide(sn, p, "read dir", dir, PermRead); err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(es)) // (es may be a local copy's own)
	for _, e := range es {
		if have, _ := sn.Access(sn.user, p.Device, joinPath(dir, e.Name)); have.Allows(PermRead) {
			out = append(out, e)
		}
	}
	return out, nil
}

// ---- changing ACLs ----

// SetACL sets who's access at path (replacing its entry there, if any),
// by device by. It does not check who may: the caller (realm) does.
func (v *Vol) SetACL(ctx context.Context, path, who string, perm Perm, by string) error {
	if err := CheckPrincipal(who); err != nil {
		return err
	}
	if _, err := ParsePerm(string(perm)); err != nil {
		return err
	}
	return v.changeACL(ctx, "acl set", path, func(r *ACLRecord) (bool, error) {
		e := ACLEntry{Who: who, Perm: perm, Set: time.Now().UnixNano(), SetBy: by}
		for i := range r.Entries {
			if r.Entries[i].Who == who {
				r.Entries[i] = e
				return true, nil
			}
		}
		if len(r.Entries) >= MaxACLEntries {
			return false, cairn.E("acl set", cairn.Invalid, path, fmt.Errorf("at most %d entries on one path", MaxACLEntries))
		}
		r.Entries = append(r.Entries, e)
		sort.Slice(r.Entries, func(i, j int) bool { return r.Entries[i].Who < r.Entries[j].Who })
		return true, nil
	})
}

// RemoveACL removes who's entry at path (NotFound if none): the access
// is then inherited again.
func (v *Vol) RemoveACL(ctx context.Context, path, who string) error {
	return v.changeACL(ctx, "acl remove", path, func(r *ACLRecord) (bool, error) {
		for i := range r.Entries {
			if r.Entries[i].Who == who {
				r.Entries = append(r.Entries[:i], r.Entries[i+1:]...)
				return true, nil
			}
		}
		return false, cairn.E("acl remove", cairn.NotFound, v.V.Name+":"+path, fmt.Errorf("no ACL entry for %s on this path", who))
	})
}

// changeACL applies fn to path's record by compare-and-swap, bumping
// aclgen in the same transaction.
func (v *Vol) changeACL(ctx context.Context, op, path string, fn func(*ACLRecord) (bool, error)) error {
	path, err := CleanACLPath(path)
	if err != nil {
		return err
	}
	k := v.aclPrefix() + path
	for attempt := 0; attempt < 20; attempt++ {
		cctx, cancel := v.s.opCtx(ctx)
		resp, err := v.s.cli.Get(cctx, k)
		cancel()
		if err != nil {
			return etcdErr(op, path, err)
		}
		rec := &ACLRecord{Format: ACLRecordFormat, Path: path}
		var rev int64
		if len(resp.Kvs) > 0 {
			if rec, err = DecodeACL(resp.Kvs[0].Value); err != nil {
				return err
			}
			rev = resp.Kvs[0].ModRevision
		}
		if _, errIn := fn(rec); errIn != nil {
			return errIn
		}
		var put clientv3.Op
		if len(rec.Entries) == 0 {
			put = clientv3.OpDelete(k)
		} else {
			b, _ := json.Marshal(rec)
			put = clientv3.OpPut(k, string(b))
		}
		cctx, cancel = v.s.opCtx(ctx)
		tr, err := v.s.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(put, clientv3.OpPut(v.aclGenKey(), path)).Commit()
		cancel()
		if err != nil {
			return etcdErr(op, path, err)
		}
		if tr.Succeeded {
			st := v.aclst()
			st.mu.Lock()
			st.snap = nil
			st.mu.Unlock()
			return nil
		}
	}
	return cairn.E(op, cairn.Conflict, path, errors.New("the ACL kept changing: try again"))
}
