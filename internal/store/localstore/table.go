package localstore

import (
	"encoding/binary"
	"math/bits"

	"cairn.dev/cairn/internal/cairn"
)

// table is the in-memory index: an open-addressing hash table (linear probing,
// backward-shift deletion) from the first 8 bytes of an ID to a location, 16
// bytes a slot. It does not hold full IDs: the caller confirms a candidate by
// comparing the full ID stored in the pack's index entries (heap or mmap).
// IDs are uniform hashes, so the prefix is the hash and the home slot is a
// multiply-shift of it; the table can have any size, which keeps it at
// 16 B / 0.8 load ≈ 20 bytes per object.
type table struct {
	slots []slot
	n     int
}

type slot struct{ key, val uint64 }

const (
	maxLoad    = 0.80
	targetLoad = 0.60
)

// keyOf is the prefix of id as a table key. 0 marks an empty slot, so a zero
// prefix is stored as 1; the full-ID check makes that harmless.
func keyOf(id *cairn.ID) uint64 {
	k := binary.LittleEndian.Uint64(id[:8])
	if k == 0 {
		k = 1
	}
	return k
}

func (t *table) home(k uint64) int {
	hi, _ := bits.Mul64(k, uint64(len(t.slots)))
	return int(hi)
}

func (t *table) next(i int) int {
	i++
	if i == len(t.slots) {
		i = 0
	}
	return i
}

// reserve makes room for n more entries without growing.
func (t *table) reserve(n int) {
	need := t.n + n
	if float64(need) <= maxLoad*float64(len(t.slots)) {
		return
	}
	t.resize(max(1024, int(float64(need)/targetLoad)))
}

func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]slot, size)
	for _, s := range old {
		if s.key != 0 {
			i := t.home(s.key)
			for t.slots[i].key != 0 {
				i = t.next(i)
			}
			t.slots[i] = s
		}
	}
}

// insert adds (k, val); the caller knows that no slot holds the same ID.
func (t *table) insert(k, val uint64) {
	t.reserve(1)
	i := t.home(k)
	for t.slots[i].key != 0 {
		i = t.next(i)
	}
	t.slots[i] = slot{k, val}
	t.n++
}

// find returns the slot index holding exactly (k, val), or -1.
func (t *table) find(k, val uint64) int {
	if len(t.slots) == 0 {
		return -1
	}
	for i := t.home(k); t.slots[i].key != 0; i = t.next(i) {
		if t.slots[i] == (slot{k, val}) {
			return i
		}
	}
	return -1
}

// remove deletes slot i and shifts later members of its cluster back so that
// every entry stays reachable from its home slot.
func (t *table) remove(i int) {
	j := i
	for {
		j = t.next(j)
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		h := t.home(s.key)
		// s may move to i only if its home is not cyclically within (i, j].
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		t.slots[i] = s
		i = j
	}
	t.slots[i] = slot{}
	t.n--
}
