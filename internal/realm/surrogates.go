package realm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/surrogate"
)

// The surrogates this device knows of (configured by hand with 'cairn
// surrogate add'), with what it measured of them: $CAIRN_HOME/surrogates.json
// (doc/surrogate.md, "Surrogate list"). Device-local: which surrogates are
// near depends on where this machine is.
const (
	surrogatesFile = "surrogates.json"
	// SurrogateListFormat is the version of surrogates.json.
	SurrogateListFormat = 1
	// MaxSurrogates bounds the list.
	MaxSurrogates = 256
)

// SurrogateEntry is one known surrogate.
type SurrogateEntry struct {
	Addr string `json:"addr"`
	// Name is the node name its certificate carried when last measured.
	Name  string    `json:"name,omitempty"`
	Added time.Time `json:"added"`
	// Measured is when RTT, Up and Down were measured (zero: never).
	Measured time.Time `json:"measured,omitzero"`
	RTT      int64     `json:"rtt_ns,omitempty"`
	Up       float64   `json:"up_bps,omitempty"`
	Down     float64   `json:"down_bps,omitempty"`
	// Offer, Quota and Lease are what it offered then.
	Offer int64 `json:"offer,omitempty"`
	Quota int64 `json:"quota,omitempty"`
	Lease int64 `json:"lease_ms,omitempty"`
	// Error is why the last measure failed ("" if it did not).
	Error string `json:"error,omitempty"`
}

type surrogateList struct {
	Format     int              `json:"format"`
	Surrogates []SurrogateEntry `json:"surrogates"`
}

// SurrogatesPath is this device's list of surrogates.
func SurrogatesPath(home string) string { return filepath.Join(home, surrogatesFile) }

// LoadSurrogates reads the list (empty if there is none).
func LoadSurrogates(home string) ([]SurrogateEntry, error) {
	const op = "read surrogates"
	p := SurrogatesPath(home)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cairn.E(op, cairn.IO, p, err)
	}
	l, err := DecodeSurrogates(b)
	if err != nil {
		return nil, cairn.E(op, cairn.Corrupt, p, err)
	}
	return l, nil
}

// DecodeSurrogates decodes surrogates.json.
func DecodeSurrogates(b []byte) ([]SurrogateEntry, error) {
	var l surrogateList
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("%d bytes exceeds 1 MiB", len(b))
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, err
	}
	if l.Format != SurrogateListFormat {
		return nil, fmt.Errorf("format %d, this cairn reads %d", l.Format, SurrogateListFormat)
	}
	if len(l.Surrogates) > MaxSurrogates {
		return nil, fmt.Errorf("%d surrogates exceeds %d", len(l.Surrogates), MaxSurrogates)
	}
	for _, e := range l.Surrogates {
		if err := wire.CheckAddr(e.Addr); err != nil {
			return nil, err
		}
	}
	return l.Surrogates, nil
}

func saveSurrogates(home string, l []SurrogateEntry) error {
	b, _ := json.MarshalIndent(surrogateList{Format: SurrogateListFormat, Surrogates: l}, "", "  ")
	if err := durable.ReplaceFile(SurrogatesPath(home), append(b, '\n'), 0o600); err != nil {
		return cairn.E("write surrogates", cairn.IO, SurrogatesPath(home), err)
	}
	return nil
}

// SurrogateClient returns a client of the surrogate at addr with this
// device's credentials: it accepts only a surrogate of this realm that the
// realm has not revoked.
func (r *Realm) SurrogateClient(ctx context.Context, addr string) (*surrogate.Client, error) {
	creds, err := r.Credentials(ctx)
	if err != nil {
		return nil, err
	}
	rev, err := r.revocations(ctx)
	if err != nil {
		return nil, err
	}
	tlsConf, err := surrogate.ClientTLS(creds, rev)
	if err != nil {
		return nil, err
	}
	return surrogate.NewClient(addr, tlsConf)
}

// AddSurrogate measures the surrogate at addr (round trip, rates) and
// keeps it in this device's list, replacing an entry of the same address.
// A surrogate that cannot be reached, or is not a surrogate of this
// realm, is not added; one that answers but has no room for a probe
// session is added with its round trip and the error.
func (r *Realm) AddSurrogate(ctx context.Context, addr string) (SurrogateEntry, error) {
	const op = "surrogate add"
	if err := wire.CheckAddr(addr); err != nil {
		return SurrogateEntry{}, cairn.E(op, cairn.Invalid, addr, err)
	}
	c, err := r.SurrogateClient(ctx, addr)
	if err != nil {
		return SurrogateEntry{}, err
	}
	defer c.Close()
	m, err := surrogate.Measure(ctx, c, 5, 0)
	if m.RTT == 0 {
		if err == nil {
			err = errors.New("no round trip measured")
		}
		return SurrogateEntry{}, cairn.E(op, cairn.KindOf(err), addr, err)
	}
	e := SurrogateEntry{Addr: addr, Name: c.Name(), Added: time.Now().UTC(), Measured: m.At.UTC(), RTT: int64(m.RTT),
		Up: m.Up, Down: m.Down, Offer: m.Info.Offer, Quota: m.Info.Quota, Lease: m.Info.Lease}
	if err != nil {
		e.Error = err.Error()
	}
	l, lerr := LoadSurrogates(r.Home)
	if lerr != nil {
		return e, lerr
	}
	if i := slices.IndexFunc(l, func(x SurrogateEntry) bool { return x.Addr == addr }); i >= 0 {
		e.Added = l[i].Added
		l[i] = e
	} else {
		if len(l) >= MaxSurrogates {
			return e, cairn.E(op, cairn.Invalid, addr, fmt.Errorf("this device knows %d surrogates already: remove one first", len(l)))
		}
		l = append(l, e)
	}
	return e, saveSurrogates(r.Home, l)
}

// RemoveSurrogate drops addr from this device's list (NotFound if absent).
func RemoveSurrogate(home, addr string) error {
	l, err := LoadSurrogates(home)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(l, func(x SurrogateEntry) bool { return x.Addr == addr })
	if i < 0 {
		return cairn.E("surrogate remove", cairn.NotFound, addr, errors.New("no such surrogate in this device's list"))
	}
	return saveSurrogates(home, slices.Delete(l, i, i+1))
}
