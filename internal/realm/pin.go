package realm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/vpath"
)

// Pins (issue 18, "pinning"; doc/offline.md "Pins"): subtrees whose
// current data this device keeps, fetched ahead so they can be used
// offline. They are this device's own choice, so they are kept in its home
// (home/pins.json, doc/format.md "Pins, version 1"), not in the metadata
// service: pin, unpin and pin ls work offline too.

// PinsVersion is the version of the pins file's format.
const PinsVersion = 1

// pinsFile is the pins file's name in the home.
const pinsFile = "pins.json"

// Pin is one pinned subtree.
type Pin struct {
	// Path is the subtree, "VOLUME:/a/b" in canonical form (vpath).
	Path string `json:"path"`
	// VolumeID is the volume's ID when it was pinned: a volume made
	// again under the same name is not the one pinned.
	VolumeID string `json:"volume_id"`
	// Priority orders the fetching: higher first (default 0).
	Priority int `json:"priority"`
	// Added is when it was pinned (unix ns).
	Added int64 `json:"added"`
}

// PinsFile is the pins file's body.
type PinsFile struct {
	Version int   `json:"version"`
	Pins    []Pin `json:"pins"`
}

// DecodePins reads a pins file: a version it does not know, a malformed
// path or a path pinned twice is an error of Kind Corrupt.
func DecodePins(b []byte) (*PinsFile, error) {
	const op = "read pins"
	var f PinsFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, cairn.E(op, cairn.Corrupt, pinsFile, err)
	}
	if f.Version != PinsVersion {
		return nil, cairn.E(op, cairn.Corrupt, pinsFile, fmt.Errorf("version %d, want %d", f.Version, PinsVersion))
	}
	seen := map[string]bool{}
	for _, p := range f.Pins {
		vp, err := vpath.Parse(p.Path)
		if err != nil || vp.String() != p.Path {
			return nil, cairn.E(op, cairn.Corrupt, pinsFile, fmt.Errorf("path %q is not a canonical VOLUME:/path", p.Path))
		}
		if p.VolumeID == "" {
			return nil, cairn.E(op, cairn.Corrupt, pinsFile, fmt.Errorf("pin %s has no volume ID", p.Path))
		}
		if seen[p.Path] {
			return nil, cairn.E(op, cairn.Corrupt, pinsFile, fmt.Errorf("%s pinned twice", p.Path))
		}
		seen[p.Path] = true
	}
	return &f, nil
}

// LoadPins returns the pins of the device whose home is home (none if it
// has no pins file), highest priority first, then oldest first.
func LoadPins(home string) ([]Pin, error) {
	b, err := os.ReadFile(filepath.Join(home, pinsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cairn.E("read pins", cairn.IO, filepath.Join(home, pinsFile), err)
	}
	f, err := DecodePins(b)
	if err != nil {
		return nil, err
	}
	sortPins(f.Pins)
	return f.Pins, nil
}

func sortPins(ps []Pin) {
	slices.SortStableFunc(ps, func(a, b Pin) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.Added, b.Added), cmp.Compare(a.Path, b.Path))
	})
}

// editPins changes the pins file under an exclusive lock (home/pins.lock),
// so that two commands pinning at once both land.
func editPins(home string, edit func([]Pin) ([]Pin, error)) error {
	const op = "pin"
	lf, err := os.OpenFile(filepath.Join(home, "pins.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return cairn.E(op, cairn.IO, home, err)
	}
	defer lf.Close()
	if errIn := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); errIn != nil {
		return cairn.E(op, cairn.IO, home, errIn)
	}
	pins, err := LoadPins(home)
	if err != nil {
		return err
	}
	if pins, err = edit(pins); err != nil {
		return err
	}
	sortPins(pins)
	b, err := json.MarshalIndent(PinsFile{Version: PinsVersion, Pins: append([]Pin{}, pins...)}, "", "  ")
	if err != nil {
		return cairn.E(op, cairn.Invalid, home, err)
	}
	if err := durable.ReplaceFile(filepath.Join(home, pinsFile), append(b, '\n'), 0o600); err != nil {
		return cairn.E(op, cairn.IO, filepath.Join(home, pinsFile), err)
	}
	return nil
}

