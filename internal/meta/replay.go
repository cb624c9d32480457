package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/journal"
)

// Reconciliation (doc/offline.md): once the metadata service is back,
// the offline log is replayed in order through the one drainer of
// journals. Each change commits with compare-and-swap against its base,
// through the same calls an online change makes, with two more writes in
// its transaction: the log's progress mark (the sequence number of the
// last change applied: a change at or below it is never applied again,
// whatever a kill between the commit and the journal's ack left), and
// the conflict's record when the change made one. The rules for each
// case are in doc/offline.md ("Conflicts").

// ConflictVersion is the format version of a conflict record
// (doc/format.md, "Conflict record").
const ConflictVersion = 1

// The kinds of conflict a replay records.
const (
	ConflictContent      = "content"             // the file changed on both sides: ours beside theirs
	ConflictCreate       = "create"              // the same name made on both sides: ours beside theirs
	ConflictEditDelete   = "edit-delete"         // edited here, deleted there: the edit is kept
	ConflictDeleteEdit   = "delete-edit"         // deleted here, edited there: the edit is kept
	ConflictDeleteDir    = "delete-nonempty"     // a directory removed here gained entries there: kept
	ConflictRenameRename = "rename-rename"       // moved or removed there too: theirs kept, ours not made
	ConflictRenameGone   = "rename-into-deleted" // moved here into a directory removed there
	ConflictParentGone   = "parent-gone"         // made here in a directory removed there
)

// ConflictSide is one side of a conflict.
type ConflictSide struct {
	Device   string `json:"device,omitempty"`
	Time     int64  `json:"time,omitempty"` // unix ns: the change's (mine) or the record's (theirs)
	Size     int64  `json:"size"`
	Manifest string `json:"manifest,omitempty"`
	Ino      uint64 `json:"ino,omitempty"`
}

// Conflict is a conflict a replay made, kept at v/<volID>/conflicts/<ID>
// until it is resolved (doc/format.md, "Conflict record").
type Conflict struct {
	V    int    `json:"v"`
	ID   string `json:"id"`
	Kind string `json:"kind"`
	// Path is the name that kept the other side ("theirs"); Copy, where
	// this device's side landed ("": it was not kept as a copy: see Kind).
	Path string `json:"path"`
	Copy string `json:"copy,omitempty"`
	// Where each is: Name in directory Parent, CopyName in CopyParent.
	Parent     uint64       `json:"parent"`
	Name       string       `json:"name"`
	CopyParent uint64       `json:"copy_parent,omitempty"`
	CopyName   string       `json:"copy_name,omitempty"`
	Mine       ConflictSide `json:"mine"`
	Theirs     ConflictSide `json:"theirs"`
	Replayed   int64        `json:"replayed"` // unix ns
	Note       string       `json:"note,omitempty"`
}

// DecodeConflict reads a conflict record.
func DecodeConflict(b []byte) (*Conflict, error) {
	var c Conflict
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, cairn.E("conflict record", cairn.Corrupt, "", err)
	}
	if c.V != ConflictVersion {
		return nil, cairn.E("conflict record", cairn.Corrupt, c.ID, fmt.Errorf("format version %d (this cairn reads %d)", c.V, ConflictVersion))
	}
	if c.ID == "" || c.Kind == "" || c.Path == "" {
		return nil, cairn.E("conflict record", cairn.Corrupt, c.ID, errors.New("no id, kind or path"))
	}
	return &c, nil
}

// ConflictName is the name this device's side of a conflict on name
// takes: NAME.conflict-DEVICE-YYYYMMDD-HHMMSS (UTC, the change's time).
func ConflictName(name, device string, at time.Time) string {
	dev := strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, device)
	return name + ".conflict-" + dev + "-" + at.UTC().Format("20060102-150405")
}

type replayKey struct{}

// replayState is what a replayed change adds to its transaction.
type replayState struct{ ops []clientv3.Op }

func replaying(ctx context.Context) bool {
	_, ok := ctx.Value(replayKey{}).(*replayState)
	return ok
}

func replayOps(ctx context.Context) []clientv3.Op {
	if st, ok := ctx.Value(replayKey{}).(*replayState); ok {
		return st.ops
	}
	return nil
}

