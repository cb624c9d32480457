package meta

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"cairn.dev/cairn/internal/cairn"
)

// Options configure a Service. The zero value is usable.
type Options struct {
	// Prefix under which every key lives. Default "/cairn/v1/".
	Prefix string
	// LockTTL is the lease time of writer locks and the GC fence: a crashed
	// holder blocks others for at most this long. Default 15 s.
	LockTTL time.Duration
	// OpTimeout bounds each single etcd request. Default 10 s.
	OpTimeout time.Duration
	Logger    *slog.Logger
	// LocalCopyDir, if set, holds this device's local copies of
	// namespaces (a file per volume ID: doc/offline.md): while the
	// Service is offline, Open opens a volume from its copy.
	LocalCopyDir string
}

func (o *Options) fill() error {
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("/cairn/v%d/", FormatVersion)
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		return cairn.E("meta options", cairn.Invalid, o.Prefix, errors.New("prefix must end in '/'"))
	}
	if o.LockTTL == 0 {
		o.LockTTL = 15 * time.Second
	}
	if o.LockTTL < time.Second {
		return cairn.E("meta options", cairn.Invalid, "", fmt.Errorf("lock TTL %v below 1s", o.LockTTL))
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Service is the namespace of one realm, on an etcd client it does not own.
type Service struct {
	cli  *clientv3.Client
	opts Options

	mu      sync.Mutex
	session *concurrency.Session
	local   keyedLocks

	// format is the realm record's format as last read or raised by
	// UseFormat (0: not known yet).
	format atomic.Int32

	// off is whether etcd can be reached (offline.go).
	off offlineState

	// principal, if set, is who the Service acts for (acl.go).
	principal atomic.Pointer[Principal]
}

// New returns a Service using cli.
func New(cli *clientv3.Client, opts Options) (*Service, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return &Service{cli: cli, opts: opts}, nil
}

// Close ends the Service's lease (releasing any locks it still holds). The
// etcd client stays open: it belongs to the caller.
func (s *Service) Close() error {
	s.stopProbe()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != nil {
		// Session.Close waits up to the lease's TTL for the revoke; an
		// unreachable etcd must not hold a closing process that long
		// (the lease lapses by itself).
		s.session.Orphan()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		_, err := s.cli.Revoke(ctx, s.session.Lease())
		cancel()
		s.session = nil
		if err != nil {
			return etcdErr("close", "", err)
		}
	}
	return nil
}

// closeTimeout bounds Close's revoke of the writer-lock lease.
const closeTimeout = 2 * time.Second

// Client returns the underlying etcd client.
func (s *Service) Client() *clientv3.Client { return s.cli }

func (s *Service) sess(ctx context.Context) (*concurrency.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.session != nil {
		select {
		case <-s.session.Done():
			s.session = nil // lease lost (e.g. etcd restarted); get a new one
		default:
			return s.session, nil
		}
	}
	ss, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(s.opts.LockTTL/time.Second)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, etcdErr("lease", "", err)
	}
	s.session = ss
	return ss, nil
}

func (s *Service) key(parts ...string) string { return s.opts.Prefix + strings.Join(parts, "/") }

func (s *Service) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.OpTimeout)
}

// etcdErr classifies an error from the etcd client.
func etcdErr(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var ce *cairn.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return cairn.E(op, cairn.Canceled, path, err)
	case errors.Is(err, context.DeadlineExceeded):
		return cairn.E(op, cairn.Unavailable, path, fmt.Errorf("metadata service (etcd) did not answer in time: %w", err))
	}
	return cairn.E(op, cairn.Unavailable, path, fmt.Errorf("metadata service (etcd): %w", err))
}

// ---- realm-level records ----

// RealmInfo is stored at realm: written once by init.
type RealmInfo struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Format  int    `json:"format"`
}

// InitRealm records the realm's identity. It fails with Exist if the etcd
// prefix already holds a realm (with its ID in the error).
func (s *Service) InitRealm(ctx context.Context, info RealmInfo) error {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	b, _ := json.Marshal(info)
	k := s.key("realm")
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(b)), clientv3.OpPut(s.key("gc", "gen"), "0")).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return etcdErr("init realm", "", err)
	}
	if !resp.Succeeded {
		var old RealmInfo
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &old)
		}
		return cairn.E("init realm", cairn.Exist, old.ID, errors.New("this metadata service already holds a realm"))
	}
	return nil
}

// Realm returns the realm record, NotFound if init never ran here.
func (s *Service) Realm(ctx context.Context) (*RealmInfo, error) {
	var r RealmInfo
	if _, err := s.getJSON(ctx, "realm", s.key("realm"), &r); err != nil {
		return nil, err
	}
	s.format.Store(int32(r.Format))
	return &r, nil
}

