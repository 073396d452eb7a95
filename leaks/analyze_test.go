package leaks

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

var (
	app    = Process{PID: 100, Comm: "app"}
	child  = Process{PID: 201, Comm: "child"}
	grower = Process{PID: 300, Comm: "grower"}
)

func rc(lqpn uint32, state string, owner Process, holders ...Process) QP {
	return QP{Port: 1, LQPN: lqpn, Type: "RC", State: state, Owner: owner, Holders: holders, HoldersCertain: len(holders) > 0}
}

// unsure is q with its holders the candidates.
func unsure(q QP) QP {
	q.HoldersCertain = false
	return q
}

func kern(lqpn uint32, typ, state, name string) QP {
	return QP{Port: 1, LQPN: lqpn, Type: typ, State: state, KernName: name}
}

// samples makes n samples a second apart of one device, rxe0, whose QPs in
// sample i are qps(i).
func samples(n int, qps func(i int) []QP) []Sample {
	var out []Sample
	for i := range n {
		out = append(out, Sample{At: t0.Add(time.Duration(i) * time.Second), Devices: []Device{{Name: "rxe0", QPs: qps(i)}}})
	}
	return out
}

// reasons is "reason:lqpn,lqpn" per finding, in report order.
func reasons(r Report) []string {
	var out []string
	for _, f := range r.Findings {
		var ns []string
		for _, q := range f.QPs {
			ns = append(ns, fmt.Sprint(q.LQPN))
		}
		out = append(out, string(f.Reason)+":"+strings.Join(ns, ","))
	}
	return out
}