// Pin pins the subtree at p (a directory or a file) with priority *prio
// (nil: 0, or for a pin already there, its priority unchanged); a pin
// already there is updated (updated true). It needs the metadata service:
// the path must exist.
func (r *Realm) Pin(ctx context.Context, p vpath.Path, prio *int) (pin Pin, updated bool, err error) {
	mv, err := r.Meta.Open(ctx, p.Volume)
	if err != nil {
		return Pin{}, false, err
	}
	if _, errIn := mv.Lookup(ctx, p.Parts); errIn != nil {
		return Pin{}, false, errIn
	}
	pin = Pin{Path: p.String(), VolumeID: mv.V.ID, Added: time.Now().UnixNano()}
	if prio != nil {
		pin.Priority = *prio
	}
	err = editPins(r.Home, func(ps []Pin) ([]Pin, error) {
		for i := range ps {
			if ps[i].Path == pin.Path {
				updated = true
				ps[i].VolumeID = mv.V.ID
				if prio != nil {
					ps[i].Priority = *prio
				}
				pin = ps[i]
				return ps, nil
			}
		}
		return append(ps, pin), nil
	})
	return pin, updated, err
}

// Unpin removes the pin of p from the device whose home is home (Kind
// NotFound if there is none). It needs neither the realm nor the service.
// Its data stays in the pin store until the next pass of the keeper hands
// it to the chunk cache.
func Unpin(home string, p vpath.Path) error {
	return editPins(home, func(ps []Pin) ([]Pin, error) {
		i := slices.IndexFunc(ps, func(q Pin) bool { return q.Path == p.String() })
		if i < 0 {
			return nil, cairn.E("unpin", cairn.NotFound, p.String(), errors.New("not pinned"))
		}
		return slices.Delete(ps, i, i+1), nil
	})
}

// PinProgress is told, during SyncPins, how far it is.
type PinProgress struct {
	Files, FilesDone int
	Fetched          int64 // bytes copied into the pin store so far
}

// PinPass says what one SyncPins pass did.
type PinPass struct {
	Pins     int
	Files    int   // files pinned
	Fetched  int   // objects copied into the pin store
	Bytes    int64 // their bytes
	Released int   // objects no longer pinned, handed to the chunk cache
	Failed   []error
}

// pinMemo is what a keeper remembers between passes: the objects of each
// version's manifest it has read (by manifest ID), so that a pass over a
// subtree that did not change reads no manifest and asks only Has.
type pinMemo struct {
	objs map[cairn.ID][]fs.Object
}

func newPinMemo() *pinMemo { return &pinMemo{objs: map[cairn.ID][]fs.Object{}} }

// pinFile is one file of a pinned subtree.
type pinFile struct {
	path string
	ver  *meta.Version
}

