package journal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
