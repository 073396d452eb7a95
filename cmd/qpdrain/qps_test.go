package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

func testQPs() []inventory.QP {
	return []inventory.QP{
		{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: 17, RQPN: 18, RQPSN: 5, SQPSN: 6, Type: rdmanl.QPTypeRC, State: rdmanl.QPStateRTS, PID: 105, PDN: 3,
			Has: rdmanl.HasPort | rdmanl.HasRQPN | rdmanl.HasRQPSN | rdmanl.HasSQPSN | rdmanl.HasPathMigState | rdmanl.HasPID | rdmanl.HasPDN},
			Comm: "worker", Owner: &inventory.Owner{PID: 100, TID: 105, Comm: "server", Via: inventory.FromQP},
			Holders: []inventory.Holder{{PID: 100, Comm: "server", FDs: []int{7}}}, HoldersCertain: true},
		// Its holder is one of two processes: not proven which.
		{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", LQPN: 19, Type: rdmanl.QPTypeRC, State: rdmanl.QPStateReset, PDN: 4, Has: rdmanl.HasSQPSN | rdmanl.HasPDN},
			CreatorGone: true, Holders: []inventory.Holder{{PID: 200, Comm: "child", FDs: []int{3}}, {PID: 201, Comm: "kid", FDs: []int{4}}}},
		{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: 1, Type: rdmanl.QPTypeGSI, State: rdmanl.QPStateRTS, KernName: "ib_core", Has: rdmanl.HasPort | rdmanl.HasSQPSN | rdmanl.HasKernName},
			Comm: "ib_core", Owner: &inventory.Owner{Comm: "ib_core", Via: inventory.FromKernel}, HoldersCertain: true},
		{QP: rdmanl.QP{Device: 2, DeviceName: "mlx5_0", Port: 2, LQPN: 33, Type: rdmanl.QPTypeUD, State: rdmanl.QPStateErr, PID: 300, Has: rdmanl.HasPort | rdmanl.HasSQPSN | rdmanl.HasPID},
			Comm: "ud", Owner: &inventory.Owner{PID: 300, Comm: "ud", Via: inventory.FromQP}},
	}
}

func TestQPFilters(t *testing.T) {
	checkQPFilters(t, testQPs(), []qpFilterCase{
		{nil, []uint32{17, 19, 1, 33}, ""},
		{[]string{"link", "rxe0"}, []uint32{17, 19, 1}, ""},
		{[]string{"link", "rxe0/1"}, []uint32{17, 1}, ""},
		{[]string{"link", "rxe0/-"}, []uint32{19}, ""},
		{[]string{"link", "mlx5_0/2", "type", "UD"}, []uint32{33}, ""},
		{[]string{"lqpn", "1-17"}, []uint32{17, 1}, ""},
		{[]string{"lqpn", "19,33"}, []uint32{19, 33}, ""},
		{[]string{"state", "rts,ERR"}, []uint32{17, 1, 33}, ""},
		{[]string{"type", "GSI"}, []uint32{1}, ""},
		// A filter on an attribute the QP lacks drops it, as in rdma.
		{[]string{"pid", "0-1000"}, []uint32{17, 33}, ""},
		{[]string{"rqpn", "18"}, []uint32{17}, ""},
		{[]string{"pdn", "4"}, []uint32{19}, ""},
		{[]string{"lqpn"}, nil, `filter "lqpn" has no value`},
		{[]string{"colour", "red"}, nil, `unknown filter "colour"`},
		{[]string{"lqpn", "9-3"}, nil, "ends before it starts"},
		{[]string{"lqpn", "x"}, nil, "is not a number"},
		{[]string{"link", "rxe0/x"}, nil, "is not a port number"},
		{[]string{"state", "RTS,"}, nil, "empty word"},
		{[]string{"state", "FOO"}, nil, `filter state "FOO": no state is "FOO": want one of RESET, INIT, RTR, RTS, SQD, SQE, ERR, UNKNOWN (any case)`},
		{[]string{"type", "rc,XYZ"}, nil, "want one of SMI, GSI, RC, UC, UD, RAW_IPV6, RAW_ETHERTYPE, UNKNOWN, RAW_PACKET, XRC_INI, XRC_TGT"},
		{[]string{"path-mig-state", "moved"}, nil, "want one of MIGRATED, REARM, ARMED, UNKNOWN"},
		{[]string{"path-mig-state", "migrated"}, []uint32{17}, ""},
	})
}