// pinnedFiles returns the files of the subtree at parts, read with
// children (by the directory's inode), each inode once.
func pinnedFiles(ctx context.Context, top *meta.Entry, base string, children func(ino uint64) ([]meta.Entry, error)) ([]pinFile, error) {
	var out []pinFile
	seen := map[uint64]bool{}
	var walk func(e *meta.Entry, path string) error
	walk = func(e *meta.Entry, path string) error {
		switch e.Type {
		case meta.TypeFile:
			if ver := e.Current(); ver != nil && !seen[e.Ino] {
				seen[e.Ino] = true
				out = append(out, pinFile{path: path, ver: ver})
			}
		case meta.TypeDir:
			if err := ctx.Err(); err != nil {
				return store.CtxErr(ctx, "pin", path)
			}
			kids, err := children(e.Ino)
			if err != nil {
				return err
			}
			for i := range kids {
				if err := walk(&kids[i], path+"/"+kids[i].Name); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(top, base)
}

// SyncPins is one pass of keeping the pins: for each pinned volume, a
// whole listing at one revision, saved as its local copy of the namespace
// (so that a volume pinned but never mounted here is served offline);
// then, pins by priority, every file of the subtree whose current
// version's manifest and chunks are not on this device for good is
// fetched into the pin store (director.Hoard). When every pin was gone
// through, what the pin store holds that no pin wants any more is handed
// to the chunk cache. It is a plain idempotent sync: everything it does is
// derived again from the pins and the namespace at each pass, so a crash
// or a kill loses nothing but the pass (DESIGN decision 12's journal is
// for work accepted and not yet done; a pin is neither).
func (r *Realm) SyncPins(ctx context.Context, progress func(PinProgress)) (PinPass, error) {
	return r.syncPins(ctx, newPinMemo(), progress)
}

func (r *Realm) syncPins(ctx context.Context, memo *pinMemo, progress func(PinProgress)) (PinPass, error) {
	var pass PinPass
	pins, err := LoadPins(r.Home)
	if err != nil {
		return pass, err
	}
	pass.Pins = len(pins)
	vols := map[string]*pinVol{}
	defer func() {
		for _, vs := range vols {
			if vs.v != nil {
				vs.v.Close()
			}
		}
	}()
	var files [][]pinFile
	var volOf []*pinVol
	complete := true
	for _, p := range pins {
		vp, _ := vpath.Parse(p.Path) // DecodePins checked it
		vs := vols[p.VolumeID]
		if vs == nil {
			vs, err = r.pinVolume(ctx, vp.Volume, p.VolumeID)
			if err != nil {
				if errors.Is(err, cairn.ErrUnavailable) || ctx.Err() != nil {
					return pass, err
				}
				pass.Failed = append(pass.Failed, fmt.Errorf("%s: %w", p.Path, err))
				complete = false
				files, volOf = append(files, nil), append(volOf, nil)
				continue
			}
			vols[p.VolumeID] = vs
		}
		top := vs.root
		for _, name := range vp.Parts {
			i := slices.IndexFunc(vs.kids[top.Ino], func(e meta.Entry) bool { return e.Name == name })
			if i < 0 || top.Type != meta.TypeDir {
				top = nil
				break
			}
			top = &vs.kids[top.Ino][i]
		}
		if top == nil {
			pass.Failed = append(pass.Failed, cairn.E("pin", cairn.NotFound, p.Path, errors.New("the pinned path is gone")))
			files, volOf = append(files, nil), append(volOf, nil)
			continue
		}
		fl, errIn := pinnedFiles(ctx, top, vp.Slash(), func(ino uint64) ([]meta.Entry, error) { return vs.kids[ino], nil })
		if errIn != nil {
			return pass, errIn
		}
		files, volOf = append(files, fl), append(volOf, vs)
		pass.Files += len(fl)
	}
	want := map[cairn.ID]bool{}
	current := map[cairn.ID]bool{} // manifests of this pass: the memo keeps only those
	defer func() {
		for m := range memo.objs {
			if !current[m] {
				delete(memo.objs, m)
			}
		}
	}()
	prog := PinProgress{Files: pass.Files}
	for i, fl := range files {
		vs := volOf[i]
		for _, f := range fl {
			fctx := store.WithSources(ctx, f.ver.Stores)
			current[f.ver.Manifest] = true
			err = nil
			objs, ok := memo.objs[f.ver.Manifest]
			if !ok {
				objs, err = vs.v.Objects(fctx, f.ver, nil)
				if err == nil {
					memo.objs[f.ver.Manifest] = objs
				}
			}
			if err == nil {
				ids := make([]cairn.ID, len(objs))
				for j, o := range objs {
					ids[j], want[o.ID] = o.ID, true
				}
				var hs director.HoardStats
				hs, err = r.dir().Hoard(fctx, ids)
				pass.Fetched += hs.Fetched
				pass.Bytes += hs.FetchedBytes
				prog.Fetched += hs.FetchedBytes
			}
			if err != nil {
				if ctx.Err() != nil {
					return pass, store.CtxErr(ctx, "pin", pins[i].Path)
				}
				complete = false
				pass.Failed = append(pass.Failed, fmt.Errorf("%s:%s: %w", volOf[i].mv.V.Name, f.path, err))
			}
			prog.FilesDone++
			if progress != nil {
				progress(prog)
			}
		}
	}
	if complete {
		n, _, err := r.dir().Unhoard(ctx, func(id cairn.ID) bool { return want[id] })
		pass.Released = n
		if err != nil {
			return pass, err
		}
	}
	return pass, nil
}

// pinVol is a pinned volume during a pass: its namespace as listed, by
// directory inode, and the volume opened for reading manifests.
type pinVol struct {
	mv   *meta.Vol
	v    *fs.Volume
	kids map[uint64][]meta.Entry
	root *meta.Entry
}

// pinVolume lists a pinned volume whole at one revision, saves that as
// its local copy of the namespace (unless the copy there is as recent:
// a mount keeps it too) and opens it.
func (r *Realm) pinVolume(ctx context.Context, name, id string) (*pinVol, error) {
	mv, err := r.Meta.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	if mv.V.ID != id {
		return nil, cairn.E("pin", cairn.NotFound, name, fmt.Errorf("volume %s is not the one pinned (ID %s, pinned %s)", name, mv.V.ID, id))
	}
	ents, rev, err := mv.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	lc := meta.OpenLocalCopy(filepath.Join(LocalCopyDir(r.Home), mv.V.ID), mv.V, r.log)
	if lc.State().Rev < rev {
		lc.BeginReplace()
		lc.Replace(ents, rev)
		if errIn := lc.Save(ctx); errIn != nil {
			r.log.Warn("pins: saving the local copy of the namespace", "volume", name, "err", errIn)
		}
	}
	pv := &pinVol{mv: mv, kids: map[uint64][]meta.Entry{}}
	for i := range ents {
		e := &ents[i]
		if e.Parent == 0 && e.Name == "" {
			pv.root = e
			continue
		}
		pv.kids[e.Parent] = append(pv.kids[e.Parent], *e)
	}
	if pv.root == nil {
		return nil, cairn.E("pin", cairn.Corrupt, name, errors.New("the listing has no root"))
	}
	for ino := range pv.kids {
		slices.SortFunc(pv.kids[ino], func(a, b meta.Entry) int { return cmp.Compare(a.Name, b.Name) })
	}
	if pv.v, err = r.openVolume(ctx, name); err != nil {
		return nil, err
	}
	return pv, nil
}

// PinState is what pin ls says of one pin.
type PinState struct {
	Pin
	Files     int   // files in the subtree (with data)
	Bytes     int64 // their current versions' bytes
	HereBytes int64 // of which on this device for good (its store, the pin store)
	Missing   int   // files not wholly here
	// Err says why the subtree could not be gone through (the path is
	// gone, the volume cannot be opened, offline without a local copy).
	Err string
}

// PinStates says, for each pin, how much of its data is on this device.
// It reads only this device's data (never fetches), and works offline
// from the local copy of the namespace when the realm was opened offline.
func (r *Realm) PinStates(ctx context.Context) ([]PinState, error) {
	pins, err := LoadPins(r.Home)
	if err != nil {
		return nil, err
	}
	out := make([]PinState, len(pins))
	vols := map[string]*fs.Volume{}
	defer func() {
		for _, v := range vols {
			v.Close()
		}
	}()
	for i, p := range pins {
		out[i].Pin = p
		if err := r.pinState(ctx, &out[i], vols); err != nil {
			if ctx.Err() != nil {
				return nil, store.CtxErr(ctx, "pin ls", p.Path)
			}
			out[i].Err = err.Error()
		}
	}
	return out, nil
}

func (r *Realm) pinState(ctx context.Context, st *PinState, vols map[string]*fs.Volume) error {
	vp, _ := vpath.Parse(st.Path)
	v := vols[vp.Volume]
	if v == nil {
		var err error
		if v, err = r.openVolume(ctx, vp.Volume); err != nil {
			return err
		}
		vols[vp.Volume] = v
	}
	if v.Meta.V.ID != st.VolumeID {
		return fmt.Errorf("volume %s is not the one pinned (ID %s, pinned %s)", vp.Volume, v.Meta.V.ID, st.VolumeID)
	}
	top, err := v.Meta.Lookup(ctx, vp.Parts)
	if err != nil {
		return err
	}
	fl, err := pinnedFiles(ctx, top, vp.Slash(), func(ino uint64) ([]meta.Entry, error) { return v.Meta.ReadDir(ctx, ino) })
	if err != nil {
		return err
	}
	d := r.dir()
	for _, f := range fl {
		st.Files++
		st.Bytes += f.ver.Size
		objs, err := v.Objects(ctx, f.ver, d.GetHere)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			st.Missing++ // its manifest is not here
			continue
		}
		ids := make([]cairn.ID, len(objs))
		for i, o := range objs {
			ids[i] = o.ID
		}
		here, err := d.Here(ctx, ids)
		if err != nil {
			return err
		}
		if !slices.Contains(here, false) {
			st.HereBytes += f.ver.Size
			continue
		}
		st.Missing++
		for i, o := range objs {
			if here[i] {
				st.HereBytes += o.Size
			}
		}
	}
	return nil
}

// DefaultPinEvery is how often KeepPins goes through the pins with no
// change seen (the watch tells it of changes; this catches what a watch
// cannot, such as data that was unreachable at the last pass).
const DefaultPinEvery = time.Minute

// pinRetry is how soon a pass that did not finish is tried again.
const pinRetry = 5 * time.Second

// pinDebounce gathers the changes of a burst into one pass.
const pinDebounce = 300 * time.Millisecond

// KeepPins keeps this device's pins until ctx ends: a pass (SyncPins) at
// the start, soon after a pinned volume changes (a watch on each), when
// the pins file changes (cairn pin, cairn unpin), and every every (0:
// DefaultPinEvery). A pass that fails (offline: the service or the data's
// node cannot be reached) is logged and tried again within pinRetry.
// The device's node runs it (cairn node serve): it is the process a device
// keeps running whether or not a volume is mounted, and one keeper per
// device means one fetch of each object.
func (r *Realm) KeepPins(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultPinEvery
	}
	memo := newPinMemo()
	trigger := make(chan struct{}, 1)
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	watches := map[string]context.CancelFunc{}
	defer func() {
		for _, cancel := range watches {
			cancel()
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastMod time.Time
	var lastErr string
	due := time.Now()
	for {
		if fi, err := os.Stat(filepath.Join(r.Home, pinsFile)); err == nil && !fi.ModTime().Equal(lastMod) {
			lastMod, due = fi.ModTime(), time.Now()
		}
		if !time.Now().Before(due) {
			due = time.Now().Add(every)
			t0 := time.Now()
			pass, err := r.syncPins(ctx, memo, nil)
			if ctx.Err() != nil {
				return
			}
			msg := ""
			switch {
			case err != nil:
				msg = err.Error()
			case len(pass.Failed) > 0:
				msg = fmt.Sprintf("%d files not kept, first: %v", len(pass.Failed), pass.Failed[0])
			}
			if msg != "" && msg != lastErr {
				r.log.Warn("pins: pass incomplete; will try again", "err", msg)
			}
			if msg != "" {
				due = time.Now().Add(min(every, pinRetry))
			}
			lastErr = msg
			if pass.Fetched > 0 || pass.Released > 0 {
				r.log.Info("pins: kept", "pins", pass.Pins, "files", pass.Files, "fetched", pass.Fetched, "bytes", pass.Bytes, "released", pass.Released, "took", time.Since(t0))
			}
			r.watchPins(ctx, watches, poke)
		}
		select {
		case <-ctx.Done():
			return
		case <-trigger:
			due = time.Now().Add(pinDebounce)
		case <-tick.C:
		}
	}
}

// watchPins runs a watch on each pinned volume (and stops those of
// volumes no longer pinned); each change, and each new start of a watch
// (changes may have been missed meanwhile), calls poke.
func (r *Realm) watchPins(ctx context.Context, watches map[string]context.CancelFunc, poke func()) {
	pins, err := LoadPins(r.Home)
	if err != nil {
		return
	}
	want := map[string]bool{}
	for _, p := range pins {
		vp, _ := vpath.Parse(p.Path)
		want[vp.Volume] = true
		if watches[vp.Volume] != nil {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		watches[vp.Volume] = cancel
		go r.watchPinned(wctx, vp.Volume, poke)
	}
	for name, cancel := range watches {
		if !want[name] {
			cancel()
			delete(watches, name)
		}
	}
}

func (r *Realm) watchPinned(ctx context.Context, name string, poke func()) {
	for ctx.Err() == nil {
		var w *meta.EntryWatch
		mv, err := r.Meta.Open(ctx, name)
		if err == nil {
			w, err = mv.WatchEntries(ctx)
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			continue
		}
		poke()
		for {
			ev, err := w.Next()
			if err != nil {
				break
			}
			if len(ev.Changes) > 0 {
				poke()
			}
		}
		w.Close()
	}
}
