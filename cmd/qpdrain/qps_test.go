package main

import (
	"bytes"
	"encoding/json"
	"errors"
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
			Holders: []inventory.Holder{{PID: 100, Comm: "server", FDs: []int{7}}}},
		{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", LQPN: 19, Type: rdmanl.QPTypeRC, State: rdmanl.QPStateReset, PDN: 4, Has: rdmanl.HasSQPSN | rdmanl.HasPDN},
			CreatorGone: true, Holders: []inventory.Holder{{PID: 200, Comm: "child", FDs: []int{3}}}},
		{QP: rdmanl.QP{Device: 1, DeviceName: "rxe0", Port: 1, LQPN: 1, Type: rdmanl.QPTypeGSI, State: rdmanl.QPStateRTS, KernName: "ib_core", Has: rdmanl.HasPort | rdmanl.HasSQPSN | rdmanl.HasKernName},
			Comm: "ib_core", Owner: &inventory.Owner{Comm: "ib_core", Via: inventory.FromKernel}},
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
		f, err := parseQPFilter(tc.args)
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
			if f.match(&qps[i]) {
				got = append(got, qps[i].LQPN)
			}
		}
		if !equalU32(got, tc.want) {
			t.Errorf("%v: %v, want %v", tc.args, got, tc.want)
		}
	}
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
		{"link rxe0/- lqpn 19 type RC state RESET sq-psn 0 pdn 4", " owner - (creator gone) holders 200/child"},
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

func TestQPJSON(t *testing.T) {
	snap := &inventory.Snapshot{QPs: testQPs()}
	var b bytes.Buffer
	f, _ := parseQPFilter(nil)
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
		`{"ifindex":1,"ifname":"rxe0","lqpn":19,"type":"RC","state":"RESET","sq-psn":0,"pdn":4,"owner":null,"creator_gone":true,"holders":[{"pid":200,"comm":"child","fds":[3]}]}`,
		`{"ifindex":1,"port":1,"ifname":"rxe0","lqpn":17,"rqpn":18,"type":"RC","state":"RTS","rq-psn":5,"sq-psn":6,"path-mig-state":"MIGRATED","pdn":3,"pid":105,"comm":"worker","owner":{"pid":100,"tid":105,"comm":"server","via":"qp"},"creator_gone":false,"holders":[{"pid":100,"comm":"server","fds":[7]}]}`,
		`{"ifindex":1,"port":1,"ifname":"rxe0","lqpn":1,"type":"GSI","state":"RTS","sq-psn":0,"comm":"ib_core","owner":{"comm":"ib_core","via":"kernel"},"creator_gone":false,"holders":[]}`,
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
	f, _ := parseQPFilter(nil)
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
	var ec *exitCodeError
	if !errors.As(err, &ec) || ec.code != exitUnsupported || !strings.Contains(err.Error(), "no RDMA devices") {
		t.Fatalf("qps without RDMA: %v, want exit 3 saying no RDMA devices", err)
	}
	if _, err := runQpdrain(t, "qps", "lqpn"); !errors.As(err, &ec) || ec.code != exitError {
		t.Fatalf("qps with a bad filter: %v, want exit 2", err)
	}
}
