package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

func goodReport() Report {
	return Report{Addr: "donor.lan:7461", Capacity: 1 << 40, Free: 1 << 39, Used: 12345, Served: 99, Rate: 1.5e6, Donated: 1 << 30, Lease: int64(10 * time.Second)}
}

func TestReportRoundTrip(t *testing.T) {
	r := goodReport()
	got, err := DecodeReport(EncodeReport(r))
	if err != nil || got != r {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// A body that names a node or a role: those fields are not part of a
	// report and are dropped.
	j := `{"name":"desk","role":"device","addr":"[::1]:1","lease":2000000000}`
	got, err = DecodeReport(Compress(nil, []byte(j)))
	if err != nil || got.Addr != "[::1]:1" {
		t.Fatalf("extra fields: %+v %v", got, err)
	}
	bad := []func(*Report){
		func(r *Report) { r.Addr = "" },
		func(r *Report) { r.Addr = "nohost" },
		func(r *Report) { r.Addr = ":7461" },
		func(r *Report) { r.Addr = strings.Repeat("a", 300) + ":1" },
		func(r *Report) { r.Capacity = -1 },
		func(r *Report) { r.Used = -1 },
		func(r *Report) { r.Donated = -1 },
		func(r *Report) { r.Rate = math.Inf(1) },
		func(r *Report) { r.Rate = -1 },
		func(r *Report) { r.Lease = int64(time.Millisecond) },
		func(r *Report) { r.Lease = int64(time.Hour) },
	}
	for i, f := range bad {
		r := goodReport()
		f(&r)
		if _, err := DecodeReport(EncodeReport(r)); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("bad report %d (%+v): %v", i, r, err)
		}
	}
	// NaN does not survive JSON; a raw body with garbage is Invalid.
	for _, b := range [][]byte{nil, []byte("{}"), Compress(nil, []byte("{")), Compress(nil, []byte(`{"addr":"a:1","lease":"x"}`))} {
		if _, err := DecodeReport(b); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("body %q: %v", b, err)
		}
	}
	// A compression bomb is refused before it is expanded.
	if _, err := DecodeReport(Compress(nil, make([]byte, MaxReport+1))); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("oversized report: %v", err)
	}
}

func TestRegisterReplyRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	r := RegisterReply{Lease: int64(5 * time.Second), Registrars: []string{"a:1", "[::1]:2"},
		Revoked: Revocations{Names: map[string]time.Time{"laptop": at}, Serials: map[string]time.Time{"ab12": at}}}
	b, err := EncodeJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRegisterReply(b)
	if err != nil || got.Lease != r.Lease || len(got.Registrars) != 2 || !got.Revoked.Names["laptop"].Equal(at) || !got.Revoked.Serials["ab12"].Equal(at) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// Empty lists decode as empty maps, never nil.
	b, _ = EncodeJSON(RegisterReply{Lease: int64(time.Second)})
	if got, err := DecodeRegisterReply(b); err != nil || got.Revoked.Names == nil || got.Revoked.Serials == nil {
		t.Fatalf("empty reply: %+v %v", got, err)
	}
	for _, bad := range []RegisterReply{
		{Lease: 0},
		{Lease: int64(time.Second), Registrars: []string{"nope"}},
		{Lease: int64(time.Second), Registrars: make([]string, MaxRegistrars+1)},
	} {
		b, _ := EncodeJSON(bad)
		if _, err := DecodeRegisterReply(b); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("bad reply %+v: %v", bad, err)
		}
	}
}

// A reply with the longest revocation lists the decoder takes (names of 63
// characters, serials of 32 hex digits) fits the decompression bound.
func TestRegisterReplyLimits(t *testing.T) {
	at := time.Now().UTC()
	r := RegisterReply{Lease: int64(time.Second), Revoked: Revocations{Names: map[string]time.Time{}, Serials: map[string]time.Time{}}}
	for i := range MaxRevoked {
		r.Revoked.Names[fmt.Sprintf("n%062d", i)] = at
		r.Revoked.Serials[fmt.Sprintf("%032x", i)] = at
	}
	j, _ := json.Marshal(r)
	if len(j) > MaxRegisterReply {
		t.Fatalf("longest reply is %d bytes, bound %d", len(j), MaxRegisterReply)
	}
	if _, err := DecodeRegisterReply(Compress(nil, j)); err != nil {
		t.Fatal(err)
	}
	r.Revoked.Names["one-more"] = at
	b, _ := EncodeJSON(r)
	if _, err := DecodeRegisterReply(b); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("too many names: %v", err)
	}
}

// A report's power fields (added within version 1): standby with a wake
// method decodes; standby and leaving at once, a malformed MAC or a
// broadcast address that is not IPv4 are refused.
func TestReportPowerFields(t *testing.T) {
	ok := Report{Addr: "h:1", Lease: int64(MinLease), Standby: true, MAC: "02:00:00:00:00:01", Broadcast: "192.0.2.255"}
	got, err := DecodeReport(EncodeReport(ok))
	if err != nil || got != ok {
		t.Fatalf("standby report: %+v %v", got, err)
	}
	for _, bad := range []Report{
		{Addr: "h:1", Lease: int64(MinLease), Standby: true, Leaving: true},
		{Addr: "h:1", Lease: int64(MinLease), MAC: "not-a-mac"},
		{Addr: "h:1", Lease: int64(MinLease), MAC: "02:00:00:00:00:01", Broadcast: "fe80::1"},
	} {
		if _, err := DecodeReport(EncodeReport(bad)); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}
