package director

// Striping across benefactors (FreeLoader §3.2, §4.1.2; DESIGN "Donated
// desktops"): a stripe:W[,greedy] policy. A write's chunks (encrypted by
// the pipeline above, as every chunk is) are packed into morsels of about
// MorselSize (packstore packs: an object named by the hash of its bytes,
// with a trailer listing the chunk IDs it holds), and each morsel goes to
// one benefactor, round-robin over the stripe node set. The set is chosen
// greedily when the policy is first written under: the benefactors sorted
// by what they can still take, the top W that have room for a morsel
// (fewer when fewer have room: the width is decremented). Space is
// reserved before anything is written (meta.Service.Reserve: one etcd
// transaction, all or nothing, bound to this client's lease) in
// increments of Options.StripeReserve, and reserved again on the same set
// when the reservation is used up; a write the set cannot take fails with
// Kind Permission (meta.ErrNoRoom). Versions record the policy with its
// node set (stripe:W,greedy@b1,...,bn), from which any device rebuilds the
// read path: a pack store over the same set, which learns where each chunk
// is from the morsels' trailers. Benefactors only ever receive morsels:
// ciphertext chunks and their IDs.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/store/packstore"
)

// MorselSize is the size of a morsel: the pack size of a striped policy's
// pack store (FreeLoader's 1 MiB morsels).
const MorselSize = 1 << 20

// DefaultStripeReserve is how much a striped write reserves at a time.
const DefaultStripeReserve = 256 << 20

// stripeLease is the lease of a striped write's reservations: they lapse
// this long after the writer dies.
const stripeLease = 10 * time.Second

// Donations is the optional ability of an Env to reserve donated space
// (meta.Service.Reserve). Without it a stripe policy cannot be written.
type Donations interface {
	Reserve(ctx context.Context, req meta.ReserveRequest) (*meta.Reservation, error)
}

// stripeStrategy chooses the stripe node set of pol (a policy a person
// set, naming no benefactors) on the first write under it, reserving the
// first increment, and returns the wrapper of the policy with its set.
func stripeStrategy(ctx context.Context, d *Director, pol meta.Policy) (Strategy, error) {
	if len(pol.Stores) > 0 {
		// A recorded stripe set (written before): its own wrapper.
		return d.Policy(ctx, pol.String())
	}
	key := pol.String()
	d.stripeMu.Lock()
	defer d.stripeMu.Unlock()
	if name := d.stripeSets[key]; name != "" {
		return d.Policy(ctx, name)
	}
	don, ok := d.env.(Donations)
	if !ok {
		return nil, cairn.E("open policy", cairn.Invalid, key, errors.New("this realm cannot reserve donated space"))
	}
	inc, whole := d.stripeReserve(), false
	if size := datasetSize(ctx); size > 0 {
		// The whole dataset, with room for the morsels' trailers, the
		// chunks' headers and the manifests: all or nothing.
		inc, whole = size+size/32+MorselSize, true
	}
	var set []string // the plan's benefactors, most free first
	res, err := don.Reserve(ctx, meta.ReserveRequest{Holder: d.self(ctx), TTL: stripeLease, Plan: func(donors []meta.Donor) (map[string]int64, error) {
		// As much of an increment as the top W can take, halved down to
		// a morsel per benefactor; a whole dataset or nothing.
		for n := inc; ; n /= 2 {
			plan, err := GreedyPlan(donors, pol.W, n, MorselSize)
			if err == nil || n <= MorselSize || whole {
				set = set[:0]
				for _, dn := range donors {
					if plan[dn.Name] > 0 {
						set = append(set, dn.Name)
					}
				}
				return plan, err
			}
		}
	}})
	if err != nil {
		return nil, err
	}
	rec := pol
	rec.Stores = set
	ps, err := d.Policy(ctx, rec.String())
	if err != nil {
		_ = res.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	ps.morsels.addReservation(res)
	if d.stripeSets == nil {
		d.stripeSets = map[string]string{}
	}
	d.stripeSets[key] = rec.String()
	return ps, nil
}

type datasetSizeKey struct{}

// WithDatasetSize tells a write under a stripe policy made with ctx the
// size of the dataset about to be written (put knows it): the first
// ForWrite under the policy then reserves it whole, all or nothing,
// before anything is written (FreeLoader §4.1.1), instead of increments.
func WithDatasetSize(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, datasetSizeKey{}, n)
}

func datasetSize(ctx context.Context) int64 {
	n, _ := ctx.Value(datasetSizeKey{}).(int64)
	return n
}

func (d *Director) stripeReserve() int64 {
	if d.opts.StripeReserve > 0 {
		return d.opts.StripeReserve
	}
	return DefaultStripeReserve
}

