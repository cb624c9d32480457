package fs

// Staged writes: the two halves of a write that a background upload queue
// splits in time and between processes. Stage stores a file's chunks and
// manifest in a spool store (on the writing device, never swept by a
// garbage collection) and commits nothing; later, maybe in another
// process, CommitStaged copies what the volume's own store lacks from the
// spool and commits, under the GC fence like any writer. See
// doc/format.md, "Upload queue".

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store"
)

// Stage stores the content open yields and its manifest in v's store and
// returns the version that would commit it (Stores not set: the version
// records where CommitStaged stores it). Nothing is committed and the GC
// generation is not read: the objects are safe only in a store no
// collection sweeps (a spool). The content is stored whole, never as
// deltas, so the spool holds every object the version names.
func (v *Volume) Stage(ctx context.Context, open func() (io.ReadCloser, error), a Attrs) (meta.Version, WriteStats, error) {
	r, err := open()
	if err != nil {
		return meta.Version{}, WriteStats{}, err
	}
	defer r.Close()
	refs, st, err := v.eng.Write(ctx, r)
	if err != nil {
		return meta.Version{}, st, err
	}
	mid, mst, err := v.putManifest(ctx, refs, st.LogicalBytes)
	if err != nil {
		return meta.Version{}, st, err
	}
	st.NewStoredBytes += mst
	return meta.Version{Manifest: mid, Size: st.LogicalBytes, Mtime: a.Mtime.UnixNano(), Chunks: len(refs),
		Src: a.Src, Digest: v.digest(refs, st.LogicalBytes)}, st, nil
}

// StagedFile is a version Stage stored, to be committed as file Name in
// directory Dir with the mode and owner of Attrs (Attrs.Lock is ignored).
type StagedFile struct {
	Dir     *meta.Entry
	Name    string
	Version meta.Version
	Attrs   Attrs
	// Check, if set, is called with the file's entry as read before the
	// commit (nil: absent); an error it returns is the file's result and
	// nothing is committed (the caller's rule for versions committed
	// since the file was staged).
	Check func(cur *meta.Entry) error
}

// StagedResult is what CommitStaged did for one StagedFile.
type StagedResult struct {
	Entry *meta.Entry
	// Already is set when the file already had the staged version (a
	// CommitStaged before a crash committed it): nothing was committed.
	Already bool
	Err     error
}

// CopyStats counts what CommitStaged copied into the volume's store.
type CopyStats struct {
	Objects int64 // objects the store lacked and was sent
	Bytes   int64 // their stored bytes
	Present int64 // objects the store held already
}

// stagedRounds bounds the fenced rounds of CommitStaged.
const stagedRounds = 20

// CommitStaged commits files staged in src (by Stage on a volume with the
// same key) as new versions stored in v's store, in rounds that follow
// the GC fence protocol: read the generation, ask v's store which of the
// versions' objects it lacks (manifests, chunks, delta bases) and copy
// those from src, flush a store that buffers and check that it holds every
// object, then commit each version with that generation. Nothing is
// committed before every object it names is stored. A commit that is
// fenced (a garbage collection ran during the round) is retried in the
// next round, its objects checked and copied again. A file whose current
// version already names the staged manifest (committed by an earlier
// attempt) is reported Already and not committed again. src is only read.
//
// Writer locks are not taken, but respected: a file whose writer lock
// someone holds (a mount writing it, a put) is not committed; its result
// is an error matching meta.ErrLocked (Kind Conflict), for the caller to
// try again later. Each commit is a compare-and-swap on the file's record,
// so a version committed since the file was staged is kept in the file's
// history (Check decides whether the staged one may follow it).
//
// progress, if not nil, is called with the bytes of each object copied.
// An error reading src or v's store fails every file not committed yet.
func (v *Volume) CommitStaged(ctx context.Context, src cairn.Store, files []StagedFile, progress func(bytes int64)) ([]StagedResult, CopyStats, error) {
	res := make([]StagedResult, len(files))
	var cs CopyStats
	// The objects each version names, read from the manifests in src.
	objs := make([][]cairn.ID, len(files))
	for i, f := range files {
		ids, err := stagedObjects(ctx, v, src, f.Version.Manifest)
		if err != nil {
			res[i].Err = cairn.E("commit staged", cairn.KindOf(err), v.Name()+":"+f.Name, err)
			continue
		}
		objs[i] = ids
	}
	pending := make([]int, 0, len(files))
	for i := range files {
		if res[i].Err == nil {
			pending = append(pending, i)
		}
	}
	for round := 0; len(pending) > 0; round++ {
		if round == stagedRounds {
			for _, i := range pending {
				res[i].Err = cairn.E("commit staged", cairn.Conflict, v.Name()+":"+files[i].Name,
					fmt.Errorf("fenced by garbage collections %d times", stagedRounds))
			}
			break
		}
		gen, err := v.writeGen(ctx)
		if err != nil {
			return res, cs, err
		}
		var ids []cairn.ID
		seen := map[cairn.ID]bool{}
		for _, i := range pending {
			for _, id := range objs[i] {
				if !seen[id] {
					seen[id] = true
					ids = append(ids, id)
				}
			}
		}
		if err := v.copyMissing(ctx, src, ids, &cs, progress); err != nil {
			return res, cs, err
		}
		var mu sync.Mutex
		var fenced []int
		var wg sync.WaitGroup
		sem := make(chan struct{}, commitConcurrency)
		for _, i := range pending {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				f := files[i]
				cur, err := v.Meta.Get(ctx, f.Dir.Ino, f.Name)
				if err != nil && !errors.Is(err, cairn.ErrNotFound) {
					res[i].Err = err
					return
				}
				if cur != nil && cur.Type == meta.TypeFile {
					for _, old := range cur.Versions {
						if old.Manifest == f.Version.Manifest {
							res[i].Entry, res[i].Already = cur, true
							return
						}
					}
				}
				if f.Check != nil {
					if err = f.Check(cur); err != nil {
						res[i].Err = err
						return
					}
				}
				ver := f.Version
				ver.Stores = []string{v.storeName}
				e, _, err := v.Meta.CommitVersion(ctx, f.Dir, f.Name, meta.Commit{Version: ver,
					Mode: f.Attrs.Mode, UID: f.Attrs.UID, GID: f.Attrs.GID, Gen: gen, Cur: meta.KnownEntry(cur), Unlocked: true})
				if errors.Is(err, meta.ErrFenced) {
					mu.Lock()
					fenced = append(fenced, i)
					mu.Unlock()
					return
				}
				res[i].Entry, res[i].Err = e, err
			})
		}
		wg.Wait()
		if len(fenced) > 0 {
			v.staleGen()
			v.log.Info("garbage collection ran during an upload; checking the objects again", "files", len(fenced))
		}
		pending = fenced
	}
	return res, cs, nil
}