func (v *Vol) conflictKey(id string) string { return v.base + "conflicts/" + id }
func (v *Vol) markKey(l *OfflineLog) string { return v.base + "offline/" + l.id }

// ReplayResult says what a replay did.
type ReplayResult struct {
	Applied   int        // changes made
	Skipped   int        // changes already made (at or below the progress mark)
	Dropped   int        // changes a rule dropped (each with its conflict)
	Conflicts []Conflict // the conflicts recorded
	Bad       int        // records that could not be read: left in the log
}

// Replay applies the log's changes to v (online), in order, and returns
// what it did. It stops at the first change that cannot be made (an
// error; the metadata service gone again: Kind Unavailable): that one and
// those after it stay in the log for the next replay. A replay killed
// midway resumes at the first change not made.
func (l *OfflineLog) Replay(ctx context.Context, v *Vol, log *slog.Logger) (ReplayResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var res ReplayResult
	cctx, cancel := v.s.opCtx(ctx)
	resp, err := v.s.cli.Get(cctx, v.markKey(l))
	cancel()
	if err != nil {
		return res, etcdErr("replay", v.V.Name, err)
	}
	var mark uint64
	if len(resp.Kvs) > 0 {
		mark, _ = strconv.ParseUint(string(resp.Kvs[0].Value), 10, 64)
	}
	r := &replayer{v: v, l: l, log: log, alive: map[uint64]*Entry{}}
	d := &journal.Drainer{
		Apply: func(ctx context.Context, recs []journal.Record, ack func(...uint64) error) error {
			var done []uint64
			flush := func() error {
				if len(done) == 0 {
					return nil
				}
				errIn := ack(done...)
				done = done[:0]
				return errIn
			}
			for _, jr := range recs {
				if jr.Seq <= mark {
					res.Skipped++
					done = append(done, jr.Seq)
					continue
				}
				rec, errIn := DecodeOfflineRecord(jr.Payload)
				if errIn != nil {
					res.Bad++
					log.Error("an offline change cannot be read; it is left in the log", "seq", jr.Seq, "err", errIn)
					continue
				}
				if v.s.isOffline() {
					flush()
					return cairn.E("replay", cairn.Unavailable, rec.Path, errors.New("the metadata service is unreachable again"))
				}
				c, dropped, errIn := r.apply(ctx, jr.Seq, rec)
				if errIn != nil {
					flush()
					return errIn
				}
				mark = jr.Seq
				if dropped {
					res.Dropped++
				} else {
					res.Applied++
				}
				if c != nil {
					res.Conflicts = append(res.Conflicts, *c)
					log.Warn("offline change made a conflict", "kind", c.Kind, "path", c.Path, "copy", c.Copy)
				}
				done = append(done, jr.Seq)
				if len(done) >= 64 {
					if errIn2 := flush(); errIn2 != nil {
						return errIn2
					}
				}
			}
			return flush()
		},
		Retry:      func(err error) bool { return cairn.KindOf(err) == cairn.Unavailable },
		RetryFor:   0,
		MinBackoff: 100 * time.Millisecond,
	}
	err = d.Run(ctx, l.j)
	return res, err
}

type replayer struct {
	v     *Vol
	l     *OfflineLog
	log   *slog.Logger
	alive map[uint64]*Entry // directories found in place this replay
}

// withMark is ctx for a change at seq: its transaction also writes the
// progress mark and, if c is set, the conflict's record.
func (r *replayer) withMark(ctx context.Context, seq uint64, c *Conflict) context.Context {
	ops := []clientv3.Op{clientv3.OpPut(r.v.markKey(r.l), strconv.FormatUint(seq, 10))}
	if c != nil {
		b, _ := json.Marshal(c)
		ops = append(ops, clientv3.OpPut(r.v.conflictKey(c.ID), string(b)))
	}
	return context.WithValue(ctx, replayKey{}, &replayState{ops: ops})
}

// markOnly writes the progress mark (and conflict) alone: a change a rule
// dropped.
func (r *replayer) markOnly(ctx context.Context, seq uint64, c *Conflict) error {
	ops := replayOps(r.withMark(ctx, seq, c))
	cctx, cancel := r.v.s.opCtx(ctx)
	defer cancel()
	_, err := r.v.s.cli.Txn(cctx).Then(ops...).Commit()
	return etcdErr("replay", r.v.V.Name, err)
}

