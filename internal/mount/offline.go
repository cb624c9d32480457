package mount

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/meta"
)

// The mount keeps this device's local copy of the volume's namespace
// (meta.LocalCopy, doc/offline.md): it takes a whole listing each time
// its watch is (re)established, applies every change the watch reports,
// and saves the copy every copySaveEvery while it changes (and at the
// unmount). While the metadata service cannot be reached, the volume's
// reads answer from the copy (meta.Vol), reads of data not on this device
// fail at once (director.Options.Offline), and changes go to the volume's
// offline log (meta.OfflineLog; refused with EROFS without one), replayed
// once the service is back.

// copySaveEvery is the least time between two saves of the local copy;
// a save that took long waits copySaveFactor times as long before the
// next, so that a large namespace costs the disk at most a twentieth of
// its time.
const (
	copySaveEvery  = 2 * time.Second
	copySaveFactor = 20
)

// errWatchSilent is why a mount finds the metadata service unreachable
// when its watch stops answering.
var errWatchSilent = errors.New("the watch on the volume stopped answering")

// localCopyPath is where the copy of volume id is kept.
func localCopyPath(o Options, id string) string {
	dir := o.LocalCopyDir
	if dir == "" {
		dir = filepath.Join(o.CacheDir, "offline")
	}
	return filepath.Join(dir, id)
}

// startCopy opens the volume's local copy and makes the volume answer
// from it while offline.
func (m *Mount) startCopy(o Options) {
	lc := meta.OpenLocalCopy(localCopyPath(o, m.vol.Meta.V.ID), m.vol.Meta.V, m.log)
	m.vol.Meta.UseLocalCopy(lc)
	m.lc = lc
	if st := lc.State(); st.Complete {
		m.log.Info("local copy of the namespace loaded", "revision", st.Rev, "entries", st.Entries, "saved", st.Saved.Format(time.RFC3339))
	}
	m.copyStop, m.copyDone = make(chan struct{}), make(chan struct{})
	m.copyKick = make(chan struct{}, 1)
	go m.keepCopy(m.copyStop, m.copyKick, m.copyDone)
	m.startOfflineLog(o)
}

// startOfflineLog opens the volume's offline log beside its local copy:
// while offline, the mount's changes are decided against the copy and
// appended to it (meta.Vol.UseOfflineLog); each time the service is back
// (and now, if it holds changes and the service answers) it is replayed.
// Without it (another process holds it) offline writes are refused.
func (m *Mount) startOfflineLog(o Options) {
	dir := meta.OfflineLogDir(filepath.Dir(localCopyPath(o, m.vol.Meta.V.ID)), m.vol.Meta.V.ID)
	l, err := meta.OpenOfflineLog(context.Background(), dir, meta.OfflineLogOptions{Device: o.Device, NoSync: o.Mode == WriteBack})
	if err != nil {
		m.log.Warn("no offline log: writes are refused while the metadata service cannot be reached", "err", err)
		return
	}
	for _, d := range l.Damage() {
		m.log.Error("the offline log is damaged: offline changes may be lost", "err", d)
	}
	m.offLog = l
	m.vol.Meta.UseOfflineLog(l)
	m.replayStop = make(chan struct{})
	stop := m.replayStop
	m.vol.Meta.Service().OnOnline(func() { m.replayOffline(stop) })
	if n := l.Len(); n > 0 {
		m.log.Info("offline changes wait for the metadata service", "count", n)
		if !m.offline() {
			go m.replayOffline(stop)
		}
	}
}

// replayOffline replays the offline log (one replay at a time), and says
// what it did in the mount's log: the conflicts it made, each.
func (m *Mount) replayOffline(stop <-chan struct{}) {
	m.replayMu.Lock()
	defer m.replayMu.Unlock()
	select {
	case <-stop:
		return
	default:
	}
	if m.offLog.Len() == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	t0 := time.Now()
	res, err := m.offLog.Replay(ctx, m.vol.Meta, m.log)
	if err != nil {
		m.log.Warn("offline changes not all replayed; the rest waits for the next time the service is back", "applied", res.Applied, "left", m.offLog.Len(), "err", err)
	} else {
		// At the level of the offline and online messages: the end of
		// the episode.
		m.log.Warn("offline changes replayed", "applied", res.Applied, "dropped", res.Dropped, "skipped", res.Skipped, "took", time.Since(t0))
	}
	if len(res.Conflicts) > 0 {
		m.log.Warn("the replay of offline changes made conflicts: see 'cairn conflicts'", "conflicts", len(res.Conflicts))
	}
}

