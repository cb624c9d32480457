package objstore

import (
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		raw, bucket, prefix, canon string
	}{
		{"s3://bucket", "bucket", "", "s3://bucket"},
		{"s3://bucket/", "bucket", "", "s3://bucket"},
		{"S3://bucket/a/b/", "bucket", "a/b", "s3://bucket/a/b"},
		{"s3://my.bucket-1_x/some%20dir/x", "my.bucket-1_x", "some dir/x", "s3://my.bucket-1_x/some%20dir/x"},
		{"s3://b/p?region=eu-west-1&endpoint=h:9000", "b", "p", "s3://b/p?endpoint=h%3A9000&region=eu-west-1"},
		{"s3://b/ünï", "b", "ünï", "s3://b/%C3%BCn%C3%AF"},
	} {
		u, err := ParseURL(tc.raw, "s3", "region", "endpoint")
		if err != nil {
			t.Errorf("ParseURL(%q): %v", tc.raw, err)
			continue
		}
		if u.Bucket != tc.bucket || u.Prefix != tc.prefix || u.String() != tc.canon {
			t.Errorf("ParseURL(%q) = bucket %q prefix %q (%s), want %q %q (%s)", tc.raw, u.Bucket, u.Prefix, u, tc.bucket, tc.prefix, tc.canon)
		}
	}
	for _, raw := range []string{
		"",
		"bucket/prefix",
		"gs://bucket",
		"s3:bucket",
		"s3:///prefix",
		"s3://key:secret@bucket/p",
		"s3://key@bucket/p",
		"s3://Bucket/p",
		"s3://bucket:9000/p",
		"s3://bucket/p#frag",
		"s3://bucket/a//b",
		"s3://bucket/a/../b",
		"s3://bucket/./b",
		"s3://bucket/a%00b",
		"s3://bucket/a%0Ab",
		"s3://bucket/a%C2%85b",
		"s3://bucket/%FF",
		"s3://bucket/p?unknown=1",
		"s3://bucket/p?region=a&region=b",
		"s3://bucket/p?region=%zz",
		"s3://bucket/" + strings.Repeat("x", MaxPrefix+1),
		"s3://" + strings.Repeat("b", 223),
	} {
		if u, err := ParseURL(raw, "s3", "region"); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("ParseURL(%q) = %+v, %v; want Invalid", raw, u, err)
		}
	}
	// An error never repeats credentials found in the URL.
	// Nor a query's values, which may be secrets (a SAS signature).
	for _, raw := range []string{"s3://key:secret@bucket/p", "s3://key:secret@bucket/p%zz", "s3://key:secret@bucket/p\x00",
		"azblob://c/p?sv=2024&sig=secret", "s3://b/p?region=eu&x=secret", "s3://bucket/p?sig=secret%zz", "s3://Bad_Bucket/p?sig=secret"} {
		if _, err := ParseURL(raw, "s3", "region"); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q): %v", raw, err)
		}
	}
	if _, err := ParseURL("gs://b/p?x=1", "gs"); err == nil || !strings.Contains(err.Error(), "takes none") {
		t.Errorf("gs:// with a parameter: %v", err)
	}
}

func TestURLBool(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "false": false, "1": true, "true": true} {
		u, err := ParseURL("s3://b?insecure="+v, "s3", "insecure")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := u.Bool("insecure"); err != nil || got != want {
			t.Errorf("insecure=%q: %v, %v", v, got, err)
		}
	}
	u, _ := ParseURL("s3://b?insecure=yes", "s3", "insecure")
	if _, err := u.Bool("insecure"); !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("insecure=yes: %v", err)
	}
}

// FuzzParseURL: ParseURL never panics, and what it accepts is canonical:
// its String parses back to the same URL, and keys made under its prefix
// parse back to their IDs and to nothing under another prefix.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket/prefix?endpoint=127.0.0.1:9000&region=us-east-1&insecure=1",
		"s3://b", "s3://b/a/b/c/", "s3://b/%2e%2e/x", "s3://a%62c/d", "s3://b/p?insecure=1&insecure=0",
		"s3://u:p@b/", "s3://b/ü/ä", "s3://b/p#x", "s3:opaque", "s3://b/a%2Fb",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := ParseURL(raw, "s3", "endpoint", "region", "insecure")
		if err != nil {
			if cairn.KindOf(err) != cairn.Invalid {
				t.Fatalf("ParseURL(%q): error of kind %v: %v", raw, cairn.KindOf(err), err)
			}
			return
		}
		if u.Bucket == "" || strings.HasPrefix(u.Prefix, "/") || strings.HasSuffix(u.Prefix, "/") || strings.Contains(u.Prefix, "//") {
			t.Fatalf("ParseURL(%q) accepted bucket %q prefix %q", raw, u.Bucket, u.Prefix)
		}
		again, err := ParseURL(u.String(), "s3", "endpoint", "region", "insecure")
		if err != nil {
			t.Fatalf("ParseURL(%q) = %s, which does not parse: %v", raw, u, err)
		}
		if again.Bucket != u.Bucket || again.Prefix != u.Prefix || again.String() != u.String() {
			t.Fatalf("ParseURL(%q) = %s, which parses to %s", raw, u, again)
		}
		id := cairn.ID{0xab, 0xcd, byte(len(raw))}
		k := Key(u.Prefix, id)
		if got, ok := ParseKey(u.Prefix, k); !ok || got != id {
			t.Fatalf("prefix %q: key %q does not parse back", u.Prefix, k)
		}
		if _, ok := ParseKey(u.Prefix+"x", k); ok {
			t.Fatalf("prefix %q: key %q parses under %q too", u.Prefix, k, u.Prefix+"x")
		}
	})
}
