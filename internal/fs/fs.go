// Package fs is cairn's file layer: whole-file writes that commit atomically
// at close, reads that verify every byte, and the walk-everything jobs (gc,
// fsck, stats). It joins the namespace (meta), the chunk pipeline and a
// store; it knows nothing about command lines or mounts.
package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/chunker"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/manifest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/volkey"
)

// KeyCheck is the value recorded in a volume's metadata so a device can tell
// a wrong key from damage: a BLAKE3 derivation of the master key, which
// reveals nothing about it.
func KeyCheck(m volkey.Master) string {
	var out [16]byte
	blake3.DeriveKey("cairn v1 volume key check", m[:], out[:])
	return fmt.Sprintf("%x", out)
}

// Volume is an open volume: namespace, keys, pipeline and store.
type Volume struct {
	Meta  *meta.Vol
	svc   *meta.Service
	store cairn.Store
	eng   *pipeline.Engine
	wrap  [32]byte
	// oldWraps are the wrap keys of earlier key epochs, newest first
	// (Options.Epochs): manifests written before a rotation open with them.
	oldWraps [][32]byte
	// digesters are BLAKE3 hashers keyed for content digests (see digest);
	// pooled because building a keyed hasher allocates 10 KiB.
	digesters sync.Pool
	// StoreName is recorded in each version as where its chunks live.
	storeName string
	// offloadTo, if set, is where this volume's writes were meant to go
	// (director.Write.Home): each commit records an offload entry.
	offloadTo    *meta.OffloadTo
	readaheadFor func(stores []string) int // Options.ReadaheadFor
	placement    Placement                 // SetPlacement
	log          *slog.Logger

	genMu   sync.Mutex
	lastGen int64
	genOK   bool
	// flushMu keeps CommitGroup's Flushes one at a time.
	flushMu sync.Mutex
}

// Options for Open.
type Options struct {
	StoreName string // recorded in versions; default "local"
	Workers   int    // pipeline workers; 0 = all cores
	// PutConcurrency is how many Puts one file's write keeps in flight;
	// 0 = 256 (each holds one chunk: 4 MiB at the default chunk size).
	PutConcurrency int
	// Readahead is how many chunks one read fetches ahead; 0 = the
	// pipeline's default (2 per worker), enough for a local store but not
	// to hide the round trips of fetching from another node.
	Readahead int
	// ReadaheadFor, if set, gives how many chunks a whole-file read
	// (ReadFile) of a version whose data is in stores (Version.Stores)
	// fetches ahead; 0: Readahead. A cloud bucket's packs need more in
	// flight than a node.
	ReadaheadFor func(stores []string) int
	// Epochs are the volume's later key epochs, oldest first (a rotation
	// after an unshare adds one, doc/format.md "Key epochs"): new
	// manifests are wrapped with the last one's ManifestWrap, and a
	// manifest opens with any. The master key passed to Open (epoch 0)
	// keeps the chunker's gear, the convergence and digest keys.
	Epochs []volkey.Master
	Logger *slog.Logger
}

