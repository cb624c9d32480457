package wire

// The registrar exchange (doc/format.md, "Registrar"): a benefactor or
// surrogate, which has no metadata access, reports to a device's node at
// PathRegister every lease/3; the device writes the node's registry record
// on its behalf and answers with what the node needs to keep going: the
// other registrars and the realm's revocation list.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"time"
)

// Limits of the registrar exchange.
const (
	MaxReport        = 4 << 10 // bytes of a decompressed report
	MaxRegisterReply = MaxJSON // bytes of a decompressed registrar reply
	MaxAddr          = 255     // bytes of an address (host:port)
	MinLease         = time.Second
	MaxLease         = 10 * time.Minute
	MaxRevoked       = 4096 // names, and serials, in a reply's revocation list (fits MaxRegisterReply)
	MaxRegistrars    = 64   // registrar addresses in a reply
)

// Report is what a benefactor or surrogate tells its registrar. It names
// no node and no role: the registrar takes both from the reporter's
// verified certificate.
type Report struct {
	// Addr is where the node's chunk service listens (host:port).
	Addr string `json:"addr"`
	// Capacity and Free are the bytes of the file system holding its
	// store; Used is what the store takes on it.
	Capacity int64 `json:"capacity"`
	Free     int64 `json:"free"`
	Used     int64 `json:"used"`
	// Served is the object bytes served since the node started; Rate its
	// measured serving rate, bytes per second.
	Served int64   `json:"served"`
	Rate   float64 `json:"rate"`
	// Donated is a benefactor's donation (node serve --donate): the most
	// its store may hold; 0: none set. Optional, added within version 1.
	Donated int64 `json:"donated,omitempty"`
	// Lease is the node's heartbeat lease in ns: it reports every Lease/3,
	// and shows offline when no report arrives within Lease.
	Lease int64 `json:"lease"`
	// Leaving says the node stops: the registrar ends its lease at once.
	Leaving bool `json:"leaving,omitempty"`
	// Standby says the node is going to sleep (cairn node standby, or a
	// suspend announced by systemd-logind): the registrar records its
	// standby, with MAC and Broadcast as its wake method, and ends its
	// lease at once, so that it reads as standby, never offline. A later
	// report without it registers the node again (awake). Optional, added
	// within version 1 (doc/format.md, "Registrar").
	Standby bool `json:"standby,omitempty"`
	// MAC and Broadcast are how the node can be woken (the hardware
	// address and IPv4 broadcast address of the interface that carries
	// Addr), if it knows: recorded as its wake method. Optional, added
	// within version 1.
	MAC       string `json:"mac,omitempty"`
	Broadcast string `json:"broadcast,omitempty"`
}

// RegisterReply is the registrar's answer to a report.
type RegisterReply struct {
	// Lease is the lease the registrar holds for the node (ns).
	Lease int64 `json:"lease"`
	// Registrars are the chunk-service addresses of the realm's online
	// devices, this registrar's first: every device's node is a
	// registrar, so a node that loses this one reports to another.
	Registrars []string `json:"registrars"`
	// Revoked is the realm's revocation list, whole: the node refuses the
	// certificates it names (a benefactor or surrogate reads no metadata,
	// so this is how it learns of a removed device).
	Revoked Revocations `json:"revoked"`
}

// Revocations is a revocation list: node names, each revoking every
// certificate of that name issued (NotBefore + pki.Backdate) at or before
// its time, and serial numbers (lowercase hex), each revoking one
// certificate.
type Revocations struct {
	Names   map[string]time.Time `json:"names"`
	Serials map[string]time.Time `json:"serials"`
}

// EncodeReport is the body of a report: JSON, compressed.
func EncodeReport(r Report) []byte {
	j, _ := json.Marshal(r)
	return Compress(nil, j)
}

// DecodeReport reverses EncodeReport and checks the report: an address of
// the form host:port (at most MaxAddr bytes), no negative or non-finite
// figure, a lease within [MinLease, MaxLease]. Fields it does not know are
// ignored (a later version may add some), and so is any name or role a
// body carries: they are not part of a report.
func DecodeReport(body []byte) (Report, error) {
	var r Report
	raw, err := Decompress(body, MaxReport)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return Report{}, invalid("report", err)
	}
	if err := r.Check(); err != nil {
		return Report{}, err
	}
	return r, nil
}

// Check validates a report (see DecodeReport).
func (r Report) Check() error {
	if err := CheckAddr(r.Addr); err != nil {
		return err
	}
	if r.Capacity < 0 || r.Free < 0 || r.Used < 0 || r.Served < 0 || r.Donated < 0 {
		return invalid("report", errors.New("negative figure"))
	}
	if math.IsNaN(r.Rate) || math.IsInf(r.Rate, 0) || r.Rate < 0 {
		return invalid("report", fmt.Errorf("rate %v", r.Rate))
	}
	if r.Lease < int64(MinLease) || r.Lease > int64(MaxLease) {
		return invalid("report", fmt.Errorf("lease %v outside [%v, %v]", time.Duration(r.Lease), MinLease, MaxLease))
	}
	if r.Standby && r.Leaving {
		return invalid("report", errors.New("both standby and leaving"))
	}
	if r.MAC != "" {
		if hw, err := net.ParseMAC(r.MAC); err != nil || len(hw) != 6 {
			return invalid("report", fmt.Errorf("mac %q: not a 48-bit MAC address", r.MAC))
		}
	}
	if r.Broadcast != "" {
		if ip := net.ParseIP(r.Broadcast); ip == nil || ip.To4() == nil {
			return invalid("report", fmt.Errorf("broadcast %q: not an IPv4 address", r.Broadcast))
		}
	}
	return nil
}

// CheckAddr checks a node address: host:port, a non-empty host, a port,
// at most MaxAddr bytes.
func CheckAddr(a string) error {
	if len(a) > MaxAddr {
		return invalid("address", fmt.Errorf("%d bytes exceeds %d", len(a), MaxAddr))
	}
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return invalid("address", err)
	}
	if h == "" || p == "" {
		return invalid("address", fmt.Errorf("%q: want host:port", a))
	}
	return nil
}

// DecodeRegisterReply decodes a registrar's reply (at most
// MaxRegisterReply bytes decompressed) and checks it: a lease within
// bounds, at most MaxRegistrars well-formed addresses, at most MaxRevoked
// names and serials. A malformed address is an error, not skipped: a
// registrar that sends one is broken.
func DecodeRegisterReply(body []byte) (RegisterReply, error) {
	var r RegisterReply
	raw, err := Decompress(body, MaxRegisterReply)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return RegisterReply{}, invalid("register reply", err)
	}
	if r.Lease < int64(MinLease) || r.Lease > int64(MaxLease) {
		return RegisterReply{}, invalid("register reply", fmt.Errorf("lease %v", time.Duration(r.Lease)))
	}
	if len(r.Registrars) > MaxRegistrars {
		return RegisterReply{}, invalid("register reply", fmt.Errorf("%d registrars", len(r.Registrars)))
	}
	for _, a := range r.Registrars {
		if err := CheckAddr(a); err != nil {
			return RegisterReply{}, err
		}
	}
	if len(r.Revoked.Names) > MaxRevoked || len(r.Revoked.Serials) > MaxRevoked {
		return RegisterReply{}, invalid("register reply", errors.New("revocation list too long"))
	}
	if r.Revoked.Names == nil {
		r.Revoked.Names = map[string]time.Time{}
	}
	if r.Revoked.Serials == nil {
		r.Revoked.Serials = map[string]time.Time{}
	}
	return r, nil
}