// GreedyPlan is the greedy striping of FreeLoader §4.1.2 for size bytes:
// donors (most free first, as meta gives them) with room for at least a
// morsel, the top w of them (fewer if fewer have room: the width is
// decremented), size spread evenly over them, and what one cannot take
// given to the others in order. Kind Permission (meta.ErrNoRoom) if they
// cannot take size between them.
func GreedyPlan(donors []meta.Donor, w int, size, morsel int64) (map[string]int64, error) {
	var top []meta.Donor
	for _, dn := range donors {
		if dn.Free >= morsel && len(top) < w {
			top = append(top, dn)
		}
	}
	if len(top) == 0 {
		return nil, cairn.E("reserve", cairn.Permission, "", fmt.Errorf("%w: no benefactor has room for a morsel", meta.ErrNoRoom))
	}
	plan := map[string]int64{}
	left := size
	per := (size + int64(len(top)) - 1) / int64(len(top))
	for _, dn := range top {
		n := min(per, dn.Free, left)
		if n > 0 {
			plan[dn.Name] = n
			left -= n
		}
	}
	for _, dn := range top { // the overflow, to those with more room
		if left == 0 {
			break
		}
		n := min(dn.Free-plan[dn.Name], left)
		if n > 0 {
			plan[dn.Name] += n
			left -= n
		}
	}
	if left > 0 {
		return nil, cairn.E("reserve", cairn.Permission, "", fmt.Errorf("%w: %d bytes more than the %d benefactors with room can take", meta.ErrNoRoom, left, len(top)))
	}
	return plan, nil
}

// newStripe makes the wrapper of a stripe policy with its node set: a
// pack store of morsels over the set.
func (d *Director) newStripe(ctx context.Context, pol meta.Policy) (*PolicyStore, error) {
	if len(pol.Stores) == 0 {
		return nil, cairn.E("open policy", cairn.Invalid, pol.String(), errors.New("a stripe policy is written through ForWrite, which picks its benefactors"))
	}
	ms := &morselSet{d: d, pol: pol, left: map[string]int64{}, at: map[cairn.ID]int{}}
	for _, name := range pol.Stores {
		ms.members = append(ms.members, &member{name: name, d: d})
	}
	ps, err := packstore.New(ctx, ms, packstore.Options{PackSize: MorselSize, Threshold: MorselSize,
		MaxUploads: max(4, len(pol.Stores)), ReadAhead: 2 * MorselSize, Logger: d.log})
	if err != nil {
		return nil, err
	}
	return &PolicyStore{Policy: pol, Store: ps, io: ps, morsels: ms}, nil
}

// morselSet is the backing store of a stripe policy's pack store: each
// object it is given (a morsel, or a chunk too large to pack) goes to one
// benefactor of the set, round-robin among those whose reservation has
// room for it; reads go to the member known to hold it, else to each.
type morselSet struct {
	d       *Director
	pol     meta.Policy
	members []*member

	mu   sync.Mutex
	next int                 // the member the next morsel goes to, round-robin
	left map[string]int64    // bytes still reserved per member
	res  []*meta.Reservation // this writer's reservations
	at   map[cairn.ID]int    // member holding an object, as written or listed
}

var _ cairn.Store = (*morselSet)(nil)

func (m *morselSet) addReservation(r *meta.Reservation) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.res = append(m.res, r)
	for n, b := range r.Parts {
		m.left[n] += b
	}
}

// pick chooses the member the next object of size n goes to and takes n
// from its reservation; -1 if none has room left.
func (m *morselSet) pick(n int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range m.members {
		i := m.next % len(m.members)
		m.next++
		if name := m.members[i].name; m.left[name] >= n {
			m.left[name] -= n
			return i
		}
	}
	return -1
}

// reserveMore reserves another increment on the set (at least n bytes).
func (m *morselSet) reserveMore(ctx context.Context, n int64) error {
	m.mu.Lock()
	writer := len(m.res) > 0
	m.mu.Unlock()
	if !writer {
		return cairn.E("put", cairn.Permission, m.pol.String(), errors.New("no space is reserved for this stripe set here: write under the stripe policy itself"))
	}
	don, ok := m.d.env.(Donations)
	if !ok {
		return cairn.E("put", cairn.Invalid, m.pol.String(), errors.New("this realm cannot reserve donated space"))
	}
	inc := max(m.d.stripeReserve(), n)
	res, err := don.Reserve(ctx, meta.ReserveRequest{Holder: m.d.self(ctx), TTL: stripeLease, Plan: func(donors []meta.Donor) (map[string]int64, error) {
		var in []meta.Donor
		for _, dn := range donors {
			for _, mb := range m.members {
				if mb.name == dn.Name {
					in = append(in, dn)
				}
			}
		}
		plan, err := GreedyPlan(in, len(m.members), inc, n)
		if err != nil && inc > n {
			plan, err = GreedyPlan(in, len(m.members), n, n)
		}
		return plan, err
	}})
	if err != nil {
		return err
	}
	m.addReservation(res)
	return nil
}

