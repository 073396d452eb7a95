package ilist

import (
	"slices"
	"testing"
)

type elem struct {
	v     int
	links Links[elem]
}

// forward and backward read l both ways, so that a broken prev link shows.
func forward(l *List[elem]) (vs []int) {
	for e := l.Front(); e != nil; e = e.links.Next() {
		vs = append(vs, e.v)
	}
	return vs
}

func backward(l *List[elem]) (vs []int) {
	for e := l.Back(); e != nil; e = e.links.Prev() {
		vs = append(vs, e.v)
	}
	slices.Reverse(vs)
	return vs
}

func TestList(t *testing.T) {
	var l List[elem]
	es := make([]*elem, 6)
	for i := range es {
		es[i] = &elem{v: i}
	}
	check := func(want ...int) {
		t.Helper()
		if f, b := forward(&l), backward(&l); !slices.Equal(f, want) || !slices.Equal(b, want) || l.Len() != len(want) {
			t.Fatalf("forward %v, backward %v, len %d: want %v", f, b, l.Len(), want)
		}
	}
	check()
	l.PushBack(es[1], &es[1].links)
	l.PushFront(es[0], &es[0].links)
	l.PushBack(es[3], &es[3].links)
	l.InsertAfter(es[2], &es[2].links, &es[1].links)
	l.InsertAfter(es[4], &es[4].links, &es[3].links)
	check(0, 1, 2, 3, 4)
	l.Remove(&es[0].links)
	l.Remove(&es[4].links)
	l.Remove(&es[2].links)
	check(1, 3)
	if es[2].links.Next() != nil || es[2].links.Prev() != nil {
		t.Fatal("a removed element still has neighbours")
	}
	// Moving an element between lists, as both users do.
	var other List[elem]
	l.Remove(&es[1].links)
	other.PushBack(es[1], &es[1].links)
	check(3)
	if other.Front() != es[1] || other.Back() != es[1] || other.Len() != 1 {
		t.Fatal("moved element not alone on its new list")
	}
	l.Remove(&es[3].links)
	check()
}
