package gcsstore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"

	"cairn.dev/cairn/internal/store/cloudtest"
	"cairn.dev/cairn/internal/store/objstore"
)

// TestFakeGCS runs the cloud store suite against fake-gcs-server, reached
// the standard way: STORAGE_EMULATOR_HOST.
func TestFakeGCS(t *testing.T) {
	g := cloudtest.StartFakeGCS(t)
	t.Setenv("STORAGE_EMULATOR_HOST", g.Host)
	open := func(t *testing.T, prefix string, so objstore.Options, copts ...option.ClientOption) *objstore.Store {
		t.Helper()
		o, err := FromURL("gs://" + g.Bucket + "/" + prefix)
		if err != nil {
			t.Fatal(err)
		}
		o.Store, o.ClientOptions = so, copts
		s, err := New(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	raw, err := storage.NewClient(context.Background(), storage.WithDisabledClientMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	cloudtest.RunStore(t, cloudtest.Backend{
		Open: func(t *testing.T, prefix string, so objstore.Options) *objstore.Store { return open(t, prefix, so) },
		OpenAt: func(t *testing.T, addr, prefix string, so objstore.Options) *objstore.Store {
			return open(t, prefix, so, option.WithEndpoint("http://"+addr+"/storage/v1/"))
		},
		// fake-gcs-server checks no credentials: the refusal comes from
		// a stand-in that answers every request as GCS does a request
		// without valid credentials.
		OpenRefused: func(t *testing.T, prefix string) *objstore.Store {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json; charset=UTF-8")
				w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/"`)
				w.WriteHeader(http.StatusUnauthorized)
				if r.Method != http.MethodHead {
					_, _ = w.Write([]byte(`{"error":{"code":401,"message":"Invalid Credentials","errors":[{"message":"Invalid Credentials","domain":"global","reason":"authError","locationType":"header","location":"Authorization"}]}}`))
				}
			}))
			t.Cleanup(srv.Close)
			return open(t, prefix, objstore.Options{}, option.WithEndpoint(srv.URL+"/storage/v1/"))
		},
		RawPut: func(t *testing.T, key string, data []byte) {
			w := raw.Bucket(g.Bucket).Object(key).NewWriter(context.Background())
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		},
		Stop: g.Stop,
	})
}
