package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store"
)

// RepairOptions for FsckRepair.
type RepairOptions struct {
	// Others are stores that may hold good copies of what is damaged here
	// (the realm's registered stores, other devices' stores). They are
	// only read, and what they return is checked against its ID.
	Others []NamedStore
	// Sources are local files or directories that may hold the original
	// data: every regular file under them is cut exactly as each damaged
	// volume cuts its files, and the chunks that are needed are written.
	// (A chunk stored as a delta, and a manifest, cannot be rebuilt from a
	// file: only from another store.)
	Sources []string
	// Progress, if set, is told how many versions each check has done.
	Progress func(done, total int)
}

// RepairReport is what FsckRepair found and did.
type RepairReport struct {
	// Found is the first check: every damaged or missing object.
	Found *FsckReport `json:"found"`
	// Needed counts the distinct objects versions name that were damaged
	// or missing.
	Needed int `json:"needed"`
	// FromStores and FromSources count the objects written afresh from
	// another store and from a source file.
	FromStores  int `json:"healed_from_stores"`
	FromSources int `json:"healed_from_sources"`
	// SourceFiles counts the source files read.
	SourceFiles int `json:"source_files_read"`
	// After is the check made after healing: its Damaged are the files
	// (and versions) that stay unreadable.
	After *FsckReport `json:"after"`
	// Errors are sources or stores that could not be read.
	Errors []string `json:"errors,omitempty"`
}

// OK reports whether every file reads after the repair.
func (r *RepairReport) OK() bool { return r.After != nil && r.After.OK() }

// FsckRepair checks every kept version reading all data (Fsck with
// readData), then heals what it found damaged or missing: a damaged copy
// the store still holds is deleted (a store that quarantines damage, the
// local store, has already dropped it: its Has never again answers
// "present" for it); a good copy is fetched from another store
// (opts.Others) or rebuilt by cutting the files under opts.Sources; each is
// written to st under its ID, which heals every version that names it.
// Then it checks everything again: After names what stays unreadable.
func FsckRepair(ctx context.Context, vols []*Volume, st cairn.Store, opts RepairOptions) (*RepairReport, error) {
	first, err := Fsck(ctx, vols, st, true, opts.Progress)
	if err != nil {
		return nil, err
	}
	rep := &RepairReport{Found: first}
	// need: per volume, the objects its versions name that are bad.
	need := map[*Volume]map[cairn.ID]bool{}
	all := map[cairn.ID]bool{}
	for _, d := range first.Damaged {
		id, perr := cairn.ParseID(d.Object)
		if perr != nil || d.vol == nil {
			continue
		}
		if need[d.vol] == nil {
			need[d.vol] = map[cairn.ID]bool{}
		}
		need[d.vol][id] = true
		all[id] = true
	}
	rep.Needed = len(all)
	healed := func(id cairn.ID) {
		delete(all, id)
		for _, ids := range need {
			delete(ids, id)
		}
	}
	// A damaged copy still in the store would make the Put below a no-op.
	for _, id := range sortedIDs(all) {
		_, gerr := st.Get(ctx, id)
		switch {
		case gerr == nil:
			healed(id) // good now (a passing read error, or healed meanwhile)
		case errors.Is(gerr, cairn.ErrCorrupt):
			if derr := st.Delete(ctx, id); derr != nil {
				return rep, derr
			}
		case errors.Is(gerr, cairn.ErrNotFound):
		default:
			if ctx.Err() != nil {
				return rep, store.CtxErr(ctx, "fsck", "")
			}
			rep.Errors = append(rep.Errors, fmt.Sprintf("reading %s here: %v", id.Short(), gerr))
		}
	}
	// Another store or device that has a good copy.
	for _, id := range sortedIDs(all) {
		for _, o := range opts.Others {
			data, gerr := o.Store.Get(ctx, id)
			if gerr != nil {
				if ctx.Err() != nil {
					return rep, store.CtxErr(ctx, "fsck", "")
				}
				continue
			}
			if cairn.ID(blake3.Sum256(data)) != id {
				continue
			}
			if perr := st.Put(ctx, id, data); perr != nil {
				return rep, perr
			}
			rep.FromStores++
			healed(id)
			break
		}
	}
	// The original files.
	if len(all) > 0 && len(opts.Sources) > 0 {
		for _, v := range vols {
			if len(need[v]) == 0 {
				continue
			}
			n, files, errs, herr := v.healFromSources(ctx, st, need[v], opts.Sources)
			rep.FromSources += n
			rep.SourceFiles += files
			rep.Errors = append(rep.Errors, errs...)
			if herr != nil {
				return rep, herr
			}
			for id := range all {
				if !need[v][id] && !neededElsewhere(need, v, id) {
					delete(all, id)
				}
			}
		}
	}
	if rep.FromStores+rep.FromSources == 0 && len(rep.Errors) == 0 {
		// Nothing changed: the first check stands (without the damaged
		// copies, which are quarantined now: a second read would say
		// "missing" where the first said "damaged").
		rep.After = first
		return rep, nil
	}
	after, err := Fsck(ctx, vols, st, true, opts.Progress)
	if err != nil {
		return rep, err
	}
	rep.After = after
	return rep, nil
}

