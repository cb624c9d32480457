// Package store holds what every cairn.Store implementation shares: the
// optional abilities a store may offer (found by type assertion, like
// cairn.StoreStats) and small helpers. Implementations live in
// subpackages (memstore, localstore); the conformance suite in storetest.
package store

import (
	"context"
	"sync"

	"cairn.dev/cairn/internal/cairn"
)

// Verifier is an optional ability of a Store: read every stored object and
// check that it hashes to its ID, without any key.
//
// Verify calls fn once per damaged object, from the caller's goroutine, with
// an error of Kind Corrupt (or IO when the object could not be read). It
// returns nil when it checked everything, whatever it found; it returns an
// error only when it could not finish (ctx canceled: Kind Canceled, or the
// medium failed).
type Verifier interface {
	Verify(ctx context.Context, fn func(id cairn.ID, err error)) error
}

// Compacter is an optional ability of a Store: reclaim the space of deleted
// objects. It is crash-safe (a crash during Compact loses no live object and
// resurrects no deleted one) and may run while other methods are in use.
// It returns the number of bytes freed on the medium.
type Compacter interface {
	Compact(ctx context.Context) (freed int64, err error)
}

// RangeReader is an optional ability of a Store: read part of a stored
// object without fetching all of it (a cloud store: one ranged GET).
//
// GetRange returns exactly n bytes of the stored object id, starting at
// byte off. The bytes are NOT verified: a part cannot be checked against
// the whole object's ID, so the caller checks what it reads by other means
// (packstore checks each object it cuts out of a pack against that
// object's own ID). off and n must not be negative; n = 0 returns an empty
// slice once the object is known to exist. A missing object fails with
// Kind NotFound; a range that reaches past the object's end (or a store
// that returned fewer bytes) fails with Kind Invalid; a canceled ctx with
// Kind Canceled. The returned slice belongs to the caller.
type RangeReader interface {
	GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error)
}

// CtxErr returns nil if ctx is live, or an error of Kind Canceled wrapping
// ctx.Err(), so that both errors.Is(err, cairn.ErrCanceled) and
// errors.Is(err, context.Canceled) (or context.DeadlineExceeded) hold.
func CtxErr(ctx context.Context, op, path string) error {
	if err := ctx.Err(); err != nil {
		return cairn.E(op, cairn.Canceled, path, err)
	}
	return nil
}

// Refresher is an optional ability of a Store that several processes share
// (the local store): bring this process's view up to date with what the
// others did, deletions included. Without it, Has may go on answering
// "present" for an object another process deleted. The file layer calls it
// whenever a garbage collection has run since its last write, so a writer
// never skips storing a chunk on the strength of a stale "present".
type Refresher interface {
	Refresh(ctx context.Context) error
}

type sourcesKey struct{}

// WithSources returns a context that tells a store which stores (node
// names, as recorded in a version's metadata) hold the objects about to be
// read. A store that reads from several places (the realm's device store)
// tries those first; every other store ignores it. It is a hint: the
// objects are still verified against their IDs wherever they come from.
func WithSources(ctx context.Context, names []string) context.Context {
	if len(names) == 0 {
		return ctx
	}
	return context.WithValue(ctx, sourcesKey{}, names)
}

// Sources returns the names WithSources put in ctx, or nil.
func Sources(ctx context.Context) []string {
	s, _ := ctx.Value(sourcesKey{}).([]string)
	return s
}

type deferredKey struct{}

// WithDeferred returns a context whose Puts a store that buffers writes
// (a Deferrer whose Defers reports true) may answer once the object is
// buffered rather than stored: the object is durable only once a later
// Flush of that store has returned nil. Every other store ignores it and
// stores as usual. A caller must Flush before it commits anything that
// names the objects.
func WithDeferred(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferredKey{}, true)
}

// Deferred reports whether ctx came from WithDeferred.
func Deferred(ctx context.Context) bool {
	d, _ := ctx.Value(deferredKey{}).(bool)
	return d
}

// Deferrer is a store that can buffer Puts made with a WithDeferred
// context. Defers reports whether it does (a wrapper may buffer only over
// some stores); Flush returns once every object buffered before it is
// stored, or an error if one could not be.
type Deferrer interface {
	Defers() bool
	Flush(ctx context.Context) error
}

// VerifyNote records that a store checked an object it returned against
// its ID, so that the reader above it, which would otherwise hash the same
// bytes again, can skip its own check (a cold read from a cloud store used
// to hash every chunk twice: packstore, then the pipeline). One note serves
// one Get: make it with WithVerifyNote, pass the context to Get, then ask
// Verified about exactly the bytes Get returned.
//
// A note covers the very bytes that were checked (same backing array,
// same length), not copies: a layer in between that returned other bytes
// (a copy, reconstructed data) leaves the reader to check them itself.
// The zero note has seen nothing.
type VerifyNote struct {
	mu   sync.Mutex
	id   cairn.ID
	data []byte
	ok   bool
}

