package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/store"
)

// Walk visits every entry reachable from the root and from the trash, depth
// first, with its "VOLUME:/path" (trash items get their old path). Subtrees
// orphaned by an interrupted trash purge are not visited: nothing can reach
// them any more.
func (v *Volume) Walk(ctx context.Context, fn func(path string, e *meta.Entry, trashed bool) error) error {
	root, err := v.Meta.Root(ctx)
	if err != nil {
		return err
	}
	if err = v.walk(ctx, v.Name()+":", root, false, fn); err != nil {
		return err
	}
	items, err := v.Meta.Trash(ctx)
	if err != nil {
		return err
	}
	for i := range items {
		if err := v.walk(ctx, items[i].Path, &items[i].Entry, true, fn); err != nil {
			return err
		}
	}
	return nil
}

func (v *Volume) walk(ctx context.Context, path string, e *meta.Entry, trashed bool, fn func(string, *meta.Entry, bool) error) error {
	if path == "" || path[len(path)-1] == ':' {
		path += "/"
	}
	if err := fn(path, e, trashed); err != nil {
		if errors.Is(err, errSkipSubtree) {
			return nil
		}
		return err
	}
	if !e.IsDir() {
		return nil
	}
	kids, err := v.Meta.ReadDir(ctx, e.Ino)
	if err != nil {
		return err
	}
	sep := "/"
	if path[len(path)-1] == '/' {
		sep = ""
	}
	for i := range kids {
		if err := v.walk(ctx, path+sep+kids[i].Name, &kids[i], trashed, fn); err != nil {
			return err
		}
	}
	return nil
}

// idSet is a sorted set of IDs: 32 bytes each, no per-entry overhead.
type idSet []cairn.ID

func (s *idSet) finish() {
	slices.SortFunc(*s, func(a, b cairn.ID) int { return bytes.Compare(a[:], b[:]) })
	*s = slices.Compact(*s)
}

func (s idSet) has(id cairn.ID) bool {
	_, ok := slices.BinarySearchFunc(s, id, func(a, b cairn.ID) int { return bytes.Compare(a[:], b[:]) })
	return ok
}

// versionRef is one version of one file, for the jobs below.
type versionRef struct {
	vol  *Volume
	path string
	ver  meta.Version
}

