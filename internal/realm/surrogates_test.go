package realm

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeSurrogates: surrogates.json may be damaged or edited by hand;
// its decoder must never panic, and what it accepts re-encodes and
// decodes to the same list.
func FuzzDecodeSurrogates(f *testing.F) {
	f.Add([]byte(`{"format":1,"surrogates":[{"addr":"10.0.0.5:7461","name":"cafe","added":"2026-12-02T10:00:00Z","rtt_ns":900000,"up_bps":1e7,"down_bps":1.2e7,"offer":1024,"quota":256,"lease_ms":3600000}]}`))
	f.Add([]byte(`{"format":1,"surrogates":[]}`))
	f.Add([]byte(`{"format":2}`))
	f.Add([]byte(`{"format":1,"surrogates":[{"addr":"nope"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeSurrogates(b)
		if err != nil {
			return
		}
		re, err := json.Marshal(surrogateList{Format: SurrogateListFormat, Surrogates: l})
		if err != nil {
			t.Fatal(err)
		}
		l2, err := DecodeSurrogates(re)
		if err != nil || len(l2) != len(l) {
			t.Fatalf("re-encoded list does not decode: %v", err)
		}
	})
}
