// Package s3store is a cairn.Store in a bucket of Amazon S3 or an
// S3-compatible service (MinIO, Ceph RGW, Garage, ...), through
// github.com/minio/minio-go/v7. The store itself is objstore's: this
// package maps its few bucket operations onto the SDK.
//
// A store is named by a URL
//
//	s3://BUCKET/PREFIX?endpoint=HOST:PORT&region=REGION&insecure=1
//
// where every parameter is optional: endpoint defaults to Amazon
// (s3.amazonaws.com), region to what the service reports (us-east-1 when
// an endpoint is given), insecure=1 speaks plain HTTP. Objects are named
// as objstore.Key says (doc/format.md, "Cloud stores").
//
// Credentials never come from the URL or the command line, only from the
// standard places, in this order: the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared files
// (~/.aws/credentials and ~/.aws/config, or AWS_SHARED_CREDENTIALS_FILE
// and AWS_CONFIG_FILE, profile AWS_PROFILE), then the EC2/ECS instance
// role (unless AWS_EC2_METADATA_DISABLED=true). Without any, requests are
// anonymous.
//
// Requests are counted as the HTTP transport sends them (objstore.Requests):
// a GET with list-type is a LIST, other GETs, HEADs, PUTs and DELETEs are
// their own class; the one bucket-location lookup made when no region is
// known is not counted.
package s3store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/objstore"
)

// Scheme is the URL scheme of S3 stores.
const Scheme = "s3"

// Options configure a store. FromURL fills Bucket, Prefix, Endpoint,
// Region and Insecure.
type Options struct {
	Bucket string // required: 3 to 63 characters of a-z, 0-9, '.', '-'
	Prefix string // objects go under PREFIX/; "" for the bucket's root
	// Endpoint is the service's host[:port]; "" is Amazon S3.
	Endpoint string
	// Region is the bucket's region. "" lets the SDK ask the service
	// (one uncounted request) for Amazon, and is us-east-1 otherwise.
	Region string
	// Insecure speaks plain HTTP instead of HTTPS.
	Insecure bool
	// Credentials replaces the standard chain (see the package comment).
	// For tests and embedding; the CLI never sets it.
	Credentials *credentials.Credentials
	// Transport replaces the HTTP transport (requests are still counted).
	Transport http.RoundTripper
	// Store tunes retries, Has concurrency and logging.
	Store objstore.Options
}

// FromURL parses s3://BUCKET/PREFIX?endpoint=HOST:PORT&region=R&insecure=1.
func FromURL(raw string) (Options, error) {
	u, err := objstore.ParseURL(raw, Scheme, "endpoint", "region", "insecure")
	if err != nil {
		return Options{}, err
	}
	o := Options{Bucket: u.Bucket, Prefix: u.Prefix, Endpoint: u.Get("endpoint"), Region: u.Get("region")}
	if o.Insecure, err = u.Bool("insecure"); err != nil {
		return Options{}, err
	}
	if err := o.check(); err != nil {
		return Options{}, cairn.E("parse store URL", cairn.Invalid, raw, err)
	}
	return o, nil
}

// URL returns the store's URL: FromURL of it gives back the same location.
func (o Options) URL() string {
	u := objstore.URL{Scheme: Scheme, Bucket: o.Bucket, Prefix: strings.Trim(o.Prefix, "/"), Query: url.Values{}}
	if o.Endpoint != "" {
		u.Query.Set("endpoint", o.Endpoint)
	}
	if o.Region != "" {
		u.Query.Set("region", o.Region)
	}
	if o.Insecure {
		u.Query.Set("insecure", "1")
	}
	return u.String()
}

func (o Options) check() error {
	if n := len(o.Bucket); n < 3 || n > 63 {
		return fmt.Errorf("bucket %q: want 3 to 63 characters", o.Bucket)
	}
	for _, c := range []byte(o.Bucket) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("bucket %q: character %q, want a-z, 0-9, '.', '-'", o.Bucket, c)
		}
	}
	if o.Endpoint != "" {
		host := o.Endpoint
		if h, port, err := net.SplitHostPort(o.Endpoint); err == nil {
			if port == "" {
				return fmt.Errorf("endpoint %q: empty port", o.Endpoint)
			}
			host = h
		}
		if host == "" || strings.ContainsAny(o.Endpoint, "/?#@ \t\\") {
			return fmt.Errorf("endpoint %q: want HOST or HOST:PORT", o.Endpoint)
		}
	}
	for _, c := range []byte(o.Region) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("region %q: character %q", o.Region, c)
		}
	}
	return nil
}

