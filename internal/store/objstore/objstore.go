// Package objstore turns a bucket of a cloud object store into a
// cairn.Store. The backends (s3store, gcsstore, azstore) implement the
// narrow Bucket interface over their SDK, one request per call; everything
// else is here, once: object naming, verifying what is read against its ID,
// Has as concurrent HEADs, paging through listings, retrying transient
// failures with backoff, classifying errors into cairn Kinds, and counting
// requests by class.
//
// Object naming (doc/format.md, "Cloud stores"): an object with ID id lives
// under the key
//
//	<prefix>/<first 2 hex digits of id>/<64 hex digits of id>
//
// (without "<prefix>/" when the prefix is empty). Keys under the prefix
// that do not have this form are not cairn's and are ignored by List.
package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// MaxObject is the largest object a cloud store accepts or reads, in
// bytes: the node wire protocol's limit (chunks are at most 64 MiB of
// plaintext).
const MaxObject = 128 << 20

// Object is one entry of a listing.
type Object struct {
	Key  string
	Size int64
}

// Bucket is one bucket (or container) of a cloud object store, as a
// backend sees it. Each method makes one attempt: a backend turns its
// SDK's own retries off, and Store retries the calls whose error Kind says
// it may help. A backend counts the requests it makes in the Counter it
// gave to New.
//
// Errors: a method returns the SDK's error as it is, and Kind classifies
// it. Get of a missing key fails with an error Kind maps to NotFound;
// Head of a missing key returns false, nil; Delete of a missing key
// returns nil.
type Bucket interface {
	// Put writes data under key, replacing what is there.
	Put(ctx context.Context, key string, data []byte) error
	// Get reads the whole object. An object larger than max bytes fails
	// (with an error of Kind Invalid, or any error of the backend's).
	Get(ctx context.Context, key string, max int64) ([]byte, error)
	// GetRange reads at most n > 0 bytes of the object from byte off: the
	// service may return fewer when the range reaches past the end, and
	// fails (a 416 status, Kind Invalid) when off is at or past the end.
	GetRange(ctx context.Context, key string, off, n int64) ([]byte, error)
	// Head reports whether key exists, and its size.
	Head(ctx context.Context, key string) (size int64, ok bool, err error)
	// Delete removes key.
	Delete(ctx context.Context, key string) error
	// ListPage returns one page of at most limit objects whose keys
	// begin with prefix, starting at token ("" for the first page), and
	// the token of the next page ("" after the last). A backend may
	// return fewer than limit objects on any page (its service's maximum
	// is lower, or the service decided so).
	ListPage(ctx context.Context, prefix, token string, limit int) (objs []Object, next string, err error)
	// Kind classifies an error returned by the methods above.
	Kind(err error) cairn.Kind
	// Close releases the SDK client.
	Close() error
}

// RangeFillBucket is an optional ability of a Bucket: GetRangeInto reads
// exactly len(dst) > 0 bytes of the object from byte off into dst (one
// ranged GET, as GetRange). A reply that announces fewer bytes (the range
// reaches past the end) fails with Kind Invalid, one cut short of what it
// announced with io.ErrUnexpectedEOF (Kind IO, retried: ReadBodyInto);
// other errors as GetRange's. Store.GetRangeInto uses it; without it, it
// copies what GetRange returns.
type RangeFillBucket interface {
	GetRangeInto(ctx context.Context, key string, off int64, dst []byte) error
}

