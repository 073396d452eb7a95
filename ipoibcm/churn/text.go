package churn

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// WriteText writes the run as an operator reads it: the parameters, a
// table of at most rows samples of the lists (all of them when rows <= 0),
// and the summary. With wall false the real duration is left out, so the
// text is the same for the same seed (the tests' golden file).
func (r *Result) WriteText(w io.Writer, rows int, wall bool) error {
	srq := "SRQ"
	if !r.SRQ {
		srq = fmt.Sprintf("no SRQ (max_nonsrq_conn_qp %d)", r.MaxNonSRQConn)
	}
	clock := "virtual clock"
	if r.RealTime {
		clock = "real clock"
	}
	drainTO := ""
	if r.DrainTimeout > 0 {
		drainTO = fmt.Sprintf(", drain waits %v", r.DrainTimeout)
	}
	fmt.Fprintf(w, "churn: seed %d, policy %s, %s, %s; RX_UPDATE_TIME %v, RX_TIMEOUT %v, RX_DELAY %v%s\n",
		r.Seed, r.Policy, srq, clock, r.UpdateTime, r.Timeout, r.Delay, drainTO)
	fmt.Fprintf(w, "peers: %g connects/s, %g sends/s each, mean lifetime %v, %.0f%% vanish without DREQ\n\n",
		r.ConnectRate, r.SendRate, r.Lifetime, 100*r.VanishFraction)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "time\tevents\tpassive_ids\trx_error_list\trx_flush_list\trx_drain_list\tquarantine\tqps\taccepted\trejected\t")
	step := 1
	if rows > 0 && len(r.Samples) > rows {
		step = (len(r.Samples) + rows - 1) / rows
	}
	for i, s := range r.Samples {
		if i%step != 0 && i != len(r.Samples)-1 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", clockTime(s.At), s.Events, s.Passive, s.Error, s.Flush, s.Drain, s.Quarantine, s.QPs, s.Accepted, s.Rejected)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	e := r.Events
	fmt.Fprintf(w, "\nevents: %d (connects %d, sends %d, disconnects %d, vanishes %d); sends dropped (peer queue full) %d, send errors %d\n",
		e.Total(), e.Connects, e.Sends, e.Disconnects, e.Vanishes, r.SendsDropped, r.SendErrors)
	fmt.Fprintf(w, "connections: accepted %d, rejected %d (NO_QP %d, CONSUMER_DEFINED %d)\n",
		r.Accepted, r.RejectedNoQP+r.RejectedOther, r.RejectedNoQP, r.RejectedOther)
	if f := r.FirstReject; f != nil {
		fmt.Fprintf(w, "first rejection: event %d at %s (%s); accepted after it: %d\n", f.Event, clockTime(f.At), f.Reason, r.AcceptedAfterFirstReject)
	}
	fmt.Fprintf(w, "QPs: peak %d; at the end %d live, leaked %d (error %d, flush %d, drain %d, quarantine %d), hung drains %d\n",
		r.PeakQPs, r.End.Passive, r.Leaked, r.End.Error, r.End.Flush, r.End.Drain, r.End.Quarantine, r.HungDrains)
	fmt.Fprintf(w, "drains: drain WRs %d, QPs reaped %d (given up unproven after their wait, the CQ empty: %d), quarantined %d, false safe %d\n",
		r.DrainWRs, r.Reaped, r.GivenUp, r.Quarantined, r.LateWCs)
	fmt.Fprintf(w, "stale detection (vanish -> ERROR) of the %d vanishes and the %d peers that vanished when the churn ended: %s\n",
		e.Vanishes, r.VanishedAtEnd, r.StaleDetect)
	fmt.Fprintf(w, "time to reap (ERROR -> destroy): %s\n", r.TimeToReap)
	stop := "drained in time"
	if r.StopTimedOut {
		stop = fmt.Sprintf("RX drain timing out, %d QPs destroyed unproven", r.StopForced)
	}
	fmt.Fprintf(w, "device stop: %s\n", stop)
	if wall {
		rate := float64(e.Total()) / r.Wall.Seconds()
		fmt.Fprintf(w, "wall time %v, %.0f events/s\n", r.Wall.Round(time.Millisecond), rate)
	}
	return nil
}

// String summarises the distribution.
func (d Dist) String() string {
	if d.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("%d, min %v, p50 %v, p99 %v, max %v", d.Count, round(d.Min), round(d.P50), round(d.P99), round(d.Max))
}

func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}

// clockTime formats a time since the start as h:mm:ss.
func clockTime(d time.Duration) string {
	s := int64(d / time.Second)
	return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
}
