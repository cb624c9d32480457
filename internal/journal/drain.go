package journal

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// The one drainer of journals (DESIGN.md decision 12): what every
// consumer of a journal does the same way (take the pending records in
// order, apply them, Ack and Sync what was applied, retry with backoff
// while what they go to is unreachable, stop on ctx, and let only one
// process drain a journal directory). What a record means is the
// caller's Apply.

// Lock takes an exclusive flock(2) on path (creating it), without
// waiting: ok is false when another process (or another open file of
// this one) holds it. Closing f releases it; so does the process's end,
// even by SIGKILL.
func Lock(path string) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, cairn.E("lock", cairn.IO, path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EWOULDBLOCK {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, cairn.E("lock", cairn.IO, path, err)
	}
	return f, true, nil
}

// LockedByOther reports whether another holds path's flock (Lock).
func LockedByOther(path string) bool {
	f, ok, err := Lock(path)
	if err != nil {
		return false
	}
	if ok {
		f.Close()
	}
	return !ok
}

// ErrBusy is what DrainDir returns when another process drains (or
// writes) the journal: its lock is held.
var ErrBusy = errors.New("the journal is locked by another process")

// Drainer applies a journal's pending records.
//
// Contract: Apply is called on the draining goroutine with the records
// to apply, in order (sequence order, or Order's), and applies them in
// that order. It calls ack with the sequence numbers it has applied, as
// soon as it has (after each batch, say): they are acked and the journal
// fsynced before ack returns, so a kill after it never applies them
// again; a kill before it does (Apply must recognise work already done:
// at least once, made exactly once by the consumer). A record it neither
// acked nor failed stays pending: Run does not give it again (a record
// that fails for its own reason is not retried in a loop; the next run
// does), Serve gives it again at its next wake-up (a kick, a gate's
// time). Apply returns an error to stop the pass: one Retry accepts is
// retried with backoff (the records not acked are given again) while
// RetryFor allows, any other ends the drain.
//
// Run drains what is there and returns (put --background); Serve runs
// until told to stop, woken by kicks as records are appended (the
// mount's commit queue). Both are the one loop: the same order, gates,
// acks and retries.
type Drainer struct {
	Apply func(ctx context.Context, recs []Record, ack func(seqs ...uint64) error) error
	// Retry tells the errors worth retrying (a store or the metadata
	// service unreachable); nil: none is.
	Retry func(error) bool
	// RetryFor bounds how long a failure is retried, from the first
	// failure since the last pass that succeeded (0: no retry; Forever:
	// no bound, a long-running drainer's choice while the metadata
	// service is away). MinBackoff and MaxBackoff bound the wait between
	// tries (defaults 1 s and 30 s): it doubles from the one to the
	// other, and a success brings it back.
	RetryFor               time.Duration
	MinBackoff, MaxBackoff time.Duration
	// OnRetry, if set, is told of each error retried and the wait.
	OnRetry func(err error, wait time.Duration)
	// Order, if set, lists the records to drain, in the order to apply
	// them, in place of the journal's pending records in sequence order:
	// the caller's own order (a rename after the create it depends on),
	// or a subset (records that are not the drainer's yet, such as one
	// still being written). Each must be a pending record of the journal
	// (its Payload is the caller's to set). Called once per pass, on the
	// draining goroutine.
	Order func() []Record
	// Gate, if set, tells how long record r must still wait before it
	// may be applied (zero or less: now): a delay, a quiet period, a
	// hold. A record that waits stays pending, and so do the records
	// after it (the order holds); the drain goes on at its time, or at
	// the next kick (Serve), when Gate is asked again. Serve's last
	// pass, after stop, asks no gate. Called on the draining goroutine.
	Gate func(r Record) time.Duration
}

// Forever is the RetryFor of a drainer that never gives up retrying.
const Forever time.Duration = -1

// Run drains j, which the caller has open (and holds the lock of): it
// gives Apply the pending records, then those appended meanwhile, until
// a pass finds none new; a gated record is waited for.
func (d *Drainer) Run(ctx context.Context, j *Journal) error {
	return d.drain(ctx, j, nil, nil, false)
}

// Serve drains j until stop is closed or ctx ends: it applies what is
// pending, then waits for a kick (a send on kick, made by whoever
// appends a record; a buffered channel of one, sent to without
// blocking), a gated record's time, or the end of a backoff (which a
// kick cuts short), and drains again; a retryable failure is retried
// while RetryFor allows. Once stop is closed it makes a last pass
// without gates and returns: nil when Apply took every record it was
// given, else the error that ended the pass (the records not acked stay
// in the journal for the next drainer). A cancelled ctx returns an error
// of Kind Canceled, at once.
func (d *Drainer) Serve(ctx context.Context, j *Journal, kick, stop <-chan struct{}) error {
	return d.drain(ctx, j, kick, stop, true)
}

