package s3store

import (
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestFromURL(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want Options
	}{
		{"s3://bucket", Options{Bucket: "bucket"}},
		{"s3://bucket/a/b/", Options{Bucket: "bucket", Prefix: "a/b"}},
		{"s3://my.bucket/p?endpoint=127.0.0.1:9000&insecure=1&region=us-east-1",
			Options{Bucket: "my.bucket", Prefix: "p", Endpoint: "127.0.0.1:9000", Insecure: true, Region: "us-east-1"}},
		{"s3://b-1/p?endpoint=minio.example.org&insecure=0", Options{Bucket: "b-1", Prefix: "p", Endpoint: "minio.example.org"}},
		{"s3://bkt?endpoint=[::1]:9000", Options{Bucket: "bkt", Endpoint: "[::1]:9000"}},
		{"s3://bkt?endpoint=", Options{Bucket: "bkt"}}, // empty: Amazon's
	} {
		o, err := FromURL(tc.raw)
		if err != nil {
			t.Errorf("FromURL(%q): %v", tc.raw, err)
			continue
		}
		if o.Bucket != tc.want.Bucket || o.Prefix != tc.want.Prefix || o.Endpoint != tc.want.Endpoint ||
			o.Region != tc.want.Region || o.Insecure != tc.want.Insecure {
			t.Errorf("FromURL(%q) = %+v, want %+v", tc.raw, o, tc.want)
		}
		again, err := FromURL(o.URL())
		if err != nil || again.URL() != o.URL() {
			t.Errorf("FromURL(%q).URL() = %q, which parses to %q, %v", tc.raw, o.URL(), again.URL(), err)
		}
	}
	for _, raw := range []string{
		"s3://ab",          // too short for S3
		"s3://under_score", // not an S3 bucket name
		"s3://",
		"s3://bucket?endpoint=host/path",
		"s3://bucket?endpoint=host:",
		"s3://bucket?endpoint=:9000",
		"s3://bucket?endpoint=a@b",
		"s3://bucket?region=EU_WEST",
		"s3://bucket?insecure=yes",
		"s3://bucket?secret=x",
		"s3://AKIA:secret@bucket",
		"gs://bucket",
	} {
		if o, err := FromURL(raw); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("FromURL(%q) = %+v, %v; want Invalid", raw, o, err)
		}
	}
}

// FuzzFromURL: FromURL never panics, and what it accepts round-trips
// through Options.URL.
func FuzzFromURL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket/prefix?endpoint=127.0.0.1:9000&region=us-east-1&insecure=1",
		"s3://b.c-d/x/y", "s3://bucket?endpoint=[::1]:9000", "s3://bucket?endpoint=h:0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		o, err := FromURL(raw)
		if err != nil {
			if cairn.KindOf(err) != cairn.Invalid {
				t.Fatalf("FromURL(%q): error of kind %v: %v", raw, cairn.KindOf(err), err)
			}
			return
		}
		again, err := FromURL(o.URL())
		if err != nil {
			t.Fatalf("FromURL(%q).URL() = %q does not parse: %v", raw, o.URL(), err)
		}
		if again.Bucket != o.Bucket || again.Prefix != o.Prefix || again.Endpoint != o.Endpoint ||
			again.Region != o.Region || again.Insecure != o.Insecure {
			t.Fatalf("FromURL(%q) = %+v; its URL %q parses to %+v", raw, o, o.URL(), again)
		}
	})
}
