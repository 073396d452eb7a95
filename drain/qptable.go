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
type qpTable struct {
	slots []*Handle // a power of two long, or empty
	n     int
	shift uint8 // 64 - log2 of the number of groups, for the hash
}

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
		if h := t.slots[i]; h == nil || h.qpn == qpn {
			return h
		}
	}
}

// set makes h's number stand for h (not nil), replacing what it stood
// for.
func (t *qpTable) set(h *Handle) {
	qpn := h.qpn
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(2 * (t.n + 1))
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if *s == nil {
			*s = h
			t.n++
			return
		}
		if (*s).qpn == qpn {
			*s = h
			return
		}
	}
}

// del removes qpn, closing the gap so that no probe passes a free slot
// before the entry it looks for (backward shift: no tombstones).
func (t *qpTable) del(qpn uint32) {
	if t.n == 0 {
		return
	}
	mask := len(t.slots) - 1
	i := t.home(qpn)
	for ; t.slots[i] == nil || t.slots[i].qpn != qpn; i = (i + 1) & mask {
		if t.slots[i] == nil {
			return // not there
		}
	}
	for j := (i + 1) & mask; t.slots[j] != nil; j = (j + 1) & mask {
		// The entry at j may fill the gap at i when its home is not in
		// the (cyclic) range (i, j].
		if k := t.home(t.slots[j].qpn); (j-k)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = nil
	t.n--
}

// reserve makes room for n more entries in an empty table at once.
func (t *qpTable) reserve(n int) {
	if t.n == 0 && 4*n > 3*len(t.slots) {
		t.resize(n)
	}
}

// resize moves the entries into a table that holds n of them at a load
// of at most 3/4.
func (t *qpTable) resize(n int) {
	size, shift := 8, uint8(64) // one group: the hash is 0
	for 3*size < 4*n {
		size, shift = 2*size, shift-1
	}
	old := t.slots
	t.slots, t.shift, t.n = make([]*Handle, size), shift, 0
	for _, h := range old {
		if h != nil {
			t.set(h)
		}
	}
}

// all returns every handle in the table, in no particular order: a copy,
// so that the caller may change the table meanwhile.
func (t *qpTable) all() []*Handle {
	hs := make([]*Handle, 0, t.n)
	for _, h := range t.slots {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return hs
}