// StandardCredentials is the chain used when Options.Credentials is nil:
// environment, shared files, instance role. AWS_EC2_METADATA_DISABLED=true
// leaves the instance role out, as the AWS SDKs do. When no step finds
// credentials the chain runs again for each request, so the instance-role
// step is bounded (2 s) for machines that have no metadata service.
func StandardCredentials() *credentials.Credentials {
	providers := []credentials.Provider{&credentials.EnvAWS{}, &credentials.FileAWSCredentials{}}
	if !strings.EqualFold(os.Getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		providers = append(providers, &credentials.IAM{Client: &http.Client{Transport: http.DefaultTransport, Timeout: 2 * time.Second}})
	}
	return credentials.NewChainCredentials(providers)
}

// New returns a store in the bucket. It makes no request: a bucket that
// does not exist, or credentials that are refused, show in the first call.
func New(ctx context.Context, o Options) (*objstore.Store, error) {
	if err := o.check(); err != nil {
		return nil, cairn.E("s3 store", cairn.Invalid, o.URL(), err)
	}
	endpoint, region := o.Endpoint, o.Region
	if endpoint == "" {
		endpoint = "s3.amazonaws.com"
	} else if region == "" {
		region = "us-east-1"
	}
	creds := o.Credentials
	if creds == nil {
		creds = StandardCredentials()
	}
	base := o.Transport
	if base == nil {
		tr, err := minio.DefaultTransport(!o.Insecure)
		if err != nil {
			return nil, cairn.E("s3 store", cairn.Other, o.URL(), err)
		}
		base = tr
	}
	n := new(objstore.Counter)
	client, err := minio.New(endpoint, &minio.Options{
		Creds:      creds,
		Secure:     !o.Insecure,
		Region:     region,
		Transport:  &countingTransport{base: base, n: n},
		MaxRetries: 1, // objstore retries
	})
	if err != nil {
		return nil, cairn.E("s3 store", cairn.Invalid, o.URL(), err)
	}
	b := &bucket{c: client, name: o.Bucket}
	return objstore.New(o.URL(), o.Prefix, b, n, o.Store), nil
}

// countingTransport counts requests by class as they are sent.
type countingTransport struct {
	base http.RoundTripper
	n    *objstore.Counter
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	switch req.Method {
	case http.MethodPut:
		t.n.Add(objstore.PUT)
	case http.MethodHead:
		t.n.Add(objstore.HEAD)
	case http.MethodDelete:
		t.n.Add(objstore.DELETE)
	case http.MethodGet:
		switch {
		case q.Has("list-type"):
			t.n.Add(objstore.LIST)
		case q.Has("location"):
			// The SDK's region lookup: not one of ours.
		default:
			t.n.Add(objstore.GET)
		}
	}
	return t.base.RoundTrip(req)
}

// bucket is objstore.Bucket over minio-go.
type bucket struct {
	c    *minio.Client
	name string
}

func (b *bucket) Put(ctx context.Context, key string, data []byte) error {
	_, err := b.c.PutObject(ctx, b.name, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{
		ContentType:      "application/octet-stream",
		DisableMultipart: true, // one request; objects are at most objstore.MaxObject
		SendContentMd5:   true, // the service checks what arrived
		// UNSIGNED-PAYLOAD: over plain HTTP minio-go would otherwise sign
		// the body in 64 KiB chunks (aws-chunked), hashing every byte with
		// SHA-256 here and again at the service, which Content-MD5 above
		// makes redundant for integrity (the signature still covers the
		// headers, Content-MD5 among them; over HTTPS minio-go never
		// signs the body). Objects are named by their BLAKE3 and checked
		// on every read.
		DisableContentSha256: true,
	})
	return err
}

func (b *bucket) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	return b.read(ctx, key, minio.GetObjectOptions{}, limit)
}

