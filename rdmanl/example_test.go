package rdmanl_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/rdmanl"
)

// List every QP of every RDMA device, as `rdma resource show qp` does.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rdmanl.Dial()
	if err != nil {
		fmt.Println(err) // no RDMA netlink here: no RDMA devices
		return
	}
	defer c.Close()
	devs, err := c.Devices(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range devs {
		qps, err := c.QPs(ctx, d)
		if err != nil {
			fmt.Println(err) // names the command and the device
			return
		}
		for _, q := range qps {
			pid := "-"
			if q.Has&rdmanl.HasPID != 0 {
				pid = fmt.Sprint(q.PID)
			}
			fmt.Printf("%s lqpn %d %s %s pid %s\n", q.DeviceName, q.LQPN, q.Type, q.State, pid)
		}
	}
}
