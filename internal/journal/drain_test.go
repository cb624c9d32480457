package journal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

func appendN(t *testing.T, j *Journal, ids ...int) {
	t.Helper()
	for _, id := range ids {
		if _, err := j.Append(ctx, payload(id)); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(t *testing.T, recs []Record) []int {
	t.Helper()
	var out []int
	for _, r := range recs {
		id, ok := checkPayload(r.Payload)
		if !ok {
			t.Fatalf("record %d: bad payload %q", r.Seq, r.Payload)
		}
		out = append(out, id)
	}
	return out
}

// TestDrainerRun: the records are given in order; those acked are gone
// for good (a reopen finds only the others); a record given and not
// acked is not given again in the same run; a record appended while
// Apply runs is given by a later pass of the same run.
func TestDrainerRun(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	appendN(t, j, 1, 2, 3, 4)
	var calls [][]int
	d := &Drainer{Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
		calls = append(calls, ids(t, recs))
		if len(calls) == 1 {
			appendN(t, j, 5)
		}
		for _, r := range recs {
			if id, _ := checkPayload(r.Payload); id != 3 { // 3 fails for its own reason
				if err := ack(r.Seq); err != nil {
					return err
				}
			}
		}
		return nil
	}}
	if err := d.Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || !slices.Equal(calls[0], []int{1, 2, 3, 4}) || !slices.Equal(calls[1], []int{5}) {
		t.Fatalf("Apply got %v, want [[1 2 3 4] [5]]", calls)
	}
	j.Close()
	j = open(t, dir, 0)
	defer j.Close()
	if got := ids(t, j.Pending()); !slices.Equal(got, []int{3}) {
		t.Fatalf("after a reopen pending %v, want [3]", got)
	}
}

// TestDrainerRetry: an error Retry accepts is retried with backoff, the
// records not acked given again (those acked not); another error ends
// the run at once; RetryFor bounds the retrying; a cancelled ctx ends
// the wait.
func TestDrainerRetry(t *testing.T) {
	unavailable := cairn.E("apply", cairn.Unavailable, "", errors.New("store down"))
	j := open(t, t.TempDir(), 0)
	defer j.Close()
	appendN(t, j, 1, 2, 3)
	var calls [][]int
	var waits []time.Duration
	d := &Drainer{
		Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
			calls = append(calls, ids(t, recs))
			switch len(calls) {
			case 1:
				if err := ack(recs[0].Seq); err != nil {
					return err
				}
				return unavailable
			case 2:
				return unavailable
			}
			var seqs []uint64
			for _, r := range recs {
				seqs = append(seqs, r.Seq)
			}
			return ack(seqs...)
		},
		Retry:      func(err error) bool { return cairn.KindOf(err) == cairn.Unavailable },
		RetryFor:   time.Hour,
		MinBackoff: time.Millisecond, MaxBackoff: 3 * time.Millisecond,
		OnRetry: func(err error, wait time.Duration) { waits = append(waits, wait) },
	}
	if err := d.Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	want := [][]int{{1, 2, 3}, {2, 3}, {2, 3}}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("Apply got %v, want %v", calls, want)
	}
	if !slices.Equal(waits, []time.Duration{time.Millisecond, 2 * time.Millisecond}) {
		t.Fatalf("waits %v, want [1ms 2ms]", waits)
	}
	if j.Len() != 0 {
		t.Fatalf("%d pending after the drain", j.Len())
	}

	// Not retried: another kind, or no Retry, or RetryFor passed.
	appendN(t, j, 4)
	n := 0
	d.Apply = func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
		n++
		return cairn.E("apply", cairn.Invalid, "", errors.New("bad record"))
	}
	if err := d.Run(ctx, j); cairn.KindOf(err) != cairn.Invalid || n != 1 {
		t.Fatalf("Run: %v after %d calls, want Invalid after 1", err, n)
	}
	n = 0
	d.Apply = func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
		n++
		return unavailable
	}
	d.RetryFor = 0
	if err := d.Run(ctx, j); cairn.KindOf(err) != cairn.Unavailable || n != 1 {
		t.Fatalf("Run with RetryFor 0: %v after %d calls, want Unavailable after 1", err, n)
	}
	cctx, cancel := context.WithCancel(ctx)
	d.RetryFor, d.MinBackoff = time.Hour, time.Hour
	d.OnRetry = func(error, time.Duration) { cancel() }
	if err := d.Run(cctx, j); cairn.KindOf(err) != cairn.Canceled {
		t.Fatalf("Run with ctx cancelled in the backoff: %v, want Canceled", err)
	}
	if j.Len() != 1 {
		t.Fatalf("%d pending, want the one never acked", j.Len())
	}
}