// neededElsewhere reports whether a volume other than v still needs id.
func neededElsewhere(need map[*Volume]map[cairn.ID]bool, v *Volume, id cairn.ID) bool {
	for w, ids := range need {
		if w != v && ids[id] {
			return true
		}
	}
	return false
}

func sortedIDs(m map[cairn.ID]bool) []cairn.ID {
	out := make([]cairn.ID, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.SortFunc(out, func(a, b cairn.ID) int { return bytes.Compare(a[:], b[:]) })
	return out
}

// healFromSources cuts every regular file under sources as v cuts its
// files and writes to st the chunks in want (removing each from want once
// written). It stops early once want is empty. It returns how many chunks
// it wrote, how many files it read, and the files it could not read.
func (v *Volume) healFromSources(ctx context.Context, st cairn.Store, want map[cairn.ID]bool, sources []string) (healed, files int, errs []string, err error) {
	pick := &pickStore{Store: st, want: want}
	eng, err := v.eng.With(pick)
	if err != nil {
		return 0, 0, nil, err
	}
	defer eng.Close()
	errDone := errors.New("done")
	one := func(path string) error {
		f, oerr := os.Open(path)
		if oerr != nil {
			errs = append(errs, fmt.Sprintf("source %s: %v", path, oerr))
			return nil
		}
		defer f.Close()
		files++
		_, _, werr := eng.Write(ctx, f)
		switch {
		case werr == nil:
		case ctx.Err() != nil:
			return store.CtxErr(ctx, "fsck", path)
		case cairn.KindOf(werr) == cairn.IO:
			errs = append(errs, fmt.Sprintf("source %s: %v", path, werr))
		default:
			return werr
		}
		return nil
	}
	for _, src := range sources {
		err = filepath.WalkDir(src, func(path string, d iofs.DirEntry, derr error) error {
			if derr != nil {
				errs = append(errs, fmt.Sprintf("source %s: %v", path, derr))
				return nil
			}
			if !d.Type().IsRegular() {
				return nil
			}
			if pick.left() == 0 {
				return errDone
			}
			return one(path)
		})
		if err == errDone {
			err = nil
			break
		}
		if err != nil {
			break
		}
	}
	return pick.written(), files, errs, err
}

// pickStore is the store a repair engine writes to: it claims to hold
// every object but those in want, so the engine offers only those, and it
// passes those (once each) on to the real store.
type pickStore struct {
	cairn.Store
	mu   sync.Mutex
	want map[cairn.ID]bool
	n    int
}

func (p *pickStore) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	found := make([]bool, len(ids))
	for i, id := range ids {
		found[i] = !p.want[id]
	}
	return found, nil
}

func (p *pickStore) Put(ctx context.Context, id cairn.ID, data []byte) error {
	p.mu.Lock()
	wanted := p.want[id]
	p.mu.Unlock()
	if !wanted {
		return nil
	}
	if err := p.Store.Put(ctx, id, data); err != nil {
		return err
	}
	p.mu.Lock()
	if p.want[id] {
		delete(p.want, id)
		p.n++
	}
	p.mu.Unlock()
	return nil
}

func (p *pickStore) left() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.want)
}

func (p *pickStore) written() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Close does not close the real store.
func (p *pickStore) Close() error { return nil }
