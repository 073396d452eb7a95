package rdmanl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"

	"github.com/qpdrain/qpdrain/ibv"
)

// ErrUnusable is returned by every call on a Conn after a dump was cut
// short (by its context or a receive error): the rest of that dump may
// still be queued on the socket, so the Conn must be closed. A kernel's
// error reply (an errno in NLMSG_ERROR or NLMSG_DONE) ends its reply and
// leaves the Conn usable.
var ErrUnusable = errors.New("netlink connection unusable after an interrupted dump")

// ErrNoSuchQP is wrapped by LookupQP's error when the device has no QP
// of that number (the kernel's ENOENT, which the error wraps too): it was
// destroyed, or it is not visible in the reader's PID namespace.
var ErrNoSuchQP = errors.New("no such QP")

// ErrNoReply means the kernel answered a request with no message.
var ErrNoReply = errors.New("no reply")

// Error is the error of one nldev request: which command, on which device
// (empty for requests that name none), and why. Err wraps the cause, such
// as a unix.Errno the kernel returned (errors.Is(err, unix.EPERM)) or the
// context's error.
type Error struct {
	Command Command
	Device  string
	Err     error
}

func (e *Error) Error() string {
	if e.Device == "" {
		return fmt.Sprintf("%s (%s): %v", e.Command.action(), e.Command, e.Err)
	}
	return fmt.Sprintf("%s of %s (%s): %v", e.Command.action(), e.Device, e.Command, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// DefaultMessageBufferSize is the receive buffer Dial uses. The kernel
// sizes each dump message to the largest read the socket has seen, up to
// 32 KiB (netlink_recvmsg, netlink_dump in net/netlink/af_netlink.c), and
// every message of a resource dump resumes by walking the device's table
// from its start: fewer, larger messages make a long dump much cheaper.
const DefaultMessageBufferSize = 32 << 10

// Conn is a NETLINK_RDMA socket. Its methods may be called from one
// goroutine at a time.
type Conn struct {
	nl        *netlink.Conn
	deadlines bool
	broken    error
	// record, when set, sees every reply message of a request (tests record
	// kernel replies through it).
	record func(cmd Command, dev string, msgs []netlink.Message)
}

// Dial opens a NETLINK_RDMA socket in the caller's network namespace,
// which decides the devices it sees. On a host without RDMA netlink (the
// kernel has no NETLINK_RDMA, ib_core not loaded: EPROTONOSUPPORT; no
// netlink: EAFNOSUPPORT; not Linux) the error matches ibv.ErrNoDevice, the
// project's "no RDMA here", as well as the errno.
func Dial() (*Conn, error) {
	nl, err := netlink.Dial(familyRDMA, &netlink.Config{MessageBufferSize: DefaultMessageBufferSize})
	if err != nil {
		return nil, dialError(err, runtime.GOOS == "linux")
	}
	return NewConn(nl), nil
}

// dialError is Dial's error for err, netlink.Dial's on linux or elsewhere.
func dialError(err error, linux bool) error {
	if !linux || errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.EAFNOSUPPORT) {
		return fmt.Errorf("RDMA netlink is not available (opening its socket: %w): %w", err, ibv.ErrNoDevice)
	}
	return fmt.Errorf("opening the RDMA netlink socket: %w", err)
}

// NewConn uses an open netlink connection, such as one from nltest.Dial.
// Where the connection has no deadlines (nltest), contexts are checked
// between messages only.
func NewConn(nl *netlink.Conn) *Conn {
	return &Conn{nl: nl, deadlines: nl.SetDeadline(time.Time{}) == nil}
}

// Close closes the socket.
func (c *Conn) Close() error { return c.nl.Close() }

func msgType(cmd Command) netlink.HeaderType {
	return netlink.HeaderType(nldevClient<<10 | uint16(cmd))
}

// request sends one request and hands each reply message to fn as it
// arrives; with dump set it asks for a dump (NLM_F_DUMP) and reads every
// part. Every wait is bounded by ctx.
func (c *Conn) request(ctx context.Context, cmd Command, dev string, flags netlink.HeaderFlags, attrs *netlink.AttributeEncoder, fn func(netlink.Message) error) (err error) {
	fail := func(err error) error { return &Error{Command: cmd, Device: dev, Err: err} }
	if c.broken != nil {
		return fail(c.broken)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	var data []byte
	if attrs != nil {
		if data, err = attrs.Encode(); err != nil {
			return fail(fmt.Errorf("encoding the request: %w", err))
		}
	}
	if c.deadlines {
		// The context's deadline, or none, is the socket's; a context that
		// ends early moves it to the past, which wakes the blocked read.
		dl, _ := ctx.Deadline()
		_ = c.nl.SetDeadline(dl)
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = c.nl.SetDeadline(time.Unix(1, 0))
			close(fired)
		})
		defer func() {
			if !stop() {
				// Let it finish before the next request sets its own deadline.
				<-fired
			}
		}()
	}
	req := netlink.Message{Header: netlink.Header{Type: msgType(cmd), Flags: netlink.Request | flags}, Data: data}
	if _, err := c.nl.Send(req); err != nil {
		return fail(err)
	}
	var got []netlink.Message
	n := 0
	var ferr error
	for m, rerr := range c.nl.ReceiveIter() {
		if rerr != nil {
			replied := kernelError(rerr)
			if cerr := ctx.Err(); cerr != nil {
				rerr = cerr
			}
			if !replied && (n > 0 || flags&netlink.Dump != 0) {
				c.broken = ErrUnusable
			}
			return fail(rerr)
		}
		n++
		if c.record != nil {
			got = append(got, m)
		}
		if ferr == nil {
			ferr = fn(m)
		}
		if cerr := ctx.Err(); cerr != nil {
			c.broken = ErrUnusable
			return fail(cerr)
		}
	}
	if c.record != nil {
		c.record(cmd, dev, got)
	}
	if ferr != nil {
		return fail(ferr)
	}
	if n == 0 && flags&netlink.Dump == 0 && flags&netlink.Acknowledge == 0 {
		return fail(ErrNoReply)
	}
	return nil
}