// Open joins a volume's namespace handle with its master key and a store.
// A key that does not match the volume gives a Permission error.
func Open(svc *meta.Service, mv *meta.Vol, master volkey.Master, st cairn.Store, opts Options) (*Volume, error) {
	if mv.V.KeyCheck != "" && mv.V.KeyCheck != KeyCheck(master) {
		return nil, cairn.E("open volume", cairn.Permission, mv.V.Name, errors.New("wrong key for this volume"))
	}
	if opts.StoreName == "" {
		opts.StoreName = "local"
	}
	if opts.PutConcurrency == 0 {
		opts.PutConcurrency = 256
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	eng, err := pipeline.New(pipeline.Config{
		Conv:    master.Convergence(),
		Gear:    master.Gear(),
		Params:  chunker.Params{Min: mv.V.ChunkMin, Avg: mv.V.ChunkAvg, Max: mv.V.ChunkMax},
		Workers: opts.Workers,
		// A Put returns after the store's fsync, which the local store
		// shares among the Puts in flight (group commit): with 4 in flight
		// a large file went at 53 MB/s, fsync-bound; 64: 158 MB/s; 256: 291 MB/s.
		PutConcurrency: opts.PutConcurrency,
		Readahead:      opts.Readahead,
		Logger:         opts.Logger,
	}, st)
	if err != nil {
		return nil, err
	}
	v := &Volume{Meta: mv, svc: svc, store: st, eng: eng, wrap: master.ManifestWrap(), storeName: opts.StoreName, readaheadFor: opts.ReadaheadFor, log: opts.Logger}
	if n := len(opts.Epochs); n > 0 {
		v.wrap = opts.Epochs[n-1].ManifestWrap()
		for i := n - 2; i >= 0; i-- {
			v.oldWraps = append(v.oldWraps, opts.Epochs[i].ManifestWrap())
		}
		v.oldWraps = append(v.oldWraps, master.ManifestWrap())
	}
	var dk [32]byte
	blake3.DeriveKey("cairn v1 content digest", master[:], dk[:])
	v.digesters.New = func() any {
		h, err := blake3.NewKeyed(dk[:])
		if err != nil {
			panic(err) // only for a key that is not 32 bytes
		}
		return h
	}
	return v, nil
}

// OpenFor is Open on the stores the director chose (director.ForWrite):
// the volume writes to and reads through w.Store, and its versions record
// w.Name as where their data is (opts.StoreName is ignored).
func OpenFor(svc *meta.Service, mv *meta.Vol, master volkey.Master, w director.Write, opts Options) (*Volume, error) {
	opts.StoreName = w.Name
	v, err := Open(svc, mv, master, w.Store, opts)
	if err != nil {
		return nil, err
	}
	if w.Home != "" {
		v.offloadTo = &meta.OffloadTo{Home: w.Home, Now: w.OffloadedTo, HomeStores: w.HomePolicy}
	}
	return v, nil
}

// Close stops the volume's pipeline workers.
func (v *Volume) Close() error { return v.eng.Close() }

// Name returns the volume's name.
func (v *Volume) Name() string { return v.Meta.V.Name }

// Attrs are the attributes a new file version gets.
type Attrs struct {
	Mode  uint32
	UID   uint32
	GID   uint32
	Mtime time.Time
	Src   meta.Source
	// Lock, if set, is the file's writer lock (meta.Vol.Lock), already
	// held by the caller: WriteFile commits under it instead of taking its
	// own. A successful commit releases it; after a failure it is still
	// the caller's to release.
	Lock *meta.Lock
	// KeepAttrs: an existing file keeps its mode and owner (meta.Commit's
	// KeepAttrs); Mode, UID and GID apply only if the commit creates it.
	KeepAttrs bool
	// Path is the file's path in the volume ("/dir/name"). When it is set
	// and the volume has a placement (SetPlacement), WriteFile writes
	// through the volume the placement names for it (a placement policy's
	// stores); empty, it writes where the volume does.
	Path string
	// Cur, if set, is the file's entry as the caller knows it (a file it
	// just created, from a cache kept current by a watch), saving the read
	// of the entry before the write. It is used only while it names no
	// version: a version named by an entry read earlier than the GC
	// generation may have been dropped and collected before it, which the
	// fence does not see, and the write would reuse its manifest or chunks.
	// A stale one costs the commit a retry.
	Cur *meta.Entry
	// Listed: Cur (nil: the name was absent) is the file's entry as a
	// directory listing read it after the GC generation ListedGen was read
	// (Volume.Gen), and is used even when it names versions, as long as the
	// write's generation is still ListedGen: any collection since the
	// listing would have changed it. A stale one costs the commit a retry.
	Listed    bool
	ListedGen int64
	// Unlocked (PrepareFile only): take no writer lock; the commit succeeds
	// only while nobody holds it (meta.Commit.Unlocked), and is otherwise
	// made by WriteFile under the lock, waiting for it. A writer that
	// creates or replaces many files nobody else is writing (a put) saves
	// the lock's round trip per file.
	Unlocked bool
	// Ctime, if not zero, is the change time to record (meta.Commit.Ctime).
	Ctime time.Time
	// Ino, if not zero, is the inode number of a file the write creates
	// (meta.Commit.Ino).
	Ino uint64
}

// Placement returns the volume a file at path (in this volume) is to be
// written through: one opened on the stores of the placement policy in
// force there, or nil for the volume itself. It must be safe for
// concurrent use.
type Placement func(ctx context.Context, path string) (*Volume, error)

// SetPlacement makes WriteFile choose, for a file whose Attrs.Path is
// set, the volume p names. Set it before any write.
func (v *Volume) SetPlacement(p Placement) { v.placement = p }

// WriteStats reports what one WriteFile did.
type WriteStats = pipeline.WriteStats

// WriteFile stores the content open() yields as a new version of name in
// directory dir, and commits it atomically: readers see the old version until
// the commit, the new one after it; a crash at any point leaves the old one.
// While it writes it holds the file's writer lock (an etcd lease): its own,
// or a.Lock.
// open may be called more than once: when a garbage collection ran during the
// write, the content is written again (only missing chunks are stored).
func (v *Volume) WriteFile(ctx context.Context, dir *meta.Entry, name string, open func() (io.ReadCloser, error), a Attrs) (*meta.Entry, WriteStats, error) {
	if a.Path != "" && v.placement != nil {
		pv, err := v.placement(ctx, a.Path)
		if err != nil {
			return nil, WriteStats{}, err
		}
		if pv != nil && pv != v {
			a.Path = ""
			return pv.WriteFile(ctx, dir, name, open, a)
		}
	}
	path := v.Name() + ":" + name
	lock := a.Lock
	if lock == nil {
		var err error
		if lock, err = v.Meta.Lock(ctx, dir.Ino, name); err != nil {
			return nil, WriteStats{}, err
		}
		defer lock.Unlock(ctx)
	}
	var total WriteStats
	for attempt := 0; ; attempt++ {
		w, err := v.prepare(ctx, dir, name, open, a)
		total = addStats(total, w.stats)
		if err != nil {
			return nil, total, err
		}
		e, _, err := v.Meta.CommitVersion(ctx, dir, name, v.offload(w.commit(a, lock)))
		if errors.Is(err, meta.ErrFenced) && attempt < 20 {
			v.staleGen()
			a.Cur, a.Listed = nil, false
			v.log.Info("garbage collection ran during write; writing again", "path", path)
			continue
		}
		return e, total, err
	}
}

// prepared is one attempt of a write, stored but not committed: the GC
// generation read before anything was stored, the entry current then, the
// version to commit and what storing it did.
type prepared struct {
	gen   int64
	cur   *meta.Entry
	ver   meta.Version
	refs  []manifest.Ref // as the manifest records them
	stats WriteStats
}

// prepare stores the content open yields and its manifest (deferred when
// ctx says so: store.WithDeferred), under the GC generation it reads first.
func (v *Volume) prepare(ctx context.Context, dir *meta.Entry, name string, open func() (io.ReadCloser, error), a Attrs) (prepared, error) {
	var w prepared
	var err error
	if w.gen, err = v.writeGen(ctx); err != nil {
		return w, err
	}
	if c := a.Cur; c != nil && c.Type == meta.TypeFile && c.Current() == nil && c.Parent == dir.Ino && c.Name == name {
		w.cur = c
	} else if c := a.Cur; a.Listed && w.gen == a.ListedGen && (c == nil || c.Parent == dir.Ino && c.Name == name) {
		w.cur = c
	} else if w.cur, err = v.Meta.Get(ctx, dir.Ino, name); err != nil && !errors.Is(err, cairn.ErrNotFound) {
		return w, err
	}
	refs, plain, st, err := v.write(ctx, currentOf(w.cur), open)
	w.stats, w.refs = st, refs
	if err != nil {
		return w, err
	}
	// The digest hashes the plain chunk IDs, whatever encoding (plain
	// or delta) the manifest records, so equal content is recognised
	// however it was stored.
	digest := v.digest(plain, st.LogicalBytes)
	var mid cairn.ID
	if c := currentOf(w.cur); c != nil && c.Digest == digest && c.Size == st.LogicalBytes {
		// Unchanged content: its manifest is already stored (and was live
		// when we read the GC generation); commit refreshes mtime only.
		// The version names that manifest's chunks, not refs (which are
		// the plain encodings, never stored where a chunk is a delta).
		mid = c.Manifest
		w.refs = nil
	} else {
		var mst int64
		if mid, mst, err = v.putManifest(ctx, refs, st.LogicalBytes); err != nil {
			return w, err
		}
		w.stats.NewStoredBytes += mst
	}
	w.ver = meta.Version{Manifest: mid, Size: st.LogicalBytes, Mtime: a.Mtime.UnixNano(), Stores: []string{v.storeName}, Chunks: len(refs), Src: a.Src, Digest: digest}
	return w, nil
}

// commit is the meta.Commit of w under lock.
func (w *prepared) commit(a Attrs, lock *meta.Lock) meta.Commit {
	c := meta.Commit{Version: w.ver, Mode: a.Mode, UID: a.UID, GID: a.GID, Gen: w.gen, Lock: lock, Cur: meta.KnownEntry(w.cur), KeepAttrs: a.KeepAttrs, Ino: a.Ino,
		Unlocked: lock == nil}
	if !a.Ctime.IsZero() {
		c.Ctime = a.Ctime.UnixNano()
	}
	return c
}

// precheckLimit is the size up to which a file whose current version
// lives in the store this volume writes to is read into memory and its
// chunk IDs computed before anything is stored: unchanged content then
// costs no store round trip at all (over a slow link, the has request of
// every unchanged small file was most of what a re-put of a source tree
// sent).
const precheckLimit = 256 << 10

// write stores the content open yields and returns its refs as the
// manifest records them (refs) and as plain chunks (plain, for the
// digest); they differ only where a chunk was stored as a delta. When cur
// is a small version stored where this volume writes, the content is first
// read whole and, if its chunks are cur's, nothing is stored: cur is live,
// so its chunks are too. If it changed, its new chunks may be stored as
// deltas against cur's (see writeDelta).
func (v *Volume) write(ctx context.Context, cur *meta.Version, open func() (io.ReadCloser, error)) (refs, plain []manifest.Ref, st WriteStats, err error) {
	r, err := open()
	if err != nil {
		return nil, nil, WriteStats{}, err
	}
	defer r.Close()
	if cur == nil || cur.Digest == "" || cur.Size > precheckLimit || !slices.Contains(cur.Stores, v.storeName) {
		refs, st, err = v.eng.Write(ctx, r)
		return refs, refs, st, err
	}
	b, err := io.ReadAll(io.LimitReader(r, precheckLimit+1))
	if err != nil {
		return nil, nil, WriteStats{}, cairn.E("write", cairn.IO, "", fmt.Errorf("reading input: %w", err))
	}
	if len(b) > precheckLimit { // it grew: the rest streams after what was read
		refs, st, err = v.eng.Write(ctx, io.MultiReader(bytes.NewReader(b), r))
		return refs, refs, st, err
	}
	plain = v.eng.Refs(b)
	unchanged := int64(len(b)) == cur.Size && v.digest(plain, cur.Size) == cur.Digest
	damaged, err := v.damaged(ctx, plain, unchanged)
	if err != nil {
		return nil, nil, WriteStats{}, err
	}
	if damaged {
		// A chunk of this content was found damaged: cur's chunks are
		// not all stored after all. Store it plainly (the store lacks
		// the damaged chunk, so it is written afresh).
		refs, st, err = v.eng.WriteBytes(ctx, b)
		return refs, refs, st, err
	}
	if unchanged {
		st = WriteStats{LogicalBytes: int64(len(b)), Chunks: len(plain), DupChunks: len(plain), DupBytes: int64(len(b))}
		return plain, plain, st, nil
	}
	refs, st, err = v.writeDelta(ctx, cur, b, plain)
	if err != nil && ctx.Err() == nil && !errors.Is(err, cairn.ErrCanceled) {
		// The current version could not be read: store the content plainly.
		v.log.Warn("writing without deltas: reading the current version failed", "err", err)
		refs, st, err = v.eng.WriteBytes(ctx, b)
	}
	return refs, plain, st, err
}

// damaged reports whether the volume's store knows any of refs' chunks to
// be damaged (store.Quarantiner: memory only) or, when stored is set (refs
// are the current version's, so all stored) and under
// store.WithCheckPresent, finds one damaged when it checks them
// (store.Checker: a local store reads them). A store with neither ability
// knows nothing.
func (v *Volume) damaged(ctx context.Context, refs []manifest.Ref, stored bool) (bool, error) {
	q, isQ := v.store.(store.Quarantiner)
	c, isC := v.store.(store.Checker)
	check := isC && stored && store.CheckPresent(ctx)
	if !isQ && !check {
		return false, nil
	}
	ids := make([]cairn.ID, len(refs))
	for i := range refs {
		ids[i] = refs[i].ID
	}
	if isQ && slices.Contains(q.Quarantined(ids), true) {
		return true, nil
	}
	if !check {
		return false, nil
	}
	good, err := c.Check(ctx, ids)
	if err != nil {
		return false, err
	}
	return slices.Contains(good, false), nil
}

// writeDelta stores b, a changed small file whose current version is cur
// (live, and stored where this volume writes), chunk by chunk: a chunk
// equal to one of cur's is cur's ref, used as is; another may be stored as
// a delta against one of cur's plain chunks, the one at the same place in
// the file (after the cur chunk its predecessor matched, or before the one
// its successor matched, or else the one it overlaps most). If that chunk
// of cur is itself a delta, its base is used instead: a base is never a
// delta. Bases stay stored while cur is (its manifest names them), and
// gc keeps the base of every kept version's chunks.
//
// Cost: the manifest and the chosen bases are fetched (two round trips to
// a remote store, the bases' Gets coalesced into one request); the bytes
// come downstream, where the upstream they save is what a slow link lacks.
func (v *Volume) writeDelta(ctx context.Context, cur *meta.Version, b []byte, plain []manifest.Ref) ([]manifest.Ref, WriteStats, error) {
	rctx := store.WithSources(ctx, cur.Stores)
	m, err := v.Manifest(rctx, cur)
	if err != nil {
		return nil, WriteStats{}, err
	}
	old := m.Chunks
	oldOff := make([]int64, len(old)+1)
	byKey := make(map[[32]byte]int, len(old))
	for j, r := range old {
		oldOff[j+1] = oldOff[j] + int64(r.Size)
		if _, ok := byKey[r.Key]; !ok {
			byKey[r.Key] = j
		}
	}
	match := make([]int, len(plain))
	for i, p := range plain {
		match[i] = -1
		if j, ok := byKey[p.Key]; ok && old[j].Size == p.Size {
			match[i] = j
		}
	}
	hints := make([]pipeline.Hint, len(plain))
	baseOf := make([]int, len(plain)) // index into bases, or -1
	var bases []manifest.Ref
	baseIdx := map[cairn.ID]int{}
	var off int64
	for i, p := range plain {
		baseOf[i] = -1
		start := off
		off += int64(p.Size)
		if j := match[i]; j >= 0 {
			hints[i].Same = &old[j]
			continue
		}
		j := -1
		switch {
		case i > 0 && match[i-1] >= 0 && match[i-1]+1 < len(old):
			j = match[i-1] + 1
		case i+1 < len(plain) && match[i+1] > 0:
			j = match[i+1] - 1
		default:
			j = mostOverlap(oldOff, start, off)
		}
		if j < 0 {
			continue
		}
		base := old[j]
		if base.Base != nil {
			base = *base.Base
		}
		k, ok := baseIdx[base.ID]
		if !ok {
			k = len(bases)
			baseIdx[base.ID] = k
			bases = append(bases, base)
		}
		baseOf[i] = k
	}
	var basePlain [][]byte
	if len(bases) > 0 {
		if basePlain, err = v.eng.Plaintexts(rctx, bases); err != nil {
			return nil, WriteStats{}, err
		}
	}
	for i := range hints {
		if k := baseOf[i]; k >= 0 {
			hints[i].Base, hints[i].BasePlain = &bases[k], basePlain[k]
		}
	}
	return v.eng.WriteDelta(ctx, b, plain, hints)
}

// mostOverlap returns the index of the chunk, among those ending at
// offsets off[1:], that overlaps [lo, hi) most, or -1 if none does.
func mostOverlap(off []int64, lo, hi int64) int {
	best, bestN := -1, int64(0)
	for j := 0; j+1 < len(off); j++ {
		if off[j] >= hi {
			break
		}
		if n := min(hi, off[j+1]) - max(lo, off[j]); n > bestN {
			best, bestN = j, n
		}
	}
	return best
}

// writeGen returns the GC generation writers must commit with. It is read
// from etcd once and then reused: a commit with a stale generation is fenced
// (it fails and the writer retries after staleGen), so caching costs nothing
// in correctness and saves a round trip per file.
//
// Whenever the generation changes (a garbage collection ran), the pipeline
// forgets which chunks it has stored and a shared store re-reads what other
// processes deleted: those chunks may be gone, and a writer that skipped
// storing one on the strength of a stale "present" would commit a version
// missing it.
func (v *Volume) writeGen(ctx context.Context) (int64, error) {
	v.genMu.Lock()
	defer v.genMu.Unlock()
	if v.genOK {
		return v.lastGen, nil
	}
	gen, err := v.svc.WriteGen(ctx)
	if err != nil {
		return 0, err
	}
	if gen != v.lastGen {
		v.eng.Forget()
		if r, ok := v.store.(store.Refresher); ok {
			if err := r.Refresh(ctx); err != nil {
				return 0, err
			}
		}
	}
	v.lastGen, v.genOK = gen, true
	return gen, nil
}

// Gen returns the GC generation this volume's writes commit with now
// (reading it if needed): a caller that reads directory listings after it
// may pass their entries as Attrs.Cur with Attrs.Listed.
func (v *Volume) Gen(ctx context.Context) (int64, error) { return v.writeGen(ctx) }

// staleGen makes the next writeGen read the generation again.
func (v *Volume) staleGen() {
	v.genMu.Lock()
	v.genOK = false
	v.genMu.Unlock()
}

func currentOf(e *meta.Entry) *meta.Version {
	if e == nil || e.Type != meta.TypeFile {
		return nil
	}
	return e.Current()
}

// digest is a keyed hash of a file's size and chunk IDs: equal digests mean
// equal content. Keyed with a volume secret, so it tells the metadata
// service nothing it could compare across volumes.
func (v *Volume) digest(refs []manifest.Ref, size int64) string {
	kh := v.digesters.Get().(*blake3.Hasher)
	defer v.digesters.Put(kh)
	kh.Reset()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(size))
	kh.Write(b[:])
	for i := range refs {
		kh.Write(refs[i].ID[:])
	}
	var out [32]byte
	kh.Sum(out[:0])
	return hex.EncodeToString(out[:16])
}

