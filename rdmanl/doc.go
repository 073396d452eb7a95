// Package rdmanl speaks RDMA netlink (NETLINK_RDMA, the nldev client of
// include/uapi/rdma/rdma_netlink.h): the host's view of RDMA, every QP of
// every process, as iproute2's rdma tool reads it.
//
// A Conn lists devices (RDMA_NLDEV_CMD_GET), their ports (PORT_GET), the
// resource summary (RES_GET), the QP, PD and context tables (RES_QP_GET,
// RES_PD_GET, RES_CTX_GET), the uverbs char device of a device
// (GET_CHARDEV), and adds and deletes links such as rxe (NEWLINK, DELLINK).
// It is built on github.com/mdlayher/netlink, so tests replay recorded
// kernel replies through its nltest fakes without privileges.
//
// The kernel dumps resource tables per device (a dump without
// RDMA_NLDEV_ATTR_DEV_INDEX fails with EINVAL), in as many messages as it
// needs, each resuming at a position in the device's table; it sets no
// NLM_F_DUMP_INTR, so an object destroyed while a dump runs may take a
// later one's place, and one created may repeat an earlier one. QP dumps
// drop the repeat (Conn.AppendQPs); Conn.LookupQP asks for one QP by
// number, to tell one the dump missed from one destroyed. Every call is
// bounded by its context.
//
// Values are decoded by attribute number; attributes this package does not
// know are skipped, and an attribute sent twice takes its last value (mlx5
// sends RDMA_NLDEV_ATTR_RES_TYPE twice on 6.10 and later). Reading needs no
// privilege; NEWLINK and DELLINK need CAP_NET_ADMIN.
//
// A QP's RDMA_NLDEV_ATTR_RES_PID is the creating thread's id in the reader's
// PID namespace, absent once that thread is gone or its process a zombie;
// the PD and context tables, joined by PDN and CTXN, often still name the
// process (package inventory does the join).
package rdmanl
