package meta

// Space reservations on benefactors (FreeLoader §4.1.1): before a client
// stores a dataset on donated space it reserves the bytes it will write,
// on each benefactor a plan names, in one etcd transaction: all or
// nothing. The transaction compares every benefactor's record and the
// reservations naming it with what the plan was made from, so two clients
// reserving at once never promise the same bytes twice: one of them reads
// again and plans with what is left. A reservation is a key per
// benefactor, resv/<node>/<id>, bound to a lease the client keeps alive:
// a client that dies leaves nothing reserved once its lease lapses.
// Format: doc/format.md, "Reservations".

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pki"
)

// ReservationFormat is the format of the reservation records this cairn
// writes.
const ReservationFormat = 1

// ReservationRecord is the value at resv/<node>/<id>: bytes reserved on
// one benefactor by one reservation.
type ReservationRecord struct {
	Format  int    `json:"format"`
	ID      string `json:"id"`     // the reservation's ID (32 hex digits), shared by its parts
	Node    string `json:"node"`   // the benefactor
	Bytes   int64  `json:"bytes"`  // reserved on it, > 0
	Holder  string `json:"holder"` // who reserved (a device's name), for people
	Created int64  `json:"created"`
}

// DecodeReservation reads a reservation record, checking its figures.
func DecodeReservation(b []byte) (ReservationRecord, error) {
	var r ReservationRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return ReservationRecord{}, cairn.E("read reservation", cairn.Corrupt, "", err)
	}
	if r.Format < 1 || r.Bytes <= 0 || r.Node == "" || r.ID == "" {
		return ReservationRecord{}, cairn.E("read reservation", cairn.Corrupt, r.ID, fmt.Errorf("format %d, %d bytes on %q", r.Format, r.Bytes, r.Node))
	}
	return r, nil
}

// Donor is a benefactor as a reservation plan sees it.
type Donor struct {
	Name string
	// Free is what it can still take: its donation less its use
	// (NodeRecord.DonorFree), less every live reservation naming it.
	Free int64
	// Rate is its reported serving rate, bytes per second.
	Rate float64
}

// ReserveRequest asks for a reservation.
type ReserveRequest struct {
	// Holder names who reserves (this device), for people.
	Holder string
	// TTL is the reservation's lease (at least 1 s): it lives while the
	// Reservation keeps it alive, and lapses within TTL of its holder's
	// death.
	TTL time.Duration
	// Plan says how many bytes to reserve on which donors, given the
	// awake benefactors (most free space first, then by name). It may be
	// called more than once (again after a concurrent change) and must
	// not ask more of a donor than its Free. An error ends Reserve.
	Plan func(donors []Donor) (map[string]int64, error)
}

// ErrNoRoom is the cause of a reservation the donors cannot take (Kind
// Permission, as a benefactor's own refusal past its donation).
var ErrNoRoom = errors.New("not enough donated space")

// Reservation is a live reservation: its parts stay reserved until
// Release, or until its lease lapses (its holder died).
type Reservation struct {
	s      *Service
	ID     string
	Parts  map[string]int64 // bytes per benefactor
	lease  clientv3.LeaseID
	cancel context.CancelFunc
	lost   chan struct{}
}

// resvPrefix is where the reservations naming node are.
func (s *Service) resvPrefix(node string) string { return s.key("resv", node) + "/" }

// Donors returns the awake benefactors with what each can still take,
// most free space first (then by name), read at one revision.
func (s *Service) Donors(ctx context.Context) ([]Donor, error) {
	d, _, _, err := s.donors(ctx)
	return d, err
}

// donors reads the awake benefactors, the reservations, and the
// revisions the reservation transaction compares.
func (s *Service) donors(ctx context.Context) (donors []Donor, rev int64, nodeRev map[string]int64, err error) {
	const op = "reserve"
	np, ap, rp := s.key("node")+"/", s.key("alive")+"/", s.key("resv")+"/"
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(np, clientv3.WithPrefix()), clientv3.OpGet(ap, clientv3.WithPrefix()),
		clientv3.OpGet(rp, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, 0, nil, etcdErr(op, "", err)
	}
	alive := map[string]int64{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		alive[string(kv.Key[len(ap):])] = aliveSince(kv.Value)
	}
	reserved := map[string]int64{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		r, derr := DecodeReservation(kv.Value)
		if derr != nil {
			return nil, 0, nil, cairn.E(op, cairn.Corrupt, string(kv.Key), derr)
		}
		// Counted under the node its key names, whatever the value says.
		node, _, _ := strings.Cut(string(kv.Key[len(rp):]), "/")
		reserved[node] += r.Bytes
	}
	nodeRev = map[string]int64{}
	now := time.Now()
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec NodeRecord
		if jerr := json.Unmarshal(kv.Value, &rec); jerr != nil {
			return nil, 0, nil, cairn.E(op, cairn.Corrupt, string(kv.Key), jerr)
		}
		since, ok := alive[rec.Name]
		if rec.Role != string(pki.Benefactor) || status(rec, ok, since, now).State != NodeAwake {
			continue
		}
		nodeRev[rec.Name] = kv.ModRevision
		donors = append(donors, Donor{Name: rec.Name, Free: max(rec.DonorFree()-reserved[rec.Name], 0), Rate: rec.Rate})
	}
	sort.Slice(donors, func(i, j int) bool {
		if donors[i].Free != donors[j].Free {
			return donors[i].Free > donors[j].Free
		}
		return donors[i].Name < donors[j].Name
	})
	return donors, resp.Header.Revision, nodeRev, nil
}

