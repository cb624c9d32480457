package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/store/cloudtest"
)

type storeInfo struct {
	Name     string           `json:"name"`
	URL      string           `json:"url"`
	Health   string           `json:"health"`
	Objects  int64            `json:"objects"`
	Bytes    int64            `json:"bytes"`
	Requests map[string]int64 `json:"requests"`
	Draining bool             `json:"draining"`
}

func storeLs(t *testing.T, r *realmT, env []string) map[string]storeInfo {
	t.Helper()
	res := r.runEnv(env, "store", "ls", "--json")
	if res.code != 0 {
		t.Fatalf("store ls: %+v", res)
	}
	var list []storeInfo
	if err := json.Unmarshal([]byte(res.stdout), &list); err != nil {
		t.Fatalf("store ls --json: %v\n%s", err, res.stdout)
	}
	out := map[string]storeInfo{}
	for _, s := range list {
		out[s.Name] = s
	}
	return out
}

// TestStoreS3 adds a MinIO bucket as a store (credentials from the
// environment only), writes files to it with put --store, reads them back
// with no request to the bucket (what this device wrote is in its chunk
// cache) and with --no-cache (from the bucket), lists the store with its
// objects and requests, and removes it: the data is copied to the
// device's own store first and reads on.
func TestStoreS3(t *testing.T) {
	m := cloudtest.StartMinIO(t)
	r := newRealm(t, "--no-passphrase", "--keep", "1")
	creds := []string{"AWS_ACCESS_KEY_ID=" + m.AccessKey, "AWS_SECRET_ACCESS_KEY=" + m.SecretKey, "AWS_EC2_METADATA_DISABLED=true"}
	noCreds := []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_EC2_METADATA_DISABLED=true", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent"}
	url := fmt.Sprintf("s3://%s/cairn?endpoint=%s&insecure=1", m.Bucket, m.Endpoint)

	// Refused: a bad URL, credentials in the URL, no credentials.
	if res := r.runEnv(creds, "store", "add", "s3a", "s3://"); res.code == 0 {
		t.Fatalf("bad URL accepted: %+v", res)
	}
	if res := r.runEnv(creds, "store", "add", "s3a", fmt.Sprintf("s3://key:secret@%s/x?endpoint=%s&insecure=1", m.Bucket, m.Endpoint)); res.code == 0 || strings.Contains(res.stderr, "secret") {
		t.Fatalf("credentials in the URL: %+v", res)
	}
	if res := r.runEnv(noCreds, "store", "add", "s3a", url); res.code == 0 || !strings.Contains(res.stderr, "does not work from this device") {
		t.Fatalf("no credentials: %+v", res)
	}
	if res := r.runEnv(creds, "store", "add", "s3a", url); res.code != 0 || !strings.Contains(res.stdout, "added store s3a") {
		t.Fatalf("store add: %+v", res)
	}
	if res := r.runEnv(creds, "store", "add", "s3a", url); res.code == 0 {
		t.Fatalf("second add of one name: %+v", res)
	}
	// A node may not take a store's name (versions name both in one list).
	if res := r.run("invite", "--role", "benefactor", "--name", "s3a"); res.code != cli.ExitExist || !strings.Contains(res.stderr, "store named s3a") {
		t.Fatalf("invite under a store's name: %+v", res)
	}

	src := filepath.Join(t.TempDir(), "s")
	files := map[string][]byte{"a.bin": randBytes(300 << 10), "b.txt": []byte("small file\n"), "d/c.bin": randBytes(1 << 20)}
	for name, b := range files {
		writeFile(t, filepath.Join(src, name), b, 0o644)
	}
	if res := r.runEnv(creds, "put", "--store", "s3a", src, "home:/"); res.code != 0 {
		t.Fatalf("put --store s3a: %+v", res)
	}
	ls := storeLs(t, r, creds)["s3a"]
	if ls.Health != "ok" || ls.Objects == 0 || ls.Requests["PUT"] == 0 || !strings.HasPrefix(ls.URL, "s3://"+m.Bucket+"/cairn?") {
		t.Fatalf("store ls after put: %+v", ls)
	}
	// The bucket holds what was written (and no plaintext name).
	n := 0
	for obj := range m.Client(t).ListObjects(context.Background(), m.Bucket, minio.ListObjectsOptions{Prefix: "cairn/", Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		if strings.Contains(obj.Key, "a.bin") {
			t.Fatalf("a file name in the bucket: %s", obj.Key)
		}
		n++
	}
	// Small objects travel in packs: a few bucket objects and PUTs for
	// the 78 or so chunks and manifests.
	if n == 0 || int64(n)*10 > ls.Objects || ls.Requests["PUT"] > 10 {
		t.Fatalf("bucket has %d objects for %d stored, %d PUTs: not packed", n, ls.Objects, ls.Requests["PUT"])
	}

	// Reading back what this device wrote makes no GET: it kept it.
	gets := ls.Requests["GET"]
	for name, b := range files {
		res := r.runEnv(creds, "cat", "home:/s/"+name)
		if res.code != 0 || res.stdout != string(b) {
			t.Fatalf("cat %s: exit %d, %d bytes: %s", name, res.code, len(res.stdout), res.stderr)
		}
	}
	if g := storeLs(t, r, creds)["s3a"].Requests["GET"]; g != gets {
		t.Fatalf("reading cached files made %d GETs, want 0", g-gets)
	}
	// --no-cache reads the bucket.
	if res := r.runEnv(creds, "cat", "--no-cache", "home:/s/d/c.bin"); res.code != 0 || res.stdout != string(files["d/c.bin"]) {
		t.Fatalf("cat --no-cache: exit %d %s", res.code, res.stderr)
	}
	if g := storeLs(t, r, creds)["s3a"].Requests["GET"]; g <= gets {
		t.Fatalf("cat --no-cache made no GET (%d before, %d after)", gets, g)
	}
	// Without credentials the bucket is unreachable: --no-cache says so.
	if res := r.runEnv(noCreds, "cat", "--no-cache", "home:/s/d/c.bin"); res.code == 0 {
		t.Fatalf("cat --no-cache without credentials succeeded")
	}

	// gc sweeps the store too: a replaced file's old chunks go, and packs
	// left mostly garbage are rewritten.
	writeFile(t, filepath.Join(src, "d/c.bin"), randBytes(1<<20), 0o644)
	files["d/c.bin"] = mustRead(t, filepath.Join(src, "d/c.bin"))
	if res := r.runEnv(creds, "put", "--store", "s3a", src, "home:/"); res.code != 0 {
		t.Fatalf("second put: %+v", res)
	}
	before := storeLs(t, r, creds)["s3a"]
	out := r.runEnv(creds, "gc")
	if out.code != 0 || !strings.Contains(out.stdout, "store s3a:") {
		t.Fatalf("gc: %+v", out)
	}
	after := storeLs(t, r, creds)["s3a"]
	if after.Objects >= before.Objects || after.Bytes >= before.Bytes {
		t.Fatalf("gc left the store at %d objects / %d bytes (before %d / %d): %s", after.Objects, after.Bytes, before.Objects, before.Bytes, out.stdout)
	}
	for name, b := range files {
		if res := r.runEnv(creds, "cat", "--no-cache", "home:/s/"+name); res.code != 0 || res.stdout != string(b) {
			t.Fatalf("after gc, cat --no-cache %s: exit %d %s", name, res.code, res.stderr)
		}
	}

	// Remove: the data moves to this device's store first.
	res := r.runEnv(creds, "store", "remove", "s3a")
	if res.code != 0 || !strings.Contains(res.stdout, "removed store s3a") {
		t.Fatalf("store remove: %+v", res)
	}
	if l := storeLs(t, r, creds); len(l) != 0 {
		t.Fatalf("after remove: %+v", l)
	}
	for name, b := range files {
		res := r.runEnv(noCreds, "cat", "--no-cache", "home:/s/"+name)
		if res.code != 0 || res.stdout != string(b) {
			t.Fatalf("after remove, cat --no-cache %s: exit %d %s", name, res.code, res.stderr)
		}
	}
	r.ok("fsck", "--read-data")

	// The bucket still holds this realm's objects and its marker (gc kept
	// it): adding it again works; another realm is refused the location,
	// whose objects its gc would delete as garbage.
	if res := r.runEnv(creds, "store", "add", "s3a", url); res.code != 0 {
		t.Fatalf("re-adding the realm's own bucket: %+v", res)
	}
	other := newRealm(t)
	if res := other.runEnv(creds, "store", "add", "s3x", url); res.code == 0 || !strings.Contains(res.stderr, "not this realm's") {
		t.Fatalf("another realm adding a used bucket: %+v", res)
	}
	if res := other.runEnv(creds, "store", "add", "s3x", fmt.Sprintf("s3://%s/other?endpoint=%s&insecure=1", m.Bucket, m.Endpoint)); res.code != 0 {
		t.Fatalf("another realm, an empty prefix: %+v", res)
	}
}