// TestDrainDir: only one process drains a directory (its lock held
// elsewhere gives ErrBusy, and nothing is applied); Before runs under
// the lock before the journal opens, After with the records left.
func TestDrainDir(t *testing.T) {
	base := t.TempDir()
	dir, lock := filepath.Join(base, "journal"), filepath.Join(base, "lock")
	j := open(t, dir, 0)
	appendN(t, j, 1, 2)
	j.Sync(ctx)
	j.Close()
	applied := 0
	d := &Drainer{Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
		applied += len(recs)
		return ack(recs[0].Seq)
	}}
	held, ok, err := Lock(lock)
	if err != nil || !ok {
		t.Fatalf("Lock: %v %v", ok, err)
	}
	if !LockedByOther(lock) {
		t.Fatal("LockedByOther: false while held")
	}
	err = d.DrainDir(ctx, dir, lock, Options{}, DirHooks{})
	if !errors.Is(err, ErrBusy) || cairn.KindOf(err) != cairn.Conflict || applied != 0 {
		t.Fatalf("DrainDir with the lock held: %v (applied %d), want ErrBusy", err, applied)
	}
	held.Close()
	var order []string
	left := -1
	err = d.DrainDir(ctx, dir, lock, Options{}, DirHooks{
		Before: func() error {
			if !LockedByOther(lock) {
				t.Error("Before runs without the lock")
			}
			order = append(order, "before")
			return nil
		},
		After: func(n int) error { order, left = append(order, "after"), n; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if applied != 2 || left != 1 || !slices.Equal(order, []string{"before", "after"}) {
		t.Fatalf("applied %d, left %d, hooks %v; want 2, 1, [before after]", applied, left, order)
	}
	if LockedByOther(lock) {
		t.Fatal("the lock is still held after DrainDir")
	}
	recs, err := Read(dir)
	if err != nil || !slices.Equal(ids(t, recs), []int{2}) {
		t.Fatalf("Read after the drain: %v %v, want [2]", ids(t, recs), err)
	}
}

// TestDrainDirDamage: a journal damaged in the middle still drains the
// records before and after the damage, and DirHooks.Damage is told of
// it (Kind Corrupt) before the drain; without the hook DrainDir returns
// it.
func TestDrainDirDamage(t *testing.T) {
	for _, hook := range []bool{true, false} {
		base := t.TempDir()
		dir, lock := filepath.Join(base, "journal"), filepath.Join(base, "lock")
		j := open(t, dir, 0)
		appendN(t, j, 1, 2, 3)
		j.Close()
		seg := filepath.Join(dir, "0000000000000000.jnl")
		b, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		// The second frame's body: header, then frame 1 (8 + 9 + len).
		off := headerSize + frameHead + 9 + len(payload(1)) + frameHead + 10
		b[off] ^= 0xff
		if err := os.WriteFile(seg, b, 0o600); err != nil {
			t.Fatal(err)
		}
		var got []int
		var damage []error
		d := &Drainer{Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
			if hook && damage == nil {
				t.Error("Apply before the damage was reported")
			}
			got = append(got, ids(t, recs)...)
			return nil
		}}
		h := DirHooks{}
		if hook {
			h.Damage = func(errs []error) { damage = errs }
		}
		err = d.DrainDir(ctx, dir, lock, Options{}, h)
		if hook {
			if err != nil || len(damage) != 1 || cairn.KindOf(damage[0]) != cairn.Corrupt {
				t.Fatalf("with the hook: err %v, damage %v", err, damage)
			}
		} else if err == nil || !strings.Contains(err.Error(), "cannot be read") {
			t.Fatalf("without the hook: err %v, want the damage", err)
		}
		if !slices.Equal(got, []int{1, 3}) {
			t.Fatalf("applied %v, want [1 3]", got)
		}
	}
}

// serve runs d.Serve on j in a goroutine; the returned func stops it
// (closes stop) and returns Serve's error.
func serve(t *testing.T, d *Drainer, j *Journal, kick chan struct{}) (stop func() error) {
	t.Helper()
	st, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Serve(ctx, j, kick, st) }()
	return func() error {
		close(st)
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			t.Fatal("Serve did not return after stop")
			return nil
		}
	}
}

func poke(kick chan struct{}) {
	select {
	case kick <- struct{}{}:
	default:
	}
}

// waitFor polls cond until it holds (a generous deadline: the machine
// may be loaded).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// ackAll is an Apply that acks every record and tells of each on got.
func ackAll(got chan<- int) func(context.Context, []Record, func(...uint64) error) error {
	return func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
		for _, r := range recs {
			if err := ack(r.Seq); err != nil {
				return err
			}
			id, _ := checkPayload(r.Payload)
			got <- id
		}
		return nil
	}
}

