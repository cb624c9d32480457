package director

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
)

// DefaultWakeTimeout is how long a read waits for a node it woke, unless
// Options.WakeTimeout says otherwise.
const DefaultWakeTimeout = 60 * time.Second

// A WakeFunc sends the magic packets that wake node n (itself, or through
// the node's wake proxy) and returns how ("through proxy NAME", "broadcast
// to ADDR"). It does not wait for the node.
type WakeFunc func(ctx context.Context, n meta.NodeStatus) (string, error)

// WakeProgress is told, about once a second, how long a read has waited
// for node to wake; a last call with done set ends the wait (err nil: the
// node is awake).
type WakeProgress func(node string, waited time.Duration, done bool, err error)

// wakePoll is how often the registry is read while a node wakes.
const wakePoll = 200 * time.Millisecond

// CanWake reports whether node n, not awake, can be woken: it is in
// standby, or offline with a wake method (a MAC).
func CanWake(n meta.NodeStatus) bool {
	if n.Removed != 0 || n.Wake == nil || n.Wake.MAC == "" {
		return false
	}
	return n.State == meta.NodeStandby || n.State == meta.NodeOffline
}

// WakeDecide is a Decider for a director that wakes: a read whose node can
// be woken (CanWake) wakes it, once no awake copy answered; everything
// else is DefaultDecide's.
func WakeDecide(ctx context.Context, n meta.NodeStatus, use Use) Decision {
	if use == ForRead && CanWake(n) {
		return Wake
	}
	return DefaultDecide(ctx, n, use)
}

// wakeCall is one wake of a node and its wait, shared by every read that
// needs the node meanwhile.
type wakeCall struct {
	done chan struct{}
	err  error
}

// wakeWait wakes node n and waits until the registry shows it awake, at
// most Options.WakeTimeout. Concurrent callers for the same node share one
// burst of packets and one wait. The wait does not end with the caller's
// context (others may share it), only with the director (Close); the
// caller stops waiting when its context ends.
func (d *Director) wakeWait(ctx context.Context, n meta.NodeStatus) error {
	if d.opts.Wake == nil {
		return fmt.Errorf("%s; cannot wake it: no waker in this realm", notAwake(n))
	}
	d.wmu.Lock()
	if d.waking == nil {
		d.waking = map[string]*wakeCall{}
	}
	c := d.waking[n.Name]
	if c == nil {
		c = &wakeCall{done: make(chan struct{})}
		d.waking[n.Name] = c
		go d.runWake(c, n)
	}
	d.wmu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Director) runWake(c *wakeCall, n meta.NodeStatus) {
	timeout := d.opts.WakeTimeout
	if timeout <= 0 {
		timeout = DefaultWakeTimeout
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(d.wakeCtx, timeout)
	defer cancel()
	progress := func(done bool, err error) {
		if d.opts.OnWake != nil {
			d.opts.OnWake(n.Name, time.Since(t0), done, err)
		}
	}
	c.err = d.wakeAndPoll(ctx, n, timeout, progress)
	metrics.Default().ObserveWake(t0, c.err)
	progress(true, c.err)
	d.wmu.Lock()
	delete(d.waking, n.Name)
	d.wmu.Unlock()
	close(c.done)
}

func (d *Director) wakeAndPoll(ctx context.Context, n meta.NodeStatus, timeout time.Duration, progress func(bool, error)) error {
	how, err := d.opts.Wake(ctx, n)
	if err != nil {
		return fmt.Errorf("%s; waking it failed: %w", notAwake(n), err)
	}
	d.log.Info("woke a node for a read; waiting", "node", n.Name, "how", how, "timeout", timeout)
	progress(false, nil)
	poll := time.NewTicker(wakePoll)
	defer poll.Stop()
	tell := time.NewTicker(time.Second)
	defer tell.Stop()
	for {
		select {
		case <-ctx.Done():
			if d.wakeCtx.Err() != nil {
				return errClosed
			}
			return fmt.Errorf("%s; woken (%s), it did not wake within %v", notAwake(n), how, timeout)
		case <-tell.C:
			progress(false, nil)
		case <-poll.C:
			st, err := d.env.Node(ctx, n.Name)
			if err != nil {
				if ctx.Err() != nil {
					continue // reported as the timeout above
				}
				d.log.Warn("reading the registry while a node wakes", "node", n.Name, "err", err)
				continue
			}
			if st.Removed != 0 {
				return errors.New("the node was removed from the realm")
			}
			if st.State == meta.NodeOnline && st.Addr != "" {
				return nil
			}
		}
	}
}

// errNoAwakeStore is the error of a read whose data only sleeping nodes
// hold, after waking them failed.
func errNoAwakeStore(id cairn.ID, n meta.NodeStatus, why error) error {
	return cairn.E("fetch", cairn.Unavailable, id.String(), fmt.Errorf("no awake store holds the data: it is held by %s, %w", n.Name, why))
}