// versions lists every kept version of every file, in the volumes and their
// trash, skipping trash items older than their volume's TTL when skipExpired.
func versions(ctx context.Context, vols []*Volume, now time.Time, skipExpired bool) ([]versionRef, error) {
	var out []versionRef
	for _, v := range vols {
		ttl := v.Meta.V.TrashTTL
		items, err := v.Meta.Trash(ctx)
		if err != nil {
			return nil, err
		}
		expired := map[uint64]bool{}
		for _, it := range items {
			if skipExpired && ttl > 0 && now.Sub(time.Unix(0, it.Deleted)) > ttl {
				expired[it.Entry.Ino] = true
			}
		}
		linked := map[uint64]bool{} // inodes with several names: one record counts
		err = v.Walk(ctx, func(path string, e *meta.Entry, trashed bool) error {
			if trashed && expired[e.Ino] {
				return errSkipSubtree
			}
			if e.Nlink() > 1 {
				if linked[e.Ino] {
					return nil
				}
				linked[e.Ino] = true
			}
			for _, ver := range e.Versions {
				out = append(out, versionRef{vol: v, path: path, ver: ver})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// errSkipSubtree, returned by a Walk callback, skips the entry's children.
var errSkipSubtree = errors.New("skip subtree")

// GCOptions for GC.
type GCOptions struct {
	DryRun bool
	Now    time.Time // default time.Now()
	// Progress, if set, is told how many versions were marked so far.
	Progress func(done, total int)
	// Others are more stores to sweep with the same mark (the realm's
	// registered stores: cloud buckets, directories), after st.
	Others []NamedStore
	// Keep are objects no version references that gc must not delete
	// (the realm's marker in each store).
	Keep []cairn.ID
	// Check, if set, runs once the fence is held: the caller confirms
	// that what it decided before (which stores to sweep) still holds,
	// or returns an error and nothing is deleted.
	Check func(context.Context) error
}

// sameVolumes fails if the realm has a volume vols lacks.
func sameVolumes(ctx context.Context, svc *meta.Service, vols []*Volume) error {
	all, err := svc.Volumes(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, v := range vols {
		have[v.Meta.V.ID] = true
	}
	for _, mv := range all {
		if !have[mv.ID] {
			return cairn.E("gc", cairn.Conflict, mv.Name, errors.New("a volume was created as gc started; nothing was deleted: run gc again"))
		}
	}
	return nil
}

// NamedStore is a store with the name versions know it by.
type NamedStore struct {
	Name  string
	Store cairn.Store
}

// StoreGC is what a collection did in one of GCOptions.Others.
type StoreGC struct {
	Name           string `json:"name"`
	DeletedObjects int    `json:"deleted_objects"`
	FreedBytes     int64  `json:"freed_bytes"`
	CompactedBytes int64  `json:"compacted_bytes"`
	Error          string `json:"error,omitempty"`
}

// GCReport is what a collection did (or, dry, would do).
type GCReport struct {
	TrashPurged    int   `json:"trash_purged"`
	Versions       int   `json:"versions_kept"`
	LiveObjects    int   `json:"live_objects"`
	DeletedObjects int   `json:"deleted_objects"`
	FreedBytes     int64 `json:"freed_bytes"`
	CompactedBytes int64 `json:"compacted_bytes"`
	DryRun         bool  `json:"dry_run"`
	// Stores: the sweep of each of GCOptions.Others.
	Stores []StoreGC `json:"stores,omitempty"`
}

// GC purges expired trash, then deletes every object in st that no kept
// version or trash item references. It holds the GC fence so no writer
// commits objects it is deleting, and it stops at the first manifest it
// cannot read: it never deletes on incomplete knowledge.
func GC(ctx context.Context, svc *meta.Service, vols []*Volume, st cairn.Store, opts GCOptions) (*GCReport, error) {
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	rep := &GCReport{DryRun: opts.DryRun}
	var fence *meta.Fence
	if !opts.DryRun {
		f, err := svc.BeginGC(ctx)
		if err != nil {
			return nil, err
		}
		fence = f
		defer fence.End(ctx)
		// The volumes were listed before the fence was taken: one made in
		// between, with files committed to it, would be missing from the
		// mark, and its objects deleted. Refuse then (run again).
		if err := sameVolumes(ctx, svc, vols); err != nil {
			return rep, err
		}
		if opts.Check != nil {
			if err := opts.Check(ctx); err != nil {
				return rep, err
			}
		}
		for _, v := range vols {
			if v.Meta.V.TrashTTL <= 0 {
				continue
			}
			n, err := v.Meta.PurgeTrash(ctx, opts.Now.Add(-v.Meta.V.TrashTTL))
			rep.TrashPurged += n
			if err != nil {
				return rep, err
			}
		}
	}
	vers, err := versions(ctx, vols, opts.Now, true)
	if err != nil {
		return rep, err
	}
	rep.Versions = len(vers)
	live, err := mark(ctx, vers, opts.Progress)
	if err != nil {
		return rep, fmt.Errorf("gc stopped, nothing deleted: %w", err)
	}
	rep.LiveObjects = len(live)
	if len(opts.Keep) > 0 {
		live = append(live, opts.Keep...)
		live.finish()
	}
	one, err := sweep(ctx, st, live, fence, opts.DryRun)
	rep.DeletedObjects, rep.FreedBytes, rep.CompactedBytes = one.DeletedObjects, one.FreedBytes, one.CompactedBytes
	if err != nil {
		return rep, err
	}
	for _, o := range opts.Others {
		sg, err := sweep(ctx, o.Store, live, fence, opts.DryRun)
		sg.Name = o.Name
		if err != nil {
			if fence != nil {
				if ferr := fence.Alive(ctx); ferr != nil {
					return rep, ferr // the fence is gone: stop at once
				}
			}
			sg.Error = err.Error() // one unreachable store does not stop the others
		}
		rep.Stores = append(rep.Stores, sg)
		rep.DeletedObjects += sg.DeletedObjects
		rep.FreedBytes += sg.FreedBytes
		rep.CompactedBytes += sg.CompactedBytes
	}
	return rep, nil
}

// sweep deletes from st every object live lacks (checking the fence every
// 256 deletes), makes the deletes durable where the store buffers them
// (a pack store's tombstones: before the fence is released), and compacts
// what the store can.
func sweep(ctx context.Context, st cairn.Store, live idSet, fence *meta.Fence, dry bool) (StoreGC, error) {
	var sg StoreGC
	var dead []cairn.ID
	var deadBytes []int64
	err := st.List(ctx, func(id cairn.ID, size int64) error {
		if !live.has(id) {
			dead = append(dead, id)
			deadBytes = append(deadBytes, size)
		}
		return nil
	})
	if err != nil {
		return sg, err
	}
	flush := func() error { // deletes a store buffers land before the fence ends
		if f, ok := st.(interface{ Flush(context.Context) error }); ok && len(dead) > 0 {
			return f.Flush(context.WithoutCancel(ctx)) // also when ctx ended the sweep
		}
		return nil
	}
	for i := range dead {
		if !dry {
			if i%256 == 0 {
				if err := fence.Alive(ctx); err != nil {
					flush()
					return sg, err
				}
			}
			if err := st.Delete(ctx, dead[i]); err != nil {
				flush()
				return sg, err
			}
		}
		sg.DeletedObjects++
		sg.FreedBytes += deadBytes[i]
	}
	if dry {
		return sg, nil
	}
	if err := flush(); err != nil {
		return sg, err
	}
	if c, ok := st.(store.Compacter); ok {
		freed, err := c.Compact(ctx)
		sg.CompactedBytes = freed
		if err != nil {
			return sg, err
		}
	}
	return sg, nil
}

// mark returns the set of every manifest and chunk the versions reference.
func mark(ctx context.Context, vers []versionRef, progress func(int, int)) (idSet, error) {
	var mu sync.Mutex
	var live idSet
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2 * runtime.GOMAXPROCS(0))
	done := 0
	for i := range vers {
		vr := &vers[i]
		g.Go(func() error {
			m, err := vr.vol.Manifest(gctx, &vr.ver)
			if err != nil {
				return fmt.Errorf("%s (version %d): %w", vr.path, vr.ver.N, err)
			}
			mu.Lock()
			defer mu.Unlock()
			live = append(live, vr.ver.Manifest)
			for _, r := range m.Chunks {
				live = append(live, r.ID)
				if r.Base != nil { // a delta's base lives as long as the delta
					live = append(live, r.Base.ID)
				}
			}
			done++
			if progress != nil {
				progress(done, len(vers))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	live.finish()
	return live, nil
}

// Damage is one problem fsck found.
type Damage struct {
	Path    string `json:"path"`
	Version uint64 `json:"version,omitempty"`
	Object  string `json:"object,omitempty"`
	Problem string `json:"problem"`

	vol *Volume // the volume of Path (for FsckRepair)
}

// FsckReport is the result of Fsck.
type FsckReport struct {
	Files    int `json:"files"`
	Versions int `json:"versions"`
	// Chunks counts the distinct chunks (delta bases included) the
	// versions checked here reference, as Stats.Chunks counts those of
	// every version: the two differ only by the versions in Elsewhere.
	Chunks      int      `json:"chunks_checked"`
	BytesRead   int64    `json:"bytes_read"`
	Damaged     []Damage `json:"damaged"`
	StoreErrors []Damage `json:"store_errors,omitempty"`
	// Elsewhere counts versions whose data another node holds: not
	// checked here (run fsck on that node).
	Elsewhere int `json:"elsewhere,omitempty"`
}

// OK reports whether fsck found nothing wrong.
func (r *FsckReport) OK() bool { return len(r.Damaged) == 0 && len(r.StoreErrors) == 0 }

// storedHere reports whether ver's data is in the volume's store: its
// metadata names that store, or no store, or "local" (versions written
// before devices had node names).
func (v *Volume) storedHere(ver *meta.Version) bool {
	if len(ver.Stores) == 0 {
		return true
	}
	for _, s := range ver.Stores {
		if s == v.storeName || s == "local" {
			return true
		}
	}
	return false
}

// Fsck checks every kept version of every file whose data is in st (see
// storedHere; the others are counted in Elsewhere): its manifest opens and
// matches the metadata, and every chunk it lists is present. With readData
// it also reads every chunk and verifies its hash and AEAD tag, and asks the
// store to verify every object it holds.
func Fsck(ctx context.Context, vols []*Volume, st cairn.Store, readData bool, progress func(done, total int)) (*FsckReport, error) {
	rep := &FsckReport{Damaged: []Damage{}}
	vers, err := versions(ctx, vols, time.Now(), false)
	if err != nil {
		return nil, err
	}
	files := map[string]bool{}
	for _, vr := range vers {
		files[vr.path] = true
	}
	rep.Files, rep.Versions = len(files), len(vers)
	// Versions whose data another node holds are that node's to check.
	here := vers[:0:0]
	for _, vr := range vers {
		if vr.vol.storedHere(&vr.ver) {
			here = append(here, vr)
		} else {
			rep.Elsewhere++
		}
	}
	vers = here
	var mu sync.Mutex
	damage := func(d Damage) {
		mu.Lock()
		rep.Damaged = append(rep.Damaged, d)
		mu.Unlock()
	}
	seen := sync.Map{}                 // chunk ID → error string ("" = good), so shared chunks are read once
	counted := map[cairn.ID]struct{}{} // the distinct chunks checked (under mu)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2 * runtime.GOMAXPROCS(0))
	var done int
	for i := range vers {
		vr := &vers[i]
		g.Go(func() error {
			defer func() {
				mu.Lock()
				done++
				if progress != nil {
					progress(done, len(vers))
				}
				mu.Unlock()
			}()
			// The manifest must be in this store itself: the volume's
			// store would also find a copy in the chunk cache or on
			// another node.
			if found, err := st.Has(gctx, []cairn.ID{vr.ver.Manifest}); err != nil {
				return err
			} else if !found[0] {
				damage(Damage{vol: vr.vol, Path: vr.path, Version: vr.ver.N, Object: vr.ver.Manifest.String(), Problem: "manifest missing from this store"})
				return nil
			}
			m, err := vr.vol.Manifest(gctx, &vr.ver)
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				damage(Damage{vol: vr.vol, Path: vr.path, Version: vr.ver.N, Object: vr.ver.Manifest.String(), Problem: err.Error()})
				return nil
			}
			problems, nbytes, err := checkChunks(gctx, vr.vol, st, m.Chunks, readData, &seen)
			if err != nil {
				return err
			}
			mu.Lock()
			for _, r := range m.Chunks {
				counted[r.ID] = struct{}{}
				if r.Base != nil {
					counted[r.Base.ID] = struct{}{}
				}
			}
			rep.BytesRead += nbytes
			mu.Unlock()
			for _, p := range problems {
				damage(Damage{vol: vr.vol, Path: vr.path, Version: vr.ver.N, Object: p.Object, Problem: p.Problem})
			}
			return nil
		})
	}
	werr := g.Wait()
	rep.Chunks = len(counted)
	if werr != nil {
		return rep, werr
	}
	if vf, ok := st.(store.Verifier); ok && readData {
		err := vf.Verify(ctx, func(id cairn.ID, err error) {
			rep.StoreErrors = append(rep.StoreErrors, Damage{Path: "store", Object: id.String(), Problem: err.Error()})
		})
		if err != nil {
			return rep, err
		}
	}
	slices.SortFunc(rep.Damaged, func(a, b Damage) int {
		if a.Path != b.Path {
			return bytesCompareString(a.Path, b.Path)
		}
		return int(a.Version) - int(b.Version)
	})
	return rep, nil
}

func bytesCompareString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func checkChunks(ctx context.Context, v *Volume, st cairn.Store, refs []manifest.Ref, readData bool, seen *sync.Map) ([]Damage, int64, error) {
	var out []Damage
	var nbytes int64
	if !readData {
		ids := make([]cairn.ID, 0, len(refs))
		idx := make([]int, 0, len(refs)) // the chunk each id belongs to
		for i := range refs {
			ids, idx = append(ids, refs[i].ID), append(idx, i)
			if b := refs[i].Base; b != nil {
				ids, idx = append(ids, b.ID), append(idx, i)
			}
		}
		found, err := st.Has(ctx, ids)
		if err != nil {
			return nil, 0, err
		}
		for k, ok := range found {
			if !ok {
				what := "chunk"
				if ids[k] != refs[idx[k]].ID {
					what = "base of chunk"
				}
				out = append(out, Damage{Object: ids[k].String(), Problem: fmt.Sprintf("%s %d missing from the store", what, idx[k])})
			}
		}
		return out, 0, nil
	}
	// decode reads and decodes one chunk; a delta needs its base's
	// plaintext.
	decode := func(r manifest.Ref, base []byte) ([]byte, error) {
		stored, err := st.Get(ctx, r.ID)
		if err != nil {
			return nil, err
		}
		nbytes += int64(len(stored))
		if r.Base != nil {
			return v.eng.DecodeDelta(r, stored, base)
		}
		return pipeline.DecodeChunk(r, stored)
	}
	record := func(id cairn.ID, what string, err error) {
		msg := ""
		if err != nil {
			msg = err.Error()
			out = append(out, Damage{Object: id.String(), Problem: what + ": " + msg})
		}
		seen.Store(id, msg)
	}
	for i, r := range refs {
		if prev, ok := seen.Load(r.ID); ok {
			if s := prev.(string); s != "" {
				out = append(out, Damage{Object: r.ID.String(), Problem: fmt.Sprintf("chunk %d: %s", i, s)})
			}
			continue
		}
		var base []byte
		if b := r.Base; b != nil {
			// A base is read again for each delta that needs it: deltas
			// are chunks of small files, and few.
			var err error
			base, err = decode(*b, nil)
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if _, done := seen.Load(b.ID); !done {
				record(b.ID, fmt.Sprintf("base of chunk %d", i), err)
			}
			if err != nil {
				record(r.ID, fmt.Sprintf("chunk %d", i), fmt.Errorf("delta not checked: its base %s is damaged", b.ID.Short()))
				continue
			}
		}
		_, err := decode(r, base)
		if err != nil && ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		record(r.ID, fmt.Sprintf("chunk %d", i), err)
	}
	return out, nbytes, nil
}

// Stats describes what a realm's volumes hold.
type Stats struct {
	Volumes        int     `json:"volumes"`
	Files          int     `json:"files"`
	Dirs           int     `json:"dirs"`
	Symlinks       int     `json:"symlinks"`
	Specials       int     `json:"specials"`       // FIFOs, sockets and device nodes
	LogicalBytes   int64   `json:"logical_bytes"`  // current versions of live files
	Versions       int     `json:"versions"`       // kept versions, trash included
	VersionBytes   int64   `json:"version_bytes"`  // plaintext of every kept version
	Chunks         int     `json:"chunks"`         // distinct chunks referenced (delta bases included), as fsck counts them
	UniqueBytes    int64   `json:"unique_bytes"`   // plaintext of distinct chunks
	ChunkBytes     int64   `json:"chunk_bytes"`    // stored (compressed, encrypted) size of distinct chunks
	StoredBytes    int64   `json:"stored_bytes"`   // everything the store holds (incl. manifests, garbage)
	StoreObjects   int64   `json:"store_objects"`  // objects in the store
	DiskBytes      int64   `json:"disk_bytes"`     // space used on disk by the store
	DedupRatio     float64 `json:"dedup_ratio"`    // VersionBytes / UniqueBytes
	CompressRatio  float64 `json:"compress_ratio"` // UniqueBytes / ChunkBytes
	TrashItems     int     `json:"trash_items"`
	ManifestErrors int     `json:"manifest_errors"`
}

// ComputeStats walks every volume and reads every kept version's manifest.
func ComputeStats(ctx context.Context, vols []*Volume, st cairn.Store) (*Stats, error) {
	s := &Stats{Volumes: len(vols)}
	for _, v := range vols {
		linked := map[uint64]bool{} // inodes with several names count once
		err := v.Walk(ctx, func(path string, e *meta.Entry, trashed bool) error {
			if trashed {
				return nil
			}
			if e.Nlink() > 1 {
				if linked[e.Ino] {
					return nil
				}
				linked[e.Ino] = true
			}
			switch e.Type {
			case meta.TypeDir:
				s.Dirs++
			case meta.TypeSymlink:
				s.Symlinks++
			case meta.TypeFIFO, meta.TypeSocket, meta.TypeChar, meta.TypeBlock:
				s.Specials++
			case meta.TypeFile:
				s.Files++
				s.LogicalBytes += e.Size
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		items, err := v.Meta.Trash(ctx)
		if err != nil {
			return nil, err
		}
		s.TrashItems += len(items)
	}
	vers, err := versions(ctx, vols, time.Now(), false)
	if err != nil {
		return nil, err
	}
	s.Versions = len(vers)
	var mu sync.Mutex
	refs := map[cairn.ID]int64{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2 * runtime.GOMAXPROCS(0))
	for i := range vers {
		vr := &vers[i]
		g.Go(func() error {
			m, merr := vr.vol.Manifest(gctx, &vr.ver)
			mu.Lock()
			defer mu.Unlock()
			if merr != nil {
				s.ManifestErrors++
				return nil
			}
			s.VersionBytes += m.Size
			for _, r := range m.Chunks {
				refs[r.ID] = int64(r.Size)
				if r.Base != nil {
					refs[r.Base.ID] = int64(r.Base.Size)
				}
			}
			return nil
		})
	}
	if err = g.Wait(); err != nil {
		return nil, err
	}
	s.Chunks = len(refs)
	for _, n := range refs {
		s.UniqueBytes += n
	}
	err = st.List(ctx, func(id cairn.ID, size int64) error {
		s.StoreObjects++
		s.StoredBytes += size
		if _, ok := refs[id]; ok {
			s.ChunkBytes += size
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if u, ok := st.(cairn.StoreStats); ok {
		if usage, err := u.Stats(ctx); err == nil {
			s.DiskBytes = usage.Disk
		}
	}
	if s.UniqueBytes > 0 {
		s.DedupRatio = float64(s.VersionBytes) / float64(s.UniqueBytes)
	}
	if s.ChunkBytes > 0 {
		s.CompressRatio = float64(s.UniqueBytes) / float64(s.ChunkBytes)
	}
	return s, nil
}

// DropUnreferenced deletes from st, the store versions call name, each of
// ids that no kept version or trash item of vols whose data may be in st
// references (reclaim's removal of an offloaded copy, doc/director.md):
// a version that names st, "local" or no store, or a copies or ec policy
// with st as a member. A version held elsewhere has its own copy of its
// chunks, and its manifest is not read (its holder may sleep). It holds
// the GC fence as GC does, so no writer that found one of ids in st
// commits a version naming it while it deletes, and it deletes nothing
// if it cannot read every manifest it must. It returns how many it
// deleted.
func DropUnreferenced(ctx context.Context, svc *meta.Service, vols []*Volume, name string, st cairn.Store, ids []cairn.ID) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b cairn.ID) int { return bytes.Compare(a[:], b[:]) })
	ids = slices.Compact(ids)
	fence, err := svc.BeginGC(ctx)
	if err != nil {
		return 0, err
	}
	defer fence.End(ctx)
	if err = sameVolumes(ctx, svc, vols); err != nil {
		return 0, err
	}
	all, err := versions(ctx, vols, time.Now(), false)
	if err != nil {
		return 0, err
	}
	var vers []versionRef
	for _, vr := range all {
		if mayHold(vr.ver.Stores, name) {
			vers = append(vers, vr)
		}
	}
	live, err := mark(ctx, vers, nil)
	if err != nil {
		return 0, fmt.Errorf("nothing deleted: %w", err)
	}
	// Deleted 32 at a time, in batches of 1024 each after a check of the
	// fence's lease: writers wait while it is held (one by one, the
	// deletes of a large file on a node behind a slow link held them for
	// seconds).
	var dead []cairn.ID
	for _, id := range ids {
		if !live.has(id) {
			dead = append(dead, id)
		}
	}
	var deleted atomic.Int64
	for start := 0; start < len(dead); start += 1024 {
		if err := fence.Alive(ctx); err != nil {
			return int(deleted.Load()), err
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(32)
		for _, id := range dead[start:min(len(dead), start+1024)] {
			g.Go(func() error {
				if err := st.Delete(gctx, id); err != nil && !errors.Is(err, cairn.ErrNotFound) {
					return err
				}
				deleted.Add(1)
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return int(deleted.Load()), err
		}
	}
	n := int(deleted.Load())
	if f, ok := st.(interface{ Flush(context.Context) error }); ok && n > 0 {
		if err := f.Flush(context.WithoutCancel(ctx)); err != nil {
			return n, err
		}
	}
	return n, nil
}

// mayHold reports whether a version naming stores may have its data in
// the store called name.
func mayHold(stores []string, name string) bool {
	if len(stores) == 0 {
		return true
	}
	for _, s := range stores {
		if s == name || s == "local" {
			return true
		}
		if p, err := meta.ParsePolicy(s); err == nil && slices.Contains(p.Stores, name) {
			return true
		}
	}
	return false
}
