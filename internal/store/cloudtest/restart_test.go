package cloudtest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"cairn.dev/cairn/internal/store/cloudtest"
)

// TestRestart stores an object in each server, stops it (requests then
// fail), restarts it and reads the object back from the same address.
// Two MinIOs started with the same credentials both take them.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	t.Run("MinIO", func(t *testing.T) {
		o := cloudtest.MinIOOptions{AccessKey: "cairnsame", SecretKey: "secret-same-1234"}
		m := cloudtest.StartMinIOWith(t, o)
		m2 := cloudtest.StartMinIOWith(t, o)
		if m2.AccessKey != m.AccessKey || m2.Endpoint == m.Endpoint {
			t.Fatalf("two servers: %s %s", m.Endpoint, m2.Endpoint)
		}
		put := func(m *cloudtest.MinIO) error {
			_, err := m.Client(t).PutObject(ctx, m.Bucket, "k", strings.NewReader("v1"), 2, minio.PutObjectOptions{})
			return err
		}
		get := func() (string, error) {
			obj, err := m.Client(t).GetObject(ctx, m.Bucket, "k", minio.GetObjectOptions{})
			if err != nil {
				return "", err
			}
			b, err := io.ReadAll(obj)
			return string(b), err
		}
		if err := put(m); err != nil {
			t.Fatal(err)
		}
		if err := put(m2); err != nil {
			t.Fatal(err)
		}
		m.Stop()
		if _, err := get(); err == nil {
			t.Fatal("a stopped server answered")
		}
		m.Restart(t)
		if v, err := get(); err != nil || v != "v1" {
			t.Fatalf("after restart: %q %v", v, err)
		}
	})
	t.Run("FakeGCS", func(t *testing.T) {
		g := cloudtest.StartFakeGCSWith(t, cloudtest.FakeGCSOptions{OnDisk: true})
		url := fmt.Sprintf("http://%s/upload/storage/v1/b/%s/o?uploadType=media&name=ab/k", g.Host, g.Bucket)
		resp, err := http.Post(url, "application/octet-stream", bytes.NewReader([]byte("v1")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("upload: %s", resp.Status)
		}
		get := func() (string, error) {
			resp, err := http.Get(fmt.Sprintf("http://%s/storage/v1/b/%s/o/ab%%2Fk?alt=media", g.Host, g.Bucket))
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return "", fmt.Errorf("%s", resp.Status)
			}
			return string(b), err
		}
		g.Stop()
		if _, err := get(); err == nil {
			t.Fatal("a stopped server answered")
		}
		g.Restart(t)
		if v, err := get(); err != nil || v != "v1" {
			t.Fatalf("after restart: %q %v", v, err)
		}
	})
	t.Run("Azurite", func(t *testing.T) {
		a := cloudtest.StartAzurite(t)
		if _, err := a.Client(t).UploadBuffer(ctx, a.Container, "ab/k", []byte("v1"), nil); err != nil {
			t.Fatal(err)
		}
		get := func() (string, error) {
			resp, err := a.Client(t).DownloadStream(ctx, a.Container, "ab/k", nil)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return string(b), err
		}
		a.Stop()
		a.Restart(t)
		if v, err := get(); err != nil || v != "v1" {
			t.Fatalf("after restart: %q %v", v, err)
		}
	})
}
