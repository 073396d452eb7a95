package drain

import (
	"math/rand/v2"
	"testing"
)

// TestQPTable checks the table against a map through random sets and
// deletes of numbers in a row, with strides, and at random, so that
// probes wrap, collide and close gaps.
func TestQPTable(t *testing.T) {
	for _, pattern := range []struct {
		name string
		qpn  func(i int) uint32
	}{
		{"row", func(i int) uint32 { return 17 + uint32(i) }},
		{"stride 8", func(i int) uint32 { return uint32(8 * i) }},
		{"stride 4096", func(i int) uint32 { return uint32(4096*i) & 0xffffff }},
		{"random", func(i int) uint32 { return uint32(rand.N(1 << 24)) }},
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

// TestQPTableTombstones checks that deleted entries' tombstones neither
// hide a later entry nor pile up: a table that held a batch and then
// takes QPs one at a time, each deleted before the next, stays at the
// batch's size, and one that churns past it is rebuilt smaller.
func TestQPTableTombstones(t *testing.T) {
	var tab qpTable
	tab.reserve(1000)
	size := len(tab.slots)
	for i := range 1000 {
		tab.set(&Handle{qpn: uint32(i)})
	}
	for i := range 1000 {
		tab.del(uint32(i))
	}
	if tab.n != 0 || tab.dead != 1000 {
		t.Fatalf("after deleting every entry: %d entries, %d tombstones; want 0, 1000", tab.n, tab.dead)
	}
	for i := range 100000 {
		qpn := uint32(1000 + i)
		h := &Handle{qpn: qpn}
		tab.set(h)
		if got := tab.get(qpn); got != h {
			t.Fatalf("get(%d) after set = %p, want %p", qpn, got, h)
		}
		if 4*(tab.n+tab.dead) > 3*len(tab.slots) {
			t.Fatalf("%d entries and %d tombstones in %d slots: over 3/4", tab.n, tab.dead, len(tab.slots))
		}
		tab.del(qpn)
		if tab.get(qpn) != nil {
			t.Fatalf("get(%d) after del is not nil", qpn)
		}
	}
	if len(tab.slots) > size {
		t.Errorf("the table grew from %d to %d slots holding at most one entry", size, len(tab.slots))
	}
}
