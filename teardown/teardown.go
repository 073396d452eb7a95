// Package teardown closes verbs objects in the reverse order of their
// creation, children before parents, and keeps going past a failure so that
// one object that will not close does not leak the rest. Add each object
// (of any ibv device) as it is created and defer the List's Close.
package teardown

import (
	"errors"
	"fmt"
	"io"
)

// List is the objects to close, in creation order. The zero value is an
// empty list ready to use.
type List struct {
	objs []io.Closer
}

// Add records c, to be closed before everything added earlier.
func (l *List) Add(c io.Closer) { l.objs = append(l.objs, c) }

// Close closes every object, the last added first, and returns the failures
// joined, each naming the object's type. The list is empty afterwards, so a
// second Close does nothing.
func (l *List) Close() error {
	var errs []error
	for i := len(l.objs) - 1; i >= 0; i-- {
		if err := l.objs[i].Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing %T: %w", l.objs[i], err))
		}
	}
	l.objs = nil
	return errors.Join(errs...)
}
