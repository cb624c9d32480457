// Package logind takes systemd-logind's sleep inhibitor (mode "delay")
// over D-Bus and reports its PrepareForSleep signals, so that a node can
// announce its standby before the machine sleeps (doc/power.md).
//
// logind delays a suspend while a delay inhibitor is held (at most its
// InhibitDelayMaxSec, 5 s by default): it emits PrepareForSleep(true),
// waits until every delay inhibitor's file descriptor is closed, sleeps,
// and emits PrepareForSleep(false) on resume. The holder takes the
// inhibitor again after a resume.
package logind

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/godbus/dbus/v5"

	"cairn.dev/cairn/internal/cairn"
)

// logind's names on the system bus.
const (
	Service = "org.freedesktop.login1"
	Path    = dbus.ObjectPath("/org/freedesktop/login1")
	Manager = "org.freedesktop.login1.Manager"
)

// SystemBus is the system bus's address when $DBUS_SYSTEM_BUS_ADDRESS is
// not set.
const SystemBus = "unix:path=/run/dbus/system_bus_socket"

// Watcher holds a connection to logind. Its methods may be called from
// any goroutine.
type Watcher struct {
	conn  *dbus.Conn
	why   string
	sleep chan bool

	mu sync.Mutex
	fd *os.File // the inhibitor, while held
}

// Open connects to the bus at address (empty: $DBUS_SYSTEM_BUS_ADDRESS,
// else SystemBus), checks that logind is on it and subscribes to its
// PrepareForSleep signal. why is the reason logind shows for the
// inhibitor. It fails with Unavailable if the bus cannot be reached or
// has no logind.
func Open(ctx context.Context, address, why string) (*Watcher, error) {
	const op = "logind"
	if address == "" {
		address = os.Getenv("DBUS_SYSTEM_BUS_ADDRESS")
	}
	if address == "" {
		address = SystemBus
	}
	conn, err := dbus.Connect(address, dbus.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, cairn.E(op, cairn.Unavailable, address, err)
	}
	var has bool
	if err := conn.BusObject().CallWithContext(ctx, "org.freedesktop.DBus.NameHasOwner", 0, Service).Store(&has); err != nil {
		conn.Close()
		return nil, cairn.E(op, cairn.Unavailable, address, err)
	}
	if !has {
		conn.Close()
		return nil, cairn.E(op, cairn.Unavailable, address, fmt.Errorf("no %s on this bus", Service))
	}
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchSender(Service), dbus.WithMatchObjectPath(Path),
		dbus.WithMatchInterface(Manager), dbus.WithMatchMember("PrepareForSleep")); err != nil {
		conn.Close()
		return nil, cairn.E(op, cairn.Unavailable, address, err)
	}
	sigs := make(chan *dbus.Signal, 16)
	conn.Signal(sigs)
	w := &Watcher{conn: conn, why: why, sleep: make(chan bool, 16)}
	go func() {
		defer close(w.sleep)
		for s := range sigs {
			if s.Path != Path || s.Name != Manager+".PrepareForSleep" || len(s.Body) != 1 {
				continue
			}
			if v, ok := s.Body[0].(bool); ok {
				w.sleep <- v
			}
		}
	}()
	return w, nil
}

// Sleep delivers the argument of every PrepareForSleep signal: true when
// the machine is about to sleep, false when it has resumed. It is closed
// when the connection ends.
func (w *Watcher) Sleep() <-chan bool { return w.sleep }

// Take takes a delay inhibitor of sleep, if this Watcher holds none.
func (w *Watcher) Take(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd != nil {
		return nil
	}
	var fd dbus.UnixFD
	err := w.conn.Object(Service, Path).CallWithContext(ctx, Manager+".Inhibit", 0, "sleep", "cairn", w.why, "delay").Store(&fd)
	if err != nil {
		return cairn.E("logind inhibit", cairn.Unavailable, "", err)
	}
	if fd < 0 {
		return cairn.E("logind inhibit", cairn.Other, "", errors.New("logind returned no file descriptor"))
	}
	w.fd = os.NewFile(uintptr(fd), "logind-inhibitor")
	return nil
}

// Held says whether this Watcher holds an inhibitor.
func (w *Watcher) Held() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fd != nil
}

// Release closes the inhibitor's file descriptor, if held: logind may
// then let the machine sleep.
func (w *Watcher) Release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd == nil {
		return nil
	}
	err := w.fd.Close()
	w.fd = nil
	return err
}

// Close releases the inhibitor and closes the connection.
func (w *Watcher) Close() error {
	rerr := w.Release()
	if err := w.conn.Close(); err != nil {
		return err
	}
	return rerr
}
