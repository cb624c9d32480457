package meta

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Working without the metadata service (doc/offline.md). When etcd (or
// the gateway in front of it) cannot be reached, a Service is offline: a
// volume with a usable local copy (Vol.UseLocalCopy) answers its reads
// from it at once, without trying etcd again, and refuses writes at once
// (ErrOfflineWrites) unless it has an offline log (offwrite.go); a probe
// asks etcd every probeEvery and turns the Service online again when it
// answers.

// ErrOfflineWrites is the cause of the error a write gets while the
// Service is offline (Kind Unavailable).
var ErrOfflineWrites = errors.New("offline: writes need the metadata service (a mount takes them offline, into its offline log)")

// errOfflineXattrs is why an extended attribute cannot be read offline.
var errOfflineXattrs = errors.New("offline: extended attributes are not in the local copy")

// probeEvery is how often an offline Service asks etcd whether it is back;
// probeTimeout bounds each try.
const (
	probeEvery   = time.Second
	probeTimeout = 2 * time.Second
)

type offlineState struct {
	mu      sync.Mutex
	since   time.Time // zero: online
	cause   error
	episode uint64 // counts the times the Service went offline
	probing bool
	stop    chan struct{} // closed by Close: no new probe, the running one ends
	online  []func()      // called (in their own goroutines) when the service is back
	gen     atomic.Int64  // the last GC generation WriteGen read (given offline)
}

// OfflineInfo says since when the Service has been offline, and why.
type OfflineInfo struct {
	Since time.Time
	Cause string
}

// Offline reports whether the Service is offline now (and since when).
func (s *Service) Offline() (OfflineInfo, bool) {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	if s.off.since.IsZero() {
		return OfflineInfo{}, false
	}
	c := ""
	if s.off.cause != nil {
		c = s.off.cause.Error()
	}
	return OfflineInfo{Since: s.off.since, Cause: c}, true
}

func (s *Service) isOffline() bool {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	return !s.off.since.IsZero()
}

// OnOnline registers f, called in its own goroutine each time the Service
// turns online again after being offline.
func (s *Service) OnOnline(f func()) {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	s.off.online = append(s.off.online, f)
}

// MarkUnreachable turns the Service offline, because of err (an error of
// Kind Unavailable from etcd, or a watch that stopped answering), unless
// it is already. It logs once and starts the probe that turns it online.
func (s *Service) MarkUnreachable(err error) {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	if !s.off.since.IsZero() {
		return
	}
	if s.off.stop == nil {
		s.off.stop = make(chan struct{})
	}
	select {
	case <-s.off.stop:
		return // closed
	default:
	}
	s.off.since, s.off.cause = time.Now(), err
	s.off.episode++
	s.opts.Logger.Warn("offline: metadata service unreachable", "since", s.off.since.Format(time.RFC3339), "err", err)
	if !s.off.probing {
		s.off.probing = true
		go s.probe(s.off.stop)
	}
}

// probe asks etcd for the realm record every probeEvery until it
// answers, then turns the Service online.
func (s *Service) probe(stop chan struct{}) {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			s.off.mu.Lock()
			s.off.probing = false
			s.off.mu.Unlock()
			return
		case <-t.C:
		}
		// gRPC waits longer and longer between its attempts to connect
		// again (up to 2 minutes) while nothing answers: the probe asks
		// it to try now, so that the service is found within a probe of
		// its return however long it was gone.
		if cc := s.cli.ActiveConnection(); cc != nil {
			cc.ResetConnectBackoff()
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		_, err := s.cli.Get(ctx, s.key("realm"))
		cancel()
		if err != nil {
			continue
		}
		s.off.mu.Lock()
		since := s.off.since
		// Logged before the state changes: whoever sees it online can
		// find the line. At the level of the line that said offline, so
		// that a log showing one shows the other.
		s.opts.Logger.Warn("online: metadata service reachable again", "offline_for", time.Since(since).Round(time.Millisecond).String())
		s.off.since, s.off.cause, s.off.probing = time.Time{}, nil, false
		fs := append([]func(){}, s.off.online...)
		s.off.mu.Unlock()
		for _, f := range fs {
			go f()
		}
		return
	}
}

// stopProbe ends the probe (Close).
func (s *Service) stopProbe() {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	if s.off.stop == nil {
		s.off.stop = make(chan struct{})
	}
	select {
	case <-s.off.stop:
	default:
		close(s.off.stop)
	}
}

