// Package azstore is a cairn.Store in an Azure Blob Storage container,
// through github.com/Azure/azure-sdk-for-go/sdk/storage/azblob. The store
// itself is objstore's: this package maps its few bucket operations onto
// the SDK. Objects are block blobs written in one Put Blob request.
//
// A store is named by a URL
//
//	azblob://CONTAINER/PREFIX
//
// Objects are named as objstore.Key says (doc/format.md, "Cloud stores").
//
// Credentials never come from the URL or the command line, only from the
// environment: AZURE_STORAGE_CONNECTION_STRING (which may also name the
// endpoint: BlobEndpoint=..., as for the Azurite emulator), or else
// AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY for
// https://ACCOUNT.blob.core.windows.net/.
//
// Each SDK call made here is one request and is counted as such
// (objstore.Requests): Get Blob Properties counts as HEAD.
package azstore

import (
	"bytes"
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/objstore"
)

// Scheme is the URL scheme of Azure Blob stores.
const Scheme = "azblob"

// The environment variables credentials are read from.
const (
	EnvConnectionString = "AZURE_STORAGE_CONNECTION_STRING"
	EnvAccount          = "AZURE_STORAGE_ACCOUNT"
	EnvKey              = "AZURE_STORAGE_KEY"
)

// Options configure a store. FromURL fills Container and Prefix.
type Options struct {
	Container string // required: 3 to 63 characters of a-z, 0-9, '-'
	Prefix    string // objects go under PREFIX/; "" for the container's root
	// ConnectionString, or else Account and Key, replace the
	// environment's. For tests and embedding; the CLI never sets them.
	ConnectionString string
	Account, Key     string
	// Transport replaces the HTTP client (policy.Transporter, which
	// *http.Client satisfies).
	Transport policy.Transporter
	// Store tunes retries, Has concurrency and logging.
	Store objstore.Options
}

// FromURL parses azblob://CONTAINER/PREFIX.
func FromURL(raw string) (Options, error) {
	u, err := objstore.ParseURL(raw, Scheme)
	if err != nil {
		return Options{}, err
	}
	o := Options{Container: u.Bucket, Prefix: u.Prefix}
	if err := o.check(); err != nil {
		return Options{}, cairn.E("parse store URL", cairn.Invalid, raw, err)
	}
	return o, nil
}

// URL returns the store's URL.
func (o Options) URL() string {
	return objstore.URL{Scheme: Scheme, Bucket: o.Container, Prefix: strings.Trim(o.Prefix, "/")}.String()
}

func (o Options) check() error {
	c := o.Container
	if n := len(c); n < 3 || n > 63 {
		return fmt.Errorf("container %q: want 3 to 63 characters", c)
	}
	for i := range len(c) {
		ch := c[i]
		if !('a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-') {
			return fmt.Errorf("container %q: character %q, want a-z, 0-9, '-'", c, ch)
		}
	}
	if c[0] == '-' || c[len(c)-1] == '-' || strings.Contains(c, "--") {
		return fmt.Errorf("container %q: '-' may not begin or end it or come twice in a row", c)
	}
	return nil
}

// New returns a store in the container. It makes no request: a container
// that does not exist, or credentials that are refused, show in the first
// call.
func New(ctx context.Context, o Options) (*objstore.Store, error) {
	if err := o.check(); err != nil {
		return nil, cairn.E("azure store", cairn.Invalid, o.URL(), err)
	}
	copts := &azblob.ClientOptions{ClientOptions: azcore.ClientOptions{
		Retry:     policy.RetryOptions{MaxRetries: -1}, // objstore retries
		Transport: o.Transport,
	}}
	conn, account, key := o.ConnectionString, o.Account, o.Key
	if conn == "" && account == "" {
		conn, account, key = os.Getenv(EnvConnectionString), os.Getenv(EnvAccount), os.Getenv(EnvKey)
	}
	var (
		client *azblob.Client
		err    error
	)
	switch {
	case conn != "":
		client, err = azblob.NewClientFromConnectionString(conn, copts)
	case account != "" && key != "":
		var cred *azblob.SharedKeyCredential
		if cred, err = azblob.NewSharedKeyCredential(account, key); err == nil {
			client, err = azblob.NewClientWithSharedKeyCredential("https://"+account+".blob.core.windows.net/", cred, copts)
		}
	default:
		return nil, cairn.E("azure store", cairn.Permission, o.URL(),
			fmt.Errorf("no credentials: set %s, or %s and %s", EnvConnectionString, EnvAccount, EnvKey))
	}
	if err != nil {
		// The messages of these errors never include the key.
		return nil, cairn.E("azure store", cairn.Invalid, o.URL(), err)
	}
	n := new(objstore.Counter)
	b := &bucket{c: client.ServiceClient().NewContainerClient(o.Container), n: n}
	return objstore.New(o.URL(), o.Prefix, b, n, o.Store), nil
}

