package drain

// qpTable maps QP numbers to handles (the reaper's byNum). It is an open
// addressed table with linear probing whose slot is picked by a
// Fibonacci hash of the number without its low 3 bits, which pick the
// slot within a group of 8: devices number QPs in a row (rxe from its
// pool index, soft from a counter), so the QPs of a batch share groups of
// two cache lines, where a map spreads them over its whole table and
// every lookup of a large batch misses the cache. Numbers in any other
// pattern are spread by the hash as a map's would be.
type qpTable struct {
	slots []qpSlot // a power of two long, or empty
	n     int
	shift uint8 // 64 - log2 of the number of groups, for the hash
}

// qpSlot holds one entry; h == nil marks a free slot.
type qpSlot struct {
	qpn uint32
	h   *Handle
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
		s := &t.slots[i]
		if s.h == nil || s.qpn == qpn {
			return s.h
		}
	}
}

// set makes qpn stand for h (not nil), replacing what it stood for.
func (t *qpTable) set(qpn uint32, h *Handle) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(2 * (t.n + 1))
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.h == nil {
			*s = qpSlot{qpn: qpn, h: h}
			t.n++
			return
		}
		if s.qpn == qpn {
			s.h = h
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
	for ; t.slots[i].qpn != qpn; i = (i + 1) & mask {
		if t.slots[i].h == nil {
			return
		}
	}
	if t.slots[i].h == nil {
		return
	}
	for j := (i + 1) & mask; t.slots[j].h != nil; j = (j + 1) & mask {
		// The entry at j may fill the gap at i when its home is not in
		// the (cyclic) range (i, j].
		if k := t.home(t.slots[j].qpn); (j-k)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = qpSlot{}
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
	t.slots, t.shift, t.n = make([]qpSlot, size), shift, 0
	for _, s := range old {
		if s.h != nil {
			t.set(s.qpn, s.h)
		}
	}
}

// all returns every handle in the table, in no particular order: a copy,
// so that the caller may change the table meanwhile.
func (t *qpTable) all() []*Handle {
	hs := make([]*Handle, 0, t.n)
	for _, s := range t.slots {
		if s.h != nil {
			hs = append(hs, s.h)
		}
	}
	return hs
}