// Options tune a Store. The zero value takes the defaults.
type Options struct {
	// Attempts is how many times a request is tried in all when it fails
	// with Kind Unavailable or IO (a 5xx or 429 status, a refused or
	// reset connection, a timeout). Default 4; 1 turns retrying off.
	Attempts int
	// Backoff is the wait before the first retry; each later one doubles
	// it, up to MaxBackoff. Each wait is drawn at random between half and
	// all of that. Defaults 100ms and 2s.
	Backoff, MaxBackoff time.Duration
	// HasWorkers is how many HEAD requests one Has call keeps in flight.
	// Default 16.
	HasWorkers int
	// PageSize is how many objects one LIST request asks for. Default
	// 1000 (the most S3 and GCS return; Azure allows 5000).
	PageSize int
	// Logger receives a note for each retry. nil discards.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Attempts <= 0 {
		o.Attempts = 4
	}
	if o.Backoff <= 0 {
		o.Backoff = 100 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 2 * time.Second
	}
	o.MaxBackoff = max(o.MaxBackoff, o.Backoff)
	if o.HasWorkers <= 0 {
		o.HasWorkers = 16
	}
	if o.PageSize <= 0 {
		o.PageSize = 1000
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Store is a cairn.Store over a Bucket. Make one with New (usually through
// s3store.New, gcsstore.New or azstore.New).
type Store struct {
	name   string // the store's URL, for messages
	prefix string
	b      Bucket
	n      *Counter
	o      Options
	closed atomic.Bool
}

var (
	_ cairn.Store      = (*Store)(nil)
	_ cairn.StoreStats = (*Store)(nil)
)

// New returns a Store keeping its objects in b under prefix (see Key).
// name is the store's URL, used in error messages. n is where b counts its
// requests.
func New(name, prefix string, b Bucket, n *Counter, o Options) *Store {
	return &Store{name: name, prefix: strings.Trim(prefix, "/"), b: b, n: n, o: o.withDefaults()}
}

// Name returns the store's URL.
func (s *Store) Name() string { return s.name }

// Requests returns how many requests of each class the store has sent so
// far, retries included.
func (s *Store) Requests() Requests { return s.n.Snapshot() }

// KeyVersion is the version of the layout of object names (Key) in a
// bucket (doc/format.md, "Cloud stores").
const KeyVersion = 1

// Key returns the object key of id under prefix.
func Key(prefix string, id cairn.ID) string {
	h := id.String()
	if prefix = strings.Trim(prefix, "/"); prefix == "" {
		return h[:2] + "/" + h
	}
	return prefix + "/" + h[:2] + "/" + h
}

// listPrefix is what every key of the store begins with.
func listPrefix(prefix string) string {
	if prefix == "" {
		return ""
	}
	return prefix + "/"
}

// ParseKey returns the ID whose key under prefix is key, and false when key
// is not such a key.
func ParseKey(prefix, key string) (cairn.ID, bool) {
	rest, ok := strings.CutPrefix(key, listPrefix(strings.Trim(prefix, "/")))
	if !ok || len(rest) != 3+2*cairn.IDSize || rest[2] != '/' || rest[:2] != rest[3:5] {
		return cairn.ID{}, false
	}
	h := rest[3:]
	if strings.ToLower(h) != h { // String is lowercase; keep names canonical
		return cairn.ID{}, false
	}
	id, err := cairn.ParseID(h)
	return id, err == nil
}

// ReadBody reads a reply's body for a backend: size is what the reply
// announced (-1 if nothing), limit the most the caller takes. More than
// limit bytes fail with Kind Invalid; fewer than announced with
// io.ErrUnexpectedEOF (IO: the reply was cut short, retried).
func ReadBody(r io.Reader, size, limit int64, key string) ([]byte, error) {
	if size > limit {
		return nil, cairn.E("get", cairn.Invalid, key, fmt.Errorf("reply of %d bytes exceeds %d", size, limit))
	}
	if size >= 0 {
		// Exactly size bytes, then the end. (bytes.Buffer.ReadFrom would
		// double the buffer, copying every byte, once the announced size
		// was read, to look for more.)
		data := make([]byte, size)
		if n, err := io.ReadFull(r, data); err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil, fmt.Errorf("read %d bytes of %d: %w", n, size, io.ErrUnexpectedEOF)
			}
			return nil, err
		}
		var one [1]byte
		switch n, err := io.ReadFull(r, one[:]); {
		case n > 0:
			return nil, fmt.Errorf("read more than the %d bytes announced: %w", size, io.ErrUnexpectedEOF)
		case err != io.EOF:
			return nil, err
		}
		return data, nil
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(size, 0)+1))
	if _, err := buf.ReadFrom(io.LimitReader(r, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, cairn.E("get", cairn.Invalid, key, fmt.Errorf("reply exceeds %d bytes", limit))
	}
	if size >= 0 && int64(buf.Len()) != size {
		return nil, fmt.Errorf("read %d bytes of %d: %w", buf.Len(), size, io.ErrUnexpectedEOF)
	}
	return buf.Bytes(), nil
}

