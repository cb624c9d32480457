package realm

import (
	"testing"

	"cairn.dev/cairn/internal/store/objstore"
)

// TestReadaheadFor: a whole-file read of a version whose data is in a
// cloud store (opened, as the read of its manifest opens it) fetches
// cloudReadahead chunks ahead; anything else keeps the volume's readahead.
func TestReadaheadFor(t *testing.T) {
	r := &Realm{named: map[string]*namedStore{
		"s3a":   {counter: &objstore.Store{}},
		"other": {}, // a registered store that is not a cloud bucket
	}}
	for _, tc := range []struct {
		stores []string
		want   int
	}{
		{nil, 0},
		{[]string{"laptop"}, 0},
		{[]string{"other"}, 0},
		{[]string{"s3a"}, cloudReadahead},
		{[]string{"laptop", "s3a"}, cloudReadahead},
	} {
		if got := r.readaheadFor(tc.stores); got != tc.want {
			t.Errorf("readaheadFor(%q) = %d, want %d", tc.stores, got, tc.want)
		}
	}
}
