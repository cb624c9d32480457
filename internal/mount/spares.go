package mount

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Spare files. Every new file and every open that truncates gets an empty
// work copy (diskCache.newWork); making one is a create on the cache's
// disk, which the program creating the file waits for (and which some
// disks make slow: 100-250 µs each on this project's ext4 at times, as
// much as the local disk's own create). So empty files are made ahead, in
// the background, and a new work copy takes one: its create is then off
// the path of the request. They are named work/spare-<random> (a work
// copy's name needs no inode: its ino is kept in memory and in queue
// records), empty, and removed at the unmount; a killed mount's are
// removed by the next one (empty work copies are, at start).

// sparesMax is how many spare files are kept ready; refilled once fewer
// than half are left.
const sparesMax = 32

type spares struct {
	dir string // work/

	mu      sync.Mutex
	ready   []*os.File
	started bool
	stopped bool
	kick    chan struct{}
	done    chan struct{}
}

func newSpares(dir string) *spares {
	return &spares{dir: dir, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// take returns a spare file open read-write and its path, or nil when
// none is ready (the caller makes one itself). The first call starts the
// filler.
func (s *spares) take() (*os.File, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, ""
	}
	if !s.started {
		s.started = true
		go s.fill()
	}
	var f *os.File
	if n := len(s.ready); n > 0 {
		f = s.ready[n-1]
		s.ready = s.ready[:n-1]
	}
	if len(s.ready) < sparesMax/2 {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if f == nil {
		return nil, ""
	}
	return f, f.Name()
}

// fill makes spare files whenever asked, until stop.
func (s *spares) fill() {
	defer close(s.done)
	for range s.kick {
		for {
			s.mu.Lock()
			stop, need := s.stopped, len(s.ready) < sparesMax
			s.mu.Unlock()
			if stop || !need {
				break
			}
			var r [6]byte
			rand.Read(r[:])
			f, err := os.OpenFile(filepath.Join(s.dir, fmt.Sprintf("spare-%x", r)), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				break // the requests make their own, and say what fails
			}
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				f.Close()
				os.Remove(f.Name())
				break
			}
			s.ready = append(s.ready, f)
			s.mu.Unlock()
		}
	}
}

// stop ends the filler and removes the spare files left.
func (s *spares) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	left := s.ready
	s.ready = nil
	started := s.started
	s.mu.Unlock()
	close(s.kick)
	if started {
		<-s.done
	}
	for _, f := range left {
		f.Close()
		os.Remove(f.Name())
	}
}
