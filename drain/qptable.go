package drain

// qpTable maps QP numbers to handles (the reaper's byNum): a window of
// numbers in a row, where most numbers go, and an open addressed hash
// table for the others.
//
// Devices number QPs in a row (rxe from its pool index, soft from a
// counter), so the QPs of a batch take numbers close together. The window
// is an array indexed by the number less its base: a pass over a batch in
// the order it was added (AddAll, the drain WRs' completions, the finished
// QPs' deletes) walks it line by line, where a hash spreads the batch over
// its whole table and every eighth lookup or so misses the cache (at
// 65,536 QPs the table takes 1 MB). The window grows, by doubling, to take
// a number past its end as long as at least a quarter of it is in use;
// a number it cannot take goes to the hash table.
//
// The hash table uses linear probing from a slot picked by a Fibonacci
// hash of the number without its low 3 bits, which pick the slot within a
// group of 8, so that numbers in a row still share lines; numbers in any
// other pattern are spread by the hash as a map's would be. A slot holds
// only the handle, nil when free, and a probe compares the number the
// handle holds: a slot of 8 bytes, not 16 with the number beside it. A
// deleted entry leaves a tombstone (deleted), reused by a later entry on
// its probe and dropped when the table is rebuilt: closing the gap instead
// (backward shift) reads the handle of every entry after it up to a free
// slot, a cache miss each.
//
// A number is in the window or in the hash table, never both: one in the
// window's range that the hash table holds (taken there before the window
// grew over it) stays there until deleted.
type qpTable struct {
	n     int       // entries, in the window and the hash table
	win   []*Handle // the handles of numbers base to base+len(win)-1
	base  uint32
	inWin int // entries in win

	slots  []*Handle // a power of two long, or empty
	inHash int       // entries in slots
	dead   int       // tombstones in slots
	shift  uint8     // 64 - log2 of the number of groups, for the hash
}

// deleted marks a hash slot whose entry was deleted: a probe passes it.
var deleted = new(Handle)

// minWin is the length a window starts at.
const minWin = 64

// at is qpn's slot in the window, nil when the window does not cover it.
func (t *qpTable) at(qpn uint32) **Handle {
	if i := qpn - t.base; uint64(i) < uint64(len(t.win)) {
		return &t.win[i]
	}
	return nil
}

// home is the slot the probe for qpn starts at.
func (t *qpTable) home(qpn uint32) int {
	const fib = 0x9e3779b97f4a7c15 // 2^64 / golden ratio, odd
	group := (uint64(qpn>>3) * fib) >> t.shift
	return int(group<<3|uint64(qpn&7)) & (len(t.slots) - 1)
}

// get returns the handle for qpn, nil if there is none. It is inlined
// and checks the count first: a poll loop asks for every completion of a
// QP the reaper does not drain.
func (t *qpTable) get(qpn uint32) *Handle {
	if t.n == 0 {
		return nil
	}
	return t.find(qpn)
}

// find is get of a table that is not empty.
func (t *qpTable) find(qpn uint32) *Handle {
	if s := t.at(qpn); s != nil && (*s != nil || t.inHash == 0) {
		return *s
	}
	if t.inHash == 0 {
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

// slot returns, in one lookup, qpn's handle (nil if none) and the slot
// to store its handle in through put: the one it is in, or a free one in
// the window (grown to take it if it may), or else the first free or
// deleted one on its probe in the hash table, which then keeps room for
// one more entry.
func (t *qpTable) slot(qpn uint32) (s **Handle, old *Handle) {
	w := t.at(qpn)
	if w == nil && t.grow(qpn) {
		w = t.at(qpn)
	}
	if w != nil && (*w != nil || t.inHash == 0) {
		return w, *w
	}
	if w == nil && 4*(t.inHash+t.dead+1) > 3*len(t.slots) {
		t.resize(2 * (t.inHash + 1))
	}
	mask := len(t.slots) - 1
	for i := t.home(qpn); len(t.slots) > 0; i = (i + 1) & mask {
		switch h := t.slots[i]; {
		case h == nil:
			if s == nil {
				s = &t.slots[i]
			}
			if w != nil {
				return w, nil // not in the hash table: the window takes it
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
	return w, nil // no hash table: w covers qpn
}

// grow makes the window cover qpn if it may: an empty window starts
// there, one that qpn is past doubles as long as at least a quarter of
// what it would cover is in use. It reports whether it did.
func (t *qpTable) grow(qpn uint32) bool {
	if t.inWin == 0 {
		// Every slot is nil: the window moves to qpn.
		if cap(t.win) < minWin {
			t.win = make([]*Handle, minWin)
		}
		t.win, t.base = t.win[:cap(t.win)], qpn
		return true
	}
	if qpn < t.base {
		return false
	}
	need := uint64(qpn-t.base) + 1
	size := uint64(len(t.win))
	for size < need {
		size *= 2
	}
	if size > 4*uint64(t.inWin+1) || size > 1<<31 {
		return false
	}
	win := make([]*Handle, size)
	copy(win, t.win)
	t.win = win
	return true
}

// put stores h in s, the slot slot returned with old, before any other
// change to the table.
func (t *qpTable) put(s **Handle, old, h *Handle) {
	if old == nil {
		t.n++
		if t.at(h.qpn) == s {
			t.inWin++
		} else {
			if *s == deleted {
				t.dead--
			}
			t.inHash++
		}
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
	if s := t.at(qpn); s != nil && *s != nil {
		*s = nil
		t.n--
		t.inWin--
		return
	}
	if t.inHash == 0 {
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
			t.inHash--
			t.dead++
			return
		}
	}
}

// reserve makes room at once in an empty table for a batch of n entries
// whose first numbers are first: a batch does not grow it step by step.
// The window is sized for numbers as far apart as those (a device may
// number other objects between a batch's QPs: each QP's peer, say), at
// most 4 apart, as far as the window goes when it grows. A window that
// has room already is kept.
func (t *qpTable) reserve(n int, first []uint32) {
	stride := uint64(1)
	if k := len(first); k > 1 && first[k-1] > first[0] {
		stride = min((uint64(first[k-1]-first[0])+uint64(k-2))/uint64(k-1), 4)
	}
	if size := uint64(n) * stride; t.n == 0 && size > uint64(len(t.win)) && size <= 1<<30 {
		t.win = make([]*Handle, 0, size)
	}
}

// resize moves the hash table's entries into one that holds n of them at
// a load of at most 3/4, without tombstones.
func (t *qpTable) resize(n int) {
	size, shift := 8, uint8(64) // one group: the hash is 0
	for 3*size < 4*n {
		size, shift = 2*size, shift-1
	}
	old := t.slots
	t.slots, t.shift, t.dead = make([]*Handle, size), shift, 0
	for _, h := range old {
		if h != nil && h != deleted {
			*t.hashSlot(h.qpn) = h
		}
	}
}

// hashSlot is the first free slot on qpn's probe, for resize: the table
// has room and does not hold qpn.
func (t *qpTable) hashSlot(qpn uint32) **Handle {
	mask := len(t.slots) - 1
	for i := t.home(qpn); ; i = (i + 1) & mask {
		if t.slots[i] == nil {
			return &t.slots[i]
		}
	}
}

// all returns every handle in the table, in no particular order: a copy,
// so that the caller may change the table meanwhile.
func (t *qpTable) all() []*Handle {
	hs := make([]*Handle, 0, t.n)
	for _, s := range [...][]*Handle{t.win, t.slots} {
		for _, h := range s {
			if h != nil && h != deleted {
				hs = append(hs, h)
			}
		}
	}
	return hs
}
