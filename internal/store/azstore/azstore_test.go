package azstore

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/cloudtest"
	"cairn.dev/cairn/internal/store/objstore"
)

// TestAzurite runs the cloud store suite against Azurite, reached the
// standard way: AZURE_STORAGE_CONNECTION_STRING.
func TestAzurite(t *testing.T) {
	a := cloudtest.StartAzurite(t)
	t.Setenv(EnvAccount, "")
	t.Setenv(EnvKey, "")
	t.Setenv(EnvConnectionString, a.ConnectionString)
	open := func(t *testing.T, prefix string, so objstore.Options) *objstore.Store {
		t.Helper()
		o, err := FromURL("azblob://" + a.Container + "/" + prefix)
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
	raw := a.Client(t)
	cloudtest.RunStore(t, cloudtest.Backend{
		Open: open,
		OpenAt: func(t *testing.T, addr, prefix string, so objstore.Options) *objstore.Store {
			t.Setenv(EnvConnectionString, strings.Replace(a.ConnectionString, a.Addr, addr, 1))
			return open(t, prefix, so)
		},
		OpenRefused: func(t *testing.T, prefix string) *objstore.Store {
			// Another key for the same account: the signatures do not
			// match. Restored when the subtest ends.
			t.Setenv(EnvConnectionString, a.ConnectionStringWithKey(base64.StdEncoding.EncodeToString([]byte("not the account key of devstoreaccount1"))))
			return open(t, prefix, objstore.Options{})
		},
		RawPut: func(t *testing.T, key string, data []byte) {
			if _, err := raw.UploadBuffer(context.Background(), a.Container, key, data, nil); err != nil {
				t.Fatal(err)
			}
		},
		Stop: a.Stop,
	})
}

func TestCredentialsFromEnvironment(t *testing.T) {
	t.Setenv(EnvConnectionString, "")
	t.Setenv(EnvAccount, "")
	t.Setenv(EnvKey, "")
	if _, err := New(context.Background(), Options{Container: "abc"}); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("New without credentials: %v, want Permission", err)
	}
	t.Setenv(EnvAccount, "someaccount")
	t.Setenv(EnvKey, base64.StdEncoding.EncodeToString([]byte("key")))
	s, err := New(context.Background(), Options{Container: "abc"})
	if err != nil {
		t.Fatalf("New with account and key: %v", err)
	}
	s.Close()
	t.Setenv(EnvKey, "not base64!")
	if _, err := New(context.Background(), Options{Container: "abc"}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("New with a malformed key: %v, want Invalid", err)
	}
}
