package mount

import (
	"sync"
	"time"
)

// BreakWatch ends the mount's watch as a failure would and holds the
// next one back until resume is called. It returns once the mount has
// stopped trusting its entry cache.
func BreakWatch(m *Mount) (resume func()) {
	hold := make(chan struct{})
	m.watchMu.Lock()
	m.watchHold = hold
	w := m.curWatch
	m.watchMu.Unlock()
	if w != nil {
		w.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, trusted := m.ents.watchedRev(); !trusted {
			break
		}
		if time.Now().After(deadline) {
			panic("the mount still trusts its entry cache after its watch was closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return func() {
		m.watchMu.Lock()
		m.watchHold = nil
		m.watchMu.Unlock()
		close(hold)
	}
}

// WatchState returns the revision up to which the mount's watch has
// reported every change, and whether the mount trusts its entry cache.
func WatchState(m *Mount) (int64, bool) { return m.ents.watchedRev() }

// CacheStats returns the bytes of clean copies in the cache and how many
// were evicted.
func CacheStats(m *Mount) (int64, int64) { return m.cache.size(), m.cache.evictions.Load() }

// CacheDir returns the mount's cache directory for its volume.
func CacheDir(m *Mount) string { return m.cache.dir }

// SetWatchTiming changes how long the entry cache is trusted after the
// watch last answered, and how often the watch is asked for progress.
func SetWatchTiming(m *Mount, trust, progress time.Duration) {
	m.ents.mu.Lock()
	m.ents.trust, m.ents.progress = trust, progress
	m.ents.mu.Unlock()
}

// OpenCopies returns how many copies have handles (the kernel sends a
// release some time after the last close), or are held (passthrough: a
// writable mapping may outlive the last close, held.go).
func OpenCopies(m *Mount) int {
	open := map[*content]bool{}
	for _, c := range m.cache.openContents() {
		open[c] = true
	}
	m.heldMu.Lock()
	for c := range m.held {
		open[c] = true
	}
	m.heldMu.Unlock()
	return len(open)
}

// HeldCopies returns how many copies are held (held.go).
func HeldCopies(m *Mount) int {
	m.heldMu.Lock()
	defer m.heldMu.Unlock()
	return len(m.held)
}

// ReadCalls returns how many reads the kernel asked of the mount.
func ReadCalls(m *Mount) int64 { return m.readCalls.Load() }

// PassthroughOn reports whether new opens of the mount use passthrough.
func PassthroughOn(m *Mount) bool { return m.ptOn() }

// WriteCalls returns how many writes the kernel asked of the mount.
func WriteCalls(m *Mount) int64 { return m.writeCalls.Load() }

// FlushCalls returns how many FLUSH requests the kernel made.
func FlushCalls(m *Mount) int64 { return m.flushCalls.Load() }

// ReleaseWaitsOut counts the fsyncs that waited their whole bound for
// other writers' releases.
func ReleaseWaitsOut(m *Mount) int64 { return m.releaseWaitsOut.Load() }

// GetattrCalls returns how many GETATTR requests the kernel made.
func GetattrCalls(m *Mount) int64 { return m.getattrCalls.Load() }

// SetQuietTime sets how long a write-back mount must go without a request
// to count as quiet (quiet.go).
func SetQuietTime(m *Mount, d time.Duration) { m.quietTime.Store(int64(d)) }

// HoldWriteBack stops the applier of a write-back mount before its next
// batch until release is called: changes stay pending meanwhile.
func HoldWriteBack(m *Mount) (release func()) {
	hold := make(chan struct{})
	m.wb.mu.Lock()
	m.wb.hold = hold
	m.wb.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.wb.mu.Lock()
			m.wb.hold = nil
			m.wb.mu.Unlock()
			close(hold)
		})
	}
}

// PendingChanges returns how many namespace changes a write-back mount
// has not written yet.
func PendingChanges(m *Mount) int {
	m.wb.mu.Lock()
	defer m.wb.mu.Unlock()
	return len(m.wb.items)
}

// ForgetRoot asks the kernel to drop its entry for name in the root
// (FUSE_NOTIFY_INVAL_ENTRY) and reports whether the kernel then let the
// node go (it is no longer in go-fuse's tree) within wait.
func ForgetRoot(m *Mount, name string, wait time.Duration) bool {
	m.root.NotifyEntry(name)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m.root.GetChild(name) == nil {
			return true
		}
	}
	return false
}

// CheckAllowOtherUser is CheckAllowOther for a user other than root.
var CheckAllowOtherUser = checkAllowOther

// HoldQueue keeps a mount's queued commits from being made until release
// is called.
func HoldQueue(m *Mount) (release func()) {
	hold := make(chan struct{})
	m.queue.mu.Lock()
	m.queue.hold = hold
	m.queue.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.queue.mu.Lock()
			m.queue.hold = nil
			m.queue.mu.Unlock()
			close(hold)
			m.queue.poke()
		})
	}
}

// HoldRelease holds the mount's RELEASE requests until release is called,
// as a kernel that sends the release late after the close.
func HoldRelease(m *Mount) (release func()) {
	hold := make(chan struct{})
	m.releaseHold.Store(&hold)
	var once sync.Once
	return func() {
		once.Do(func() {
			m.releaseHold.Store(nil)
			close(hold)
		})
	}
}

// ListingCached reports whether the entry cache holds directory ino's
// every entry (answers its link count without a listing).
func ListingCached(m *Mount, ino uint64) bool {
	_, ok := m.ents.subdirCount(ino, nil)
	return ok
}
