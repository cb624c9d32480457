// Package gcsstore is a cairn.Store in a Google Cloud Storage bucket,
// through cloud.google.com/go/storage (JSON API over HTTP). The store
// itself is objstore's: this package maps its few bucket operations onto
// the SDK.
//
// A store is named by a URL
//
//	gs://BUCKET/PREFIX
//
// Objects are named as objstore.Key says (doc/format.md, "Cloud stores").
//
// Credentials are Google's Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the
// metadata server), never the URL or the command line; without any,
// requests go unauthenticated and fail with Kind Permission on a private
// bucket. STORAGE_EMULATOR_HOST=HOST:PORT sends everything, without
// credentials, to an emulator (the client library honours it). The
// library's own metrics export to Cloud Monitoring is turned off.
//
// Each SDK call made here is one request and is counted as such
// (objstore.Requests): object metadata reads count as HEAD.
package gcsstore

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"strings"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/objstore"
)

// Scheme is the URL scheme of GCS stores.
const Scheme = "gs"

// Options configure a store. FromURL fills Bucket and Prefix.
type Options struct {
	Bucket string // required: 3 to 222 characters of a-z, 0-9, '.', '-', '_'
	Prefix string // objects go under PREFIX/; "" for the bucket's root
	// ClientOptions are added to the client's (an endpoint, a
	// credentials file, an HTTP client). For tests and embedding; the
	// CLI never sets them.
	ClientOptions []option.ClientOption
	// Store tunes retries, Has concurrency and logging.
	Store objstore.Options
}

// FromURL parses gs://BUCKET/PREFIX.
func FromURL(raw string) (Options, error) {
	u, err := objstore.ParseURL(raw, Scheme)
	if err != nil {
		return Options{}, err
	}
	o := Options{Bucket: u.Bucket, Prefix: u.Prefix}
	if err := o.check(); err != nil {
		return Options{}, cairn.E("parse store URL", cairn.Invalid, raw, err)
	}
	return o, nil
}

// URL returns the store's URL.
func (o Options) URL() string {
	return objstore.URL{Scheme: Scheme, Bucket: o.Bucket, Prefix: strings.Trim(o.Prefix, "/")}.String()
}

func (o Options) check() error {
	if n := len(o.Bucket); n < 3 || n > 222 {
		return fmt.Errorf("bucket %q: want 3 to 222 characters", o.Bucket)
	}
	for _, c := range []byte(o.Bucket) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("bucket %q: character %q, want a-z, 0-9, '.', '-', '_'", o.Bucket, c)
		}
	}
	return nil
}

// New returns a store in the bucket. It makes no request to the bucket; it
// may look up Application Default Credentials.
func New(ctx context.Context, o Options) (*objstore.Store, error) {
	if err := o.check(); err != nil {
		return nil, cairn.E("gcs store", cairn.Invalid, o.URL(), err)
	}
	opts := append([]option.ClientOption{storage.WithDisabledClientMetrics()}, o.ClientOptions...)
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, cairn.E("gcs store", cairn.Canceled, o.URL(), ctx.Err())
		}
		return nil, cairn.E("gcs store", cairn.Other, o.URL(), err)
	}
	client.SetRetry(storage.WithPolicy(storage.RetryNever)) // objstore retries
	n := new(objstore.Counter)
	b := &bucket{c: client, b: client.Bucket(o.Bucket), n: n}
	return objstore.New(o.URL(), o.Prefix, b, n, o.Store), nil
}

// bucket is objstore.Bucket over the GCS client.
type bucket struct {
	c *storage.Client
	b *storage.BucketHandle
	n *objstore.Counter
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (b *bucket) Put(ctx context.Context, key string, data []byte) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a failed write leaves nothing behind
	b.n.Add(objstore.PUT)
	w := b.b.Object(key).NewWriter(ctx)
	w.ChunkSize = 0 // one request, no buffer copy
	w.ContentType = "application/octet-stream"
	w.CRC32C = crc32.Checksum(data, castagnoli)
	w.SendCRC32C = true // the service checks what arrived
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

func (b *bucket) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	return b.read(ctx, key, 0, -1, limit)
}

func (b *bucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	return b.read(ctx, key, off, n, n)
}

// read sends one GET of length bytes from off (-1: to the end) and reads
// the body: at most limit bytes, and all the bytes the reply announced.
func (b *bucket) read(ctx context.Context, key string, off, length, limit int64) ([]byte, error) {
	b.n.Add(objstore.GET)
	r, err := b.b.Object(key).NewRangeReader(ctx, off, length)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return objstore.ReadBody(r, r.Remain(), limit, key)
}

func (b *bucket) Head(ctx context.Context, key string) (int64, bool, error) {
	b.n.Add(objstore.HEAD)
	a, err := b.b.Object(key).Attrs(ctx)
	switch {
	case err == nil:
		return a.Size, true, nil
	case errors.Is(err, storage.ErrObjectNotExist):
		return 0, false, nil
	}
	return 0, false, err
}

func (b *bucket) Delete(ctx context.Context, key string) error {
	b.n.Add(objstore.DELETE)
	err := b.b.Object(key).Delete(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil
	}
	return err
}

// maxPage is the most objects the JSON API lists in one reply.
const maxPage = 1000

func (b *bucket) ListPage(ctx context.Context, prefix, token string, limit int) ([]objstore.Object, string, error) {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size"}); err != nil {
		return nil, "", err
	}
	b.n.Add(objstore.LIST)
	var attrs []*storage.ObjectAttrs
	next, err := iterator.NewPager(b.b.Objects(ctx, q), min(limit, maxPage), token).NextPage(&attrs)
	if err != nil {
		return nil, "", err
	}
	objs := make([]objstore.Object, len(attrs))
	for i, a := range attrs {
		objs[i] = objstore.Object{Key: a.Name, Size: a.Size}
	}
	return objs, next, nil
}

// Kind classifies the client's errors: the library's not-exist errors,
// then the HTTP status of a googleapi.Error, then the network.
func (b *bucket) Kind(err error) cairn.Kind {
	var ge *googleapi.Error
	switch {
	case errors.Is(err, storage.ErrObjectNotExist), errors.Is(err, storage.ErrBucketNotExist):
		return cairn.NotFound
	case errors.As(err, &ge):
		if ge.Code == http.StatusBadRequest {
			for _, e := range ge.Errors {
				if e.Reason == "invalid" && strings.Contains(strings.ToLower(e.Message), "crc32c") {
					return cairn.IO // damaged on the way: sending again may succeed
				}
			}
		}
		if k := objstore.HTTPKind(ge.Code); k != cairn.Other {
			return k
		}
	}
	return objstore.NetKind(err)
}

func (b *bucket) Close() error { return b.c.Close() }
