package pki

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"sync"
	"syscall"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// Revocations is where the realm's revocation list comes from. ServerTLS and
// ClientTLS consult it on every handshake, and the node service on every
// request, so an implementation must answer from memory (a file re-read when
// it changes; later an etcd watch).
type Revocations interface {
	// Revoked reports whether cert, a node certificate that already
	// verified against the realm CA, is revoked. A non-nil error refuses
	// the peer: revocation checking fails closed.
	Revoked(cert *x509.Certificate) (bool, error)
}

// NoRevocations revokes nothing. For tests and for a realm's very first
// start; everything else passes a real list.
type NoRevocations struct{}

// Revoked reports false.
func (NoRevocations) Revoked(*x509.Certificate) (bool, error) { return false, nil }

// RecheckInterval is how often a file-backed RevocationList looks at its file
// for changes made by another process: a revocation reaches a running
// server within this time.
const RecheckInterval = time.Second

const revocationFormat = 1

// RevocationList is a Revocations kept in memory and, if opened with a path,
// in a JSON file shared by every process of the machine. It revokes single
// certificates by serial number, and whole node names: revoking a name
// revokes every certificate of that name issued (NotBefore + Backdate) at or
// before the revocation, so a node removed and later re-invited under the
// same name is accepted again with its new certificate.
type RevocationList struct {
	path string
	now  func() time.Time

	mu        sync.RWMutex
	serials   map[string]time.Time // lowercase hex serial → revoked at
	names     map[string]time.Time // node name → revoked at
	lastCheck time.Time
	file      os.FileInfo // of the version loaded; nil if none
}

type revocationFile struct {
	Format  int                  `json:"format"`
	Serials map[string]time.Time `json:"serials"`
	Names   map[string]time.Time `json:"names"`
}

// NewRevocationList returns an empty list kept only in memory.
func NewRevocationList() *RevocationList {
	return &RevocationList{now: time.Now, serials: map[string]time.Time{}, names: map[string]time.Time{}}
}

// OpenRevocationList opens the list kept in the file at path (a missing file
// is an empty list; it is created on the first revocation).
func OpenRevocationList(path string) (*RevocationList, error) {
	l := NewRevocationList()
	l.path = path
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.reloadLocked(true); err != nil {
		return nil, err
	}
	return l, nil
}

// reloadLocked re-reads the file if it changed (always, if force).
func (l *RevocationList) reloadLocked(force bool) error {
	const op = "read revocation list"
	l.lastCheck = l.now()
	fi, err := os.Stat(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		l.serials, l.names = map[string]time.Time{}, map[string]time.Time{}
		l.file = nil
		return nil
	}
	if err != nil {
		return cairn.E(op, cairn.IO, l.path, err)
	}
	if !force && l.file != nil && os.SameFile(fi, l.file) && fi.ModTime().Equal(l.file.ModTime()) && fi.Size() == l.file.Size() {
		return nil
	}
	b, err := os.ReadFile(l.path)
	if err != nil {
		return cairn.E(op, cairn.IO, l.path, err)
	}
	var f revocationFile
	if err := json.Unmarshal(b, &f); err != nil {
		return cairn.E(op, cairn.Corrupt, l.path, err)
	}
	if f.Format != revocationFormat {
		return cairn.E(op, cairn.Corrupt, l.path, fmt.Errorf("format %d, this cairn reads %d", f.Format, revocationFormat))
	}
	if f.Serials == nil {
		f.Serials = map[string]time.Time{}
	}
	if f.Names == nil {
		f.Names = map[string]time.Time{}
	}
	l.serials, l.names = f.Serials, f.Names
	l.file = fi
	return nil
}

// Revoked implements Revocations.
func (l *RevocationList) Revoked(cert *x509.Certificate) (bool, error) {
	if l.path != "" {
		l.mu.RLock()
		stale := l.now().Sub(l.lastCheck) >= RecheckInterval
		l.mu.RUnlock()
		if stale {
			l.mu.Lock()
			err := l.reloadLocked(false)
			l.mu.Unlock()
			if err != nil {
				return true, err
			}
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if _, ok := l.serials[serialKey(cert.SerialNumber)]; ok {
		return true, nil
	}
	if at, ok := l.names[cert.Subject.CommonName]; ok && !cert.NotBefore.Add(Backdate).After(at) {
		return true, nil
	}
	return false, nil
}

// RevokeSerial revokes the one certificate with this serial number.
func (l *RevocationList) RevokeSerial(serial *big.Int) error {
	return l.update(func(f *revocationFile) { f.Serials[serialKey(serial)] = l.now().UTC() })
}

// RevokeName revokes every certificate issued so far to the node name.
func (l *RevocationList) RevokeName(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	return l.update(func(f *revocationFile) { f.Names[name] = l.now().UTC() })
}

// RevokedNames returns the revoked node names and when each was revoked.
func (l *RevocationList) RevokedNames() (map[string]time.Time, error) {
	if l.path != "" {
		l.mu.Lock()
		err := l.reloadLocked(false)
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	m := make(map[string]time.Time, len(l.names))
	for k, v := range l.names {
		m[k] = v
	}
	return m, nil
}

// update applies fn to the list; for a file-backed list it does so under an
// exclusive lock on path+".lock", on the file's current content, and writes
// the file back atomically.
func (l *RevocationList) update(fn func(*revocationFile)) error {
	const op = "revoke"
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.path != "" {
		unlock, err := lockFile(l.path + ".lock")
		if err != nil {
			return cairn.E(op, cairn.IO, l.path, err)
		}
		defer unlock()
		if err := l.reloadLocked(true); err != nil {
			return err
		}
	}
	f := &revocationFile{Format: revocationFormat, Serials: clone(l.serials), Names: clone(l.names)}
	fn(f)
	if l.path != "" {
		b, err := json.MarshalIndent(f, "", "  ")
		if err != nil {
			return cairn.E(op, cairn.Other, l.path, err)
		}
		if err := durable.ReplaceFile(l.path, append(b, '\n'), 0o644); err != nil {
			return cairn.E(op, cairn.IO, l.path, err)
		}
		if err := l.reloadLocked(true); err != nil {
			return err
		}
		return nil
	}
	l.serials, l.names = f.Serials, f.Names
	return nil
}

func clone(m map[string]time.Time) map[string]time.Time {
	c := make(map[string]time.Time, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func serialKey(s *big.Int) string { return s.Text(16) }

// lockFile takes an exclusive flock on path (created 0600), returning the
// function that releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
