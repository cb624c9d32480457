package meta

// Background work per store (doc/power.md, "Background work"): when gc,
// scrub and repair last ran to the end on each store, so that work
// skipped while a store's node was asleep is caught up once it is awake.
// Key: maint/<store>, where <store> is a node's name (its own store) or a
// registered store's name.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
)

// MaintFormat is the format of maint/<store> records.
const MaintFormat = 1

// Kinds of background work recorded per store.
const (
	MaintGC     = "gc"
	MaintScrub  = "scrub"
	MaintRepair = "repair"
)

// MaintRecord says when each kind of background work last completed on
// one store (unix ns; 0: never).
type MaintRecord struct {
	Format int    `json:"format"`
	Store  string `json:"store"`
	GC     int64  `json:"gc,omitempty"`
	Scrub  int64  `json:"scrub,omitempty"`
	Repair int64  `json:"repair,omitempty"`
}

// Last is when work of kind last completed (zero time: never).
func (m MaintRecord) Last(kind string) time.Time {
	var ns int64
	switch kind {
	case MaintGC:
		ns = m.GC
	case MaintScrub:
		ns = m.Scrub
	case MaintRepair:
		ns = m.Repair
	}
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// MarkMaint records that work of kind completed at at on each of stores.
// A later time recorded meanwhile is kept.
func (s *Service) MarkMaint(ctx context.Context, kind string, at time.Time, stores ...string) error {
	const op = "record background work"
	if kind != MaintGC && kind != MaintScrub && kind != MaintRepair {
		return cairn.E(op, cairn.Invalid, kind, fmt.Errorf("unknown kind of work %q", kind))
	}
	octx, cancel := s.opCtx(ctx)
	defer cancel()
	for _, name := range stores {
		k := s.key("maint", name)
		for {
			resp, err := s.cli.Get(octx, k)
			if err != nil {
				return etcdErr(op, name, err)
			}
			rec := MaintRecord{Store: name}
			var modRev int64
			if len(resp.Kvs) > 0 {
				if jerr := json.Unmarshal(resp.Kvs[0].Value, &rec); jerr != nil {
					return cairn.E(op, cairn.Corrupt, k, jerr)
				}
				if rec.Format != MaintFormat {
					return cairn.E(op, cairn.Corrupt, k, fmt.Errorf("format %d, this cairn reads %d", rec.Format, MaintFormat))
				}
				modRev = resp.Kvs[0].ModRevision
			}
			rec.Format, rec.Store = MaintFormat, name
			t := at.UnixNano()
			switch kind {
			case MaintGC:
				rec.GC = max(rec.GC, t)
			case MaintScrub:
				// A scrub checks everything a repair does.
				rec.Scrub, rec.Repair = max(rec.Scrub, t), max(rec.Repair, t)
			case MaintRepair:
				rec.Repair = max(rec.Repair, t)
			}
			b, _ := json.Marshal(rec)
			tr, err := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", modRev)).Then(clientv3.OpPut(k, string(b))).Commit()
			if err != nil {
				return etcdErr(op, name, err)
			}
			if tr.Succeeded {
				break
			}
		}
	}
	return nil
}

// Maint returns every store's background-work record, by store name.
func (s *Service) Maint(ctx context.Context) (map[string]MaintRecord, error) {
	const op = "read background work"
	octx, cancel := s.opCtx(ctx)
	defer cancel()
	p := s.key("maint") + "/"
	resp, err := s.cli.Get(octx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr(op, "", err)
	}
	out := map[string]MaintRecord{}
	for _, kv := range resp.Kvs {
		var rec MaintRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, cairn.E(op, cairn.Corrupt, string(kv.Key), err)
		}
		if rec.Format != MaintFormat {
			return nil, cairn.E(op, cairn.Corrupt, string(kv.Key), fmt.Errorf("format %d, this cairn reads %d", rec.Format, MaintFormat))
		}
		out[strings.TrimPrefix(string(kv.Key), p)] = rec
	}
	return out, nil
}