func (r *replayer) conflict(rec *OfflineRecord, kind string, theirs *Entry, parent uint64, copyParent uint64, copyName, copyPath, note string) *Conflict {
	c := &Conflict{V: ConflictVersion, ID: fmt.Sprintf("%s-%016x-%016x", sanitize(r.l.device), rec.At, rec.Ino), Kind: kind,
		Path: rec.Path, Parent: parent, Name: rec.Name, CopyParent: copyParent, CopyName: copyName, Copy: copyPath,
		Mine:     ConflictSide{Device: r.l.device, Time: rec.At, Ino: rec.Ino},
		Replayed: time.Now().UnixNano(), Note: note}
	if rec.Op == OffRename {
		c.Path, c.Name = rec.DstPath, rec.DstName
	}
	if rec.Version != nil {
		c.Mine.Size, c.Mine.Manifest = rec.Version.Size, rec.Version.Manifest.String()
	}
	if theirs != nil {
		c.Theirs = ConflictSide{Time: theirs.Ctime, Size: theirs.Size, Manifest: curBase(theirs), Ino: theirs.Ino}
	}
	return c
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r < ' ' {
			return '_'
		}
		return r
	}, s)
}

// get reads name in directory parent from etcd (nil: absent).
func (r *replayer) get(ctx context.Context, parent uint64, name string) (*Entry, error) {
	e, err := r.v.Get(ctx, parent, name)
	if errors.Is(err, cairn.ErrNotFound) {
		return nil, nil
	}
	return e, err
}

