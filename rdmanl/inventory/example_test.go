package inventory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

// Find the QPs whose creator is gone, and who keeps them alive.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rdmanl.Dial()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	snap, err := inventory.Take(ctx, c, inventory.Options{})
	if err != nil {
		fmt.Println(err) // inventory.ErrNoDevices on a host without RDMA
		return
	}
	for _, q := range snap.QPs {
		if !q.CreatorGone {
			continue
		}
		if q.HoldersCertain {
			fmt.Printf("%s lqpn %d: creator gone, held by %v\n", q.DeviceName, q.LQPN, q.Holders)
		} else {
			fmt.Printf("%s lqpn %d: creator gone, held by one or more of %v\n", q.DeviceName, q.LQPN, q.Holders)
		}
	}
}