type verifyKey struct{}

// WithVerifyNote returns a context carrying a fresh note for one Get.
func WithVerifyNote(ctx context.Context) (context.Context, *VerifyNote) {
	n := new(VerifyNote)
	return context.WithValue(ctx, verifyKey{}, n), n
}

// NoteVerified is called by a store that has just checked that data
// hashes to id and is about to return data from a Get made with ctx. It
// does nothing when ctx carries no note.
func NoteVerified(ctx context.Context, id cairn.ID, data []byte) {
	n, _ := ctx.Value(verifyKey{}).(*VerifyNote)
	if n == nil {
		return
	}
	n.mu.Lock()
	n.id, n.data, n.ok = id, data, true
	n.mu.Unlock()
}

// Verified reports whether a store noted that data, these very bytes,
// hash to id.
func (n *VerifyNote) Verified(id cairn.ID, data []byte) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ok && n.id == id && len(n.data) == len(data) && len(data) > 0 && &n.data[0] == &data[0]
}

type hashedKey struct{}

// WithHashedIDs returns a context whose Puts come from a caller that has
// just computed each ID from the very bytes it passes (the pipeline names
// a chunk by hashing it; a pack store names a pack by hashing it): a store
// that checks data against its ID on Put may skip that check, which would
// hash every byte once more. Every other store ignores it. Reads are
// checked as always.
func WithHashedIDs(ctx context.Context) context.Context {
	return context.WithValue(ctx, hashedKey{}, true)
}

// HashedPutter is an optional ability of a Store that checks data against
// its ID on Put: PutHashed is Put for a caller that has just computed id
// from data itself (a pack store storing a pack it named), without the
// check. (WithHashedIDs says the same through layers of wrappers; this is
// for a store that cannot import this package.)
type HashedPutter interface {
	PutHashed(ctx context.Context, id cairn.ID, data []byte) error
}

// HashedIDs reports whether ctx came from WithHashedIDs.
func HashedIDs(ctx context.Context) bool {
	h, _ := ctx.Value(hashedKey{}).(bool)
	return h
}

type sequentialKey struct{}

// WithSequential returns a context whose Gets are part of one read of many
// objects in order (a whole file), asked for a little ahead of need: a
// store that reads ahead (packstore) may then read a large span at the
// first Get that enters a region, rather than wait to see a run. Every
// other store ignores it.
func WithSequential(ctx context.Context) context.Context {
	return context.WithValue(ctx, sequentialKey{}, true)
}

// Sequential reports whether ctx came from WithSequential.
func Sequential(ctx context.Context) bool {
	q, _ := ctx.Value(sequentialKey{}).(bool)
	return q
}

// RangeFiller is an optional ability of a RangeReader: GetRangeInto reads
// len(dst) bytes of the stored object id from byte off into dst, as
// GetRange would return them (not verified; the same errors), so that a
// caller reading many ranges can reuse its buffers (packstore's
// read-ahead spans).
type RangeFiller interface {
	GetRangeInto(ctx context.Context, id cairn.ID, off int64, dst []byte) error
}

type checkPresentKey struct{}

// WithCheckPresent returns a context whose writes do not take a store's
// word that an object is present (LBFS: the chunk index is a hint, never
// the truth) where checking is cheap: a writer asks a store that is a
// Checker to verify the objects its Has found, and writes afresh those
// that fail, healing every version that names them. A store that is not
// a Checker (a remote node, a cloud bucket: checking would mean
// downloading) is trusted as before. `cairn put --force` asks for it.
func WithCheckPresent(ctx context.Context) context.Context {
	return context.WithValue(ctx, checkPresentKey{}, true)
}

// Checker is an optional ability of a Store whose reads are cheap (a
// local directory): Check reads every one of ids it holds and verifies it
// against its ID, and reports, in order, which it holds a good copy of. A
// damaged copy is quarantined as a Get would (the store never again counts
// it present), so that a Put of the object writes it afresh. It fails only
// when it cannot check (ctx canceled, the medium failing). Callers ask
// about objects they believe present (Has said so, or a committed version
// names them); a wrapper over a store that cannot check cheaply may answer
// true for all of them (trust, as without the ability).
type Checker interface {
	Check(ctx context.Context, ids []cairn.ID) ([]bool, error)
}

// CheckPresent reports whether ctx came from WithCheckPresent.
func CheckPresent(ctx context.Context) bool {
	c, _ := ctx.Value(checkPresentKey{}).(bool)
	return c
}

// Quarantiner is an optional ability of a Store that remembers damage
// (the local store): Quarantined reports, in order, which of ids it holds
// no good copy of because every copy it had was found damaged. It is
// cheap (memory only, no I/O). A writer that would otherwise take an
// object's presence on trust (fs's unchanged-content shortcut) asks it
// first, so that a put of the original data heals the object.
type Quarantiner interface {
	Quarantined(ids []cairn.ID) []bool
}
