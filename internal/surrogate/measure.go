package surrogate

import (
	"context"
	"crypto/rand"
	"slices"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// Measurement is what a device measured of a surrogate: how near it is
// (round trip) and how fast it moves chunks each way.
type Measurement struct {
	// RTT is the median round trip of an info request over an open
	// connection.
	RTT time.Duration
	// Up and Down are the rates, in bytes per second, of staging and of
	// reading back one probe chunk (ProbeBytes of random bytes) in a
	// session made for the measure and ended after it.
	Up, Down float64
	// ProbeBytes is the probe chunk's size.
	ProbeBytes int
	// Info is the surrogate's last answer to info.
	Info Info
	At   time.Time
}

// DefaultProbe is the probe chunk's size: large enough that a 100 Mbit/s
// link's rate shows past its round trip, small enough to cost little on a
// slow one.
const DefaultProbe = 1 << 20

// Measure measures the surrogate: rounds info requests for the round trip
// (the first, which opens the connection, is not counted), then a probe of
// probe bytes (0: DefaultProbe) staged and read back in a session of its
// own, deregistered at the end. A surrogate with no room for a session
// gives its round trip and Kind Unavailable.
func Measure(ctx context.Context, c *Client, rounds, probe int) (Measurement, error) {
	const op = "surrogate measure"
	if rounds <= 0 {
		rounds = 5
	}
	if probe <= 0 || probe > MaxChunk {
		probe = DefaultProbe
	}
	m := Measurement{ProbeBytes: probe, At: time.Now()}
	var err error
	if m.Info, err = c.Info(ctx); err != nil {
		return m, err
	}
	rtts := make([]time.Duration, 0, rounds)
	for range rounds {
		t0 := time.Now()
		if m.Info, err = c.Info(ctx); err != nil {
			return m, err
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	m.RTT = rtts[len(rtts)/2]

	data := make([]byte, probe)
	rand.Read(data)
	id := cairn.ID(blake3.Sum256(data))
	s, err := c.Register(ctx, int64(probe))
	if err != nil {
		return m, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = s.Deregister(dctx)
	}()
	t0 := time.Now()
	if _, err := s.Stage(ctx, []Object{{ID: id, Data: data}}); err != nil {
		return m, err
	}
	m.Up = rate(probe, time.Since(t0))
	t0 = time.Now()
	if _, err := s.Get(ctx, id); err != nil {
		return m, cairn.E(op, cairn.KindOf(err), c.addr, err)
	}
	m.Down = rate(probe, time.Since(t0))
	return m, nil
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		d = time.Microsecond
	}
	return float64(n) / d.Seconds()
}
