package realm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
)

// Moves (doc/director.md, "Moves"; ZZFS §3.4): 'cairn move VOLUME:/PATH
// --to X' relocates the data of the files under PATH to X (a node or a
// registered store) without blocking them. A move is offload and reclaim
// run the other way round: every kept version under PATH that is held
// elsewhere gets an offload entry whose home is X and whose "now" is where
// the version is, marked with the move's path; reclaim (the home's node
// daemon, the source's, or 'cairn move --wait' / 'cairn offload reclaim')
// copies what X lacks, records the version there and deletes the old copy.
// Then the policy copies:1@X on PATH sends new versions to X. While
// entries of the move remain, writes of files under PATH are offloaded
// (director.ForMove): X lacks most of their chunks until the copy is done.

// MoveReport is what Move recorded.
type MoveReport struct {
	Vol    string `json:"volume"`
	Path   string `json:"path"`
	To     string `json:"to"`
	Policy string `json:"policy"` // set on Path: where new versions go
	Files  int    `json:"files"`  // files with at least one version to move
	// Versions and Bytes: the versions recorded to move and their size.
	Versions int   `json:"versions"`
	Bytes    int64 `json:"bytes"`
	// There: versions already held by To.
	There int `json:"there"`
	// Skipped: versions left where they are, and why ("copies:2@a,b: a
	// replicated version is moved by 'cairn policy set' and 'cairn
	// repair'").
	Skipped []string `json:"skipped,omitempty"`
}

// MoveOptions select what Move does.
type MoveOptions struct {
	// Progress, if set, is told what Move does, one line at a time.
	Progress func(line string)
	// Settle is how long Move waits, after setting the policy, before
	// it looks again for versions written meanwhile (writers read
	// policies and moves at most placementTTL old). 0: placementTTL plus
	// a second; negative: no second look.
	Settle time.Duration
}

// Move records the move of the data under vol:path to `to` (see above)
// and returns once it is recorded: the copy runs in the background. It is
// idempotent: a move run again (interrupted, or with new versions since)
// records what is still elsewhere.
func (r *Realm) Move(ctx context.Context, vol, path, to string, o MoveOptions) (*MoveReport, error) {
	const op = "move"
	tell := func(format string, args ...any) {
		if o.Progress != nil {
			o.Progress(fmt.Sprintf(format, args...))
		}
	}
	if !meta.CleanPath(path) {
		return nil, cairn.E(op, cairn.Invalid, vol+":"+path, errors.New("the path is absolute, without a trailing '/' or an empty, '.' or '..' segment"))
	}
	if meta.IsPolicyName(to) {
		return nil, cairn.E(op, cairn.Invalid, to, errors.New("a move goes to one node or store; to spread files over several, 'cairn policy set' a copies or ec policy"))
	}
	// A node (not removed, not a surrogate) or a registered store not
	// being removed, as for a policy.
	pol := meta.PolicyCopies + ":1@" + to
	if _, err := r.CheckPolicy(ctx, pol); err != nil {
		return nil, err
	}
	v, err := r.Volume(ctx, vol)
	if err != nil {
		return nil, err
	}
	rep := &MoveReport{Vol: vol, Path: path, To: to, Policy: pol}
	seen := map[uint64]bool{}
	seenVer := map[verKey]bool{}
	record := func() error {
		// A version with an entry for `to` already (an earlier run, the
		// first look, or written meanwhile and offloaded for it) keeps it.
		have, err := r.Meta.Offloads(ctx)
		if err != nil {
			return err
		}
		for _, o := range have {
			if o.VolID == v.Meta.V.ID && o.Home == to {
				seenVer[verKey{o.Ino, o.N}] = true
			}
		}
		list, err := r.moveEntries(ctx, v, path, to, rep, seen, seenVer)
		if err != nil {
			return err
		}
		if len(list) > 0 {
			if err := r.Meta.PutOffloads(ctx, list); err != nil {
				return err
			}
		}
		return nil
	}
	// The entries first: from then on writers offload (director.ForMove),
	// and never write a whole file to `to` before it holds it.
	if err := record(); err != nil {
		return nil, err
	}
	tell("recorded %d versions of %d files (%s) to move to %s", rep.Versions, rep.Files, apitypes.IBytes(rep.Bytes), to)
	if _, err := r.SetPolicy(ctx, vol, path, pol); err != nil {
		return nil, err
	}
	tell("new versions under %s:%s go to %s (policy %s)", vol, path, to, pol)
	// A writer that read the policies before the entries existed writes
	// by the old policy for at most placementTTL: look again then.
	settle := o.Settle
	if settle == 0 {
		settle = placementTTL + time.Second
	}
	if settle > 0 {
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(settle):
		}
		before := rep.Versions
		if err := record(); err != nil {
			return nil, err
		}
		if n := rep.Versions - before; n > 0 {
			tell("recorded %d versions written meanwhile", n)
		}
	}
	return rep, nil
}

