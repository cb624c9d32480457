package gcsstore

import (
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestFromURL(t *testing.T) {
	for raw, want := range map[string][2]string{
		"gs://bucket":             {"bucket", ""},
		"gs://my_bucket.x/a/b/":   {"my_bucket.x", "a/b"},
		"GS://bucket/some%20path": {"bucket", "some path"},
	} {
		o, err := FromURL(raw)
		if err != nil || o.Bucket != want[0] || o.Prefix != want[1] {
			t.Errorf("FromURL(%q) = %+v, %v; want bucket %q prefix %q", raw, o, err, want[0], want[1])
			continue
		}
		if again, err := FromURL(o.URL()); err != nil || again.URL() != o.URL() {
			t.Errorf("FromURL(%q).URL() = %q does not round-trip: %v", raw, o.URL(), err)
		}
	}
	for _, raw := range []string{"gs://ab", "gs://Bucket", "gs://bucket?endpoint=x", "s3://bucket", "gs://u:p@bucket", "gs://b/../x"} {
		if o, err := FromURL(raw); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("FromURL(%q) = %+v, %v; want Invalid", raw, o, err)
		}
	}
}
