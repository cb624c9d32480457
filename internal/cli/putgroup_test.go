package cli_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/store/cloudtest"
)

// TestPutSmallFilesS3 puts many small files to a cloud store: they are
// committed in groups after one Flush each, so a pack holds the objects of
// many files (few PUTs); then a second put of changed files runs while gc
// runs again and again, and nothing is lost.
func TestPutSmallFilesS3(t *testing.T) {
	m := cloudtest.StartMinIO(t)
	r := newRealm(t, "--no-passphrase", "--keep", "1")
	creds := []string{"AWS_ACCESS_KEY_ID=" + m.AccessKey, "AWS_SECRET_ACCESS_KEY=" + m.SecretKey, "AWS_EC2_METADATA_DISABLED=true"}
	url := fmt.Sprintf("s3://%s/cairn?endpoint=%s&insecure=1", m.Bucket, m.Endpoint)
	if res := r.runEnv(creds, "store", "add", "s3a", url); res.code != 0 {
		t.Fatalf("store add: %+v", res)
	}
	const n = 600
	src := filepath.Join(t.TempDir(), "many")
	for i := range n {
		writeFile(t, filepath.Join(src, fmt.Sprintf("d%d/f%03d", i%6, i)), randBytes(4096), 0o644)
	}
	puts := storeLs(t, r, creds)["s3a"].Requests["PUT"]
	if res := r.runEnv(creds, "put", "--store", "s3a", src, "home:/"); res.code != 0 {
		t.Fatalf("put: %+v", res)
	}
	// 600 files, 1,200 objects: a few groups of up to 256 files, one pack
	// each (and a few more if a group lingered). Without groups, about 9
	// files shared a pack: some 70 PUTs.
	if p := storeLs(t, r, creds)["s3a"].Requests["PUT"] - puts; p > 15 {
		t.Fatalf("put of %d small files made %d PUTs, want at most 15", n, p)
	}

	// Version 2 of every file, put while collections run.
	for i := range n {
		writeFile(t, filepath.Join(src, fmt.Sprintf("d%d/f%03d", i%6, i)), randBytes(4096), 0o644)
	}
	done := make(chan result, 1)
	go func() { done <- r.runEnv(creds, "put", "-q", "--store", "s3a", src, "home:/") }()
	gcs := 0
	for running := true; running; {
		select {
		case res := <-done:
			if res.code != 0 {
				t.Fatalf("put during gc: %+v", res)
			}
			running = false
		default:
			if res := r.runEnv(creds, "gc"); res.code != 0 && res.code != cli.ExitConflict {
				t.Fatalf("gc during put: %+v", res)
			}
			gcs++
		}
	}
	t.Logf("%d garbage collections ran during the put", gcs)
	if res := r.runEnv(creds, "gc"); res.code != 0 {
		t.Fatalf("gc: %+v", res)
	}
	if res := r.runEnv(creds, "fsck", "--read-data"); res.code != 0 {
		t.Fatalf("fsck: %+v", res)
	}
	for i := 0; i < n; i += 37 {
		name := fmt.Sprintf("d%d/f%03d", i%6, i)
		if res := r.runEnv(creds, "cat", "--no-cache", "home:/many/"+name); res.code != 0 || res.stdout != string(mustRead(t, filepath.Join(src, name))) {
			t.Fatalf("%s after put during gc: exit %d %s", name, res.code, res.stderr)
		}
	}
}

// TestPutLargeFileS3: a large file put to a cloud store is prepared and
// committed like a group, so its chunks go into full packs (a few PUTs),
// not into one small pack per set of Puts waiting at once (about one PUT
// per MiB); get --no-cache reads it back from the bucket.
func TestPutLargeFileS3(t *testing.T) {
	m := cloudtest.StartMinIO(t)
	r := newRealm(t, "--no-passphrase", "--keep", "1")
	creds := []string{"AWS_ACCESS_KEY_ID=" + m.AccessKey, "AWS_SECRET_ACCESS_KEY=" + m.SecretKey, "AWS_EC2_METADATA_DISABLED=true"}
	url := fmt.Sprintf("s3://%s/cairn?endpoint=%s&insecure=1", m.Bucket, m.Endpoint)
	if res := r.runEnv(creds, "store", "add", "s3a", url); res.code != 0 {
		t.Fatalf("store add: %+v", res)
	}
	src := filepath.Join(t.TempDir(), "big")
	writeFile(t, src, randBytes(48<<20), 0o644)
	puts := storeLs(t, r, creds)["s3a"].Requests["PUT"]
	if res := r.runEnv(creds, "put", "--store", "s3a", src, "home:/"); res.code != 0 {
		t.Fatalf("put: %+v", res)
	}
	// 48 MiB: three or four packs of up to 16 MiB (and the manifest's
	// share). Written with waiting Puts it made about 50.
	if p := storeLs(t, r, creds)["s3a"].Requests["PUT"] - puts; p > 8 {
		t.Fatalf("put of a 48 MiB file made %d PUTs, want at most 8", p)
	}
	dst := filepath.Join(t.TempDir(), "back")
	if res := r.runEnv(creds, "get", "--no-cache", "home:/big", dst); res.code != 0 {
		t.Fatalf("get --no-cache: %+v", res)
	}
	if string(mustRead(t, dst)) != string(mustRead(t, src)) {
		t.Fatal("get --no-cache: content differs")
	}
}