func (b *bucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, cairn.E("get range", cairn.Invalid, key, err)
	}
	return b.read(ctx, key, opts, n)
}

// GetRangeInto reads len(dst) bytes of key from off straight into dst
// (objstore.RangeFillBucket): no buffer is allocated per read.
func (b *bucket) GetRangeInto(ctx context.Context, key string, off int64, dst []byte) error {
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+int64(len(dst))-1); err != nil {
		return cairn.E("get range", cairn.Invalid, key, err)
	}
	rc, _, h, err := minio.Core{Client: b.c}.GetObject(ctx, b.name, key, opts)
	if err != nil {
		return err
	}
	defer rc.Close()
	size := int64(-1)
	if cl := h.Get("Content-Length"); cl != "" {
		if size, err = strconv.ParseInt(cl, 10, 64); err != nil || size < 0 {
			return fmt.Errorf("bad Content-Length %q", cl)
		}
	}
	return objstore.ReadBodyInto(rc, size, dst, key)
}

// read sends one GET and reads the body: at most limit bytes, and all the
// bytes the reply announced.
func (b *bucket) read(ctx context.Context, key string, opts minio.GetObjectOptions, limit int64) ([]byte, error) {
	rc, _, h, err := minio.Core{Client: b.c}.GetObject(ctx, b.name, key, opts)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	size := int64(-1)
	if cl := h.Get("Content-Length"); cl != "" {
		if size, err = strconv.ParseInt(cl, 10, 64); err != nil || size < 0 {
			return nil, fmt.Errorf("bad Content-Length %q", cl)
		}
	}
	return objstore.ReadBody(rc, size, limit, key)
}

func (b *bucket) Head(ctx context.Context, key string) (int64, bool, error) {
	info, err := b.c.StatObject(ctx, b.name, key, minio.StatObjectOptions{})
	if err == nil {
		return info.Size, true, nil
	}
	if er := toResponse(err); er != nil && (er.StatusCode == http.StatusNotFound && er.Code != "NoSuchBucket") {
		return 0, false, nil
	}
	return 0, false, err
}

func (b *bucket) Delete(ctx context.Context, key string) error {
	return b.c.RemoveObject(ctx, b.name, key, minio.RemoveObjectOptions{})
}

// maxPage is the most keys S3 lists in one reply.
const maxPage = 1000

// ListPage lists up to limit keys after token, the last key of the
// previous page (S3's start-after): minio-go hides continuation tokens,
// and sends a page's request only when the one before is used up.
func (b *bucket) ListPage(ctx context.Context, prefix, token string, limit int) ([]objstore.Object, string, error) {
	limit = min(limit, maxPage)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fetchOwner := false
	var objs []objstore.Object
	for info := range b.c.ListObjectsIter(ctx, b.name, minio.ListObjectsOptions{
		Prefix: prefix, Recursive: true, StartAfter: token, MaxKeys: limit, FetchOwner: &fetchOwner,
	}) {
		if info.Err != nil {
			return nil, "", info.Err
		}
		objs = append(objs, objstore.Object{Key: info.Key, Size: info.Size})
		if len(objs) == limit {
			return objs, info.Key, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err // the iterator stops quietly when ctx is done
	}
	return objs, "", nil
}

func toResponse(err error) *minio.ErrorResponse {
	var er minio.ErrorResponse
	if errors.As(err, &er) {
		return &er
	}
	var erp *minio.ErrorResponse
	if errors.As(err, &erp) {
		return erp
	}
	return nil
}

// Kind classifies minio-go's errors: S3 error codes first, then the HTTP
// status, then the network.
func (b *bucket) Kind(err error) cairn.Kind {
	if er := toResponse(err); er != nil && (er.Code != "" || er.StatusCode != 0) {
		switch er.Code {
		case "NoSuchKey", "NoSuchBucket":
			return cairn.NotFound
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
			"InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem":
			return cairn.Permission
		case "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout", "XMinioServerNotInitialized":
			return cairn.Unavailable
		case "BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "IncompleteBody":
			return cairn.IO // damaged on the way: sending again may succeed
		}
		if k := objstore.HTTPKind(er.StatusCode); k != cairn.Other {
			return k
		}
	}
	return objstore.NetKind(err)
}

func (b *bucket) Close() error { return nil }