// ReadBodyInto reads a reply's body into dst for a backend's
// GetRangeInto: size is what the reply announced (-1 if nothing). A reply
// announcing another length than len(dst) fails with Kind Invalid, one
// with fewer bytes than announced with io.ErrUnexpectedEOF, one with more
// with io.ErrUnexpectedEOF too (as ReadBody).
func ReadBodyInto(r io.Reader, size int64, dst []byte, key string) error {
	if size >= 0 && size != int64(len(dst)) {
		return cairn.E("get range", cairn.Invalid, key, fmt.Errorf("reply of %d bytes for a range of %d", size, len(dst)))
	}
	if n, err := io.ReadFull(r, dst); err != nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return fmt.Errorf("read %d bytes of %d: %w", n, len(dst), io.ErrUnexpectedEOF)
		}
		return err
	}
	var one [1]byte
	switch n, err := io.ReadFull(r, one[:]); {
	case n > 0:
		return fmt.Errorf("read more than the %d bytes asked for: %w", len(dst), io.ErrUnexpectedEOF)
	case err != io.EOF:
		return err
	}
	return nil
}

// path names an object in errors: the store's URL and the object's ID.
func (s *Store) path(id cairn.ID) string { return s.name + " " + id.String() }

var errClosed = errors.New("cloud store is closed")

// begin checks ctx and that s is open.
func (s *Store) begin(ctx context.Context, op, path string) error {
	if err := ctx.Err(); err != nil {
		return cairn.E(op, cairn.Canceled, path, err)
	}
	if s.closed.Load() {
		return cairn.E(op, cairn.Invalid, path, errClosed)
	}
	return nil
}

// kind classifies err from the bucket, given the ctx of the call.
func (s *Store) kind(ctx context.Context, err error) cairn.Kind {
	if ctx.Err() != nil {
		return cairn.Canceled
	}
	if k := cairn.KindOf(err); k != cairn.Other {
		return k
	}
	return s.b.Kind(err)
}

// retry calls fn until it succeeds, fails with a Kind that retrying cannot
// help, or has been tried Options.Attempts times; the error names op and
// path and carries the Kind.
func (s *Store) retry(ctx context.Context, op, path string, fn func() error) error {
	wait := s.o.Backoff
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		k := s.kind(ctx, err)
		if (k != cairn.Unavailable && k != cairn.IO) || attempt >= s.o.Attempts {
			if k == cairn.Canceled && ctx.Err() != nil {
				err = ctx.Err()
			}
			return cairn.E(op, k, path, err)
		}
		d := wait/2 + rand.N(wait/2+1)
		s.o.Logger.Debug("cloud store: retrying", "op", op, "path", path, "attempt", attempt, "wait", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return cairn.E(op, cairn.Canceled, path, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, s.o.MaxBackoff)
	}
}

// Put writes the object, after checking that data hashes to id (Kind
// Corrupt otherwise). Writing an object already present writes it again:
// the content is the same, and a damaged copy is repaired.
func (s *Store) Put(ctx context.Context, id cairn.ID, data []byte) error {
	path := s.path(id)
	if err := s.begin(ctx, "put", path); err != nil {
		return err
	}
	if len(data) > MaxObject {
		return cairn.E("put", cairn.Invalid, path, fmt.Errorf("object of %d bytes exceeds %d", len(data), MaxObject))
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return cairn.E("put", cairn.Corrupt, path, errors.New("data does not hash to the ID"))
	}
	return s.put(ctx, path, id, data)
}

