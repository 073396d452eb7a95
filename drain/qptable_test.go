package drain

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestQPTable checks the table against a map through random sets and
// deletes of numbers in a row, with strides, and at random, so that the
// window grows, moves and turns numbers away, and probes in the hash
// table wrap, collide and pass tombstones.
func TestQPTable(t *testing.T) {
	for _, pattern := range []struct {
		name string
		qpn  func(i int) uint32
	}{
		{"row", func(i int) uint32 { return 17 + uint32(i) }},
		{"every other", func(i int) uint32 { return 17 + 2*uint32(i) }},
		{"stride 8", func(i int) uint32 { return uint32(8 * i) }},
		{"stride 4096", func(i int) uint32 { return uint32(4096*i) & 0xffffff }},
		{"random", func(i int) uint32 { return uint32(rand.N(1 << 24)) }},
		{"top", func(i int) uint32 { return ^uint32(0) - uint32(i) }},
	} {
		t.Run(pattern.name, func(t *testing.T) {
			var tab qpTable
			want := map[uint32]*Handle{}
			nums := make([]uint32, 3000)
			for i := range nums {
				nums[i] = pattern.qpn(i)
			}
			for step := range 50000 {
				qpn := nums[rand.N(len(nums))]
				if step < len(nums) {
					qpn = nums[step] // first in order, as a batch comes
				}
				if rand.N(3) == 0 {
					tab.del(qpn)
					delete(want, qpn)
				} else {
					h := &Handle{qpn: qpn}
					tab.set(h)
					want[qpn] = h
				}
				if tab.n != len(want) {
					t.Fatalf("step %d: %d entries, want %d", step, tab.n, len(want))
				}
				if 4*(tab.inHash+tab.dead) > 3*len(tab.slots) {
					t.Fatalf("step %d: %d entries and %d tombstones in %d hash slots: over 3/4", step, tab.inHash, tab.dead, len(tab.slots))
				}
				if step%997 == 0 {
					for _, q := range nums {
						if got := tab.get(q); got != want[q] {
							t.Fatalf("step %d: get(%d) = %p, want %p", step, q, got, want[q])
						}
					}
					if len(tab.all()) != len(want) {
						t.Fatalf("step %d: all() has %d, want %d", step, len(tab.all()), len(want))
					}
				}
			}
		})
	}
}

// TestQPTableWindow checks where numbers go: a batch in a row, taken
// after reserve, all in the window, in one allocation; numbers too far
// apart in the hash table; and a QP added and finished one at a time
// after a batch moves the emptied window instead of filling the hash
// table with tombstones.
func TestQPTableWindow(t *testing.T) {
	var tab qpTable
	const batch = 4096
	first := make([]uint32, 64) // every other number, as soft numbers a QP and its peer
	for i := range first {
		first[i] = 1000 + 2*uint32(i)
	}
	tab.reserve(batch, first)
	reserved := unsafe.SliceData(tab.win)
	for i := range batch {
		tab.set(&Handle{qpn: 1000 + 2*uint32(i)})
	}
	if tab.inWin != batch || tab.inHash != 0 {
		t.Fatalf("a batch of every other number: %d in the window, %d in the hash table; want all in the window", tab.inWin, tab.inHash)
	}
	if unsafe.SliceData(tab.win) != reserved {
		t.Errorf("the window grew while it took the batch: reserve sized it %d for %d numbers every other", cap(tab.win), batch)
	}
	if len(tab.win) != 2*batch {
		t.Errorf("window of %d for %d numbers every other: want %d", len(tab.win), batch, 2*batch)
	}
	for i := range batch {
		tab.del(1000 + 2*uint32(i))
	}
	for i := range 100000 {
		qpn := 1<<20*uint32(i%8) + uint32(i)
		h := &Handle{qpn: qpn}
		tab.set(h)
		if tab.get(qpn) != h || tab.inHash != 0 {
			t.Fatalf("QP %d added alone: get = %p, %d in the hash table; want %p, none", qpn, tab.get(qpn), tab.inHash, h)
		}
		tab.del(qpn)
	}
	if tab.dead != 0 || len(tab.win) != 2*batch {
		t.Errorf("after one at a time: %d tombstones, a window of %d; want none, %d", tab.dead, len(tab.win), 2*batch)
	}
	far := []uint32{5, 5 + 1<<16, 5 + 2<<16}
	for _, q := range far {
		tab.set(&Handle{qpn: q})
	}
	if tab.inWin != 1 || tab.inHash != 2 {
		t.Errorf("numbers 64 Ki apart: %d in the window, %d in the hash table; want 1, 2", tab.inWin, tab.inHash)
	}
}
