package rdmanl

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
)

// recording is the replies to one request.
type recording struct {
	name string
	msgs []netlink.Message
}

// wantQP is what a replayed dump must contain, written next to the
// recordings (want.json).
type wantQP struct {
	LQPN  uint32 `json:"lqpn"`
	Type  string `json:"type"`
	State string `json:"state"`
}

type wantFile struct {
	Device string   `json:"device"`
	PID    uint32   `json:"pid"`
	PDN    uint32   `json:"pdn"`
	QPs    []wantQP `json:"qps"`
}

// kernelRecording is every reply one kernel gave (testdata/<kernel>/).
type kernelRecording struct {
	kernel string
	byCmd  map[string][]netlink.Message
	want   wantFile
}

func (k kernelRecording) all() []recording {
	var out []recording
	for name, msgs := range k.byCmd {
		out = append(out, recording{name: name, msgs: msgs})
	}
	return out
}

// loadKernels reads testdata/<kernel>/<command>.hex (one reply message per
// line, in hex, as TestKernelReplies printed it) and want.json.
func loadKernels(tb testing.TB) []kernelRecording {
	tb.Helper()
	dirs, err := filepath.Glob("testdata/*/want.json")
	if err != nil {
		tb.Fatal(err)
	}
	var out []kernelRecording
	for _, w := range dirs {
		dir := filepath.Dir(w)
		k := kernelRecording{kernel: filepath.Base(dir), byCmd: map[string][]netlink.Message{}}
		wb, err := os.ReadFile(w)
		if err != nil {
			tb.Fatal(err)
		}
		if err := json.Unmarshal(wb, &k.want); err != nil {
			tb.Fatalf("%s: %v", w, err)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*.hex"))
		for _, f := range files {
			fh, err := os.Open(f)
			if err != nil {
				tb.Fatal(err)
			}
			sc := bufio.NewScanner(fh)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				b, err := hex.DecodeString(strings.TrimSpace(sc.Text()))
				if err != nil {
					tb.Fatalf("%s: %v", f, err)
				}
				var m netlink.Message
				if err := m.UnmarshalBinary(b); err != nil {
					tb.Fatalf("%s: %v", f, err)
				}
				name := strings.TrimSuffix(filepath.Base(f), ".hex")
				k.byCmd[name] = append(k.byCmd[name], m)
			}
			fh.Close()
		}
		out = append(out, k)
	}
	return out
}

func loadRecordings(tb testing.TB) []recording {
	var out []recording
	for _, k := range loadKernels(tb) {
		out = append(out, k.all()...)
	}
	return out
}

// replay answers requests with a kernel's recorded replies, by command:
// the recorded messages as they came, then the NLMSG_DONE of a dump.
func (k kernelRecording) replay(tb testing.TB) *Conn {
	return NewConn(nltest.Dial(func(req []netlink.Message) ([]netlink.Message, error) {
		cmd := Command(uint16(req[0].Header.Type) & 0x3ff)
		recs, ok := k.byCmd[strings.ToLower(cmd.String())]
		if !ok {
			tb.Fatalf("%s: no recording of %s", k.kernel, cmd)
		}
		msgs := append([]netlink.Message(nil), recs...)
		if req[0].Header.Flags&netlink.Dump == 0 {
			return msgs, nil
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi}, Data: make([]byte, 4)})
		return msgs, nil
	}))
}

// TestReplayKernels decodes every recorded kernel's replies (6.1 and 6.12,
// recorded in the VM) and finds the QPs, PD and context the recording test
// created, with the types and states it gave them.
func TestReplayKernels(t *testing.T) {
	ks := loadKernels(t)
	if len(ks) < 2 {
		t.Errorf("testdata has recordings of %d kernels, want 2 (6.1 and 6.12; see testdata/README.md)", len(ks))
	}
	for _, k := range ks {
		t.Run(k.kernel, func(t *testing.T) {
			c := k.replay(t)
			defer c.Close()
			ctx := context.Background()
			devs, err := c.Devices(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var dev Device
			for _, d := range devs {
				if d.Name == k.want.Device {
					dev = d
				}
			}
			if dev.Name == "" || dev.Ports != 1 || dev.Protocol != "roce" {
				t.Fatalf("devices %+v: no %s with one RoCE port", devs, k.want.Device)
			}
			ports, err := c.Ports(ctx, dev)
			if err != nil || len(ports) != 1 || ports[0].State.String() != "ACTIVE" || ports[0].Netdev != "dummy0" {
				t.Errorf("ports %+v (%v): want port 1 ACTIVE on dummy0", ports, err)
			}
			qps, err := c.QPs(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			by := map[uint32]QP{}
			for _, q := range qps {
				by[q.LQPN] = q
			}
			for _, w := range k.want.QPs {
				q, ok := by[w.LQPN]
				if !ok || q.Type.String() != w.Type || q.State.String() != w.State || q.PDN != k.want.PDN || q.Has&HasPID == 0 {
					t.Errorf("QP %d: %+v, want %s %s pdn %d with a pid", w.LQPN, q, w.Type, w.State, k.want.PDN)
				}
			}
			if g := by[1]; g.Type != QPTypeGSI || g.KernName == "" {
				t.Errorf("QP 1: %+v, want the kernel's GSI QP", g)
			}
			pds, err := c.PDs(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			var pd *PD
			for i := range pds {
				if pds[i].PDN == k.want.PDN {
					pd = &pds[i]
				}
			}
			if pd == nil || pd.Has&HasCtxN == 0 || pd.Has&HasPID == 0 {
				t.Fatalf("PD %d: %+v, want it with ctxn and pid", k.want.PDN, pds)
			}
			ctxs, err := c.Contexts(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, x := range ctxs {
				found = found || x.CtxN == pd.CtxN && x.Has&HasPID != 0
			}
			if !found {
				t.Errorf("context %d not in %+v", pd.CtxN, ctxs)
			}
			sum, err := c.Summary(ctx, dev)
			if n, ok := sum.Count("qp"); err != nil || !ok || n != uint64(len(qps)) {
				t.Errorf("summary %+v (%v): want qp %d", sum, err, len(qps))
			}
			cd, err := c.UverbsChardev(ctx, dev)
			if err != nil || cd.Name != "uverbs0" || cd.DriverID != DriverRXE {
				t.Errorf("chardev %+v (%v): want uverbs0 of rxe", cd, err)
			}
		})
	}
}
