package azstore

import (
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestFromURL(t *testing.T) {
	for raw, want := range map[string][2]string{
		"azblob://container":        {"container", ""},
		"azblob://con-tainer1/a/b/": {"con-tainer1", "a/b"},
	} {
		o, err := FromURL(raw)
		if err != nil || o.Container != want[0] || o.Prefix != want[1] {
			t.Errorf("FromURL(%q) = %+v, %v; want container %q prefix %q", raw, o, err, want[0], want[1])
			continue
		}
		if again, err := FromURL(o.URL()); err != nil || again.URL() != o.URL() {
			t.Errorf("FromURL(%q).URL() = %q does not round-trip: %v", raw, o.URL(), err)
		}
	}
	for _, raw := range []string{
		"azblob://ab", "azblob://under_score", "azblob://dot.ted", "azblob://-dash", "azblob://dash-",
		"azblob://da--sh", "azblob://container?account=x", "azblob://acct:key@container", "s3://container",
	} {
		if o, err := FromURL(raw); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("FromURL(%q) = %+v, %v; want Invalid", raw, o, err)
		}
	}
}
