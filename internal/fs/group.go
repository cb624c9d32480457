package fs

// Batched commits: many small files written to a store that buffers
// (a cloud store's pack store) share its packs, because their objects are
// stored deferred and made durable by one Flush before any of them is
// committed; and over any store, a group's files are committed many per
// etcd transaction (meta.Vol.CommitVersions).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
)

// Defers reports whether this volume's store buffers writes (a
// store.Deferrer that defers): then PrepareFile followed by CommitGroup
// saves store requests over WriteFile (over any store, it saves metadata
// round trips).
func (v *Volume) Defers() bool {
	d, ok := v.store.(store.Deferrer)
	return ok && d.Defers()
}

// PendingWrite is a file write that PrepareFile stored, deferred, and
// CommitGroup commits. It holds the file's writer lock until then.
type PendingWrite struct {
	v    *Volume
	dir  *meta.Entry
	name string
	open func() (io.ReadCloser, error)
	a    Attrs
	lock *meta.Lock
	own  bool // the lock is PrepareFile's, released by CommitGroup or Abort
	w    prepared
	done bool
}

// Size is the logical size of the content stored.
func (p *PendingWrite) Size() int64 { return p.w.stats.LogicalBytes }

// Abort gives up a write that will not be committed: it releases the
// writer lock PrepareFile took. The objects stored stay until a garbage
// collection.
func (p *PendingWrite) Abort(ctx context.Context) {
	if p.done {
		return
	}
	p.done = true
	if p.own && p.lock != nil {
		p.lock.Unlock(ctx)
	}
}

// objects returns every object the version would name: its manifest, its
// chunks and the bases of its delta chunks (just the manifest when the
// content is unchanged and the current version's manifest is reused: it
// and its chunks were live at the generation read).
func (p *PendingWrite) objects() []cairn.ID {
	ids := make([]cairn.ID, 0, 1+len(p.w.refs))
	ids = append(ids, p.w.ver.Manifest)
	for _, r := range p.w.refs {
		ids = append(ids, r.ID)
		if r.Base != nil {
			ids = append(ids, r.Base.ID)
		}
	}
	return ids
}

// PrepareFile is the first half of WriteFile: it takes the writer lock (or
// uses a.Lock, or with a.Unlocked takes none), reads the GC generation and
// the current entry (unless a.Cur is known), and stores the content and its
// manifest, deferred (store.WithDeferred) over a store that buffers: then
// nothing may be durable yet. Nothing is committed: pass the result to
// CommitGroup, or Abort it. On error the lock PrepareFile took is released.
func (v *Volume) PrepareFile(ctx context.Context, dir *meta.Entry, name string, open func() (io.ReadCloser, error), a Attrs) (*PendingWrite, error) {
	p := &PendingWrite{v: v, dir: dir, name: name, open: open, a: a, lock: a.Lock}
	if p.lock == nil && !a.Unlocked {
		var err error
		if p.lock, err = v.Meta.Lock(ctx, dir.Ino, name); err != nil {
			return nil, err
		}
		p.own = true
	}
	pctx := ctx
	if v.Defers() {
		pctx = store.WithDeferred(ctx)
	}
	var err error
	p.w, err = v.prepare(pctx, dir, name, open, a)
	if err != nil {
		p.Abort(ctx)
		return nil, err
	}
	return p, nil
}

// GroupResult is what CommitGroup did for one PendingWrite.
type GroupResult struct {
	Entry *meta.Entry
	Stats WriteStats // of PrepareFile and of any write done again
	Err   error
}

// commitConcurrency bounds the commits CommitStaged sends at once, and
// redoConcurrency the writes CommitGroup makes again at once.
const (
	commitConcurrency = 64
	redoConcurrency   = 16
)