// stagedObjects returns the objects the version whose manifest is mid
// names, reading the manifest from src.
func stagedObjects(ctx context.Context, v *Volume, src cairn.Store, mid cairn.ID) ([]cairn.ID, error) {
	stored, err := src.Get(ctx, mid)
	if err != nil {
		return nil, fmt.Errorf("staged manifest %s: %w", mid.Short(), err)
	}
	m, err := v.openManifest(stored, mid)
	if err != nil {
		return nil, fmt.Errorf("staged manifest %s: %w", mid.Short(), err)
	}
	ids := make([]cairn.ID, 0, 1+len(m.Chunks))
	ids = append(ids, mid)
	for _, r := range m.Chunks {
		ids = append(ids, r.ID)
		if r.Base != nil {
			ids = append(ids, r.Base.ID)
		}
	}
	return ids, nil
}

// copyConcurrency bounds the objects copyMissing has in flight.
const copyConcurrency = 64

// copyMissing makes v's store hold every object of ids, copying those it
// lacks from src (deferred, then one Flush over a store that buffers), and
// checks that it holds them all afterwards.
func (v *Volume) copyMissing(ctx context.Context, src cairn.Store, ids []cairn.ID, cs *CopyStats, progress func(int64)) error {
	const op = "upload"
	found, err := v.store.Has(ctx, ids)
	if err != nil {
		return err
	}
	if len(found) != len(ids) {
		return cairn.E(op, cairn.IO, v.Name(), fmt.Errorf("store answered %d of %d ids", len(found), len(ids)))
	}
	var missing []cairn.ID
	for i, ok := range found {
		if ok {
			cs.Present++
		} else {
			missing = append(missing, ids[i])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	dctx, cancel := context.WithCancel(store.WithDeferred(ctx))
	defer cancel()
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	sem := make(chan struct{}, copyConcurrency)
	for _, id := range missing {
		if dctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			data, gerr := src.Get(dctx, id)
			if gerr == nil {
				gerr = v.store.Put(dctx, id, data)
			}
			if gerr != nil {
				once.Do(func() { first = gerr; cancel() })
				return
			}
			atomic.AddInt64(&cs.Objects, 1)
			atomic.AddInt64(&cs.Bytes, int64(len(data)))
			if progress != nil {
				progress(int64(len(data)))
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = cairn.E(op, cairn.Canceled, v.Name(), ctx.Err())
	}
	if first != nil {
		return first
	}
	if d, ok := v.store.(store.Deferrer); ok && d.Defers() {
		v.flushMu.Lock()
		err = d.Flush(ctx)
		v.flushMu.Unlock()
		if err != nil {
			return fmt.Errorf("storing the data: %w", err)
		}
	}
	// A pack that failed is reported to one Flush only, maybe another's:
	// check that everything is there now.
	found, err = v.store.Has(ctx, missing)
	if err != nil {
		return err
	}
	for i, ok := range found {
		if !ok {
			v.eng.Forget()
			return cairn.E(op, cairn.Unavailable, v.Name(), fmt.Errorf("object %s not stored after its upload", missing[i].Short()))
		}
	}
	return nil
}
