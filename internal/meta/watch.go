package meta

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// Watches are etcd's cache-invalidation callbacks (DESIGN decision 2): a
// client that caches entries watches the volume's records and drops or
// replaces what changed, so an open of an unchanged file needs no request
// (the lease idea of LBFS §3.2.1, without a lease term kept by a server).

// EntryChange is one change of a namespace record seen by a watch.
type EntryChange struct {
	// Parent and Name are where the record lives: the directory's inode
	// and the entry's name (Parent 0 and Name "" for the root's record).
	Parent uint64
	Name   string
	// Entry is the record after the change; nil when it was deleted
	// (moved to the trash, renamed away, purged).
	Entry *Entry
	// Rev is the etcd revision of the change: for a put, the new record's
	// ModRevision (Entry.Rev).
	Rev int64
}

// EntryEvents is one response of a watch: its changes, oldest first, and
// Rev, the revision up to which the watch has now reported every change
// of the volume's records. A response without changes is a progress
// notice (RequestProgress) or carried only changes of other records
// (locks, attributes, the trash).
type EntryEvents struct {
	Changes []EntryChange
	Rev     int64
}

// EntryWatch is a watch on every namespace record of one volume (the root
// and every directory's entries). Next is called from one goroutine;
// RequestProgress and Close from any.
type EntryWatch struct {
	// Start is the revision at which etcd established the watch: every
	// change after it is reported, in revision order, with none missing
	// until Next returns an error.
	Start int64

	v      *Vol
	ctx    context.Context
	cancel context.CancelFunc
	ch     clientv3.WatchChan
	once   sync.Once
}

// WatchEntries starts watching the volume's records and returns once etcd
// has established the watch (or ctx ends, or the service's OpTimeout
// passes: Kind Unavailable). The watch ends with an error
// from Next when etcd cancels it (its start was compacted away, the member
// lost its leader), on Close, or when ctx ends; a caller that caches
// entries must then assume it missed changes.
func (v *Vol) WatchEntries(ctx context.Context) (*EntryWatch, error) {
	// WithRequireLeader: a member cut off from its cluster cancels the
	// watch instead of keeping it open and silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	w := &EntryWatch{v: v, ctx: wctx, cancel: cancel}
	w.ch = v.s.cli.Watch(wctx, v.base, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-w.ch:
		if !ok || wr.Err() != nil || !wr.Created {
			cancel()
			err := error(errors.New("watch closed before it was established"))
			if ok && wr.Err() != nil {
				err = wr.Err()
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, etcdErr("watch", v.V.Name, err)
		}
		w.Start = wr.Header.Revision
		return w, nil
	case <-ctx.Done():
		cancel()
		return nil, etcdErr("watch", v.V.Name, ctx.Err())
	case <-time.After(v.s.opts.OpTimeout):
		cancel()
		return nil, etcdErr("watch", v.V.Name, context.DeadlineExceeded)
	}
}

// Next waits for the watch's next response. Once it has returned an
// error, the watch is over.
func (w *EntryWatch) Next() (EntryEvents, error) {
	wr, ok := <-w.ch
	if !ok {
		err := w.ctx.Err()
		if err == nil {
			err = errors.New("watch closed")
		}
		return EntryEvents{}, etcdErr("watch", w.v.V.Name, err)
	}
	if err := wr.Err(); err != nil {
		w.Close()
		return EntryEvents{}, etcdErr("watch", w.v.V.Name, err)
	}
	if wr.Canceled {
		w.Close()
		return EntryEvents{}, cairn.E("watch", cairn.Unavailable, w.v.V.Name, errors.New("watch cancelled by etcd"))
	}
	out := EntryEvents{Rev: wr.Header.Revision}
	for _, ev := range wr.Events {
		parent, name, ok := w.v.parseEntryKey(string(ev.Kv.Key))
		if !ok {
			continue
		}
		c := EntryChange{Parent: parent, Name: name, Rev: ev.Kv.ModRevision}
		if ev.Type == clientv3.EventTypePut {
			e, err := w.v.decode("watch", ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision)
			if err != nil {
				// A record no reader can decode: report it deleted, so
				// that nothing keeps a stale copy (a read then fails
				// with Corrupt).
				e = nil
			}
			c.Entry = e
		}
		out.Changes = append(out.Changes, c)
	}
	return out, nil
}

// RequestProgress asks etcd to send this watch a progress notice (a
// response with the current revision and no changes), so that a quiet
// watch can be told from a stalled one.
func (w *EntryWatch) RequestProgress() error {
	// The request goes to the gRPC stream the watch runs on, which the
	// client finds from the context's metadata: the watch's own context.
	return etcdErr("watch progress", w.v.V.Name, w.v.s.cli.RequestProgress(w.ctx))
}

// Close ends the watch; a Next in progress returns a Canceled error.
func (w *EntryWatch) Close() { w.once.Do(w.cancel) }

// parseEntryKey reads the directory and name of a namespace record's key
// (entryKey); ok is false for the volume's other keys.
func (v *Vol) parseEntryKey(k string) (parent uint64, name string, ok bool) {
	rest, found := strings.CutPrefix(k, v.base)
	if !found {
		return 0, "", false
	}
	if rest == "root" {
		return 0, "", true
	}
	rest, found = strings.CutPrefix(rest, "e/")
	if !found {
		return 0, "", false
	}
	hex, name, found := strings.Cut(rest, "/")
	if !found || len(hex) != 16 || name == "" {
		return 0, "", false
	}
	parent, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, "", false
	}
	return parent, name, true
}