// kernelError reports whether err is the kernel's answer, an errno in an
// NLMSG_ERROR or NLMSG_DONE message: the last message of its reply
// (netlink_ack, netlink_dump_done in net/netlink/af_netlink.c), after which
// nothing of the request is left on the socket. netlink carries such an
// errno bare in its OpError, and a failed receive as an *os.SyscallError
// or a deadline error.
func kernelError(err error) bool {
	var oe *netlink.OpError
	if !errors.As(err, &oe) {
		return false
	}
	_, ok := oe.Err.(syscall.Errno)
	return ok
}

// devAttrs is a request naming a device by index.
func devAttrs(dev uint32) *netlink.AttributeEncoder {
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(attrDevIndex, dev)
	return ae
}

// Devices lists the RDMA devices visible in the socket's network namespace.
func (c *Conn) Devices(ctx context.Context) ([]Device, error) {
	return dump(ctx, c, CmdGet, "", nil, nil, appendOne(decodeDevice))
}

// Ports lists the ports of dev.
func (c *Conn) Ports(ctx context.Context, dev Device) ([]Port, error) {
	return dump(ctx, c, CmdPortGet, dev.label(), devAttrs(dev.Index), nil, appendOne(decodePort))
}

// Summary reads the resource summary of dev.
func (c *Conn) Summary(ctx context.Context, dev Device) (Summary, error) {
	var s Summary
	err := c.request(ctx, CmdResGet, dev.label(), 0, devAttrs(dev.Index), func(m netlink.Message) (err error) {
		s, err = decodeSummary(m.Data)
		return err
	})
	return s, err
}

// QPs dumps the QP table of dev, every QP of every process and of the
// kernel, in table order (which is not QP number order).
func (c *Conn) QPs(ctx context.Context, dev Device) ([]QP, error) {
	return c.AppendQPs(ctx, nil, dev)
}

// AppendQPs is QPs appending to dst, for callers that reuse a slice.
//
// A dump of more than one message lists a QP created or destroyed while
// it runs as the kernel's table had it, and more: each message resumes
// at a count of rows, not at a QP (res_get_common_dumpit in
// drivers/infiniband/core/nldev.c), so a QP created below that count
// shifts a row already sent into the next message, and one destroyed
// below it shifts the next row out of the dump. AppendQPs drops the row
// sent twice (keeping the later one); a row shifted out is missing, and
// only a later dump or LookupQP can tell it from a destroyed QP.
func (c *Conn) AppendQPs(ctx context.Context, dst []QP, dev Device) ([]QP, error) {
	start := len(dst)
	dst, err := dump(ctx, c, CmdResQPGet, dev.label(), devAttrs(dev.Index), dst, appendQPs)
	return append(dst[:start], dedupQPs(dst[start:])...), err
}

// dedupQPs drops from qps, one dump in table (ID) order, every row whose ID
// an earlier row had, the later row replacing the earlier one. A row sent
// twice comes right after a message boundary, where the IDs step back: a
// dump without churn costs one comparison per row.
func dedupQPs(qps []QP) []QP {
	out := qps[:0]
	var top uint32 // the highest ID so far
	for i := range qps {
		id := qps[i].ID()
		if len(out) == 0 || id > top {
			top = id
			out = append(out, qps[i])
			continue
		}
		// Rows before the boundary are in ID order: look back while above.
		j := len(out) - 1
		for j > 0 && out[j].ID() > id {
			j--
		}
		if out[j].ID() == id {
			out[j] = qps[i]
			continue
		}
		out = append(out, qps[i])
	}
	return out
}

