package apitypes

import "testing"

func TestIBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0:                 "0 B",
		1023:              "1023 B",
		1024:              "1.0 KiB",
		1536:              "1.5 KiB",
		5 << 20:           "5.0 MiB",
		3 << 30:           "3.0 GiB",
		(1 << 40) * 5 / 2: "2.5 TiB",
	} {
		if got := IBytes(n); got != want {
			t.Errorf("IBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