func TestAnalyze(t *testing.T) {
	gsi := kern(1, "GSI", "RTS", "ib_core")
	for _, tc := range []struct {
		name string
		n    int
		qps  func(i int) []QP
		opts Options
		want []string
	}{
		{"healthy RTS and idle QPs are never findings", 4, func(int) []QP {
			return []QP{gsi, rc(17, "RTS", app), rc(18, "RTS", app), rc(19, "INIT", app), {LQPN: 20, Type: "RC", State: "RESET", Owner: app}}
		}, Options{}, nil},
		{"ERR in every sample is stuck", 4, func(int) []QP {
			return []QP{gsi, rc(17, "RTS", app), rc(18, "ERR", app), rc(19, "SQE", app)}
		}, Options{}, []string{"stuck-in-error:18,19"}},
		{"ERR in only some samples is not", 4, func(i int) []QP {
			if i == 3 {
				return []QP{gsi, rc(18, "ERR", app)}
			}
			return []QP{gsi, rc(18, "RTS", app)}
		}, Options{}, nil},
		{"a QP destroyed during the window is not", 4, func(i int) []QP {
			if i == 3 {
				return []QP{gsi}
			}
			return []QP{gsi, rc(18, "ERR", app)}
		}, Options{}, nil},
		{"one sample proves no dwell", 1, func(int) []QP { return []QP{rc(18, "ERR", app)} }, Options{}, nil},
		{"no creator in every sample is orphaned, in any state", 3, func(int) []QP {
			return []QP{gsi, rc(17, "RTS", Process{}, child), rc(18, "ERR", Process{}, child), rc(19, "RTS", app)}
		}, Options{}, []string{"orphaned:17,18"}},
		{"one orphaned finding per holder set", 3, func(int) []QP {
			other := Process{PID: 202, Comm: "other"}
			return []QP{rc(17, "RTS", Process{}, child), rc(18, "ERR", Process{}, other), rc(19, "ERR", Process{}, child),
				unsure(rc(20, "ERR", Process{}, child, other)), rc(21, "ERR", Process{}, child, other)}
		}, Options{}, []string{"orphaned:17,19", "orphaned:18", "orphaned:20", "orphaned:21"}},
		{"an owner the kernel could not name is not orphaned", 3, func(int) []QP {
			q := rc(18, "ERR", Process{}, child)
			q.OwnerUncertain = true
			return []QP{q}
		}, Options{}, nil},
		{"an owner that went away during the window is not orphaned", 3, func(i int) []QP {
			if i == 0 {
				return []QP{rc(17, "RTS", app)}
			}
			return []QP{rc(17, "RTS", Process{}, child)}
		}, Options{}, nil},
		{"growing owner: count up each sample, ERR up", 4, func(i int) []QP {
			qps := []QP{gsi, rc(17, "RTS", app)}
			for j := 0; j <= i; j++ {
				qps = append(qps, rc(uint32(100+2*j), "ERR", grower), rc(uint32(101+2*j), "RTS", grower))
			}
			return qps
		}, Options{}, []string{"growing:100"}},
		{"churn alone is not growing: more QPs and more in ERR each sample, none of them staying", 4, func(i int) []QP {
			var qps []QP
			for j := 0; j <= i; j++ {
				qps = append(qps, rc(uint32(1000*i+2*j), "ERR", grower), rc(uint32(1000*i+2*j+1), "RTS", grower))
			}
			return qps
		}, Options{}, nil},
		{"a busy owner creating healthy QPs is not growing", 4, func(i int) []QP {
			var qps []QP
			for j := 0; j <= i; j++ {
				qps = append(qps, rc(uint32(100+j), "RTS", grower))
			}
			return qps
		}, Options{}, nil},
		{"a count that pauses is not growing", 4, func(i int) []QP {
			var qps []QP
			for j := 0; j <= min(i, 2); j++ {
				qps = append(qps, rc(uint32(100+j), "ERR", grower))
			}
			return qps
		}, Options{}, []string{"stuck-in-error:100"}},
		{"two samples, 1 then 2 QPs in ERR, are stuck: growing needs three", 2, func(i int) []QP {
			if i == 0 {
				return []QP{rc(100, "ERR", grower)}
			}
			return []QP{rc(100, "ERR", grower), rc(101, "ERR", grower)}
		}, Options{}, []string{"stuck-in-error:100"}},
		{"stuck-in-error is one finding per owner", 3, func(int) []QP {
			return []QP{rc(18, "ERR", app), rc(19, "ERR", child), rc(20, "SQE", app)}
		}, Options{}, []string{"stuck-in-error:18,20", "stuck-in-error:19"}},
		{"near max_qp in an earlier sample, not the last", 2, func(i int) []QP {
			qps := []QP{rc(17, "RTS", app), rc(18, "RTS", app), rc(19, "RTS", app)}
			if i == 0 {
				qps = append(qps, rc(20, "RTS", app))
			}
			return qps
		}, Options{Limits: map[string]Limit{"rxe0": {MaxQP: 4}}}, []string{"near-limit:"}},
		{"near max_qp", 2, func(int) []QP {
			return []QP{rc(17, "RTS", app), rc(18, "RTS", app), rc(19, "RTS", app), rc(20, "RTS", app)}
		}, Options{Limits: map[string]Limit{"rxe0": {MaxQP: 4}}}, []string{"near-limit:"}},
		{"below the threshold of max_qp", 2, func(int) []QP {
			return []QP{rc(17, "RTS", app), rc(18, "RTS", app), rc(19, "RTS", app)}
		}, Options{Limits: map[string]Limit{"rxe0": {MaxQP: 4}}}, nil},
		{"kernel QPs in ERR", 3, func(int) []QP {
			return []QP{gsi, kern(70, "UD", "RTS", "ib_ipoib"), kern(71, "RC", "ERR", "ib_ipoib"), kern(72, "RC", "ERR", "ib_ipoib"), kern(73, "RC", "RTS", "ib_ipoib")}
		}, Options{}, []string{"kernel:71,72"}},
		{"IPoIB-CM near the non-SRQ limit", 2, func(int) []QP {
			qps := []QP{gsi, kern(2, "UD", "RTS", "ib_ipoib")}
			for j := range 116 {
				qps = append(qps, kern(uint32(100+j), "RC", "RTS", "ib_ipoib"))
			}
			return qps
		}, Options{}, []string{"near-limit:"}},
		{"only ib_ipoib's RC QPs count toward the non-SRQ limit", 2, func(int) []QP {
			// 115 of them, below the threshold of 116: its UD QP and
			// another module's RC QP do not make it 116.
			qps := []QP{gsi, kern(2, "UD", "RTS", "ib_ipoib"), kern(3, "RC", "RTS", "rds_rdma")}
			for j := range 115 {
				qps = append(qps, kern(uint32(100+j), "RC", "RTS", "ib_ipoib"))
			}
			return qps
		}, Options{}, nil},
		{"IPoIB-CM below the non-SRQ limit", 2, func(int) []QP {
			qps := []QP{gsi}
			for j := range 115 {
				qps = append(qps, kern(uint32(100+j), "RC", "RTS", "ib_ipoib"))
			}
			return qps
		}, Options{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Analyze(samples(tc.n, tc.qps), tc.opts)
			if got := reasons(r); !slices.Equal(got, tc.want) {
				t.Errorf("findings %q, want %q", got, tc.want)
			}
			for _, f := range r.Findings {
				if f.Evidence == "" || f.Remedy == "" {
					t.Errorf("finding %s without evidence or remedy: %+v", f.Reason, f)
				}
			}
		})
	}
}