// moveEntries lists the offload entries that move the kept versions of
// the files under path in volume v to `to`, adding to rep. A version held
// by `to` needs none; one under a copies or ec policy (or naming several
// stores) is skipped, with why. seen: the files counted already;
// recorded: the versions dealt with already (an entry for `to`, held
// there, skipped): none is made or counted again.
func (r *Realm) moveEntries(ctx context.Context, v *fs.Volume, path, to string, rep *MoveReport, seen map[uint64]bool, recorded map[verKey]bool) ([]*meta.Offload, error) {
	prefix := v.Name() + ":" + path
	now := time.Now().UnixNano()
	var out []*meta.Offload
	err := v.Walk(ctx, func(p string, e *meta.Entry, trashed bool) error {
		if trashed || e.Type != meta.TypeFile || (p != prefix && !strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/")) {
			return nil
		}
		for _, ver := range e.Versions {
			switch {
			case recorded[verKey{e.Ino, ver.N}]:
				continue
			case slices.Contains(ver.Stores, to):
				recorded[verKey{e.Ino, ver.N}] = true
				rep.There++
				continue
			case len(ver.Stores) != 1 || meta.IsPolicyName(ver.Stores[0]) || ver.Stores[0] == meta.PolicyLocal:
				recorded[verKey{e.Ino, ver.N}] = true
				rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s v%d on %s: only a version held by one node or store is moved in this build", p, ver.N, strings.Join(ver.Stores, ",")))
				continue
			}
			out = append(out, &meta.Offload{Vol: v.Name(), VolID: v.Meta.V.ID, Ino: e.Ino, Parent: e.Parent, Name: e.Name, N: ver.N,
				Manifest: ver.Manifest, Chunks: ver.Chunks, Bytes: ver.Size, Home: to, Now: ver.Stores[0], Since: now, Move: path})
			recorded[verKey{e.Ino, ver.N}] = true
			rep.Versions++
			rep.Bytes += ver.Size
			if !seen[e.Ino] {
				seen[e.Ino] = true
				rep.Files++
			}
		}
		return nil
	})
	return out, err
}

// verKey is a version of an inode.
type verKey struct{ ino, n uint64 }

// MoveStatus is one move in progress: what of it waits for reclaim.
type MoveStatus struct {
	Vol      string    `json:"volume"`
	Path     string    `json:"path"`
	To       string    `json:"to"`
	Versions int       `json:"versions"` // versions still to copy
	Bytes    int64     `json:"bytes"`
	From     []string  `json:"from"` // where they are now
	Since    time.Time `json:"since"`
}

// Moves lists the moves in progress (their offload entries), oldest
// first.
func (r *Realm) Moves(ctx context.Context) ([]MoveStatus, error) {
	list, err := r.Meta.Offloads(ctx)
	if err != nil {
		return nil, err
	}
	return movesOf(list), nil
}

func movesOf(list []*meta.Offload) []MoveStatus {
	var out []MoveStatus
	at := map[string]int{}
	for _, o := range list {
		if o.Move == "" {
			continue
		}
		k := o.VolID + "\x00" + o.Move + "\x00" + o.Home
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, MoveStatus{Vol: o.Vol, Path: o.Move, To: o.Home, Since: time.Unix(0, o.Since).UTC()})
		}
		m := &out[i]
		m.Versions++
		m.Bytes += o.Bytes
		if !slices.Contains(m.From, o.Now) {
			m.From = append(m.From, o.Now)
		}
	}
	return out
}

// MovingTo returns, among moves (of volume volID), the node or store the
// file at path is being moved to, or "".
func MovingTo(moves []MoveStatus, path string) string {
	best, to := -1, ""
	for _, m := range moves {
		if m.Path != "/" && path != m.Path && !strings.HasPrefix(path, m.Path+"/") {
			continue
		}
		if len(m.Path) > best {
			best, to = len(m.Path), m.To
		}
	}
	return to
}

// volumeMoves returns the moves in progress in volume name.
func (r *Realm) volumeMoves(ctx context.Context, name string) ([]MoveStatus, error) {
	v, err := r.Volume(ctx, name)
	if err != nil {
		return nil, err
	}
	list, err := r.Meta.Offloads(ctx)
	if err != nil {
		return nil, err
	}
	var mine []*meta.Offload
	for _, o := range list {
		if o.VolID == v.Meta.V.ID {
			mine = append(mine, o)
		}
	}
	return movesOf(mine), nil
}

// MoveVolume returns volume name opened to write files being moved to
// `to` (director.ForMove): offloaded, each commit recording an offload
// entry naming `to`.
func (r *Realm) MoveVolume(ctx context.Context, name, to string) (*fs.Volume, error) {
	w, err := r.dir().ForMove(ctx, to)
	if err != nil {
		return nil, err
	}
	return r.writeVolume(ctx, name, w)
}

// WriteVolumeFor returns the volume a file at path of volume name is to
// be written through, given the policies set there (recs) and the moves in
// progress (moves): a move's (MoveVolume), a policy's (PolicyVolume), or
// nil for the volume itself.
func (r *Realm) WriteVolumeFor(ctx context.Context, name string, recs []meta.PolicyRecord, moves []MoveStatus, path string) (*fs.Volume, error) {
	if to := MovingTo(moves, path); to != "" {
		v, err := r.MoveVolume(ctx, name, to)
		if err != nil {
			return nil, fmt.Errorf("moving %s:%s to %s: %w", name, path, to, err)
		}
		return v, nil
	}
	rec := meta.PolicyFor(recs, path)
	if rec == nil || rec.Policy == meta.PolicyLocal {
		return nil, nil
	}
	v, err := r.PolicyVolume(ctx, name, rec.Policy)
	if err != nil {
		return nil, fmt.Errorf("policy %s of %s:%s: %w", rec.Policy, name, rec.Path, err)
	}
	return v, nil
}

// VolumeMoves is volumeMoves, for writers (put) that choose per file.
func (r *Realm) VolumeMoves(ctx context.Context, name string) ([]MoveStatus, error) {
	return r.volumeMoves(ctx, name)
}
