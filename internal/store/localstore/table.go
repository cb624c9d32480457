package localstore

import (
	"encoding/binary"
	"math/bits"
	"syscall"
	"unsafe"

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
	slots  []slot
	n      int
	mapped bool // slots live in an anonymous mapping, outside the Go heap
}

type slot struct{ key, val uint64 }

const (
	maxLoad    = 0.80
	growLoad   = 0.50 // after growing by single inserts
	bulkLoad   = 0.70 // after sizing for a known batch (Open)
	slotSize   = 16
	mapAtBytes = 1 << 20
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

// reserve makes room for n more entries; if it must grow, it sizes the table
// for the given load.
func (t *table) reserve(n int, load float64) {
	need := t.n + n
	if float64(need) <= maxLoad*float64(len(t.slots)) {
		return
	}
	t.resize(max(1024, int(float64(need)/load)))
}

func (t *table) resize(size int) {
	old, oldMapped := t.slots, t.mapped
	t.slots, t.mapped = allocSlots(size)
	for _, s := range old {
		if s.key != 0 {
			i := t.home(s.key)
			for t.slots[i].key != 0 {
				i = t.next(i)
			}
			t.slots[i] = s
		}
	}
	freeSlots(old, oldMapped)
}

// free releases the table's memory.
func (t *table) free() {
	freeSlots(t.slots, t.mapped)
	*t = table{}
}

// allocSlots returns n zeroed slots. Large tables live in an anonymous
// mapping: they hold no pointers, and outside the Go heap they do not raise
// the garbage collector's target, which would otherwise let garbage grow to
// the table's size again (at 10 M objects, some 250 MB).
func allocSlots(n int) ([]slot, bool) {
	if n*slotSize >= mapAtBytes {
		b, err := syscall.Mmap(-1, 0, n*slotSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err == nil {
			// Huge pages: fewer page faults to fill it, fewer TLB misses to probe it.
			_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
			return unsafe.Slice((*slot)(unsafe.Pointer(&b[0])), n), true
		}
	}
	return make([]slot, n), false
}

func freeSlots(s []slot, mapped bool) {
	if mapped && len(s) > 0 {
		_ = syscall.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*slotSize))
	}
}

// insert adds (k, val); the caller knows that no slot holds the same ID.
func (t *table) insert(k, val uint64) {
	t.reserve(1, growLoad)
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
