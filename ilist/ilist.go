// Package ilist is the intrusive doubly linked list of drain's reaper and
// ipoibcm's manager: an element carries its Links, so moving it between
// lists allocates nothing, as the kernel's list_move does not, and removal
// is O(1). The links point at each other and each at its element, so no
// operation calls back into the element's type: a generic method call
// would go through a dictionary, which the hot paths of both users cannot
// afford.
//
// A List is not safe for concurrent use; its users guard it with their
// own lock.
package ilist

// Links are what an element of type T embeds (as a field) to be on one
// List[T] at a time. The zero value is on no list.
type Links[T any] struct {
	prev, next *Links[T]
	elem       *T
}

// Next is the element after n on its list, nil at the back or off a list.
func (n *Links[T]) Next() *T { return n.next.of() }

// Prev is the element before n on its list, nil at the front or off a
// list.
func (n *Links[T]) Prev() *T { return n.prev.of() }

// of is the element whose links n are, nil for no links.
func (n *Links[T]) of() *T {
	if n == nil {
		return nil
	}
	return n.elem
}

// List is a list of elements of type T; the zero value is empty.
type List[T any] struct {
	head, tail *Links[T]
	n          int
}

// Len is the number of elements on l.
func (l *List[T]) Len() int { return l.n }

// Front is l's first element, nil when l is empty.
func (l *List[T]) Front() *T { return l.head.of() }

// Back is l's last element, nil when l is empty.
func (l *List[T]) Back() *T { return l.tail.of() }

// PushFront puts e, whose links are n, first on l. e must be on no list.
func (l *List[T]) PushFront(e *T, n *Links[T]) { l.InsertAfter(e, n, nil) }

// PushBack puts e, whose links are n, last on l. e must be on no list.
func (l *List[T]) PushBack(e *T, n *Links[T]) { l.InsertAfter(e, n, l.tail) }

// InsertAfter puts e, whose links are n, on l after the element whose
// links are at, first when at is nil. e must be on no list, at on l.
func (l *List[T]) InsertAfter(e *T, n, at *Links[T]) {
	n.elem, n.prev = e, at
	if at == nil {
		n.next, l.head = l.head, n
	} else {
		n.next, at.next = at.next, n
	}
	if n.next != nil {
		n.next.prev = n
	} else {
		l.tail = n
	}
	l.n++
}

// Remove takes the element whose links are n off l, which it must be on.
func (l *List[T]) Remove(n *Links[T]) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next = nil, nil
	l.n--
}
