package cm

import (
	"fmt"
	"syscall"
)

// EventType is the type of a CM event (enum rdma_cm_event_type), with
// rdma_cma.h's values.
type EventType int

// CM event types.
const (
	EventAddrResolved     EventType = iota // RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError                         // RDMA_CM_EVENT_ADDR_ERROR
	EventRouteResolved                     // RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError                        // RDMA_CM_EVENT_ROUTE_ERROR
	EventConnectRequest                    // RDMA_CM_EVENT_CONNECT_REQUEST
	EventConnectResponse                   // RDMA_CM_EVENT_CONNECT_RESPONSE
	EventConnectError                      // RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable                       // RDMA_CM_EVENT_UNREACHABLE
	EventRejected                          // RDMA_CM_EVENT_REJECTED
	EventEstablished                       // RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected                      // RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval                     // RDMA_CM_EVENT_DEVICE_REMOVAL
	EventMulticastJoin                     // RDMA_CM_EVENT_MULTICAST_JOIN
	EventMulticastError                    // RDMA_CM_EVENT_MULTICAST_ERROR
	EventAddrChange                        // RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit                      // RDMA_CM_EVENT_TIMEWAIT_EXIT
	EventAddrinfoResolved                  // RDMA_CM_EVENT_ADDRINFO_RESOLVED
	EventAddrinfoError                     // RDMA_CM_EVENT_ADDRINFO_ERROR
)

var eventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR",
	"CONNECT_REQUEST", "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE",
	"REJECTED", "ESTABLISHED", "DISCONNECTED", "DEVICE_REMOVAL",
	"MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE", "TIMEWAIT_EXIT",
	"ADDRINFO_RESOLVED", "ADDRINFO_ERROR",
}

// String is the name rdma_event_str(3) gives ("RDMA_CM_EVENT_ESTABLISHED").
func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return "RDMA_CM_EVENT_" + eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// MarshalText encodes the type as its String.
func (t EventType) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Event is a CM event of one ID (struct rdma_cm_event), copied and already
// acknowledged (rdma_ack_cm_event), so that no held event keeps
// rdma_destroy_id waiting.
type Event struct {
	Type EventType
	// Status is rdma_cm_event's status: for an error event a negative
	// errno or, for RDMA_CM_EVENT_REJECTED, the transport's reject reason
	// (IB: 8 invalid service ID, 28 consumer reject; iWARP: -ECONNREFUSED
	// and others).
	Status int
	// PrivateData is what the peer sent with a request, reply, reject or
	// disconnect, when it sent any.
	PrivateData []byte
}

func (e Event) String() string {
	if e.Status != 0 {
		return fmt.Sprintf("%s status=%d", e.Type, e.Status)
	}
	return e.Type.String()
}

// Err is nil when e is of type want, and otherwise an *EventError saying
// that op got e instead.
func (e Event) Err(op string, want EventType) error {
	if e.Type == want {
		return nil
	}
	return &EventError{Op: op, Want: want, Event: e}
}

// Sentinel errors: each is what an *EventError of its event type matches
// with errors.Is.
var (
	ErrAddrError       = eventSentinel(EventAddrError, syscall.EADDRNOTAVAIL)
	ErrRouteError      = eventSentinel(EventRouteError, syscall.EHOSTUNREACH)
	ErrConnectError    = eventSentinel(EventConnectError, syscall.ECONNABORTED)
	ErrUnreachable     = eventSentinel(EventUnreachable, syscall.ETIMEDOUT)
	ErrRejected        = eventSentinel(EventRejected, syscall.ECONNREFUSED)
	ErrDisconnected    = eventSentinel(EventDisconnected, syscall.ECONNRESET)
	ErrDeviceRemoval   = eventSentinel(EventDeviceRemoval, syscall.ENODEV)
	ErrUnexpectedEvent = &sentinel{msg: "unexpected CM event", errno: syscall.EPROTO}
)

// sentinel is an error the EventErrors of one event type match. It also
// matches an errno that says the same, so errors.Is(err,
// syscall.ECONNREFUSED) holds for a rejection.
type sentinel struct {
	msg   string
	errno syscall.Errno
}

func (s *sentinel) Error() string { return s.msg }

// Is reports whether target is the sentinel's errno.
func (s *sentinel) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && errno == s.errno
}

var sentinels = map[EventType]*sentinel{}

func eventSentinel(t EventType, errno syscall.Errno) error {
	s := &sentinel{msg: t.String(), errno: errno}
	sentinels[t] = s
	return s
}

// EventError reports an operation that waited for event Want and got Event
// instead. It matches the sentinel of Event's type (ErrRejected for
// RDMA_CM_EVENT_REJECTED, ...) or ErrUnexpectedEvent for a type without
// one.
type EventError struct {
	Op    string
	Want  EventType
	Event Event
}

func (e *EventError) Error() string {
	return fmt.Sprintf("%s: got %s, want %s", e.Op, e.Event, e.Want)
}

// Unwrap returns the sentinel of the event's type.
func (e *EventError) Unwrap() error {
	if s, ok := sentinels[e.Event.Type]; ok {
		return s
	}
	return ErrUnexpectedEvent
}