func addStats(a, b WriteStats) WriteStats {
	a.LogicalBytes += b.LogicalBytes
	a.Chunks += b.Chunks
	a.NewChunks += b.NewChunks
	a.NewStoredBytes += b.NewStoredBytes
	a.DupChunks += b.DupChunks
	a.DupBytes += b.DupBytes
	a.CompressedChunks += b.CompressedChunks
	a.DeltaChunks += b.DeltaChunks
	a.StoredBytes += b.StoredBytes
	a.HealedChunks += b.HealedChunks
	return a
}

// putManifest seals and stores a manifest; it returns its ID and the bytes added.
func (v *Volume) putManifest(ctx context.Context, refs []manifest.Ref, size int64) (cairn.ID, int64, error) {
	stored, id, err := manifest.Seal(&manifest.Manifest{Size: size, Chunks: refs}, v.wrap)
	if err != nil {
		return id, 0, err
	}
	if err := v.store.Put(ctx, id, stored); err != nil {
		return id, 0, err
	}
	return id, int64(len(stored)), nil
}

// openManifest opens a manifest with the current epoch's wrap key, else
// with an earlier epoch's (a manifest written before a rotation).
func (v *Volume) openManifest(stored []byte, id cairn.ID) (*manifest.Manifest, error) {
	m, err := manifest.Open(stored, id, v.wrap)
	for _, w := range v.oldWraps {
		if err == nil || cairn.KindOf(err) != cairn.Permission {
			break
		}
		m, err = manifest.Open(stored, id, w)
	}
	return m, err
}

