package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/librdmacm"
	"github.com/qpdrain/qpdrain/rcsetup"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/softcm"
)

// softCMAddr is the address the soft device gets on its soft RDMA CM
// network (TEST-NET-1, RFC 5737: no real host has it).
var softCMAddr = netip.MustParseAddr("192.0.2.1")

// checkCM is the RDMA CM connection of a check: the connector the probes'
// pairs connect through and what closes it.
type checkCM struct {
	conn *rcsetup.CM
	// close closes the connector, then the device it was opened for
	// (soft), once every probe's objects are closed.
	close func() error
}

// softCM connects the soft device's QPs through a soft RDMA CM network
// (package softcm) on softCMAddr.
func softCM(dev *openedDevice) (*checkCM, error) {
	n := softcm.NewNetwork()
	if err := n.Attach(dev.soft, softCMAddr); err != nil {
		return nil, err
	}
	c, err := rcsetup.ListenCM(n, softCMAddr)
	if err != nil {
		return nil, err
	}
	return &checkCM{conn: c, close: func() error { return errors.Join(c.Close(), dev.Close()) }}, nil
}

// verbsCM connects the QPs of the libibverbs device name through librdmacm
// on addr, or when addr is not valid on the IP address of the device's
// netdev. The probes then run on librdmacm's own context of the device
// (rcsetup.ListenCM), which the returned connector holds.
func verbsCM(ctx context.Context, name string, addr netip.Addr) (*checkCM, error) {
	if !addr.IsValid() {
		var err error
		if addr, err = netdevAddr(ctx, name); err != nil {
			return nil, err
		}
	}
	m, err := librdmacm.Open()
	if err != nil {
		return nil, fmt.Errorf("connecting through the RDMA CM: %w", err)
	}
	c, err := rcsetup.ListenCM(m, addr)
	if err != nil {
		return nil, err
	}
	if got := c.Context().Name(); got != name {
		return nil, errors.Join(fmt.Errorf("the RDMA CM binds %s to %s, not %s: give --cm-addr an address of %s's netdev", addr, got, name, name), c.Close())
	}
	return &checkCM{conn: c, close: c.Close}, nil
}

// errNoAddr is the error of a device whose netdev has no IP address the
// RDMA CM could bind.
var errNoAddr = errors.New("no IP address")

// netdevAddr is the IP address of the netdev RDMA device name's port 1 is
// on (rdma link's netdev), IPv4 first: the address the RDMA CM binds to
// that device.
func netdevAddr(ctx context.Context, name string) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := rdmanl.Dial()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("finding %s's netdev for the RDMA CM (or give --cm-addr): %w", name, err)
	}
	defer conn.Close()
	dev, err := findDevice(ctx, conn, name)
	if err != nil {
		return netip.Addr{}, err
	}
	ports, err := conn.Ports(ctx, dev)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("finding %s's netdev for the RDMA CM: %w", name, err)
	}
	for _, p := range ports {
		if p.Netdev == "" {
			continue
		}
		ifc, err := net.InterfaceByName(p.Netdev)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("netdev %s of %s: %w", p.Netdev, name, err)
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return netip.Addr{}, fmt.Errorf("netdev %s of %s: %w", p.Netdev, name, err)
		}
		var best netip.Addr
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok || ip.IsLinkLocalUnicast() {
				continue
			}
			if ip = ip.Unmap(); ip.Is4() {
				return ip, nil
			}
			if !best.IsValid() {
				best = ip
			}
		}
		if best.IsValid() {
			return best, nil
		}
		return netip.Addr{}, fmt.Errorf("netdev %s of %s has %w for the RDMA CM: give --cm-addr", p.Netdev, name, errNoAddr)
	}
	return netip.Addr{}, fmt.Errorf("%s has no netdev (rdma link) whose address the RDMA CM could bind: give --cm-addr: %w", name, ibv.ErrNoDevice)
}
