package drain

// qpTable maps QP numbers to handles (the reaper's byNum). It is an open
// addressed table with linear probing whose slot is picked by a
// Fibonacci hash of the number without its low 3 bits, which pick the
// slot within a group of 8: devices number QPs in a row (rxe from its
// pool index, soft from a counter), so the QPs of a batch share groups of
// one cache line, where a map spreads them over its whole table and
// every lookup of a large batch misses the cache. Numbers in any other
// pattern are spread by the hash as a map's would be.
//
// A slot holds only the handle, nil when free, and a probe compares the
// number the handle holds: a slot of 8 bytes, not 16 with the number
// beside it, halves the lines a pass over a batch misses in the table (at
// 65,536 QPs it takes 1 MB), and a probe rarely passes another QP's slot
// (in a row, numbers do not collide), whose handle it would then read.
//
// A deleted entry leaves a tombstone (deleted), reused by a later entry
// on its probe and dropped when the table is rebuilt: closing the gap
// instead (backward shift) reads the handle of every entry after it up
// to a free slot, and in a row of numbers that is the rest of its group,
// a cache miss each when a batch ends.
type qpTable struct {
	slots []*Handle // a power of two long, or empty
	n     int
	dead  int   // tombstones
	shift uint8 // 64 - log2 of the number of groups, for the hash
}

// deleted marks a slot whose entry was deleted: a probe passes it.
var deleted = new(Handle)

// home is the slot the probe for qpn starts at.
func (t *qpTable) home(qpn uint32) int {
	const fib = 0x9e3779b97f4a7c15 // 2^64 / golden ratio, odd
	group := (uint64(qpn>>3) * fib) >> t.shift
	return int(group<<3|uint64(qpn&7)) & (len(t.slots) - 1)
}

// get returns the handle for qpn, nil if there is none.
func (t *qpTable) get(qpn uint32) *Handle {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		h := t.slots[i]
		if h == nil {
			return nil
		}
		if h != deleted && h.qpn == qpn {
			return h
		}
	}
}

// slot returns, in one probe, qpn's handle (nil if none) and the slot to
// store its handle in through put: the one it is in, or the first free
// or deleted one on its probe. The table keeps room for one more entry.
func (t *qpTable) slot(qpn uint32) (s **Handle, old *Handle) {
	if 4*(t.n+t.dead+1) > 3*len(t.slots) {
		t.resize(2 * (t.n + 1))
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		switch h := t.slots[i]; {
		case h == nil:
			if s == nil {
				s = &t.slots[i]
			}
			return s, nil
		case h == deleted:
			if s == nil {
				s = &t.slots[i]
			}
		case h.qpn == qpn:
			return &t.slots[i], h
		}
	}
}

// put stores h in s, the slot slot returned with old, before any other
// change to the table.
func (t *qpTable) put(s **Handle, old, h *Handle) {
	if old == nil {
		if *s == deleted {
			t.dead--
		}
		t.n++
	}
	*s = h
}

// set makes h's number stand for h (not nil), replacing what it stood
// for.
func (t *qpTable) set(h *Handle) {
	s, old := t.slot(h.qpn)
	t.put(s, old, h)
}

// del removes qpn.
func (t *qpTable) del(qpn uint32) {
	if t.n == 0 {
		return
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		h := t.slots[i]
		if h == nil {
			return // not there
		}
		if h != deleted && h.qpn == qpn {
			t.slots[i] = deleted
			t.n--
			t.dead++
			return
		}
	}
}

// reserve makes room for n more entries in an empty table at once.
func (t *qpTable) reserve(n int) {
	if t.n == 0 && 4*(n+t.dead) > 3*len(t.slots) {
		t.resize(n)
	}
}

// resize moves the entries into a table that holds n of them at a load
// of at most 3/4, without tombstones.
func (t *qpTable) resize(n int) {
	size, shift := 8, uint8(64) // one group: the hash is 0
	for 3*size < 4*n {
		size, shift = 2*size, shift-1
	}
	old := t.slots
	t.slots, t.shift, t.n, t.dead = make([]*Handle, size), shift, 0, 0
	for _, h := range old {
		if h != nil && h != deleted {
			t.set(h)
		}
	}
}

// all returns every handle in the table, in no particular order: a copy,
// so that the caller may change the table meanwhile.
func (t *qpTable) all() []*Handle {
	hs := make([]*Handle, 0, t.n)
	for _, h := range t.slots {
		if h != nil && h != deleted {
			hs = append(hs, h)
		}
	}
	return hs
}