// TestDrainerServeKick: Serve drains what is pending, then waits; a
// record appended later is applied once a kick wakes it (and not before
// while there is no kick: no polling); stop ends it with nil.
func TestDrainerServeKick(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	defer j.Close()
	appendN(t, j, 1)
	got := make(chan int, 10)
	kick := make(chan struct{}, 1)
	stop := serve(t, &Drainer{Apply: ackAll(got)}, j, kick)
	if id := <-got; id != 1 {
		t.Fatalf("applied %d, want 1", id)
	}
	appendN(t, j, 2)
	select {
	case id := <-got:
		t.Fatalf("record %d applied without a kick", id)
	case <-time.After(200 * time.Millisecond):
	}
	poke(kick)
	select {
	case id := <-got:
		if id != 2 {
			t.Fatalf("applied %d, want 2", id)
		}
	case <-time.After(time.Minute):
		t.Fatal("the kick did not wake Serve")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if j.Len() != 0 {
		t.Fatalf("%d pending after Serve", j.Len())
	}
}

// TestDrainerServeGate: a gated record, and the records after it, stay
// pending until its time; then they are applied in order. A record that
// is held (gated far ahead) is applied after a kick once its gate lets
// it, and by the last pass after stop regardless of its gate.
func TestDrainerServeGate(t *testing.T) {
	j := open(t, t.TempDir(), 0)
	defer j.Close()
	appendN(t, j, 1, 2, 3)
	var mu sync.Mutex
	notBefore := map[int]time.Time{}
	at := time.Now().Add(300 * time.Millisecond)
	notBefore[2] = at
	var applied []int
	var appliedAt []time.Time
	got := make(chan int, 10)
	kick := make(chan struct{}, 1)
	d := &Drainer{
		Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
			for _, r := range recs {
				id, _ := checkPayload(r.Payload)
				mu.Lock()
				applied, appliedAt = append(applied, id), append(appliedAt, time.Now())
				mu.Unlock()
				if err := ack(r.Seq); err != nil {
					return err
				}
				got <- id
			}
			return nil
		},
		Gate: func(r Record) time.Duration {
			id, _ := checkPayload(r.Payload)
			mu.Lock()
			defer mu.Unlock()
			return time.Until(notBefore[id])
		},
	}
	stop := serve(t, d, j, kick)
	for range 3 {
		<-got
	}
	mu.Lock()
	if !slices.Equal(applied, []int{1, 2, 3}) {
		t.Fatalf("applied %v, want [1 2 3]", applied)
	}
	if appliedAt[1].Before(at) || appliedAt[2].Before(at) {
		t.Fatalf("records 2 and 3 applied before the gate's time (%v, %v < %v)", appliedAt[1], appliedAt[2], at)
	}
	// Held: far ahead; released by a kick once the gate lets it.
	notBefore[4] = time.Now().Add(time.Hour)
	mu.Unlock()
	appendN(t, j, 4)
	poke(kick)
	select {
	case id := <-got:
		t.Fatalf("held record %d applied", id)
	case <-time.After(200 * time.Millisecond):
	}
	mu.Lock()
	delete(notBefore, 4)
	mu.Unlock()
	poke(kick)
	if id := <-got; id != 4 {
		t.Fatalf("applied %d, want 4", id)
	}
	// Held at stop: the last pass asks no gate.
	mu.Lock()
	notBefore[5] = time.Now().Add(time.Hour)
	mu.Unlock()
	appendN(t, j, 5)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if id := <-got; id != 5 || j.Len() != 0 {
		t.Fatalf("after stop: applied %d, %d pending; want 5, 0", id, j.Len())
	}
}