func (m *morselSet) Put(ctx context.Context, id cairn.ID, data []byte) error {
	n := int64(len(data))
	i := m.pick(n)
	if i < 0 {
		if err := m.reserveMore(ctx, n); err != nil {
			return err
		}
		if i = m.pick(n); i < 0 {
			return cairn.E("put", cairn.Permission, id.String(), fmt.Errorf("%w on %s", meta.ErrNoRoom, m.pol.String()))
		}
	}
	if err := m.members[i].Put(ctx, id, data); err != nil {
		m.mu.Lock()
		m.left[m.members[i].name] += n
		m.mu.Unlock()
		return err
	}
	m.mu.Lock()
	m.at[id] = i
	m.mu.Unlock()
	return nil
}

// holder returns the member known to hold id, or -1.
func (m *morselSet) holder(id cairn.ID) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i, ok := m.at[id]; ok {
		return i
	}
	return -1
}

// each tries fn on the member holding id, else on every member in turn
// until one answers other than NotFound.
func (m *morselSet) each(id cairn.ID, fn func(i int) error) error {
	if i := m.holder(id); i >= 0 {
		if err := fn(i); !errors.Is(err, cairn.ErrNotFound) {
			return err
		}
	}
	var errs []error
	for i := range m.members {
		err := fn(i)
		if err == nil {
			m.mu.Lock()
			m.at[id] = i
			m.mu.Unlock()
			return nil
		}
		if !errors.Is(err, cairn.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return cairn.E("get", cairn.Unavailable, id.String(), errors.Join(errs...))
	}
	return cairn.E("get", cairn.NotFound, id.String(), fmt.Errorf("on none of %s", m.pol.String()))
}

func (m *morselSet) Get(ctx context.Context, id cairn.ID) ([]byte, error) {
	var out []byte
	err := m.each(id, func(i int) error {
		b, err := m.members[i].Get(ctx, id)
		out = b
		return err
	})
	return out, err
}

// GetRange reads a range of a morsel (its trailer, the chunks wanted).
func (m *morselSet) GetRange(ctx context.Context, id cairn.ID, off, n int64) ([]byte, error) {
	var out []byte
	err := m.each(id, func(i int) error {
		b, err := m.members[i].GetRange(ctx, id, off, n)
		out = b
		return err
	})
	return out, err
}

func (m *morselSet) Has(ctx context.Context, ids []cairn.ID) ([]bool, error) {
	out := make([]bool, len(ids))
	var firstErr error
	for _, mb := range m.members {
		h, err := mb.Has(ctx, ids)
		if err != nil {
			firstErr = err
			continue
		}
		for j := range h {
			out[j] = out[j] || h[j]
		}
	}
	return out, firstErr
}

func (m *morselSet) Delete(ctx context.Context, id cairn.ID) error {
	return m.each(id, func(i int) error { return m.members[i].Delete(ctx, id) })
}

// List lists every member, learning where each object is; a member that
// cannot be listed is skipped (its objects are learned on a later
// listing) unless none can be.
func (m *morselSet) List(ctx context.Context, fn func(id cairn.ID, size int64) error) error {
	var errs []error
	for i, mb := range m.members {
		err := mb.List(ctx, func(id cairn.ID, size int64) error {
			m.mu.Lock()
			m.at[id] = i
			m.mu.Unlock()
			return fn(id, size)
		})
		if err != nil {
			if ctx.Err() != nil || cairn.KindOf(err) != cairn.Unavailable {
				return err
			}
			errs = append(errs, err)
			m.d.log.Warn("a benefactor of a stripe set could not be listed", "policy", m.pol.String(), "node", mb.name, "err", err)
		}
	}
	if len(errs) == len(m.members) {
		return errors.Join(errs...)
	}
	return nil
}

// Close releases this writer's reservations and closes the members.
func (m *morselSet) Close() error {
	m.mu.Lock()
	res := m.res
	m.res = nil
	m.mu.Unlock()
	for _, r := range res {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := r.Release(ctx); err != nil {
			m.d.log.Warn("releasing a reservation (it lapses with its lease)", "id", r.ID, "err", err)
		}
		cancel()
	}
	var errs []error
	for _, mb := range m.members {
		if err := mb.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