// PutHashed is Put without checking that data hashes to id, for a caller
// that has just computed id from data (store.HashedPutter: a pack store
// storing a pack it named).
func (s *Store) PutHashed(ctx context.Context, id cairn.ID, data []byte) error {
	path := s.path(id)
	if err := s.begin(ctx, "put", path); err != nil {
		return err
	}
	if len(data) > MaxObject {
		return cairn.E("put", cairn.Invalid, path, fmt.Errorf("object of %d bytes exceeds %d", len(data), MaxObject))
	}
	return s.put(ctx, path, id, data)
}

func (s *Store) put(ctx context.Context, path string, id cairn.ID, data []byte) error {
	key := Key(s.prefix, id)
	return s.retry(ctx, "put", path, func() error { return s.b.Put(ctx, key, data) })
}

// Get reads the object and checks it against id: Kind Corrupt if it does
// not hash to id, NotFound if there is no such object.
func (s *Store) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	path := s.path(id)
	if err := s.begin(ctx, "get", path); err != nil {
		return nil, err
	}
	key := Key(s.prefix, id)
	var data []byte
	err := s.retry(ctx, "get", path, func() (err error) {
		data, err = s.b.Get(ctx, key, MaxObject)
		return err
	})
	if err != nil {
		return nil, err
	}
	if cairn.ID(blake3.Sum256(data)) != id {
		return nil, cairn.E("get", cairn.Corrupt, path, errors.New("stored object does not hash to its ID"))
	}
	return data, nil
}

// GetRange reads n bytes of the object from byte off (store.RangeReader)
// with one ranged GET, or one HEAD when n is 0. The bytes are not checked:
// a part cannot be checked against the whole object's ID. A range reaching
// past the object's end fails with Kind Invalid, a missing object with
// NotFound.
func (s *Store) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	path := s.path(id)
	if err := s.begin(ctx, "get range", path); err != nil {
		return nil, err
	}
	if off < 0 || n < 0 || n > MaxObject {
		return nil, cairn.E("get range", cairn.Invalid, path, fmt.Errorf("range of %d bytes at %d", n, off))
	}
	key := Key(s.prefix, id)
	if n == 0 {
		var (
			size int64
			ok   bool
		)
		err := s.retry(ctx, "get range", path, func() (err error) {
			size, ok, err = s.b.Head(ctx, key)
			return err
		})
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, cairn.E("get range", cairn.NotFound, path, nil)
		case off > size:
			return nil, cairn.E("get range", cairn.Invalid, path, fmt.Errorf("offset %d is past the end of the %d-byte object", off, size))
		}
		return []byte{}, nil
	}
	var data []byte
	err := s.retry(ctx, "get range", path, func() (err error) {
		data, err = s.b.GetRange(ctx, key, off, n)
		return err
	})
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != n {
		return nil, cairn.E("get range", cairn.Invalid, path, fmt.Errorf("range [%d, %d) reaches past the object's end (%d bytes read)", off, off+n, len(data)))
	}
	return data, nil
}

// GetRangeInto reads len(dst) bytes of the object from byte off into dst
// (store.RangeFiller): one ranged GET, read straight into dst when the
// bucket can (RangeFillBucket), else GetRange's bytes copied. As
// GetRange, the bytes are not checked; a range reaching past the object's
// end fails with Kind Invalid, a missing object with NotFound. On error
// dst may hold anything.
func (s *Store) GetRangeInto(ctx context.Context, id cairn.ID, off int64, dst []byte) error {
	fb, ok := s.b.(RangeFillBucket)
	if !ok || len(dst) == 0 {
		data, err := s.GetRange(ctx, id, off, int64(len(dst)))
		if err == nil {
			copy(dst, data)
		}
		return err
	}
	path := s.path(id)
	if err := s.begin(ctx, "get range", path); err != nil {
		return err
	}
	if off < 0 || len(dst) > MaxObject {
		return cairn.E("get range", cairn.Invalid, path, fmt.Errorf("range of %d bytes at %d", len(dst), off))
	}
	key := Key(s.prefix, id)
	return s.retry(ctx, "get range", path, func() error {
		return fb.GetRangeInto(ctx, key, off, dst)
	})
}

