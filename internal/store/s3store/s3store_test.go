package s3store

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/minio/minio-go/v7"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/cloudtest"
	"cairn.dev/cairn/internal/store/objstore"
	"cairn.dev/cairn/internal/store/storetest"
)

// TestMinIO runs the cloud store suite against a real MinIO. Credentials
// reach the store the standard way, through the environment.
func TestMinIO(t *testing.T) {
	m := cloudtest.StartMinIO(t)
	// Keep the user's ~/.aws out of it.
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_ACCESS_KEY_ID", m.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", m.SecretKey)
	open := func(t *testing.T, addr, prefix string, so objstore.Options) *objstore.Store {
		t.Helper()
		o, err := FromURL("s3://" + m.Bucket + "/" + prefix + "?insecure=1&endpoint=" + addr)
		if err != nil {
			t.Fatal(err)
		}
		o.Store = so
		s, err := New(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	raw := m.Client(t)
	t.Run("MissingBucket", func(t *testing.T) {
		s, err := New(context.Background(), Options{Bucket: "no-such-bucket", Endpoint: m.Endpoint, Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		id, data := storetest.Blob(1, 100)
		if err := s.Put(context.Background(), id, data); !errors.Is(err, cairn.ErrNotFound) {
			t.Fatalf("Put into a missing bucket: %v, want NotFound", err)
		}
		if _, err := s.Get(context.Background(), id); !errors.Is(err, cairn.ErrNotFound) {
			t.Fatalf("Get from a missing bucket: %v, want NotFound", err)
		}
	})
	cloudtest.RunStore(t, cloudtest.Backend{
		Open: func(t *testing.T, prefix string, so objstore.Options) *objstore.Store {
			return open(t, m.Endpoint, prefix, so)
		},
		OpenAt: open,
		OpenRefused: func(t *testing.T, prefix string) *objstore.Store {
			// Restored when the subtest ends.
			t.Setenv("AWS_SECRET_ACCESS_KEY", "not-"+m.SecretKey)
			return open(t, m.Endpoint, prefix, objstore.Options{})
		},
		RawPut: func(t *testing.T, key string, data []byte) {
			_, err := raw.PutObject(context.Background(), m.Bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
		},
		Stop: m.Stop,
	})
}
