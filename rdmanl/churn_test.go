package rdmanl

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"

	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
)

// churnKernel is a device's QP table as res_get_common_dumpit
// (drivers/infiniband/core/nldev.c) dumps it: in ID order, perMsg rows a
// message, each message resuming at the count of rows sent so far, with
// between(i), when set, changing the table after message i (0 is the
// first), as other processes do while a dump runs. A request naming one
// QP (RDMA_NLDEV_ATTR_RES_LQPN) is answered with its row or ENOENT, as
// res_get_common_doit does.
type churnKernel struct {
	ids     []uint32 // the table, sorted
	perMsg  int
	between func(i int)
}

func (k *churnKernel) add(id uint32) {
	if i, ok := slices.BinarySearch(k.ids, id); !ok {
		k.ids = slices.Insert(k.ids, i, id)
	}
}

func (k *churnKernel) remove(id uint32) {
	if i, ok := slices.BinarySearch(k.ids, id); ok {
		k.ids = slices.Delete(k.ids, i, i+1)
	}
}

func (k *churnKernel) dial(t *testing.T) *Conn {
	return NewConn(nltest.Dial(func(req []netlink.Message) ([]netlink.Message, error) {
		r := req[0]
		reply := func(data []byte) netlink.Message {
			return netlink.Message{Header: netlink.Header{Type: r.Header.Type, Sequence: r.Header.Sequence}, Data: data}
		}
		entry := func(id uint32) func(*netlink.AttributeEncoder) {
			return func(e *netlink.AttributeEncoder) {
				e.Uint32(attrResLQPN, id)
				e.Uint8(attrResType, uint8(QPTypeRC))
				e.Uint8(attrResState, uint8(QPStateErr))
			}
		}
		if r.Header.Flags&netlink.Dump == 0 {
			ad, err := netlink.NewAttributeDecoder(r.Data)
			if err != nil {
				t.Fatal(err)
			}
			var id uint32
			for ad.Next() {
				if ad.Type() == attrResLQPN {
					id = ad.Uint32()
				}
			}
			if _, ok := slices.BinarySearch(k.ids, id); !ok {
				r.Header.Flags = 0
				return nltest.Error(int(syscall.ENOENT), []netlink.Message{r})
			}
			ae := netlink.NewAttributeEncoder()
			ae.Uint32(attrDevIndex, 1)
			ae.String(attrDevName, "rxe0")
			entry(id)(ae)
			b, err := ae.Encode()
			if err != nil {
				t.Fatal(err)
			}
			return []netlink.Message{reply(b)}, nil
		}
		var msgs []netlink.Message
		for start, i := 0, 0; start < len(k.ids); i++ {
			var rows []func(*netlink.AttributeEncoder) error
			for _, id := range k.ids[start:min(start+k.perMsg, len(k.ids))] {
				rows = append(rows, qpEntry(entry(id)))
			}
			msgs = append(msgs, reply(qpMessage(t, 1, "rxe0", rows...)))
			start += len(rows)
			if k.between != nil {
				k.between(i)
			}
		}
		msgs = append(msgs, netlink.Message{Header: netlink.Header{Type: netlink.Done}, Data: make([]byte, 4)})
		return nltest.Multipart(msgs)
	}))
}

func ids(qps []QP) []uint32 {
	out := make([]uint32, len(qps))
	for i := range qps {
		out[i] = qps[i].ID()
	}
	return out
}

// A QP created below the resume point while a dump runs shifts a row
// already sent into the next message: the dump lists every QP once.
func TestDumpUnderChurnListsNoQPTwice(t *testing.T) {
	k := &churnKernel{ids: []uint32{20, 30, 40, 50, 60, 70}, perMsg: 3}
	k.between = func(i int) {
		if i == 0 {
			k.add(10) // below the three rows sent: 40 is sent again
		}
	}
	c := k.dial(t)
	defer c.Close()
	qps, err := c.QPs(context.Background(), Device{Index: 1, Name: "rxe0"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(qps), []uint32{20, 30, 40, 50, 60, 70}; !slices.Equal(got, want) {
		t.Errorf("dump with a QP created below its resume point: %v, want %v", got, want)
	}
}

// A QP destroyed below the resume point shifts the next row out of the
// dump; LookupQP finds it, and says ErrNoSuchQP of the destroyed one.
func TestLookupQPFindsWhatADumpMissed(t *testing.T) {
	k := &churnKernel{ids: []uint32{20, 30, 40, 50, 60, 70}, perMsg: 3}
	k.between = func(i int) {
		if i == 0 {
			k.remove(20) // 50 moves to row 3, already counted as sent
		}
	}
	c := k.dial(t)
	defer c.Close()
	dev := Device{Index: 1, Name: "rxe0"}
	qps, err := c.QPs(context.Background(), dev)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(qps); slices.Contains(got, 50) {
		t.Fatalf("the fake kernel did not skip 50: %v", got)
	}
	q, err := c.LookupQP(context.Background(), QP{Device: 1, DeviceName: "rxe0", LQPN: 50, Type: QPTypeRC})
	if err != nil || q.LQPN != 50 || q.State != QPStateErr || q.Device != 1 || q.DeviceName != "rxe0" {
		t.Errorf("LookupQP(50): %+v, %v; want its row", q, err)
	}
	_, err = c.LookupQP(context.Background(), QP{Device: 1, DeviceName: "rxe0", LQPN: 20, Type: QPTypeRC})
	if !errors.Is(err, ErrNoSuchQP) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("LookupQP(20), destroyed: %v, want ErrNoSuchQP and ENOENT", err)
	}
	// The kernel's ENOENT leaves the Conn usable.
	if _, err := c.QPs(context.Background(), dev); err != nil {
		t.Errorf("a dump after it: %v", err)
	}
}

// The SMI and GSI QPs of every port share their numbers: their ID has the
// port in its top byte, and the dump's order follows it.
func TestQPIDOfSpecialQPs(t *testing.T) {
	gsi := QP{LQPN: 1, Port: 2, Type: QPTypeGSI}
	rc := QP{LQPN: 1, Port: 2, Type: QPTypeRC}
	if gsi.ID() != 1|2<<24 || rc.ID() != 1 {
		t.Errorf("ID: GSI %#x, RC %#x", gsi.ID(), rc.ID())
	}
	in := []QP{{LQPN: 17}, {LQPN: 18}, {LQPN: 1, Port: 1, Type: QPTypeGSI}, {LQPN: 1, Port: 2, Type: QPTypeGSI}}
	if got := dedupQPs(slices.Clone(in)); len(got) != 4 {
		t.Errorf("dedupQPs dropped a port's GSI QP: %v", ids(got))
	}
}