// TestDrainerServeRetry: with RetryFor Forever, a failure is retried far
// past any count, the backoff doubling up to MaxBackoff and staying
// there; a kick cuts a backoff short; once the failures end the records
// are applied; a failure at the last pass after stop ends it with the
// error, leaving the record pending.
func TestDrainerServeRetry(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	appendN(t, j, 1, 2)
	unavailable := cairn.E("apply", cairn.Unavailable, "", errors.New("metadata service away"))
	var mu sync.Mutex
	down, calls := true, 0
	var waits []time.Duration
	got := make(chan int, 10)
	apply := ackAll(got)
	kick := make(chan struct{}, 1)
	d := &Drainer{
		Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
			mu.Lock()
			calls++
			dn := down
			mu.Unlock()
			if dn {
				return unavailable
			}
			return apply(ctx, recs, ack)
		},
		Retry:      func(err error) bool { return cairn.KindOf(err) == cairn.Unavailable },
		RetryFor:   Forever,
		MinBackoff: time.Millisecond, MaxBackoff: 8 * time.Millisecond,
		OnRetry: func(err error, wait time.Duration) {
			mu.Lock()
			waits = append(waits, wait)
			mu.Unlock()
		},
	}
	stop := serve(t, d, j, kick)
	waitFor(t, "100 failures", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 100 })
	mu.Lock()
	down = false
	w := slices.Clone(waits)
	mu.Unlock()
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(w[:6], want) || slices.Max(w) != 8*time.Millisecond {
		t.Fatalf("waits %v..., max %v; want %v... capped at 8ms", w[:6], slices.Max(w), want)
	}
	if a, b := <-got, <-got; a != 1 || b != 2 {
		t.Fatalf("applied %d %d, want 1 2", a, b)
	}
	// A long backoff, cut short by a kick.
	mu.Lock()
	down = true
	mu.Unlock()
	d.MinBackoff, d.MaxBackoff = time.Hour, time.Hour // read at Serve's start: a new Serve
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	appendN(t, j, 3)
	mu.Lock()
	calls = 0
	mu.Unlock()
	stop = serve(t, d, j, kick)
	waitFor(t, "the first failure", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 1 })
	mu.Lock()
	down = false
	mu.Unlock()
	poke(kick)
	select {
	case id := <-got:
		if id != 3 {
			t.Fatalf("applied %d, want 3", id)
		}
	case <-time.After(time.Minute):
		t.Fatal("a kick did not cut the backoff short")
	}
	// Down at stop: the last pass fails, the record stays.
	mu.Lock()
	down = true
	mu.Unlock()
	appendN(t, j, 4)
	poke(kick)
	if err := stop(); cairn.KindOf(err) != cairn.Unavailable {
		t.Fatalf("Serve after stop with the service away: %v, want Unavailable", err)
	}
	j.Close()
	j = open(t, dir, 0)
	defer j.Close()
	if got := ids(t, j.Pending()); !slices.Equal(got, []int{4}) {
		t.Fatalf("after a reopen pending %v, want [4]", got)
	}
}

// TestDrainerServeCancel: a cancelled ctx ends Serve at once (Kind
// Canceled), whether it waits for a kick, a gate or a backoff, and
// applies nothing more.
func TestDrainerServeCancel(t *testing.T) {
	for _, waiting := range []string{"kick", "gate", "backoff"} {
		j := open(t, t.TempDir(), 0)
		if waiting != "kick" {
			appendN(t, j, 1)
		}
		entered := make(chan struct{}, 1)
		d := &Drainer{
			Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
				poke(entered)
				return cairn.E("apply", cairn.Unavailable, "", errors.New("down"))
			},
			Retry:      func(error) bool { return true },
			RetryFor:   Forever,
			MinBackoff: time.Hour,
		}
		if waiting == "gate" {
			d.Gate = func(Record) time.Duration { poke(entered); return time.Hour }
		}
		if waiting == "kick" {
			d.Order = func() []Record { poke(entered); return j.Pending() }
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Serve(cctx, j, make(chan struct{}, 1), make(chan struct{})) }()
		<-entered
		cancel()
		select {
		case err := <-done:
			if cairn.KindOf(err) != cairn.Canceled {
				t.Fatalf("%s: Serve returned %v, want Canceled", waiting, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: Serve did not return after the cancel", waiting)
		}
		j.Close()
	}
}

// TestDrainerOrder: Order replaces the sequence order (and may leave
// records out: they stay pending); what Apply acked is in the journal's
// files when ack returns, and a record given, not acked, stays.
func TestDrainerOrder(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	appendN(t, j, 1, 2, 3, 4)
	var got []int
	d := &Drainer{
		Order: func() []Record { // newest first, 3 left out
			var out []Record
			for _, r := range slices.Backward(j.Pending()) {
				if id, _ := checkPayload(r.Payload); id != 3 {
					out = append(out, r)
				}
			}
			return out
		},
		Apply: func(ctx context.Context, recs []Record, ack func(...uint64) error) error {
			for _, r := range recs {
				id, _ := checkPayload(r.Payload)
				got = append(got, id)
				if id != 1 { // 1 given, not acked
					if err := ack(r.Seq); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	if err := d.Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{4, 2, 1}) {
		t.Fatalf("applied %v, want [4 2 1]", got)
	}
	// No Close: the acks are in the files already.
	recs, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p := ids(t, recs); !slices.Equal(p, []int{1, 3}) {
		t.Fatalf("on disk after the drain: %v, want [1 3]", p)
	}
	j.Close()
}
