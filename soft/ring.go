package soft

// ring is a FIFO that grows by doubling and keeps no capacity it never
// needed, so an idle queue of a deep QP costs nothing until it is used.
type ring[T any] struct {
	buf  []T // len is zero or a power of two
	head int
	n    int
}

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

// alloc appends a zero element and returns it, for the caller to fill in
// place (a WQE is filled where it is queued, not copied there).
func (r *ring[T]) alloc() *T {
	if r.n == len(r.buf) {
		r.grow()
	}
	v := &r.buf[(r.head+r.n)&(len(r.buf)-1)]
	r.n++
	return v
}

// pushFront puts v before every other element.
func (r *ring[T]) pushFront(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.head = (r.head - 1) & (len(r.buf) - 1)
	r.buf[r.head] = v
	r.n++
}

// pop removes and returns the oldest element; the ring must not be empty.
func (r *ring[T]) pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero // drop references for the collector
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return v
}

// drop removes the oldest element; the ring must not be empty.
func (r *ring[T]) drop() {
	var zero T
	r.buf[r.head] = zero
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
}

// at returns the i-th oldest element.
func (r *ring[T]) at(i int) *T { return &r.buf[(r.head+i)&(len(r.buf)-1)] }

// reset empties the ring and releases its memory.
func (r *ring[T]) reset() { *r = ring[T]{} }

func (r *ring[T]) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 8
	}
	buf := make([]T, size)
	for i := 0; i < r.n; i++ {
		buf[i] = *r.at(i)
	}
	r.buf, r.head = buf, 0
}
