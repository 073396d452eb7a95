package churn

import (
	"slices"
	"time"

	"github.com/qpdrain/qpdrain/ipoibcm"
)

// Events counts the churn events by kind.
type Events struct {
	Connects    int `json:"connects"`
	Sends       int `json:"sends"`
	Disconnects int `json:"disconnects"`
	Vanishes    int `json:"vanishes"`
}

// Total is every event.
func (e Events) Total() int { return e.Connects + e.Sends + e.Disconnects + e.Vanishes }

// Sample is the state of the lists at one time of a run.
type Sample struct {
	At         time.Duration `json:"at_ns"` // since the run started
	Events     int           `json:"events"`
	Passive    int           `json:"passive_ids"`
	Error      int           `json:"rx_error_list"`
	Flush      int           `json:"rx_flush_list"`
	Drain      int           `json:"rx_drain_list"`
	Reap       int           `json:"rx_reap_list"`
	Quarantine int           `json:"quarantine"`
	QPs        int           `json:"qps"`
	Accepted   int           `json:"accepted"`
	Rejected   int           `json:"rejected"`
}

// Mark is where in a run something first happened.
type Mark struct {
	Event  int           `json:"event"` // the event's number, from 1
	At     time.Duration `json:"at_ns"` // since the run started
	Reason string        `json:"reason,omitempty"`
}

// Dist summarises durations.
type Dist struct {
	Count int           `json:"count"`
	Min   time.Duration `json:"min_ns"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

func dist(d []time.Duration) Dist {
	if len(d) == 0 {
		return Dist{}
	}
	slices.Sort(d)
	q := func(f float64) time.Duration { return d[min(len(d)-1, int(f*float64(len(d))))] }
	return Dist{Count: len(d), Min: d[0], P50: q(0.50), P99: q(0.99), Max: d[len(d)-1]}
}

// Result is what a run saw. Every field but Wall is the same for the same
// seed, configuration and device behaviour.
type Result struct {
	Seed           uint64         `json:"seed"`
	Policy         ipoibcm.Policy `json:"policy"`
	SRQ            bool           `json:"srq"`
	MaxNonSRQConn  int            `json:"max_nonsrq_conn_qp,omitempty"`
	Timeout        time.Duration  `json:"rx_timeout_ns"`
	Delay          time.Duration  `json:"rx_delay_ns"`
	UpdateTime     time.Duration  `json:"rx_update_time_ns"`
	DrainTimeout   time.Duration  `json:"drain_timeout_ns,omitempty"`
	ConnectRate    float64        `json:"connect_rate"`
	SendRate       float64        `json:"send_rate"`
	Lifetime       time.Duration  `json:"lifetime_ns"`
	VanishFraction float64        `json:"vanish_fraction"`
	RealTime       bool           `json:"real_time"`

	Events       Events `json:"events"`
	Accepted     int    `json:"accepted"`
	RejectedNoQP int    `json:"rejected_no_qp"`
	// RejectedOther were rejected with CONSUMER_DEFINED: the device
	// created no more QPs.
	RejectedOther int   `json:"rejected_consumer_defined"`
	FirstReject   *Mark `json:"first_reject,omitempty"`
	// AcceptedAfterFirstReject counts connections accepted after the
	// first rejection: 0 means the device stopped taking connections.
	AcceptedAfterFirstReject int `json:"accepted_after_first_reject"`
	SendsDropped             int `json:"sends_dropped"`
	SendErrors               int `json:"send_errors"`
	PeakQPs                  int `json:"peak_qps"`
	// VanishedAtEnd counts the peers still connected when the churn ended
	// that ended by vanishing, as they would have: no event counts them,
	// but the stale task finds them as it finds Events.Vanishes.
	VanishedAtEnd int `json:"vanished_at_end"`

	// At the end of the churn and the settle time after it.
	End Sample `json:"end"`
	// Leaked is the QPs left in ERROR and never reaped at the end: on the
	// error, flush and drain lists, and the quarantine.
	Leaked int `json:"leaked_qps"`
	// HungDrains is the QPs still behind a drain (on rx_drain_list) at the
	// end, after every bounded wait would have ended.
	HungDrains  int `json:"hung_drains"`
	Quarantined int `json:"quarantined"`
	// GivenUp is the QPs the bounded policy destroyed unproven after their
	// wait ran out, the CQ found empty.
	GivenUp  int `json:"given_up"`
	DrainWRs int `json:"drain_wrs"`
	Reaped   int `json:"reaped"`
	// LateWCs counts completions that arrived for a QP already destroyed:
	// a QP declared finished that was not (false safe).
	LateWCs int `json:"false_safe"`
	// StaleDetect is from a peer vanishing to its connection entering
	// ERROR by the stale task; TimeToReap from ERROR to destroy.
	StaleDetect Dist `json:"stale_detect"`
	TimeToReap  Dist `json:"time_to_reap"`
	// Stop is what the device stop at the end had to do.
	StopTimedOut bool `json:"stop_timed_out"`
	StopForced   int  `json:"stop_forced"`
	// Samples are the lists over the run.
	Samples []Sample `json:"samples"`
	// Wall is the run's real duration.
	Wall time.Duration `json:"wall_ns"`
}

func newResult(c Config) *Result {
	return &Result{Seed: c.Seed, ConnectRate: c.ConnectRate, SendRate: c.SendRate, Lifetime: c.Lifetime,
		VanishFraction: c.VanishFraction, RealTime: c.RealTime}
}

func (r *Result) setManager(c ipoibcm.Config) {
	r.Policy, r.SRQ = c.Policy, !c.NoSRQ
	if c.NoSRQ {
		r.MaxNonSRQConn = c.MaxNonSRQConn
	}
	r.Timeout, r.Delay, r.UpdateTime = c.Timeout, c.Delay, c.UpdateTime
	if c.Policy == ipoibcm.Bounded {
		r.DrainTimeout = c.Drain.DrainTimeout
	}
}

func (r *Result) reject(reason ipoibcm.RejectReason, at time.Duration) {
	if reason == ipoibcm.RejNoQP {
		r.RejectedNoQP++
	} else {
		r.RejectedOther++
	}
	if r.FirstReject == nil {
		r.FirstReject = &Mark{Event: r.Events.Total(), At: at, Reason: reason.String()}
		r.AcceptedAfterFirstReject = -r.Accepted
	}
}

func (r *Result) end() {
	if len(r.Samples) > 0 {
		r.End = r.Samples[len(r.Samples)-1]
	}
	r.Leaked = r.End.Error + r.End.Flush + r.End.Drain + r.End.Quarantine
	r.HungDrains = r.End.Drain
}

func (r *Result) stopped(rep ipoibcm.StopReport, st ipoibcm.Stats) {
	r.StopTimedOut, r.StopForced = rep.TimedOut, rep.Forced
	r.Quarantined, r.DrainWRs, r.Reaped, r.LateWCs = st.Quarantined, st.DrainWRs, st.Reaped, st.LateWCs
	r.GivenUp = st.GivenUp
}

func (r *Result) finish(stale, reaped []time.Duration) {
	if r.FirstReject != nil {
		r.AcceptedAfterFirstReject += r.Accepted
	}
	r.StaleDetect, r.TimeToReap = dist(stale), dist(reaped)
}