// UseFormat makes sure the realm's record says format n or newer before a
// record of format n is written (record formats: RecordFormat). It raises
// the realm record's format by a compare-and-swap on the record as read, so
// that a binary reading only older formats refuses the realm from then on
// instead of misreading or rewriting records it does not know. Once the
// realm is known to be at n or above, it costs nothing.
func (s *Service) UseFormat(ctx context.Context, n int) error {
	if n > RecordFormat {
		return cairn.E("use metadata format", cairn.Invalid, "", fmt.Errorf("format %d; this cairn writes up to %d", n, RecordFormat))
	}
	if int(s.format.Load()) >= n {
		return nil
	}
	for {
		var r RealmInfo
		k := s.key("realm")
		rev, err := s.getJSON(ctx, "use metadata format", k, &r)
		if err != nil {
			return err
		}
		if r.Format >= n {
			s.format.Store(int32(r.Format))
			return nil
		}
		old := r.Format
		r.Format = n
		b, _ := json.Marshal(r)
		octx, cancel := s.opCtx(ctx)
		resp, err := s.cli.Txn(octx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, string(b))).Commit()
		cancel()
		if err != nil {
			return etcdErr("use metadata format", "realm", err)
		}
		if resp.Succeeded {
			s.opts.Logger.Info("realm metadata format raised", "from", old, "to", n)
			s.format.Store(int32(n))
			return nil
		}
	}
}

func (s *Service) getJSON(ctx context.Context, op, k string, v any) (int64, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, k)
	if err != nil {
		return 0, etcdErr(op, k, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, cairn.E(op, cairn.NotFound, strings.TrimPrefix(k, s.opts.Prefix), nil)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
		return 0, cairn.E(op, cairn.Corrupt, strings.TrimPrefix(k, s.opts.Prefix), err)
	}
	return resp.Kvs[0].ModRevision, nil
}

// ---- volumes ----

// CreateVolume records a new volume and its root directory atomically.
func (s *Service) CreateVolume(ctx context.Context, v Volume, rootMode, uid, gid uint32) error {
	if v.ID == "" {
		v.ID = randomID()
	}
	if v.Created == 0 {
		v.Created = time.Now().UnixNano()
	}
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	vb, _ := json.Marshal(v)
	root := Entry{Name: "", Parent: 0, Ino: RootIno, Type: TypeDir, Mode: rootMode, UID: uid, GID: gid, Mtime: v.Created, Ctime: v.Created}
	rb, _ := json.Marshal(root)
	vk := s.key("vol", v.Name)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(vk), "=", 0)).
		Then(clientv3.OpPut(vk, string(vb)), clientv3.OpPut(s.key("v", v.ID, "root"), string(rb))).Commit()
	if err != nil {
		return etcdErr("create volume", v.Name, err)
	}
	if !resp.Succeeded {
		return cairn.E("create volume", cairn.Exist, v.Name, nil)
	}
	return nil
}

// Volumes lists every volume, by name.
func (s *Service) Volumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	err := s.scan(ctx, "list volumes", s.key("vol")+"/", func(k, val []byte, _ int64) error {
		var v Volume
		if err := json.Unmarshal(val, &v); err != nil {
			return cairn.E("list volumes", cairn.Corrupt, string(k), err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// Open returns a handle on the named volume; NotFound if there is none.
func (s *Service) Open(ctx context.Context, name string) (*Vol, error) {
	if s.isOffline() && s.opts.LocalCopyDir != "" {
		if v := s.openCopy(name); v != nil {
			return v, nil
		}
	}
	var v Volume
	if _, err := s.getJSON(ctx, "open volume", s.key("vol", name), &v); err != nil {
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, cairn.E("open volume", cairn.NotFound, name, errors.New("no such volume (see 'cairn volume ls')"))
		}
		return nil, err
	}
	return &Vol{s: s, V: v, base: s.key("v", v.ID) + "/"}, nil
}

// scan calls fn for every key with the prefix, in key order, in pages.
func (s *Service) scan(ctx context.Context, op, prefix string, fn func(k, v []byte, rev int64) error) error {
	_, err := s.scanAt(ctx, op, prefix, fn)
	return err
}

// scanAt is scan that also returns the revision of the snapshot it read
// (every page is read at the first one's revision): the keys fn saw are
// those the prefix had at that revision, no more, no fewer.
func (s *Service) scanAt(ctx context.Context, op, prefix string, fn func(k, v []byte, rev int64) error) (int64, error) {
	at, _, err := s.scanOpts(ctx, op, prefix, 1000, fn)
	return at, err
}

// scanOpts is scanAt reading pages of limit keys with extra options
// (clientv3.WithKeysOnly: fn gets no values), which also returns the
// etcd cluster's ID.
func (s *Service) scanOpts(ctx context.Context, op, prefix string, limit int64, fn func(k, v []byte, rev int64) error, extra ...clientv3.OpOption) (int64, uint64, error) {
	start := prefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	var atRev int64
	for {
		cctx, cancel := s.opCtx(ctx)
		opts := append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}, extra...)
		if atRev != 0 {
			opts = append(opts, clientv3.WithRev(atRev))
		}
		resp, err := s.cli.Get(cctx, start, opts...)
		cancel()
		if err != nil {
			return 0, 0, etcdErr(op, prefix, err)
		}
		if atRev == 0 {
			atRev = resp.Header.Revision // one consistent snapshot across pages
		}
		for _, kv := range resp.Kvs {
			if err := fn(kv.Key, kv.Value, kv.ModRevision); err != nil {
				return 0, 0, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return atRev, resp.Header.ClusterId, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

func randomID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func randomIno() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	// Top bit clear (fits int64 tools), never 0 or the root.
	ino := binary.LittleEndian.Uint64(b[:]) >> 1
	if ino <= RootIno {
		ino += 2
	}
	return ino
}

func sortEntries(es []Entry) {
	sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
}