// dir finds directory ino, whose record was name in directory
// dirParent, in etcd: at that place, or renamed within that directory
// (a conflict copy's name), with every directory above it in place
// (a directory removed elsewhere keeps its entries in the trash). nil:
// gone.
func (r *replayer) dir(ctx context.Context, ino, dirParent uint64, name string) (*Entry, error) {
	if ino == 0 {
		return &Entry{Type: TypeDir}, nil // where the root's own record is
	}
	if e, ok := r.alive[ino]; ok {
		return e, nil
	}
	var e *Entry
	var err error
	if ino == RootIno {
		e, err = r.v.Root(ctx)
	} else {
		if e, err = r.get(ctx, dirParent, name); err != nil {
			return nil, err
		}
		if e == nil || e.Ino != ino {
			e = nil
			kids, errIn := r.v.ReadDir(ctx, dirParent)
			if errIn != nil {
				return nil, errIn
			}
			for i := range kids {
				if kids[i].Ino == ino {
					e = &kids[i]
					break
				}
			}
		}
		if e != nil && e.Parent != RootIno {
			// Its own directory must be in place too.
			up := r.placeOf(e.Parent)
			if up == nil {
				e = nil
			} else if p, errIn := r.dir(ctx, e.Parent, up.parent, up.name); errIn != nil {
				return nil, errIn
			} else if p == nil {
				e = nil
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if e != nil && !e.IsDir() {
		e = nil
	}
	if e != nil {
		r.alive[ino] = e
	}
	return e, nil
}

// placeOf is where the local copy last saw directory ino (nil: it does
// not know).
func (r *replayer) placeOf(ino uint64) *dirPlace {
	lc := r.v.LocalCopy()
	if lc == nil {
		return nil
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if p, ok := lc.dirs[ino]; ok {
		return &p
	}
	return nil
}

// apply makes one change (doc/offline.md, "Conflicts"): it returns the
// conflict it recorded, and whether a rule dropped it.
func (r *replayer) apply(ctx context.Context, seq uint64, rec *OfflineRecord) (*Conflict, bool, error) {
	for attempt := 0; ; attempt++ {
		c, dropped, err := r.applyOnce(ctx, seq, rec)
		if err == nil || attempt >= 20 || cairn.KindOf(err) != cairn.Conflict && cairn.KindOf(err) != cairn.NotFound {
			return c, dropped, err
		}
		// Something changed between the reads and the commit: again.
		delete(r.alive, rec.Parent)
		delete(r.alive, rec.DstParent)
	}
}

func (r *replayer) applyOnce(ctx context.Context, seq uint64, rec *OfflineRecord) (*Conflict, bool, error) {
	v := r.v
	at := time.Unix(0, rec.At)
	dir, err := r.dir(ctx, rec.Parent, rec.DirParent, rec.DirName)
	if err != nil {
		return nil, false, err
	}
	// copyIn is where this device's side lands beside theirs.
	copyIn := func(d *Entry, name string) (string, string) {
		cn := ConflictName(name, r.l.device, at)
		p := rec.Path[:strings.LastIndex(rec.Path, "/")+1] + cn
		if d.Ino == RootIno && d.Ino != rec.Parent {
			p = "/" + cn
		}
		return cn, p
	}
	switch rec.Op {
	case OffCreate:
		name, kind := rec.Name, ""
		var theirs *Entry
		if dir == nil {
			if dir, err = v.Root(ctx); err != nil {
				return nil, false, err
			}
			kind = ConflictParentGone
		} else if theirs, err = r.get(ctx, dir.Ino, rec.Name); err != nil {
			return nil, false, err
		} else if theirs != nil {
			kind = ConflictCreate
		}
		var c *Conflict
		if kind != "" {
			cn, cp := copyIn(dir, rec.Name)
			name = cn
			c = r.conflict(rec, kind, theirs, rec.Parent, dir.Ino, cn, cp, "")
		}
		e := *rec.Entry
		e.Name, e.Rev = name, 0
		_, _, errIn := v.create(r.withMark(ctx, seq, c), dir, e, false)
		return c, false, errIn

	case OffCommit:
		var cur *Entry
		kind := ""
		if dir == nil {
			if dir, err = v.Root(ctx); err != nil {
				return nil, false, err
			}
			kind = ConflictParentGone
		} else if cur, err = r.get(ctx, dir.Ino, rec.Name); err != nil {
			return nil, false, err
		}
		cm := Commit{Version: *rec.Version, KeepAttrs: !rec.New, Ino: rec.Ino}
		if rec.Entry != nil {
			cm.Mode, cm.UID, cm.GID = rec.Entry.Mode, rec.Entry.UID, rec.Entry.GID
		}
		cm.Version.N = 0
		switch {
		case kind != "":
		case cur == nil && rec.New:
			// A file made here: made.
		case cur == nil:
			// Edited here, removed there: the edit is kept, under its name.
			c := r.conflict(rec, ConflictEditDelete, nil, rec.Parent, 0, "", "", "removed elsewhere; this device's edit is kept")
			cm.Cur, cm.KeepAttrs = KnownEntry(nil), false
			return c, false, r.commit(ctx, seq, c, dir, rec.Name, cm)
		case cur.Ino == rec.Ino && curBase(cur) == rec.Base:
			cm.Cur = KnownEntry(cur)
			return nil, false, r.commit(ctx, seq, nil, dir, rec.Name, cm)
		case cur.Ino == rec.Ino || !rec.New:
			kind = ConflictContent
		default:
			kind = ConflictCreate
		}
		if kind == "" {
			cm.Cur = KnownEntry(nil)
			return nil, false, r.commit(ctx, seq, nil, dir, rec.Name, cm)
		}
		cn, cp := copyIn(dir, rec.Name)
		c := r.conflict(rec, kind, cur, rec.Parent, dir.Ino, cn, cp, "")
		cm.Cur, cm.Ino, cm.KeepAttrs = KnownEntry(nil), 0, false
		if cur != nil && cm.Mode == 0 {
			cm.Mode, cm.UID, cm.GID = cur.Mode, cur.UID, cur.GID
		}
		if ex, errIn := r.get(ctx, dir.Ino, cn); errIn != nil {
			return nil, false, errIn
		} else if ex != nil {
			// An earlier change of this file made the copy: this one is
			// its next version.
			cm.Cur, cm.KeepAttrs = KnownEntry(ex), true
		}
		return c, false, r.commit(ctx, seq, c, dir, cn, cm)

	case OffUpdate:
		if dir == nil {
			return nil, true, r.markOnly(ctx, seq, nil)
		}
		cur, errIn := r.get(ctx, dir.Ino, rec.Name)
		if errIn != nil {
			return nil, false, errIn
		}
		if cur == nil || cur.Ino != rec.Ino {
			r.log.Info("an offline attribute change found its entry gone: dropped", "path", rec.Path)
			return nil, true, r.markOnly(ctx, seq, nil)
		}
		n := *cur
		n.Mode, n.UID, n.GID, n.Mtime, n.Target = rec.Entry.Mode, rec.Entry.UID, rec.Entry.GID, rec.Entry.Mtime, rec.Entry.Target
		_, errIn = v.Update(r.withMark(ctx, seq, nil), &n)
		return nil, false, errIn

	case OffRemove:
		if dir == nil {
			return nil, true, r.markOnly(ctx, seq, nil)
		}
		cur, errIn := r.get(ctx, dir.Ino, rec.Name)
		if errIn != nil {
			return nil, false, errIn
		}
		if cur == nil || cur.Ino != rec.Ino {
			return nil, true, r.markOnly(ctx, seq, nil) // gone, or the name holds another's now
		}
		if cur.Type == TypeFile && curBase(cur) != rec.Base {
			c := r.conflict(rec, ConflictDeleteEdit, cur, rec.Parent, 0, "", "", "edited elsewhere; the edit is kept, this device's removal is not made")
			return c, true, r.markOnly(ctx, seq, c)
		}
		_, errIn = v.RemoveKnown(r.withMark(ctx, seq, nil), dir, rec.Name, rec.Path, false, cur)
		if cairn.KindOf(errIn) == cairn.NotEmpty {
			c := r.conflict(rec, ConflictDeleteDir, cur, rec.Parent, 0, "", "", "entries were added elsewhere; the directory is kept with them")
			return c, true, r.markOnly(ctx, seq, c)
		}
		return nil, false, errIn

	case OffRename:
		var src *Entry
		if dir != nil {
			if src, err = r.get(ctx, dir.Ino, rec.Name); err != nil {
				return nil, false, err
			}
		}
		if src == nil || src.Ino != rec.Ino {
			// Moved or removed elsewhere meanwhile: theirs is kept.
			c := r.conflict(rec, ConflictRenameRename, nil, rec.DstParent, 0, "", "", "moved or removed elsewhere; this device's rename is not made")
			c.Path, c.Name = rec.Path, rec.Name
			return c, true, r.markOnly(ctx, seq, c)
		}
		ddir, err := r.dir(ctx, rec.DstParent, rec.DstDirParent, rec.DstDirName)
		if err != nil {
			return nil, false, err
		}
		name := rec.DstName
		var c *Conflict
		var dst *Entry
		if ddir == nil {
			// Into a directory removed elsewhere: it stays in its own,
			// under the name it was given, as a conflict.
			ddir = dir
			name = ConflictName(rec.DstName, r.l.device, at)
			c = r.conflict(rec, ConflictRenameGone, nil, rec.Parent, dir.Ino, name, rec.Path[:strings.LastIndex(rec.Path, "/")+1]+name, "the destination directory was removed elsewhere")
		} else {
			if dst, err = r.get(ctx, ddir.Ino, rec.DstName); err != nil {
				return nil, false, err
			}
			if dst != nil && !(dst.Ino == rec.DstIno && (dst.IsDir() || curBase(dst) == rec.DstBase)) {
				// The name holds what this device did not replace (made
				// or changed there): ours lands beside it.
				kind := ConflictContent
				if rec.DstIno == 0 || dst.Ino != rec.DstIno {
					kind = ConflictCreate
				}
				name = ConflictName(rec.DstName, r.l.device, at)
				c = r.conflict(rec, kind, dst, rec.DstParent, ddir.Ino, name, rec.DstPath[:strings.LastIndex(rec.DstPath, "/")+1]+name, "")
				if rec.Version == nil && src.Current() != nil {
					c.Mine.Size, c.Mine.Manifest = src.Size, curBase(src)
				}
				dst = nil
			}
		}
		mctx := r.withMark(ctx, seq, c)
		if rec.Pending {
			_, err = v.RenamePending(mctx, dir, rec.Name, src, ddir, name, rec.DstPath, KnownEntry(dst))
		} else {
			_, err = v.RenameKnown(mctx, dir, rec.Name, src, ddir, name, rec.DstPath, KnownEntry(dst))
		}
		return c, false, err
	}
	return nil, false, cairn.E("replay", cairn.Corrupt, rec.Path, fmt.Errorf("unknown operation %q", rec.Op))
}

func (r *replayer) commit(ctx context.Context, seq uint64, c *Conflict, dir *Entry, name string, cm Commit) error {
	gen, err := r.v.s.currentGen(ctx)
	if err != nil {
		return err
	}
	cm.Gen = gen
	_, _, err = r.v.commitVersion(r.withMark(ctx, seq, c), dir, name, cm)
	return err
}

// Conflicts lists the volume's conflict records (an unreadable one is
// left out and logged).
func (v *Vol) Conflicts(ctx context.Context) ([]Conflict, error) {
	var out []Conflict
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	resp, err := v.s.cli.Get(cctx, v.base+"conflicts/", clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("conflicts", v.V.Name, err)
	}
	for _, kv := range resp.Kvs {
		c, err := DecodeConflict(kv.Value)
		if err != nil {
			v.s.opts.Logger.Warn("a conflict record cannot be read", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, *c)
	}
	return out, nil
}

// DropConflict removes conflict id's record (it was settled).
func (v *Vol) DropConflict(ctx context.Context, id string) error {
	cctx, cancel := v.s.opCtx(ctx)
	defer cancel()
	_, err := v.s.cli.Delete(cctx, v.conflictKey(id))
	return etcdErr("resolve conflict", id, err)
}

// The sides ResolveConflict keeps.
const (
	KeepMine   = "mine"   // this device's side: its copy takes the name (the other's version stays in the history), or its removal is made
	KeepTheirs = "theirs" // the other side: this device's copy goes to the trash, or the removal made elsewhere is made
	KeepBoth   = "both"   // both as they are: the record alone goes
)

// ResolveConflict settles the conflict recorded for path (its Path or its
// Copy, "/a/b"): keeps the side keep says and drops the record. It
// returns the conflict settled; NotFound if none is recorded for path,
// Invalid for a keep that does not apply (mine of a rename not made).
func (v *Vol) ResolveConflict(ctx context.Context, path, keep string) (*Conflict, error) {
	const op = "resolve conflict"
	cs, err := v.Conflicts(ctx)
	if err != nil {
		return nil, err
	}
	var c *Conflict
	for i := range cs {
		if cs[i].Path == path || (cs[i].Copy != "" && cs[i].Copy == path) {
			c = &cs[i]
			break
		}
	}
	if c == nil {
		return nil, cairn.E(op, cairn.NotFound, path, errors.New("no conflict is recorded for this path"))
	}
	lookupDir := func(p string) (*Entry, error) {
		dir := p[:strings.LastIndex(p, "/")]
		var parts []string
		if dir != "" {
			parts = strings.Split(strings.TrimPrefix(dir, "/"), "/")
		}
		return v.Lookup(ctx, parts)
	}
	base := func(p string) string { return p[strings.LastIndex(p, "/")+1:] }
	remove := func(p string, recursive bool) error {
		d, errIn := lookupDir(p)
		if errIn != nil {
			return errIn
		}
		_, errIn = v.Remove(ctx, d, base(p), p, recursive)
		if errors.Is(errIn, cairn.ErrNotFound) {
			return nil
		}
		return errIn
	}
	switch keep {
	case KeepBoth:
	case KeepTheirs:
		switch {
		case c.Copy != "":
			err = remove(c.Copy, true)
		case c.Kind == ConflictEditDelete:
			err = remove(c.Path, false) // theirs: the removal
		}
	case KeepMine:
		switch {
		case c.Copy != "":
			var from, to *Entry
			if from, err = lookupDir(c.Copy); err == nil {
				if to, err = lookupDir(c.Path); err == nil {
					err = v.Rename(ctx, from, base(c.Copy), to, base(c.Path), c.Path)
				}
			}
		case c.Kind == ConflictDeleteEdit:
			err = remove(c.Path, false)
		case c.Kind == ConflictDeleteDir:
			err = remove(c.Path, true)
		case c.Kind == ConflictEditDelete:
			// Mine is the edit, which was kept.
		default:
			return c, cairn.E(op, cairn.Invalid, path, fmt.Errorf("a %s conflict has no side of this device's to keep: keep theirs or both", c.Kind))
		}
	default:
		return c, cairn.E(op, cairn.Invalid, path, fmt.Errorf("keep %q: mine, theirs or both", keep))
	}
	if err != nil {
		return c, err
	}
	return c, v.DropConflict(ctx, c.ID)
}
