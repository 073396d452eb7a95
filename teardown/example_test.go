package teardown_test

import (
	"errors"
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/soft"
	"github.com/qpdrain/qpdrain/teardown"
)

// Objects are added as they are created and closed newest first: the QP
// before its CQ and PD, the PD before the device.
func Example() {
	var objs teardown.List
	dev, _ := soft.Open(soft.Config{})
	objs.Add(dev)
	pd, _ := dev.AllocPD()
	objs.Add(pd)
	cq, _ := dev.CreateCQ(8, nil)
	objs.Add(cq)
	qp, _ := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTRC,
		Cap: ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	objs.Add(qp)
	fmt.Println(objs.Close())
	_, _, err := qp.Query(ibv.QPAttrState)
	fmt.Println(errors.Is(err, ibv.ErrClosed))
	// Output:
	// <nil>
	// true
}