// offlineEpisode returns the count of times the Service went offline.
func (s *Service) offlineEpisode() uint64 {
	s.off.mu.Lock()
	defer s.off.mu.Unlock()
	return s.off.episode
}

// volLocal is a Vol's local copy and whether it has said, in this
// offline episode, that it serves it.
type volLocal struct {
	lc  atomic.Pointer[LocalCopy]
	log atomic.Pointer[OfflineLog]
	// policies are the placement policies last read (Vol.Policies
	// answers with them offline).
	policies atomic.Pointer[[]PolicyRecord]
	logged   atomic.Uint64 // the episode it last logged
}

// Service returns the Service v belongs to.
func (v *Vol) Service() *Service { return v.s }

// UseLocalCopy makes v answer from lc while the Service is offline.
func (v *Vol) UseLocalCopy(lc *LocalCopy) { v.loc().lc.Store(lc) }

// LocalCopy returns the copy v answers from offline (nil: none).
func (v *Vol) LocalCopy() *LocalCopy { return v.loc().lc.Load() }

func (v *Vol) loc() *volLocal {
	v.locOnce.Do(func() { v.local = &volLocal{} })
	return v.local
}

// offlineCopy returns the copy to answer from instead of etcd: when the
// Service is offline, or when err (from etcd) says it cannot be reached,
// and v has a usable copy. The first answer from it in an offline episode
// is logged.
func (v *Vol) offlineCopy(ctx context.Context, err error) *LocalCopy {
	if replaying(ctx) {
		return nil // a replay reads etcd or nothing
	}
	lc := v.LocalCopy()
	if lc == nil || !lc.Usable() {
		return nil
	}
	if err != nil {
		if cairn.KindOf(err) != cairn.Unavailable {
			return nil
		}
		v.s.MarkUnreachable(err)
	} else if !v.s.isOffline() {
		return nil
	}
	ep := v.s.offlineEpisode()
	if old := v.loc().logged.Load(); old != ep && v.loc().logged.CompareAndSwap(old, ep) {
		info, _ := v.s.Offline()
		st := lc.State()
		v.s.opts.Logger.Warn("offline: metadata service unreachable since "+info.Since.Format(time.RFC3339)+
			"; serving the local copy from "+st.Saved.Format(time.RFC3339)+", revision "+strconv.FormatInt(st.Rev, 10),
			"volume", v.V.Name)
	}
	return lc
}

// offlineWrite returns the error a write gets while the Service is
// offline, nil when it is online.
func (v *Vol) offlineWrite(op, path string) error {
	if !v.s.isOffline() {
		return nil
	}
	return cairn.E(op, cairn.Unavailable, path, ErrOfflineWrites)
}

// HasLocalCopies reports whether dir holds any local copy file.
func HasLocalCopies(dir string) bool {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.Contains(e.Name(), ".") {
			return true
		}
	}
	return false
}

// openCopy returns volume name answered from its local copy in
// LocalCopyDir, or nil if there is no usable one.
func (s *Service) openCopy(name string) *Vol {
	ents, _ := os.ReadDir(s.opts.LocalCopyDir)
	for _, e := range ents {
		if !e.Type().IsRegular() || strings.Contains(e.Name(), ".") {
			continue
		}
		p := filepath.Join(s.opts.LocalCopyDir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f, err := DecodeLocalCopy(b)
		if err != nil || f.Volume.Name != name || f.Volume.ID != e.Name() {
			continue
		}
		lc := OpenLocalCopy(p, f.Volume, s.opts.Logger)
		if !lc.Usable() {
			continue
		}
		v := &Vol{s: s, V: f.Volume, base: s.key("v", f.Volume.ID) + "/"}
		v.UseLocalCopy(lc)
		return v
	}
	return nil
}

// Snapshot reads every namespace record of the volume at one revision
// (in pages): what a local copy is made from (LocalCopy.Replace).
func (v *Vol) Snapshot(ctx context.Context) ([]Entry, int64, error) {
	var out []Entry
	at, err := v.s.scanAt(ctx, "snapshot", v.base, func(k, val []byte, rev int64) error {
		if _, _, ok := v.parseEntryKey(string(k)); !ok {
			return nil
		}
		e, err := v.decode("snapshot", k, val, rev)
		if err != nil {
			if cairn.KindOf(err) == cairn.Corrupt {
				return nil // as the watch does: a record no reader can decode is not kept
			}
			return err
		}
		out = append(out, *e)
		return nil
	})
	return out, at, err
}