// LookupQP asks the kernel for the QP q names (its device, port and ID)
// again (RES_QP_GET with RDMA_NLDEV_ATTR_RES_LQPN, not a dump): its row
// now, or, when the device no longer has it, an error matching
// ErrNoSuchQP and syscall.ENOENT. It tells a QP a dump missed from a
// destroyed one. The port goes with the request when q has one: a kernel
// before 5.11 looks a QP up only on a port and refuses the request
// without one, as a QP in RESET is, with EINVAL.
func (c *Conn) LookupQP(ctx context.Context, q QP) (QP, error) {
	dev := Device{Index: q.Device, Name: q.DeviceName}
	ae := devAttrs(q.Device)
	if q.Has&HasPort != 0 {
		ae.Uint32(attrPortIndex, q.Port)
	}
	ae.Uint32(attrResLQPN, q.ID())
	var got QP
	err := c.request(ctx, CmdResQPGet, dev.label(), 0, ae, func(m netlink.Message) error {
		// The reply is the device's handle and the QP's attributes, not
		// nested in a table (res_get_common_doit, fill_res_qp_entry).
		return decodeQP(&got, &got, attrs{b: m.Data}, q.Device, []byte(q.DeviceName))
	})
	if errors.Is(err, syscall.ENOENT) {
		err = fmt.Errorf("%w: %w", ErrNoSuchQP, err)
	}
	return got, err
}

// dump sends the dump request cmd (about device dev, for errors) and
// appends to dst the entries appendMsg decodes from each reply message.
func dump[T any](ctx context.Context, c *Conn, cmd Command, dev string, attrs *netlink.AttributeEncoder, dst []T, appendMsg func([]T, []byte) ([]T, error)) ([]T, error) {
	err := c.request(ctx, cmd, dev, netlink.Dump, attrs, func(m netlink.Message) (err error) {
		dst, err = appendMsg(dst, m.Data)
		return err
	})
	return dst, err
}

// appendOne makes decode, of a reply message that holds one entry, an
// appendMsg for dump.
func appendOne[T any](decode func([]byte) (T, error)) func([]T, []byte) ([]T, error) {
	return func(dst []T, b []byte) ([]T, error) {
		v, err := decode(b)
		if err != nil {
			return dst, err
		}
		return append(dst, v), nil
	}
}

// PDs dumps the PD table of dev.
func (c *Conn) PDs(ctx context.Context, dev Device) ([]PD, error) {
	return dump(ctx, c, CmdResPDGet, dev.label(), devAttrs(dev.Index), nil, appendPDs)
}

// Contexts dumps the context table of dev (one entry per open uverbs
// file; kernel 5.11 and later).
func (c *Conn) Contexts(ctx context.Context, dev Device) ([]Ctx, error) {
	return dump(ctx, c, CmdResCtxGet, dev.label(), devAttrs(dev.Index), nil, appendCtxs)
}

// UverbsChardev looks up the uverbs char device of dev ("uverbs0").
func (c *Conn) UverbsChardev(ctx context.Context, dev Device) (Chardev, error) {
	ae := devAttrs(dev.Index)
	ae.String(attrChardevType, "uverbs")
	var cd Chardev
	err := c.request(ctx, CmdGetChardev, dev.label(), 0, ae, func(m netlink.Message) (err error) {
		cd, err = decodeChardev(m.Data)
		return err
	})
	return cd, err
}

// AddLink creates a software RDMA device named name of linkType ("rxe",
// "siw") on the net device netdev, as `rdma link add NAME type TYPE netdev
// NETDEV` does. The kernel loads the module for linkType
// ("rdma-link-rxe") when it can.
func (c *Conn) AddLink(ctx context.Context, name, linkType, netdev string) error {
	ae := netlink.NewAttributeEncoder()
	ae.String(attrDevName, name)
	ae.String(attrLinkType, linkType)
	ae.String(attrNdevName, netdev)
	return c.request(ctx, CmdNewLink, name, netlink.Acknowledge, ae, func(netlink.Message) error { return nil })
}

// DeleteLink deletes the software RDMA device dev, as `rdma link delete`
// does. The kernel handles the request inside the send and, for a driver
// that cannot disassociate its contexts (rxe), waits there until every
// process has closed the device (ib_unregister_device, ib_uverbs_remove_one):
// ctx cannot cut that wait short, so callers first wait, bounded, until
// no process holds the device (package inventory finds them).
func (c *Conn) DeleteLink(ctx context.Context, dev Device) error {
	return c.request(ctx, CmdDelLink, dev.label(), netlink.Acknowledge, devAttrs(dev.Index), func(netlink.Message) error { return nil })
}

// label names a device in errors: its name, else its index.
func (d Device) label() string {
	if d.Name != "" {
		return d.Name
	}
	return fmt.Sprintf("device %d", d.Index)
}