func TestAnalyzeEvidence(t *testing.T) {
	r := Analyze(samples(4, func(int) []QP {
		return []QP{rc(18, "ERR", app), rc(17, "RTS", Process{}, child)}
	}), Options{Limits: map[string]Limit{"rxe0": {Unknown: "this build has no libibverbs"}}})
	if len(r.Findings) != 2 {
		t.Fatalf("findings %q, want 2", reasons(r))
	}
	stuck, orph := r.Findings[0], r.Findings[1]
	for _, want := range []string{"in each of 4 samples", "at least 3s"} {
		if !strings.Contains(stuck.Evidence, want) {
			t.Errorf("stuck evidence %q lacks %q", stuck.Evidence, want)
		}
	}
	if stuck.Owner == nil || stuck.Owner.PID != 100 || !strings.Contains(stuck.Remedy, "qpdrain reap --pid 100") {
		t.Errorf("stuck owner %v remedy %q", stuck.Owner, stuck.Remedy)
	}
	if !strings.Contains(orph.Evidence, "pid 201 (child)") || !strings.Contains(orph.Remedy, "qpdrain reap --pid 201") {
		t.Errorf("orphaned evidence %q remedy %q", orph.Evidence, orph.Remedy)
	}
	if orph.HoldersCertain == nil || !*orph.HoldersCertain || strings.Contains(orph.Evidence, "one or more") {
		t.Errorf("orphaned holders certain %v evidence %q", orph.HoldersCertain, orph.Evidence)
	}
	u := Analyze(samples(2, func(int) []QP { return []QP{unsure(rc(17, "RTS", Process{}, child, app))} }), Options{})
	if len(u.Findings) != 1 || *u.Findings[0].HoldersCertain || !strings.Contains(u.Findings[0].Evidence, "held by one or more of pid 201 (child), pid 100 (app) (which one is not provable here)") {
		t.Errorf("uncertain orphaned findings %+v", u.Findings)
	}
	if r.Window() != 3*time.Second || len(r.Devices) != 1 || r.Devices[0].QPs != 2 {
		t.Errorf("window %v devices %+v", r.Window(), r.Devices)
	}
	if !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "max_qp unknown (this build has no libibverbs)") }) {
		t.Errorf("notes %q do not say max_qp is unknown", r.Notes)
	}
	if got := r.QPCount(StuckInError, "rxe0"); got != 1 {
		t.Errorf("QPCount(stuck-in-error) = %d, want 1", got)
	}
}

// The samples' notes reach the report, each once.
func TestAnalyzeSampleNotes(t *testing.T) {
	ss := samples(3, func(int) []QP { return nil })
	for i := range ss {
		ss[i].Notes = []string{"rxe0: the kernel has no RES_CTX_GET"}
	}
	if r := Analyze(ss, Options{}); !slices.Equal(r.Notes, []string{"rxe0: the kernel has no RES_CTX_GET"}) {
		t.Errorf("notes %q, want the samples' note once", r.Notes)
	}
}

func TestAnalyzeNoSamples(t *testing.T) {
	r := Analyze(nil, Options{})
	if r.Samples != 0 || len(r.Findings) != 0 || r.Findings == nil || r.Devices == nil {
		t.Errorf("empty report %+v", r)
	}
}