// qpFilterCase is qps's filter args, and the QPs they select or the error
// they give.
type qpFilterCase struct {
	args []string
	want []uint32
	err  string
}

func checkQPFilters(t *testing.T, qps []inventory.QP, cases []qpFilterCase) {
	t.Helper()
	for _, tc := range cases {
		f, err := inventory.ParseFilter(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		var got []uint32
		for i := range qps {
			if f.Match(&qps[i]) {
				got = append(got, qps[i].LQPN)
			}
		}
		if !equalU32(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.args, got, tc.want)
		}
	}
}

func TestQPFilterPort(t *testing.T) {
	devs := []inventory.Device{{Device: rdmanl.Device{Name: "rxe0", Ports: 1}}, {Device: rdmanl.Device{Name: "mlx5_0", Ports: 2}}}
	for _, tc := range []struct{ link, err string }{
		{"rxe0/1", ""}, {"rxe0/-", ""}, {"rxe0", ""}, {"mlx5_0/2", ""},
		{"rxe0/7", "filter link rxe0/7: rxe0 has port 1 only"},
		{"mlx5_0/3", "mlx5_0 has ports 1-2 only"},
	} {
		f, err := inventory.ParseFilter([]string{"link", tc.link})
		if err == nil {
			err = f.CheckPort(devs)
		}
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("link %s: %v, want %q", tc.link, err, tc.err)
		}
	}
}

