package meta_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// fill is a plan that takes size from the donors in the order given
// (most free first), as much of each as it has.
func fill(want int64) func([]meta.Donor) (map[string]int64, error) {
	return func(donors []meta.Donor) (map[string]int64, error) {
		size := want
		plan := map[string]int64{}
		for _, d := range donors {
			if size == 0 {
				break
			}
			n := min(d.Free, size)
			if n > 0 {
				plan[d.Name] = n
				size -= n
			}
		}
		if size > 0 {
			// Ask for the rest anyway: Reserve refuses it.
			if len(donors) == 0 {
				return nil, errors.New("no donors")
			}
			plan[donors[0].Name] += size
		}
		return plan, nil
	}
}

// donor registers benefactor name, awake, donating donated bytes of
// which used are taken.
func donor(t *testing.T, s *meta.Service, name string, donated, used int64) *meta.Registration {
	t.Helper()
	ctx := context.Background()
	rec := meta.NodeRecord{Name: name, Role: "benefactor", Addr: "127.0.0.1:1", Capacity: 1 << 40, Free: 1 << 39, Used: used, Donated: donated}
	if err := s.PutNode(ctx, rec); err != nil {
		t.Fatal(err)
	}
	reg, err := s.Register(ctx, rec, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close(context.Background()) })
	return reg
}

// Two clients (each with its own etcd client) reserving at once, each more
// than half of the pool: exactly one gets its reservation, and no donor is
// promised more than its donation less its use. Repeated, so that the
// reads and transactions interleave in different ways.
func TestReserveRace(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	s2, err := meta.New(secondClient(t, s), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	donor(t, s, "b1", 10*mib, 1*mib) // 9 MiB free
	donor(t, s, "b2", 8*mib, 0)      // 8 MiB free
	donors, err := s.Donors(ctx)
	if err != nil || len(donors) != 2 || donors[0].Name != "b1" || donors[0].Free != 9*mib || donors[1].Free != 8*mib {
		t.Fatalf("donors %+v, %v", donors, err)
	}
	for round := 0; round < 10; round++ {
		var wg sync.WaitGroup
		res := make([]*meta.Reservation, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for i, svc := range []*meta.Service{s, s2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res[i], errs[i] = svc.Reserve(ctx, meta.ReserveRequest{Holder: "client", TTL: 5 * time.Second, Plan: fill(10 * mib)})
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i := range res {
			if errs[i] == nil {
				won++
				continue
			}
			if !errors.Is(errs[i], meta.ErrNoRoom) || cairn.KindOf(errs[i]) != cairn.Permission {
				t.Fatalf("round %d: loser's error %v", round, errs[i])
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d of 2 reservations of 10 MiB in a pool of 17 MiB succeeded (%v)", round, won, errs)
		}
		recs, err := s.Reservations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]int64{}
		for _, r := range recs {
			per[r.Node] += r.Bytes
		}
		if per["b1"] > 9*mib || per["b2"] > 8*mib || per["b1"]+per["b2"] != 10*mib {
			t.Fatalf("round %d: reserved %v", round, per)
		}
		for _, r := range res {
			if r != nil {
				if err := r.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		if recs, _ := s.Reservations(ctx); len(recs) != 0 {
			t.Fatalf("after release: %v", recs)
		}
	}
}

// A reservation whose holder stops keeping its lease alive lapses: its
// space is free again for another client.
func TestReserveLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	const mib = 1 << 20
	donor(t, s, "b1", 4*mib, 0)
	r, err := s.Reserve(ctx, meta.ReserveRequest{Holder: "dies", TTL: time.Second, Plan: fill(4 * mib)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Parts["b1"] != 4*mib {
		t.Fatalf("parts %v", r.Parts)
	}
	if _, err := s.Reserve(ctx, meta.ReserveRequest{Holder: "second", TTL: time.Second, Plan: fill(mib)}); !errors.Is(err, meta.ErrNoRoom) {
		t.Fatalf("reserve on a full donor: %v", err)
	}
	r.Abandon()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r2, err := s.Reserve(ctx, meta.ReserveRequest{Holder: "second", TTL: time.Second, Plan: fill(4 * mib)})
		if err == nil {
			r2.Release(ctx)
			break
		}
		if !errors.Is(err, meta.ErrNoRoom) || time.Now().After(deadline) {
			t.Fatalf("after the holder's lease lapsed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-r.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed")
	}
}

// Only awake benefactors are donors; a plan naming another node, or
// nothing, is refused.
func TestReserveDonors(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	donor(t, s, "b1", 1<<20, 0)
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "asleep", Role: "benefactor", Donated: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "desk", Role: "device"}); err != nil {
		t.Fatal(err)
	}
	d, err := s.Donors(ctx)
	if err != nil || len(d) != 1 || d[0].Name != "b1" {
		t.Fatalf("donors %+v %v", d, err)
	}
	_, err = s.Reserve(ctx, meta.ReserveRequest{TTL: time.Second, Plan: func([]meta.Donor) (map[string]int64, error) { return map[string]int64{"asleep": 1}, nil }})
	if cairn.KindOf(err) != cairn.Invalid {
		t.Fatalf("plan naming a sleeping benefactor: %v", err)
	}
	_, err = s.Reserve(ctx, meta.ReserveRequest{TTL: time.Second, Plan: func([]meta.Donor) (map[string]int64, error) { return nil, nil }})
	if cairn.KindOf(err) != cairn.Invalid {
		t.Fatalf("empty plan: %v", err)
	}
}

func FuzzDecodeReservation(f *testing.F) {
	f.Add([]byte(`{"format":1,"id":"00","node":"b1","bytes":5,"holder":"h","created":1}`))
	f.Add([]byte(`{"format":1,"bytes":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := meta.DecodeReservation(b)
		if err == nil && (r.Bytes <= 0 || r.Node == "" || r.Format < 1) {
			t.Fatalf("accepted %+v", r)
		}
	})
}