// Reserve makes a reservation as req.Plan says, in one transaction that
// holds only if no donor it names changed since the plan was made (its
// record, its reservations): otherwise it reads again and plans again.
// Kind Permission wrapping ErrNoRoom if the plan asks more of a donor than
// it can take, Invalid for a plan naming no bytes or a node that is not an
// awake benefactor.
func (s *Service) Reserve(ctx context.Context, req ReserveRequest) (*Reservation, error) {
	const op = "reserve"
	if req.TTL < time.Second {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("lease %v below 1s", req.TTL))
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	octx, ocancel := s.opCtx(ctx)
	defer ocancel()
	lg, err := s.cli.Grant(octx, int64((req.TTL+time.Second-1)/time.Second))
	if err != nil {
		return nil, etcdErr(op, id, err)
	}
	fail := func(err error) (*Reservation, error) {
		rctx, cancel := s.opCtx(context.WithoutCancel(ctx))
		defer cancel()
		_, _ = s.cli.Revoke(rctx, lg.ID)
		return nil, err
	}
	for {
		donors, rev, nodeRev, err := s.donors(octx)
		if err != nil {
			return fail(err)
		}
		plan, err := req.Plan(slicesClone(donors))
		if err != nil {
			return fail(err)
		}
		free := map[string]int64{}
		for _, d := range donors {
			free[d.Name] = d.Free
		}
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		names := make([]string, 0, len(plan))
		for n := range plan {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			b := plan[n]
			if b <= 0 {
				return fail(cairn.E(op, cairn.Invalid, n, fmt.Errorf("a plan reserves %d bytes", b)))
			}
			f, ok := free[n]
			if !ok {
				return fail(cairn.E(op, cairn.Invalid, n, errors.New("not an awake benefactor")))
			}
			if b > f {
				return fail(cairn.E(op, cairn.Permission, n, fmt.Errorf("%w: %d bytes asked, %d free", ErrNoRoom, b, f)))
			}
			rb, _ := json.Marshal(ReservationRecord{Format: ReservationFormat, ID: id, Node: n, Bytes: b, Holder: req.Holder, Created: time.Now().UnixNano()})
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.nodeKey(n)), "=", nodeRev[n]),
				clientv3.Compare(clientv3.ModRevision(s.resvPrefix(n)), "<", rev+1).WithPrefix())
			ops = append(ops, clientv3.OpPut(s.resvPrefix(n)+id, string(rb), clientv3.WithLease(lg.ID)))
		}
		if len(ops) == 0 {
			return fail(cairn.E(op, cairn.Invalid, "", errors.New("the plan reserves nothing")))
		}
		tr, err := s.cli.Txn(octx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fail(etcdErr(op, id, err))
		}
		if !tr.Succeeded {
			continue // a donor reported, or another reservation came: plan again
		}
		kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		ch, err := s.cli.KeepAlive(kctx, lg.ID)
		if err != nil {
			cancel()
			return fail(etcdErr(op, id, err))
		}
		r := &Reservation{s: s, ID: id, Parts: plan, lease: lg.ID, cancel: cancel, lost: make(chan struct{})}
		go func() {
			for range ch {
			}
			close(r.lost)
		}()
		return r, nil
	}
}

func slicesClone(d []Donor) []Donor { return append([]Donor(nil), d...) }

// Lost is closed when the reservation's lease is no longer kept alive
// (Release, or etcd could not be reached in time).
func (r *Reservation) Lost() <-chan struct{} { return r.lost }

// Release ends the reservation: its parts are free for others at once.
func (r *Reservation) Release(ctx context.Context) error {
	r.cancel()
	ctx, cancel := r.s.opCtx(ctx)
	defer cancel()
	if _, err := r.s.cli.Revoke(ctx, r.lease); err != nil {
		return etcdErr("release reservation", r.ID, err)
	}
	return nil
}

// Abandon stops keeping the reservation alive without releasing it, as a
// holder that dies does: it lapses with its lease (tests).
func (r *Reservation) Abandon() { r.cancel() }

// Reservations lists the live reservation records, by node then ID.
func (s *Service) Reservations(ctx context.Context) ([]ReservationRecord, error) {
	ctx, cancel := s.opCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("resv")+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, etcdErr("reservations", "", err)
	}
	out := make([]ReservationRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := DecodeReservation(kv.Value)
		if err != nil {
			return nil, cairn.E("reservations", cairn.Corrupt, string(kv.Key), err)
		}
		out = append(out, r)
	}
	return out, nil
}
