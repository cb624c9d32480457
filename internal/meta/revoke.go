package meta

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
)

// The realm's revocation list lives in etcd, so every device and node that
// reads the metadata sees a removal: revoked/name/<name> revokes every
// certificate of that node name issued at or before the time it holds,
// revoked/serial/<hex> one certificate. Same rules as pki.RevocationList.

type revocation struct {
	At time.Time `json:"at"`
}

func (s *Service) revokedNameKey(name string) string { return s.key("revoked", "name", name) }

// RevokeSerial revokes the one certificate with this serial number.
func (s *Service) RevokeSerial(ctx context.Context, serial *big.Int) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	b, _ := json.Marshal(revocation{At: time.Now().UTC()})
	if _, err := s.cli.Put(ctx, s.key("revoked", "serial", serial.Text(16)), string(b)); err != nil {
		return etcdErr("revoke", serial.Text(16), err)
	}
	return nil
}

// Revocations is a pki.Revocations kept in memory and in step with etcd by
// a watch. Until its first load, and while the watch is broken, it refuses
// every peer (revocation checking fails closed); it keeps retrying.
type Revocations struct {
	s      *Service
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.RWMutex
	names   map[string]time.Time
	serials map[string]time.Time
	err     error // why the list is not trusted now; nil when in step
}

var _ pki.Revocations = (*Revocations)(nil)

// WatchRevocations loads the revocation list and keeps it current until
// Close. It returns once the first load succeeded or failed.
func (s *Service) WatchRevocations(ctx context.Context) (*Revocations, error) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &Revocations{s: s, cancel: cancel, done: make(chan struct{}), err: errors.New("revocation list not loaded yet")}
	rev, err := r.load(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	go r.run(wctx, rev)
	return r, nil
}

// RevocationList reads the realm's whole revocation list: the revoked
// names and serials (hex), each with its time, and the revision it was
// read at. The one reader of the revoked/ keys (a registrar hands the list
// to its nodes; Revocations keeps it current by a watch).
func (s *Service) RevocationList(ctx context.Context) (names, serials map[string]time.Time, rev int64, err error) {
	octx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("revoked") + "/"
	resp, gerr := s.cli.Get(octx, p, clientv3.WithPrefix())
	if gerr != nil {
		return nil, nil, 0, etcdErr("load revocations", "", gerr)
	}
	names, serials = map[string]time.Time{}, map[string]time.Time{}
	for _, kv := range resp.Kvs {
		if aerr := apply(names, serials, strings.TrimPrefix(string(kv.Key), p), kv.Value); aerr != nil {
			return nil, nil, 0, aerr
		}
	}
	return names, serials, resp.Header.Revision, nil
}

// load reads the whole list and returns the revision it read at.
func (r *Revocations) load(ctx context.Context) (int64, error) {
	names, serials, rev, err := r.s.RevocationList(ctx)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.names, r.serials, r.err = names, serials, nil
	r.mu.Unlock()
	return rev, nil
}

// apply records one key (relative to revoked/); a nil value deletes it.
func apply(names, serials map[string]time.Time, rel string, val []byte) error {
	kind, id, ok := strings.Cut(rel, "/")
	if !ok {
		return nil
	}
	m := names
	switch kind {
	case "name":
	case "serial":
		m = serials
	default:
		return nil // a later kind of revocation: not ours to judge
	}
	if val == nil {
		delete(m, id)
		return nil
	}
	var rv revocation
	if err := json.Unmarshal(val, &rv); err != nil {
		return cairn.E("load revocations", cairn.Corrupt, rel, err)
	}
	m[id] = rv.At
	return nil
}

func (r *Revocations) setErr(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

func (r *Revocations) run(ctx context.Context, rev int64) {
	defer close(r.done)
	s := r.s
	p := s.key("revoked") + "/"
	for ctx.Err() == nil {
		wch := s.cli.Watch(clientv3.WithRequireLeader(ctx), p, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if err := resp.Err(); err != nil {
				r.setErr(etcdErr("watch revocations", "", err))
				break
			}
			r.mu.Lock()
			for _, ev := range resp.Events {
				var val []byte
				if ev.Type == clientv3.EventTypePut {
					val = ev.Kv.Value
				}
				if err := apply(r.names, r.serials, strings.TrimPrefix(string(ev.Kv.Key), p), val); err != nil {
					r.err = err
				}
			}
			r.mu.Unlock()
			rev = resp.Header.Revision
		}
		if ctx.Err() != nil {
			return
		}
		r.mu.RLock()
		ok := r.err == nil
		r.mu.RUnlock()
		if ok {
			r.setErr(cairn.E("watch revocations", cairn.Unavailable, "", errors.New("lost the metadata service")))
		}
		// Reload from scratch (the watch may have missed events), then
		// watch again; until then every peer is refused.
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if n, err := r.load(ctx); err == nil {
			rev = n
		}
	}
}

// Revoked implements pki.Revocations.
func (r *Revocations) Revoked(cert *x509.Certificate) (bool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.err != nil {
		return true, r.err
	}
	if _, ok := r.serials[cert.SerialNumber.Text(16)]; ok {
		return true, nil
	}
	if at, ok := r.names[cert.Subject.CommonName]; ok && !cert.NotBefore.Add(pki.Backdate).After(at) {
		return true, nil
	}
	return false, nil
}

// Close stops the watch.
func (r *Revocations) Close() error {
	r.cancel()
	<-r.done
	return nil
}
