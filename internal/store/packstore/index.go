package packstore

import (
	"cairn.dev/cairn/internal/cairn"
)

// pack is one pack object of the backing store, as the index knows it.
type pack struct {
	id    cairn.ID
	size  int64
	objs  []obj
	dead  []bool // per object: killed by a tombstone, deleted here, or found damaged
	tombs []tomb
	live  int   // objects not dead
	liveB int64 // their bytes
	seq   uint64
}

// ref names one copy of an object: object i of pack p.
type ref struct {
	p *pack
	i int
}

func (r ref) live() bool { return !r.p.dead[r.i] }

// plainObj is an object stored in the backing store as itself.
type plainObj struct {
	size int64
	seq  uint64
}

// index maps object IDs to their copies. Guarded by Store.mu.
type index struct {
	packs   map[cairn.ID]*pack
	copies  map[cairn.ID][]ref    // every known copy of an object, live or dead
	plain   map[cairn.ID]plainObj // objects stored as themselves
	kills   map[tomb]struct{}     // copies killed by a tombstone in a known (stored) pack
	damaged map[cairn.ID]int64    // objects that look like packs but whose index cannot be read
	seq     uint64                // bumped for each pack or plain object learned
}

func newIndex() index {
	return index{
		packs:   map[cairn.ID]*pack{},
		copies:  map[cairn.ID][]ref{},
		plain:   map[cairn.ID]plainObj{},
		kills:   map[tomb]struct{}{},
		damaged: map[cairn.ID]int64{},
	}
}

// known reports whether id is an object of the backing store that the index
// has classified (a pack, a plain object or a damaged pack).
func (x *index) known(id cairn.ID) bool {
	if _, ok := x.packs[id]; ok {
		return true
	}
	if _, ok := x.plain[id]; ok {
		return true
	}
	_, ok := x.damaged[id]
	return ok
}

// addPack installs p, applying the tombstones it holds and those already
// known that name it.
func (x *index) addPack(p *pack) {
	x.seq++
	p.seq = x.seq
	p.dead = make([]bool, len(p.objs))
	p.live, p.liveB = len(p.objs), 0
	for _, o := range p.objs {
		p.liveB += o.n
	}
	x.packs[p.id] = p
	for i, o := range p.objs {
		x.copies[o.id] = append(x.copies[o.id], ref{p, i})
		if _, k := x.kills[tomb{o.id, p.id}]; k {
			x.markDead(ref{p, i})
		}
	}
	for _, t := range p.tombs {
		x.kill(t)
	}
}

// kill records tombstone t and marks the copy it names dead if known.
func (x *index) kill(t tomb) {
	x.kills[t] = struct{}{}
	if _, ok := x.packs[t.target]; !ok {
		return
	}
	for _, r := range x.copies[t.id] {
		if r.p.id == t.target {
			x.markDead(r)
		}
	}
}

// copyIn returns the copy tombstone t names; the pack must be known.
func (x *index) copyIn(t tomb) ref {
	for _, r := range x.copies[t.id] {
		if r.p.id == t.target {
			return r
		}
	}
	panic("packstore: tombstone for a copy the index does not hold")
}

// unkill brings back the copy a tombstone that could not be stored would
// have killed, unless a stored tombstone kills it too.
func (x *index) unkill(t tomb) {
	if _, stored := x.kills[t]; stored {
		return
	}
	if _, ok := x.packs[t.target]; !ok {
		return
	}
	r := x.copyIn(t)
	if r.p.dead[r.i] {
		r.p.dead[r.i] = false
		r.p.live++
		r.p.liveB += r.p.objs[r.i].n
	}
}

func (x *index) markDead(r ref) {
	if r.p.dead[r.i] {
		return
	}
	r.p.dead[r.i] = true
	r.p.live--
	r.p.liveB -= r.p.objs[r.i].n
}

// removePack forgets p (it has been deleted from the backing store).
func (x *index) removePack(p *pack) {
	if x.packs[p.id] != p {
		return
	}
	delete(x.packs, p.id)
	for _, o := range p.objs {
		rs := x.copies[o.id]
		for j, r := range rs {
			if r.p == p {
				rs = append(rs[:j:j], rs[j+1:]...)
				break
			}
		}
		if len(rs) == 0 {
			delete(x.copies, o.id)
		} else {
			x.copies[o.id] = rs
		}
		delete(x.kills, tomb{o.id, p.id})
	}
	// Tombstones p held stay in kills while their target is known: the
	// copy stays dead (a deletion is never undone); those whose target is
	// gone are moot.
	for _, t := range p.tombs {
		if _, ok := x.packs[t.target]; !ok {
			delete(x.kills, t)
		}
	}
}

func (x *index) addPlain(id cairn.ID, size int64) {
	x.seq++
	x.plain[id] = plainObj{size: size, seq: x.seq}
}

// liveRefs returns the live packed copies of id.
func (x *index) liveRefs(id cairn.ID) []ref {
	var out []ref
	for _, r := range x.copies[id] {
		if r.live() {
			out = append(out, r)
		}
	}
	return out
}

// has reports whether id has a live copy (packed or plain) and its size.
func (x *index) has(id cairn.ID) (int64, bool) {
	for _, r := range x.copies[id] {
		if r.live() {
			return r.p.objs[r.i].n, true
		}
	}
	if p, ok := x.plain[id]; ok {
		return p.size, true
	}
	return 0, false
}
