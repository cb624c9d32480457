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
// not yet given to it in this run, in sequence order (a record it
// neither acked nor failed stays pending and is given again by the next
// run, not this one: a record that fails for its own reason is not
// retried in a loop). Apply calls ack with the sequence numbers it has
// applied, as soon as it has (after each batch, say): they are acked and
// the journal fsynced before ack returns, so a kill after it never
// applies them again; a kill before it does (Apply must recognise work
// already done: at least once, made exactly once by the consumer).
// Apply returns an error to stop the run: one Retry accepts is retried
// with backoff (the records not acked are given again) until RetryFor
// has passed, any other ends the run.
type Drainer struct {
	Apply func(ctx context.Context, recs []Record, ack func(seqs ...uint64) error) error
	// Retry tells the errors worth retrying (a store or the metadata
	// service unreachable); nil: none is.
	Retry func(error) bool
	// RetryFor bounds the retrying (0: no retry); MinBackoff and
	// MaxBackoff bound the wait between tries (defaults 1 s and 30 s).
	RetryFor               time.Duration
	MinBackoff, MaxBackoff time.Duration
	// OnRetry, if set, is told of each error retried and the wait.
	OnRetry func(err error, wait time.Duration)
}

// Run drains j, which the caller has open (and holds the lock of): it
// gives Apply the pending records, then those appended meanwhile, until
// a pass finds none new.
func (d *Drainer) Run(ctx context.Context, j *Journal) error {
	minB, maxB := d.MinBackoff, d.MaxBackoff
	if minB <= 0 {
		minB = time.Second
	}
	if maxB < minB {
		maxB = max(minB, 30*time.Second)
	}
	deadline := time.Now().Add(d.RetryFor)
	wait := minB
	given := map[uint64]bool{}
	ack := func(seqs ...uint64) error {
		if err := j.Ack(ctx, seqs...); err != nil {
			return err
		}
		return j.Sync(ctx)
	}
	for {
		if err := ctx.Err(); err != nil {
			return cairn.E("drain journal", cairn.Canceled, j.dir, err)
		}
		var recs []Record
		for _, r := range j.Pending() {
			if !given[r.Seq] {
				recs = append(recs, r)
			}
		}
		if len(recs) == 0 {
			return nil
		}
		err := d.Apply(ctx, recs, ack)
		if err == nil {
			for _, r := range recs {
				given[r.Seq] = true
			}
			wait = minB
			continue
		}
		if d.Retry == nil || !d.Retry(err) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		// Retried: what was acked is not given again, the rest is.
		if d.OnRetry != nil {
			d.OnRetry(err, wait)
		}
		select {
		case <-ctx.Done():
			return cairn.E("drain journal", cairn.Canceled, j.dir, ctx.Err())
		case <-time.After(wait):
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