// TestQPFilterExit: a bad filter word exits 2 before RDMA is asked.
func TestQPFilterExit(t *testing.T) {
	wantRefused(t, []string{"qps"}, []badInput{
		{[]string{"state", "FOO"}, exitError, "want one of"},
		{[]string{"type", "XYZ"}, exitError, "want one of"},
		{[]string{"path-mig-state", "x"}, exitError, "want one of"},
	})
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestQPText(t *testing.T) {
	qps := testQPs()
	for i, want := range []struct{ plain, details string }{
		{"link rxe0/1 lqpn 17 rqpn 18 type RC state RTS rq-psn 5 sq-psn 6 path-mig-state MIGRATED pdn 3 pid 105 comm worker",
			" owner 100/server via qp holders 100/server"},
		{"link rxe0/- lqpn 19 type RC state RESET sq-psn 0 pdn 4", " owner - (creator gone) holders one-of 200/child,201/kid"},
		{"link rxe0/1 lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]", ""},
		{"link mlx5_0/2 lqpn 33 type UD state ERR sq-psn 0 pid 300 comm ud", " owner 300/ud via qp holders -"},
	} {
		if got := string(appendQPLine(nil, &qps[i], false)); got != want.plain+"\n" {
			t.Errorf("QP %d:\n got  %q\n want %q", qps[i].LQPN, got, want.plain)
		}
		if got := string(appendQPLine(nil, &qps[i], true)); got != want.plain+want.details+"\n" {
			t.Errorf("QP %d -d:\n got  %q\n want %q", qps[i].LQPN, got, want.plain+want.details)
		}
	}
}

// A QP whose owner the kernel could not name (no RES_CTX_GET) says so.
func TestQPOwnerUncertain(t *testing.T) {
	q := testQPs()[1]
	q.CreatorGone, q.OwnerUncertain = false, true
	if got, want := string(appendQPLine(nil, &q, true)), "link rxe0/- lqpn 19 type RC state RESET sq-psn 0 pdn 4 owner unknown holders one-of 200/child,201/kid\n"; got != want {
		t.Errorf("text -d:\n got  %q\n want %q", got, want)
	}
	var enc qpJSONEncoder
	if got, err := enc.append(nil, &q); err != nil || !strings.Contains(string(got), `"creator_gone":false,"owner_uncertain":true,`) {
		t.Errorf("JSON %s (%v): want creator_gone false, owner_uncertain true", got, err)
	}
}

func TestQPJSON(t *testing.T) {
	snap := &inventory.Snapshot{QPs: testQPs()}
	var b bytes.Buffer
	f, _ := inventory.ParseFilter(nil)
	if err := printQPs(&b, snap, &f, true, false); err != nil {
		t.Fatal(err)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(b.Bytes(), &list); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	if len(list) != 4 {
		t.Fatalf("%d objects, want 4", len(list))
	}
	// rxe0's QPs without a port come first, then port 1, then mlx5_0.
	want := []string{
		`{"ifindex":1,"ifname":"rxe0","lqpn":19,"type":"RC","state":"RESET","sq-psn":0,"pdn":4,"owner":null,"creator_gone":true,"holders":[{"pid":200,"comm":"child","fds":[3]},{"pid":201,"comm":"kid","fds":[4]}],"holders_certain":false}`,
		// iproute2's print_link (rdma/res.c): ifindex, ifname, port.
		`{"ifindex":1,"ifname":"rxe0","port":1,"lqpn":17,"rqpn":18,"type":"RC","state":"RTS","rq-psn":5,"sq-psn":6,"path-mig-state":"MIGRATED","pdn":3,"pid":105,"comm":"worker","owner":{"pid":100,"tid":105,"comm":"server","via":"qp"},"creator_gone":false,"holders":[{"pid":100,"comm":"server","fds":[7]}],"holders_certain":true}`,
		`{"ifindex":1,"ifname":"rxe0","port":1,"lqpn":1,"type":"GSI","state":"RTS","sq-psn":0,"comm":"ib_core","owner":{"comm":"ib_core","via":"kernel"},"creator_gone":false,"holders":[],"holders_certain":true}`,
	}
	for i, w := range want {
		if got := strings.TrimSpace(string(list[i])); got != w {
			t.Errorf("object %d:\n got  %s\n want %s", i, got, w)
		}
	}
}

func TestQPSummary(t *testing.T) {
	snap := &inventory.Snapshot{
		Devices: []inventory.Device{{Device: rdmanl.Device{Index: 1, Name: "rxe0"}}, {Device: rdmanl.Device{Index: 2, Name: "mlx5_0"}}},
		QPs:     testQPs(),
	}
	maxQP := func(dev string) (int, bool) { return 1048560, dev == "rxe0" }
	var b bytes.Buffer
	f, _ := inventory.ParseFilter(nil)
	if err := printQPSummary(&b, snap, &f, false, maxQP); err != nil {
		t.Fatal(err)
	}
	want := "1: rxe0: max_qp 1048560 qp 3 GSI 1 RC 2 RESET 1 RTS 2\n2: mlx5_0: qp 1 UD 1 ERR 1\n"
	if b.String() != want {
		t.Errorf("summary:\n got  %q\n want %q", b.String(), want)
	}
	b.Reset()
	if err := printQPSummary(&b, snap, &f, true, maxQP); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"ifname":"rxe0","max_qp":1048560,"qp":3,"types":{"GSI":1,"RC":2}`) {
		t.Errorf("summary -j: %s", b.String())
	}
}

// TestQPsWithoutRDMA: on a host without RDMA netlink, qps says so and
// exits 3.
func TestQPsWithoutRDMA(t *testing.T) {
	if c, err := rdmanl.Dial(); err == nil {
		c.Close()
		t.Skip("this host has RDMA netlink")
	}
	_, err := runQpdrain(t, "qps")
	if exitCode(err) != exitUnsupported || !strings.Contains(err.Error(), "RDMA netlink is not available") {
		t.Fatalf("qps without RDMA: %v, want exit 3 saying RDMA netlink is not available", err)
	}
	if _, err := runQpdrain(t, "qps", "lqpn"); exitCode(err) != exitError {
		t.Fatalf("qps with a bad filter: %v, want exit 2", err)
	}
}

// qpJSON is the reference for qps -j's objects: qpJSONEncoder must write
// what encoding/json writes of it (TestQPJSONEncoder), and tests read the
// output back into it.
type qpJSON struct {
	IfIndex      uint32           `json:"ifindex"`
	IfName       string           `json:"ifname"`
	Port         *uint32          `json:"port,omitempty"`
	LQPN         uint32           `json:"lqpn"`
	RQPN         *uint32          `json:"rqpn,omitempty"`
	Type         string           `json:"type"`
	Subtype      string           `json:"subtype,omitempty"`
	State        string           `json:"state"`
	RQPSN        *uint32          `json:"rq-psn,omitempty"`
	SQPSN        *uint32          `json:"sq-psn,omitempty"`
	PathMigState string           `json:"path-mig-state,omitempty"`
	PDN          *uint32          `json:"pdn,omitempty"`
	PID          *uint32          `json:"pid,omitempty"`
	Comm         string           `json:"comm,omitempty"`
	Owner        *inventory.Owner `json:"owner"`
	CreatorGone  bool             `json:"creator_gone"`
	// OwnerUncertain is present only when true.
	OwnerUncertain bool               `json:"owner_uncertain,omitempty"`
	Holders        []inventory.Holder `json:"holders"`
	// HoldersCertain: holders are exactly the QP's context's, else the
	// candidates.
	HoldersCertain bool `json:"holders_certain"`
}

func opt(v uint32, ok bool) *uint32 {
	if !ok {
		return nil
	}
	return &v
}

// toQPJSON is the reference's view of q.
func toQPJSON(q *inventory.QP) qpJSON {
	j := qpJSON{
		IfIndex: q.Device, IfName: q.DeviceName, LQPN: q.LQPN,
		Port: opt(q.Port, q.Has&rdmanl.HasPort != 0),
		RQPN: opt(q.RQPN, q.Has&rdmanl.HasRQPN != 0),
		Type: q.Type.String(), Subtype: q.Subtype, State: q.State.String(),
		RQPSN: opt(q.RQPSN, q.Has&rdmanl.HasRQPSN != 0),
		SQPSN: opt(q.SQPSN, q.Has&rdmanl.HasSQPSN != 0),
		PDN:   opt(q.PDN, q.Has&rdmanl.HasPDN != 0),
		PID:   opt(q.PID, q.Has&rdmanl.HasPID != 0),
		Comm:  q.Comm, Owner: q.Owner, CreatorGone: q.CreatorGone, OwnerUncertain: q.OwnerUncertain, Holders: q.Holders, HoldersCertain: q.HoldersCertain,
	}
	if q.Has&rdmanl.HasPathMigState != 0 {
		j.PathMigState = q.PathMigState.String()
	}
	if j.Holders == nil {
		j.Holders = []inventory.Holder{}
	}
	return j
}

// TestQPJSONEncoder: the appender writes what encoding/json writes of the
// reference, for every test QP and for comms that need escaping.
func TestQPJSONEncoder(t *testing.T) {
	qps := testQPs()
	for _, comm := range []string{`a"b`, `back\slash`, "tab\tnl\n", "<script>&", "naïve", "bad\xffutf8"} {
		q := qps[0]
		q.Comm = comm
		qps = append(qps, q)
	}
	q := qps[0]
	q.Subtype, q.Owner, q.Holders = "GSI", nil, nil
	qps = append(qps, q)
	q = qps[1]
	q.CreatorGone, q.OwnerUncertain = false, true
	qps = append(qps, q)
	var enc qpJSONEncoder
	for i := range qps {
		want, err := json.Marshal(toQPJSON(&qps[i]))
		if err != nil {
			t.Fatal(err)
		}
		got, err := enc.append(nil, &qps[i])
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want)+"\n" {
			t.Errorf("QP %d comm %q:\n got  %s want %s", qps[i].LQPN, qps[i].Comm, got, want)
		}
	}
}
