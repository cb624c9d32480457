package s3store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
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
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true") // only 127.0.0.1, whatever happens
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
	t.Run("SharedCredentialsFile", func(t *testing.T) {
		// No keys in the environment: the profile named by AWS_PROFILE
		// in the shared credentials file.
		file := filepath.Join(t.TempDir(), "credentials")
		text := "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong-secret\n\n" +
			"[cairn]\naws_access_key_id = " + m.AccessKey + "\naws_secret_access_key = " + m.SecretKey + "\n"
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("AWS_ACCESS_KEY_ID", "")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "")
		t.Setenv("AWS_SHARED_CREDENTIALS_FILE", file)
		t.Setenv("AWS_PROFILE", "cairn")
		s := open(t, m.Endpoint, "cairn/profile", objstore.Options{})
		defer s.Close()
		id, data := storetest.Blob(2, 100)
		if err := s.Put(context.Background(), id, data); err != nil {
			t.Fatalf("Put with the cairn profile: %v", err)
		}
		t.Setenv("AWS_PROFILE", "default")
		s2 := open(t, m.Endpoint, "cairn/profile", objstore.Options{})
		defer s2.Close()
		if _, err := s2.Get(context.Background(), id); !errors.Is(err, cairn.ErrPermission) {
			t.Fatalf("Get with the default profile's wrong keys: %v, want Permission", err)
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