// Manifest fetches and opens a version's manifest.
func (v *Volume) Manifest(ctx context.Context, ver *meta.Version) (*manifest.Manifest, error) {
	stored, err := v.store.Get(store.WithSources(ctx, ver.Stores), ver.Manifest)
	if err != nil {
		return nil, fmt.Errorf("manifest of version %d: %w", ver.N, err)
	}
	m, err := v.openManifest(stored, ver.Manifest)
	if err != nil {
		return nil, fmt.Errorf("manifest of version %d: %w", ver.N, err)
	}
	if m.Size != ver.Size {
		return nil, cairn.E("open manifest", cairn.Corrupt, ver.Manifest.Short(), fmt.Errorf("manifest says %d bytes, metadata %d", m.Size, ver.Size))
	}
	return m, nil
}

// ReadFile writes version ver of a file (nil: the current one) to w. Every
// chunk is verified (hash and AEAD tag) before its bytes reach w.
func (v *Volume) ReadFile(ctx context.Context, e *meta.Entry, ver *meta.Version, w io.Writer) error {
	return v.readFile(ctx, e, ver, func(ctx context.Context, refs []manifest.Ref, ahead int) error {
		return v.eng.ReadAhead(ctx, refs, ahead, w)
	})
}

// ReadFileAt is ReadFile writing each chunk at its offset in w as soon as
// it is verified, in no particular order (pipeline ReadAheadAt), for a
// caller writing a new local file. On error w may hold any part of it.
func (v *Volume) ReadFileAt(ctx context.Context, e *meta.Entry, ver *meta.Version, w io.WriterAt) error {
	return v.readFile(ctx, e, ver, func(ctx context.Context, refs []manifest.Ref, ahead int) error {
		return v.eng.ReadAheadAt(ctx, refs, ahead, w)
	})
}

