// Package fifo is the first-in first-out queue of a slice, as the CM
// bindings keep an ID's events and connection requests until their caller
// waits for them.
package fifo

// Pop removes and returns the first element of *q, or reports false when
// *q is empty. The caller guards *q.
func Pop[T any](q *[]T) (T, bool) {
	var zero T
	if len(*q) == 0 {
		return zero, false
	}
	v := (*q)[0]
	(*q)[0] = zero // the backing array no longer holds it
	*q = (*q)[1:]
	return v, true
}
