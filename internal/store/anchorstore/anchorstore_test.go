package anchorstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/anchorstore"
	"cairn.dev/cairn/internal/store/lagstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/packstore"
	"cairn.dev/cairn/internal/store/storetest"
)

var bg = context.Background()

// bare is a store with none of the optional abilities, so that the
// wrapper's own Stats, Verify, Compact and Refresh are exercised.
type bare struct{ cairn.Store }

func TestConformance(t *testing.T) {
	t.Run("Memstore", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) cairn.Store {
			return anchorstore.New(memstore.New(), anchorstore.Options{Wait: 2 * time.Millisecond, FirstDelay: time.Millisecond})
		})
	})
	t.Run("Bare", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) cairn.Store {
			return anchorstore.New(bare{memstore.New()}, anchorstore.Options{Wait: -1})
		})
	})
	t.Run("Lagstore", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) cairn.Store {
			return lagstore.New(memstore.New(), lagstore.Options{})
		})
	})
}

// TestSecondDevice: an object written on one device, which the store shows
// only after a delay, is read on a second device: the read retries until
// the store shows it. Once straight over the lagging store, once through a
// packstore on each device, whose index learns the new pack only when the
// store lists it.
func TestSecondDevice(t *testing.T) {
	const lag = 300 * time.Millisecond
	id, data := storetest.Blob(1, 10000)

	t.Run("Plain", func(t *testing.T) {
		lagging := lagstore.New(memstore.New(), lagstore.Options{Delay: lag})
		reader := anchorstore.New(lagging, anchorstore.Options{Name: "test bucket"})
		defer reader.Close()
		start := time.Now()
		if err := lagging.Put(bg, id, data); err != nil {
			t.Fatal(err)
		}
		got, err := reader.Get(bg, id)
		if err != nil {
			t.Fatalf("Get of an object the store shows after %v: %v", lag, err)
		}
		if string(got) != string(data) {
			t.Fatal("wrong bytes")
		}
		if took := time.Since(start); took < lag || lagging.Hidden() == 0 {
			t.Fatalf("Get returned after %v with %d refusals: the lag was not exercised", took, lagging.Hidden())
		}
	})

	t.Run("Packed", func(t *testing.T) {
		lagging := lagstore.New(memstore.New(), lagstore.Options{Delay: lag})
		writer, err := packstore.New(bg, lagging, packstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := packstore.New(bg, lagging, packstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		reader := anchorstore.New(p, anchorstore.Options{Name: "test bucket"})
		start := time.Now()
		if perr := writer.Put(bg, id, data); perr != nil {
			t.Fatal(perr)
		}
		before := p.Requests()
		got, err := reader.Get(bg, id)
		if err != nil {
			t.Fatalf("Get of a packed object the store lists after %v: %v", lag, err)
		}
		if string(got) != string(data) {
			t.Fatal("wrong bytes")
		}
		took, d := time.Since(start), p.Requests().Sub(before)
		if took < lag || lagging.Hidden() == 0 || d.List < 2 {
			t.Fatalf("Get returned after %v with %d refusals and %+v: the lag was not exercised", took, lagging.Hidden(), d)
		}
		t.Logf("read after %v, %d listings", took, d.List)
		if err := reader.Close(); err != nil {
			t.Fatal(err)
		}
		if err := writer.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNeverWritten: an ID the store never shows fails, after the bound, with
// a NotFound error that says what happened and names the store.
func TestNeverWritten(t *testing.T) {
	const wait = 400 * time.Millisecond
	var gets atomic.Int64
	inner := &counting{Store: memstore.New(), gets: &gets}
	s := anchorstore.New(inner, anchorstore.Options{Name: "s3://bucket/cairn", Wait: wait, FirstDelay: 20 * time.Millisecond})
	defer s.Close()
	id, _ := storetest.Blob(2, 100)
	start := time.Now()
	_, err := s.Get(bg, id)
	took := time.Since(start)
	if !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("err = %v, want NotFound", err)
	}
	msg := err.Error()
	for _, want := range []string{id.String(), "s3://bucket/cairn", "still does not have this object", "tries over", "metadata names it"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if took < wait || took > wait+2*time.Second {
		t.Errorf("gave up after %v, want about %v", took, wait)
	}
	// 20, 40, 80, 160 ms, then what is left of 400 ms: 6 tries.
	if n := gets.Load(); n < 4 || n > 8 {
		t.Errorf("%d tries in %v, want exponential backoff (about 6)", n, wait)
	}
	t.Logf("%v", err)
	// GetRange retries the same way.
	if _, err := s.GetRange(bg, id, 0, 1); !errors.Is(err, cairn.ErrNotFound) || !strings.Contains(err.Error(), "tries over") {
		t.Errorf("GetRange: err = %v, want the same NotFound", err)
	}
}

type counting struct {
	cairn.Store
	gets *atomic.Int64
}

func (c *counting) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, id)
}

// TestCanceled: a read that is retrying stops as soon as its context ends.
func TestCanceled(t *testing.T) {
	id, data := storetest.Blob(3, 100)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var refusals atomic.Int64
	lagging := lagstore.New(memstore.New(), lagstore.Options{
		Delay: time.Hour,
		OnHidden: func(cairn.ID) {
			if refusals.Add(1) == 3 {
				cancel() // during the third try
			}
		},
	})
	s := anchorstore.New(lagging, anchorstore.Options{FirstDelay: 10 * time.Millisecond})
	defer s.Close()
	if err := lagging.Put(bg, id, data); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Get(ctx, id)
	if !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want Canceled", err)
	}
	if took := time.Since(start); took > 5*time.Second || refusals.Load() != 3 {
		t.Fatalf("returned after %v and %d tries, want right after the third try", took, refusals.Load())
	}
	// A context that ends while waiting between tries.
	ctx, cancel2 := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel2()
	start = time.Now()
	_, err = s.Get(ctx, id)
	if !errors.Is(err, cairn.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want Canceled (deadline)", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("returned after %v, want about 50ms", took)
	}
}
