package cloudtest

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// MinIO is a running MinIO server with one empty bucket.
type MinIO struct {
	*Server
	Endpoint             string // 127.0.0.1:PORT (plain HTTP)
	AccessKey, SecretKey string // the root credentials (random)
	Bucket               string
}

// StartMinIO starts MinIO and creates a bucket.
func StartMinIO(t testing.TB) *MinIO { return StartMinIOWith(t, MinIOOptions{}) }

// MinIOOptions choose how StartMinIOWith starts MinIO.
type MinIOOptions struct {
	// AccessKey and SecretKey are the root credentials (default: random).
	// Two servers given the same ones can be used by one process that
	// takes its S3 credentials from the environment.
	AccessKey, SecretKey string
}

// StartMinIOWith starts MinIO with options and creates a bucket.
func StartMinIOWith(t testing.TB, o MinIOOptions) *MinIO {
	t.Helper()
	bin := binary(t, "MinIO "+MinIOVersion, "minio-"+MinIOVersion, "minio")
	m := &MinIO{AccessKey: o.AccessKey, SecretKey: o.SecretKey, Bucket: bucketName()}
	if m.AccessKey == "" {
		m.AccessKey = "cairn" + randHex(6)
	}
	if m.SecretKey == "" {
		m.SecretKey = randHex(16)
	}
	data := t.TempDir()
	env := append(baseEnv(t),
		"MINIO_ROOT_USER="+m.AccessKey, "MINIO_ROOT_PASSWORD="+m.SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CALLHOME_ENABLE=off")
	m.Server = start(t, "MinIO", bin, env, func(port int) []string {
		return []string{"server", data, "--quiet", "--address", "127.0.0.1:" + strconv.Itoa(port),
			"--console-address", "127.0.0.1:" + strconv.Itoa(FreePort(t))}
	}, httpReady("/minio/health/ready", http.StatusOK))
	m.Endpoint = m.Addr
	c := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.MakeBucket(ctx, m.Bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		t.Fatalf("MinIO: make bucket %s: %v\n%s", m.Bucket, err, m.Log())
	}
	return m
}

// Client returns a raw SDK client with the root credentials, for a test to
// look at or damage objects behind the store's back.
func (m *MinIO) Client(t testing.TB) *minio.Client {
	t.Helper()
	c, err := minio.New(m.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(m.AccessKey, m.SecretKey, ""),
		Region: "us-east-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// FakeGCS is a running fake-gcs-server with one empty bucket.
type FakeGCS struct {
	*Server
	Host   string // 127.0.0.1:PORT, for STORAGE_EMULATOR_HOST
	Bucket string
}

// StartFakeGCS starts fake-gcs-server (in-memory backend) and creates a
// bucket. fake-gcs-server checks no credentials.
func StartFakeGCS(t testing.TB) *FakeGCS { return StartFakeGCSWith(t, FakeGCSOptions{}) }

// FakeGCSOptions choose how StartFakeGCSWith starts fake-gcs-server.
type FakeGCSOptions struct {
	// OnDisk keeps the objects in a temporary directory (the filesystem
	// backend) instead of memory, so they survive Stop and Restart.
	OnDisk bool
}

// StartFakeGCSWith starts fake-gcs-server with options and creates a
// bucket.
func StartFakeGCSWith(t testing.TB, o FakeGCSOptions) *FakeGCS {
	t.Helper()
	bin := binary(t, "fake-gcs-server "+FakeGCSVersion, "fake-gcs-server-"+FakeGCSVersion, "fake-gcs-server")
	g := &FakeGCS{Bucket: bucketName()}
	backend := []string{"-backend", "memory"}
	if o.OnDisk {
		backend = []string{"-backend", "filesystem", "-filesystem-root", t.TempDir()}
	}
	g.Server = start(t, "fake-gcs-server", bin, baseEnv(t), func(port int) []string {
		return append([]string{"-scheme", "http", "-host", "127.0.0.1", "-port", strconv.Itoa(port),
			"-log-level", "error",
			"-public-host", fmt.Sprintf("127.0.0.1:%d", port),
			"-external-url", fmt.Sprintf("http://127.0.0.1:%d", port)}, backend...)
	}, httpReady("/storage/v1/b", http.StatusOK))
	g.Host = g.Addr
	body := strings.NewReader(fmt.Sprintf(`{"name":%q}`, g.Bucket))
	resp, err := http.Post("http://"+g.Host+"/storage/v1/b?project=cairn-test", "application/json", body)
	if err != nil {
		t.Fatalf("fake-gcs-server: make bucket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fake-gcs-server: make bucket %s: %s\n%s", g.Bucket, resp.Status, g.Log())
	}
	return g
}

// Azurite's well-known development account (documented by Microsoft; it
// opens nothing but a local emulator).
const (
	AzuriteAccount = "devstoreaccount1"
	AzuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Azurite is a running Azurite blob server with one empty container.
type Azurite struct {
	*Server
	Endpoint         string // http://127.0.0.1:PORT/devstoreaccount1
	Account, Key     string
	ConnectionString string // for AZURE_STORAGE_CONNECTION_STRING
	Container        string
}

// StartAzurite starts Azurite's blob service and creates a container.
func StartAzurite(t testing.TB) *Azurite {
	t.Helper()
	bin := binary(t, "Azurite "+AzuriteVersion, "azurite-"+AzuriteVersion, filepath.Join("node_modules", ".bin", "azurite-blob"))
	a := &Azurite{Account: AzuriteAccount, Key: AzuriteKey, Container: bucketName()}
	data := t.TempDir()
	a.Server = start(t, "Azurite", bin, baseEnv(t), func(port int) []string {
		return []string{"--blobHost", "127.0.0.1", "--blobPort", strconv.Itoa(port), "--location", data,
			"--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"}
	}, httpReady("/"+AzuriteAccount+"?comp=list", http.StatusOK, http.StatusForbidden, http.StatusBadRequest))
	a.Endpoint = "http://" + a.Addr + "/" + AzuriteAccount
	a.ConnectionString = a.ConnectionStringWithKey(a.Key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.Client(t).CreateContainer(ctx, a.Container, nil); err != nil {
		t.Fatalf("Azurite: create container %s: %v\n%s", a.Container, err, a.Log())
	}
	return a
}

// ConnectionStringWithKey is the server's connection string with another
// account key (to test refused credentials).
func (a *Azurite) ConnectionStringWithKey(key string) string {
	return fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;", a.Account, key, a.Endpoint)
}

// Client returns a raw SDK client, for a test to look at or damage objects
// behind the store's back.
func (a *Azurite) Client(t testing.TB) *azblob.Client {
	t.Helper()
	c, err := azblob.NewClientFromConnectionString(a.ConnectionString, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