// bucket is objstore.Bucket over a container client.
type bucket struct {
	c *container.Client
	n *objstore.Counter
}

func (b *bucket) Put(ctx context.Context, key string, data []byte) error {
	sum := md5.Sum(data)
	ct := "application/octet-stream"
	b.n.Add(objstore.PUT)
	_, err := b.c.NewBlockBlobClient(key).Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{
		HTTPHeaders: &blob.HTTPHeaders{BlobContentType: &ct},
		// The service checks what arrived.
		TransactionalValidation: blob.TransferValidationTypeMD5(sum[:]),
	})
	return err
}

func (b *bucket) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	return b.read(ctx, key, nil, limit)
}

func (b *bucket) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	return b.read(ctx, key, &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: n}}, n)
}

// read sends one Get Blob and reads the body: at most limit bytes, and all
// the bytes the reply announced.
func (b *bucket) read(ctx context.Context, key string, opts *blob.DownloadStreamOptions, limit int64) ([]byte, error) {
	b.n.Add(objstore.GET)
	resp, err := b.c.NewBlobClient(key).DownloadStream(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	size := int64(-1)
	if resp.ContentLength != nil {
		size = *resp.ContentLength
	}
	return objstore.ReadBody(resp.Body, size, limit, key)
}

func (b *bucket) Head(ctx context.Context, key string) (int64, bool, error) {
	b.n.Add(objstore.HEAD)
	p, err := b.c.NewBlobClient(key).GetProperties(ctx, nil)
	if err == nil {
		var size int64
		if p.ContentLength != nil {
			size = *p.ContentLength
		}
		return size, true, nil
	}
	// A HEAD reply has no body: the error code comes from a header, and
	// a missing container answers 404 too.
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return 0, false, nil
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusNotFound && !bloberror.HasCode(err, bloberror.ContainerNotFound) {
		return 0, false, nil
	}
	return 0, false, err
}

func (b *bucket) Delete(ctx context.Context, key string) error {
	b.n.Add(objstore.DELETE)
	_, err := b.c.NewBlobClient(key).Delete(ctx, nil)
	if bloberror.HasCode(err, bloberror.BlobNotFound) {
		return nil
	}
	return err
}

// maxPage is the most blobs the service lists in one reply.
const maxPage = 5000

func (b *bucket) ListPage(ctx context.Context, prefix, token string, limit int) ([]objstore.Object, string, error) {
	opts := &container.ListBlobsFlatOptions{MaxResults: ptr(int32(min(limit, maxPage)))}
	if prefix != "" {
		opts.Prefix = &prefix
	}
	if token != "" {
		opts.Marker = &token
	}
	b.n.Add(objstore.LIST)
	resp, err := b.c.NewListBlobsFlatPager(opts).NextPage(ctx)
	if err != nil {
		return nil, "", err
	}
	var objs []objstore.Object
	if resp.Segment != nil {
		for _, it := range resp.Segment.BlobItems {
			if it == nil || it.Name == nil {
				continue
			}
			var size int64
			if it.Properties != nil && it.Properties.ContentLength != nil {
				size = *it.Properties.ContentLength
			}
			objs = append(objs, objstore.Object{Key: *it.Name, Size: size})
		}
	}
	next := ""
	if resp.NextMarker != nil {
		next = *resp.NextMarker
	}
	return objs, next, nil
}

func ptr[T any](v T) *T { return &v }

// Kind classifies the SDK's errors: Blob service error codes first, then
// the HTTP status, then the network.
func (b *bucket) Kind(err error) cairn.Kind {
	switch {
	case bloberror.HasCode(err, bloberror.BlobNotFound, bloberror.ContainerNotFound):
		return cairn.NotFound
	case bloberror.HasCode(err, bloberror.AuthenticationFailed, bloberror.AuthorizationFailure,
		bloberror.AuthorizationPermissionMismatch, bloberror.InsufficientAccountPermissions,
		bloberror.AccountIsDisabled, bloberror.InvalidAuthenticationInfo):
		return cairn.Permission
	case bloberror.HasCode(err, bloberror.ServerBusy, bloberror.OperationTimedOut, bloberror.InternalError):
		return cairn.Unavailable
	case bloberror.HasCode(err, bloberror.MD5Mismatch, bloberror.InvalidMD5):
		return cairn.IO // damaged on the way: sending again may succeed
	}
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		if k := objstore.HTTPKind(re.StatusCode); k != cairn.Other {
			return k
		}
	}
	return objstore.NetKind(err)
}

func (b *bucket) Close() error { return nil }