func (d *Drainer) drain(ctx context.Context, j *Journal, kick, stop <-chan struct{}, serve bool) error {
	minB, maxB := d.MinBackoff, d.MaxBackoff
	if minB <= 0 {
		minB = time.Second
	}
	if maxB < minB {
		maxB = max(minB, 30*time.Second)
	}
	wait := minB
	var failing time.Time // the first failure since the last success
	given := map[uint64]bool{}
	acked := 0
	ack := func(seqs ...uint64) error {
		if err := j.Ack(ctx, seqs...); err != nil {
			return err
		}
		if err := j.Sync(ctx); err != nil {
			return err
		}
		acked += len(seqs)
		return nil
	}
	canceled := func() error { return cairn.E("drain journal", cairn.Canceled, j.dir, ctx.Err()) }
	// sleep waits for t (less than zero: no timer), a kick, stop or the
	// end of ctx; false: ctx ended.
	sleep := func(t time.Duration) bool {
		var tc <-chan time.Time
		if t >= 0 {
			tm := time.NewTimer(t)
			defer tm.Stop()
			tc = tm.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-tc:
		case <-kick:
		case <-stop:
		}
		return true
	}
	for {
		if ctx.Err() != nil {
			return canceled()
		}
		final := false
		if serve {
			select {
			case <-stop:
				final = true
			default:
			}
		}
		all := d.Order
		if all == nil {
			all = j.Pending
		}
		var recs []Record
		for _, r := range all() {
			if !given[r.Seq] {
				recs = append(recs, r)
			}
		}
		gated := time.Duration(-1)
		if d.Gate != nil && !final {
			for i, r := range recs {
				if t := d.Gate(r); t > 0 {
					recs, gated = recs[:i], t
					break
				}
			}
		}
		if len(recs) == 0 {
			if final || (!serve && gated < 0) {
				return nil
			}
			if !sleep(gated) {
				return canceled()
			}
			continue
		}
		acked = 0
		err := d.Apply(ctx, recs, ack)
		if err == nil {
			wait, failing = minB, time.Time{}
			switch {
			case !serve:
				for _, r := range recs {
					given[r.Seq] = true
				}
			case acked > 0:
			case final:
				return nil // what is left is declined: the next drainer's
			default:
				// Nothing taken: given again at the next wake-up, not in
				// a loop.
				if !sleep(gated) {
					return canceled()
				}
			}
			continue
		}
		if ctx.Err() != nil {
			// Apply failed because, or while, ctx ended: the drain was
			// canceled (TestDrainerServeCancel, once under -race).
			return canceled()
		}
		if failing.IsZero() {
			failing = time.Now()
		}
		if final || d.Retry == nil || !d.Retry(err) || d.RetryFor == 0 ||
			(d.RetryFor > 0 && time.Since(failing) >= d.RetryFor) {
			return err
		}
		// Retried: what was acked is not given again, the rest is.
		if d.OnRetry != nil {
			d.OnRetry(err, wait)
		}
		if !sleep(wait) {
			return canceled()
		}
		wait = min(2*wait, maxB)
	}
}

// DirHooks are what DrainDir runs under the lock around the drain.
type DirHooks struct {
	// Before runs before the journal is opened (a migration of an older
	// layout into it, say).
	Before func() error
	// After runs once the drain ended without error and the journal is
	// closed, with how many records it still holds (0: all done, the
	// directory may go).
	After func(pending int) error
	// Damage, if set, is told what the open found damaged (each of Kind
	// Corrupt: records that could not be read, see Open) before the
	// drain; if nil, DrainDir returns it with its own error.
	Damage func([]error)
}

// DrainDir drains the journal in dir under the flock of lock (taken
// without waiting: an error of Kind Conflict wrapping ErrBusy if another
// holds it), opening and closing the journal itself. Damage the open
// found goes to h.Damage, or is returned with the drain's error
// (errors.Join) after the drain: a damaged journal still drains what it
// can.
func (d *Drainer) DrainDir(ctx context.Context, dir, lock string, opts Options, h DirHooks) error {
	lf, ok, err := Lock(lock)
	if err != nil {
		return err
	}
	if !ok {
		return cairn.E("drain journal", cairn.Conflict, dir, ErrBusy)
	}
	defer lf.Close()
	if h.Before != nil {
		if err = h.Before(); err != nil {
			return err
		}
	}
	j, err := Open(ctx, dir, opts)
	if err != nil {
		return err
	}
	damage := j.Damage()
	if h.Damage != nil && len(damage) > 0 {
		h.Damage(damage)
		damage = nil
	}
	err = d.Run(ctx, j)
	left := j.Len()
	if cerr := j.Close(); err == nil {
		err = cerr
	}
	if err == nil && len(damage) == 0 && h.After != nil {
		err = h.After(left)
	}
	if len(damage) == 0 {
		return err
	}
	return errors.Join(append([]error{err}, damage...)...)
}