func (v *Volume) readFile(ctx context.Context, e *meta.Entry, ver *meta.Version, read func(context.Context, []manifest.Ref, int) error) error {
	if e.Type != meta.TypeFile {
		return cairn.E("read", cairn.IsDir, e.Name, errors.New("not a regular file"))
	}
	if ver == nil {
		ver = e.Current()
	}
	if ver == nil {
		return nil // created but never written: empty
	}
	m, err := v.Manifest(ctx, ver)
	if err != nil {
		return err
	}
	ahead := 0 // the engine's Readahead
	if v.readaheadFor != nil {
		ahead = v.readaheadFor(ver.Stores)
	}
	return read(store.WithSources(ctx, ver.Stores), m.Chunks, ahead)
}

// offload adds to c the offload entry of a volume whose writes were
// offloaded (director.Write.Home).
func (v *Volume) offload(c meta.Commit) meta.Commit {
	c.Offload = v.offloadTo
	return c
}

// Object is one stored object a file version's data needs: its manifest
// or one of its chunks (Size: the chunk's plaintext bytes in the file; 0
// for the manifest and for a delta chunk's base, which only helps decode).
type Object struct {
	ID   cairn.ID
	Size int64
}

// Objects lists what version ver's data needs, the manifest first, then
// each chunk in file order (and the base of a delta chunk), without
// duplicates. get reads the manifest (nil: through the volume's store,
// which may fetch it from the nodes the version names).
func (v *Volume) Objects(ctx context.Context, ver *meta.Version, get func(context.Context, cairn.ID) ([]byte, error)) ([]Object, error) {
	var m *manifest.Manifest
	var err error
	if get == nil {
		m, err = v.Manifest(ctx, ver)
	} else {
		var stored []byte
		if stored, err = get(ctx, ver.Manifest); err == nil {
			m, err = v.openManifest(stored, ver.Manifest)
		}
		if err != nil {
			err = fmt.Errorf("manifest of version %d: %w", ver.N, err)
		}
	}
	if err != nil {
		return nil, err
	}
	out := []Object{{ID: ver.Manifest}}
	seen := map[cairn.ID]bool{ver.Manifest: true}
	for _, r := range m.Chunks {
		size := int64(r.Size)
		for ref := &r; ref != nil; ref = ref.Base {
			if !seen[ref.ID] {
				seen[ref.ID] = true
				out = append(out, Object{ID: ref.ID, Size: size})
			}
			size = 0
		}
	}
	return out, nil
}
