package soft

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
)

// TraceKind says what a TraceEntry records.
type TraceKind uint8

// Trace entry kinds.
const (
	// TraceState: QP QPNum changed state From -> To.
	TraceState TraceKind = iota + 1
	// TraceCompletion: WC was written to CQ number CQ.
	TraceCompletion
	// TraceEvent: Event was queued for NextAsyncEvent.
	TraceEvent
	// TraceSRQTake: QP QPNum took the receive WQE WRID from SRQ number SRQ
	// ahead of a message (Config.SRQPrefetch).
	TraceSRQTake
)

// TraceEntry is one thing a soft device did, for Config.Trace.
type TraceEntry struct {
	Kind   TraceKind
	Device string
	QPNum  uint32
	From   ibv.QPState
	To     ibv.QPState
	CQ     uint32 // the CQ's handle on its device, counted from 1
	SRQ    uint32 // the SRQ's handle on its device, counted from 1
	WC     ibv.WC
	WRID   uint64
	Event  ibv.AsyncEvent
}

// String formats the entry on one line, naming the device first.
func (e TraceEntry) String() string {
	switch e.Kind {
	case TraceState:
		return fmt.Sprintf("%s qpn %d: %s -> %s", e.Device, e.QPNum, e.From, e.To)
	case TraceCompletion:
		return fmt.Sprintf("%s cq %d: %s", e.Device, e.CQ, e.WC)
	case TraceSRQTake:
		return fmt.Sprintf("%s qpn %d: took wr_id=%d from srq %d", e.Device, e.QPNum, e.WRID, e.SRQ)
	case TraceEvent:
		if c, ok := e.Event.CQ.(*CQ); ok && c != nil && e.Event.QP == nil {
			return fmt.Sprintf("%s event %s cq %d", e.Device, e.Event.Type, c.id)
		}
		if s, ok := e.Event.SRQ.(*SRQ); ok && s != nil && e.Event.QP == nil && e.Event.CQ == nil {
			return fmt.Sprintf("%s event %s srq %d", e.Device, e.Event.Type, s.id)
		}
		// A QP event, a port event, or an entry not made by a soft device.
		return fmt.Sprintf("%s event %s", e.Device, e.Event)
	}
	return fmt.Sprintf("%s trace kind %d", e.Device, e.Kind)
}

// emit passes e to the device's trace hook, if any. Called with fab.mu held.
func (d *Device) emit(e TraceEntry) {
	if d.trace != nil {
		e.Device = d.name
		d.trace(e)
	}
}