// CommitGroup commits writes PrepareFile made on this volume (each one
// once): first, over a store that buffers, one Flush of the store makes
// every object they stored durable; then the versions are committed, many
// per etcd transaction (meta.Vol.CommitVersions), each with the fence of
// its PrepareFile. Nothing is committed unless the Flush returned nil and
// the store then holds every object the version names: if the Flush fails,
// no write of the group is committed and each result carries the error. A
// write whose commit is fenced (a garbage collection ran since its
// PrepareFile), one of whose objects the store no longer holds (lost with a
// pack another Flush reported), or one prepared without a lock
// (Attrs.Unlocked) whose file another writer holds, is written again and
// committed as by WriteFile. Every writer lock PrepareFile took is released.
func (v *Volume) CommitGroup(ctx context.Context, ps []*PendingWrite) []GroupResult {
	res := make([]GroupResult, len(ps))
	for i, p := range ps {
		res[i].Stats = p.w.stats
	}
	defer func() {
		for _, p := range ps {
			p.Abort(ctx)
		}
	}()
	var err error
	var missing map[cairn.ID]bool
	if d, ok := v.store.(store.Deferrer); ok && d.Defers() {
		// One Flush at a time: a Flush seals the open pack, and the next
		// group's objects are joining it.
		v.flushMu.Lock()
		err = d.Flush(ctx)
		v.flushMu.Unlock()
		if err != nil {
			err = fmt.Errorf("storing the data: %w", err)
		}
		// Which objects does the store hold now? A pack that failed is
		// reported to one Flush only, perhaps another group's, while this
		// group's objects joined it (or skipped storing an object it
		// held). (A store that does not buffer stored each object before
		// PrepareFile returned, as for WriteFile.)
		if err == nil {
			missing, err = v.missing(ctx, ps)
		}
		if err != nil || len(missing) > 0 {
			// The engine may remember as stored an object that was
			// lost: writes must store everything again.
			v.eng.Forget()
		}
	}
	if err != nil {
		for i, p := range ps {
			res[i].Err = cairn.E("write", cairn.KindOf(err), v.Name()+":"+p.name, err)
		}
		return res
	}
	var redo, batched []int
	var cs []meta.BatchCommit
	for i, p := range ps {
		if p.names(missing) {
			v.log.Info("an object of a prepared write is not stored; writing again", "path", v.Name()+":"+p.name)
			redo = append(redo, i)
			continue
		}
		batched = append(batched, i)
		cs = append(cs, meta.BatchCommit{Parent: p.dir, Name: p.name, Commit: v.offload(p.w.commit(p.a, p.lock))})
	}
	for n, r := range v.Meta.CommitVersions(ctx, cs) {
		i := batched[n]
		p := ps[i]
		switch {
		case errors.Is(r.Err, meta.ErrFenced):
			v.staleGen()
			v.log.Info("garbage collection ran during write; writing again", "path", v.Name()+":"+p.name)
			redo = append(redo, i)
		case errors.Is(r.Err, meta.ErrLocked) && p.lock == nil:
			redo = append(redo, i) // under the lock, once the other writer is done
		default:
			res[i].Entry, res[i].Err = r.Entry, r.Err
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, redoConcurrency)
	for _, i := range redo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res[i] = ps[i].redo(ctx, res[i])
		})
	}
	wg.Wait()
	return res
}

// missing returns the objects that the writes of ps name and the store
// does not hold.
func (v *Volume) missing(ctx context.Context, ps []*PendingWrite) (map[cairn.ID]bool, error) {
	var ids []cairn.ID
	seen := map[cairn.ID]bool{}
	for _, p := range ps {
		for _, id := range p.objects() {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	found, err := v.store.Has(ctx, ids)
	if err != nil {
		return nil, err
	}
	if len(found) != len(ids) {
		return nil, fmt.Errorf("store answered %d of %d ids", len(found), len(ids))
	}
	var missing map[cairn.ID]bool
	for i, ok := range found {
		if !ok {
			if missing == nil {
				missing = map[cairn.ID]bool{}
			}
			missing[ids[i]] = true
		}
	}
	return missing, nil
}

// names reports whether p's version names one of the objects in missing.
func (p *PendingWrite) names(missing map[cairn.ID]bool) bool {
	if len(missing) == 0 {
		return false
	}
	for _, id := range p.objects() {
		if missing[id] {
			return true
		}
	}
	return false
}

// redo writes p again and commits it as WriteFile does, under p's lock if
// it holds one (else WriteFile takes its own, waiting for another writer).
func (p *PendingWrite) redo(ctx context.Context, r GroupResult) GroupResult {
	a := p.a
	a.Lock = p.lock
	a.Cur, a.Listed = nil, false
	e, st, err := p.v.WriteFile(ctx, p.dir, p.name, p.open, a)
	r.Entry, r.Err, r.Stats = e, err, addStats(r.Stats, st)
	return r
}