// stopOfflineLog waits for a running replay and closes the log.
func (m *Mount) stopOfflineLog() {
	if m.offLog == nil {
		return
	}
	close(m.replayStop)
	m.replayMu.Lock()
	defer m.replayMu.Unlock()
	m.vol.Meta.UseOfflineLog(nil)
	if err := m.offLog.Close(); err != nil {
		m.log.Error("the offline log could not be closed", "err", err)
	}
}

// resyncCopy asks the copy keeper to take a whole listing (the watch was
// just established: what happened while there was none is in no change).
func (m *Mount) resyncCopy() {
	if m.copyKick == nil {
		return
	}
	select {
	case m.copyKick <- struct{}{}:
	default:
	}
}

// keepCopy takes the listings resyncCopy asks for and saves the copy.
// Its channels are passed in, not read from m: stopCopy clears
// m.copyStop once the keeper is done.
func (m *Mount) keepCopy(stop <-chan struct{}, kick <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	wait := copySaveEvery
	for {
		select {
		case <-stop:
			m.saveCopy(context.Background())
			return
		case <-kick:
			m.lc.BeginReplace()
			ents, rev, err := m.vol.Meta.Snapshot(ctx)
			if err != nil {
				m.lc.AbortReplace()
				m.log.Warn("local copy of the namespace not refreshed", "err", err)
				continue
			}
			m.lc.Replace(ents, rev)
			m.log.Debug("local copy of the namespace refreshed", "revision", rev, "entries", len(ents))
		case <-time.After(wait):
		}
		t0 := time.Now()
		m.saveCopy(ctx)
		wait = max(copySaveEvery, copySaveFactor*time.Since(t0))
	}
}

func (m *Mount) saveCopy(ctx context.Context) {
	if err := m.lc.Save(ctx); err != nil && ctx.Err() == nil {
		m.log.Warn("local copy of the namespace not saved", "err", err)
	}
}

// stopCopy saves the copy a last time and stops its keeper.
func (m *Mount) stopCopy() {
	if m.copyStop == nil {
		return
	}
	close(m.copyStop)
	<-m.copyDone
	m.copyStop = nil
}

// offlineStatus is the mount's offline state for its status.
func (m *Mount) offlineStatus() *apitypes.Offline {
	info, off := m.vol.Meta.Service().Offline()
	if !off {
		return nil
	}
	o := &apitypes.Offline{Since: info.Since, Cause: info.Cause}
	if m.lc != nil {
		st := m.lc.State()
		o.CopyRev, o.CopySaved, o.CopyEntries, o.Serving = st.Rev, st.Saved, st.Entries, st.Complete
	}
	return o
}

// offline reports whether the metadata service cannot be reached now.
func (m *Mount) offline() bool {
	_, off := m.vol.Meta.Service().Offline()
	return off
}

// offlineWrite reports whether a change must be refused because the
// metadata service cannot be reached (EROFS), logging the first refusal
// of each episode: with an offline log, none is (the volume takes them
// into its log: doc/offline.md); without, all are.
func (m *Mount) offlineWrite() bool {
	if !m.offline() || m.offLog != nil {
		return false
	}
	return m.refuseOffline()
}

// offlineLinkOrXattr reports whether a hard link or an extended attribute
// change must be refused (EROFS): offline, always (not in the local copy).
func (m *Mount) offlineLinkOrXattr() bool {
	if !m.offline() {
		return false
	}
	return m.refuseOffline()
}

func (m *Mount) refuseOffline() bool {
	if m.refusedOnce.CompareAndSwap(false, true) {
		m.log.Warn(meta.ErrOfflineWrites.Error())
	}
	return true
}