// Has sends one HEAD request per distinct ID, Options.HasWorkers at a time.
func (s *Store) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	if err := s.begin(ctx, "has", s.name); err != nil {
		return nil, err
	}
	found := make([]bool, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	// Ask once per distinct ID.
	index := make(map[cairn.ID]int, len(ids))
	var uniq []cairn.ID
	for _, id := range ids {
		if _, ok := index[id]; !ok {
			index[id] = len(uniq)
			uniq = append(uniq, id)
		}
	}
	present := make([]bool, len(uniq))
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(s.o.HasWorkers, len(uniq)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(uniq) || hctx.Err() != nil {
					return
				}
				key := Key(s.prefix, uniq[i])
				err := s.retry(hctx, "has", s.path(uniq[i]), func() (err error) {
					_, present[i], err = s.b.Head(hctx, key)
					return err
				})
				if err != nil {
					once.Do(func() { firstErr = err })
					cancel()
					return
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, cairn.E("has", cairn.Canceled, s.name, err)
	}
	if firstErr != nil {
		return nil, firstErr
	}
	for i, id := range ids {
		found[i] = present[index[id]]
	}
	return found, nil
}

// Delete removes the object; a missing object is not an error.
func (s *Store) Delete(ctx context.Context, id cairn.ID) error {
	path := s.path(id)
	if err := s.begin(ctx, "delete", path); err != nil {
		return err
	}
	key := Key(s.prefix, id)
	err := s.retry(ctx, "delete", path, func() error { return s.b.Delete(ctx, key) })
	if errors.Is(err, cairn.ErrNotFound) {
		return nil
	}
	return err
}

// List pages through the bucket's listing under the prefix and calls fn for
// each object named like a cairn object (see ParseKey); other keys are
// skipped. Each page is retried on its own, so a transient failure midway
// does not start the listing over.
func (s *Store) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	if err := s.begin(ctx, "list", s.name); err != nil {
		return err
	}
	lp := listPrefix(s.prefix)
	token := ""
	for {
		var (
			objs []Object
			next string
		)
		err := s.retry(ctx, "list", s.name, func() (err error) {
			objs, next, err = s.b.ListPage(ctx, lp, token, s.o.PageSize)
			return err
		})
		if err != nil {
			return err
		}
		for _, o := range objs {
			id, ok := ParseKey(s.prefix, o.Key)
			if !ok {
				continue
			}
			if err := ctx.Err(); err != nil {
				return cairn.E("list", cairn.Canceled, s.name, err)
			}
			if err := fn(id, o.Size); err != nil {
				return err
			}
		}
		if next == "" {
			return nil
		}
		if next == token {
			return cairn.E("list", cairn.Other, s.name, errors.New("the listing did not advance (the server returned the same page token)"))
		}
		token = next
	}
}

// Stats counts the objects and bytes under the prefix by listing them:
// one LIST request per Options.PageSize objects.
// Disk is Bytes: the provider's own overhead is not visible.
func (s *Store) Stats(ctx context.Context) (cairn.StoreUsage, error) {
	var u cairn.StoreUsage
	err := s.List(ctx, func(_ cairn.ID, size int64) error {
		u.Objects++
		u.Bytes += size
		return nil
	})
	if err != nil {
		return cairn.StoreUsage{}, err
	}
	u.Disk = u.Bytes
	return u, nil
}

// Close closes the SDK client. No method may be called after.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.b.Close(); err != nil {
		return cairn.E("close", cairn.Other, s.name, err)
	}
	return nil
}
