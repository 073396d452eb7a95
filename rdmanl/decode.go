package rdmanl

import (
	"fmt"

	"github.com/mdlayher/netlink"
)

// The decoders below read one reply message's attributes (nldev messages
// carry no family header). They switch on attribute numbers and ignore the
// ones they do not know; a repeated attribute overwrites the earlier value.

func newDecoder(b []byte) (*netlink.AttributeDecoder, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, fmt.Errorf("malformed attributes: %w", err)
	}
	return ad, nil
}

func decodeDevice(b []byte) (Device, error) {
	var d Device
	ad, err := newDecoder(b)
	if err != nil {
		return d, err
	}
	for ad.Next() {
		switch ad.Type() {
		case attrDevIndex:
			d.Index = ad.Uint32()
		case attrDevName:
			d.Name = ad.String()
		case attrPortIndex:
			d.Ports = ad.Uint32()
		case attrFWVersion:
			d.FWVersion = ad.String()
		case attrNodeGUID:
			d.NodeGUID = ad.Uint64()
		case attrSysImageGUID:
			d.SysImageGUID = ad.Uint64()
		case attrDevNodeType:
			d.NodeType = ad.Uint8()
		case attrDevProtocol:
			d.Protocol = ad.String()
		}
	}
	return d, ad.Err()
}

func decodePort(b []byte) (Port, error) {
	var p Port
	ad, err := newDecoder(b)
	if err != nil {
		return p, err
	}
	for ad.Next() {
		switch ad.Type() {
		case attrDevIndex:
			p.Device = ad.Uint32()
		case attrDevName:
			p.DeviceName = ad.String()
		case attrPortIndex:
			p.Port = ad.Uint32()
		case attrPortState:
			p.State = PortState(ad.Uint8())
		case attrPortPhysState:
			p.PhysState = ad.Uint8()
		case attrLID:
			p.LID = ad.Uint32()
		case attrNdevIndex:
			p.NetdevIndex = ad.Uint32()
		case attrNdevName:
			p.Netdev = ad.String()
		}
	}
	return p, ad.Err()
}

func decodeSummary(b []byte) (Summary, error) {
	var s Summary
	ad, err := newDecoder(b)
	if err != nil {
		return s, err
	}
	for ad.Next() {
		switch ad.Type() {
		case attrDevIndex:
			s.Device = ad.Uint32()
		case attrDevName:
			s.DeviceName = ad.String()
		case attrResSummary:
			s.Counts = s.Counts[:0]
			ad.Nested(func(tab *netlink.AttributeDecoder) error {
				for tab.Next() {
					if tab.Type() != attrResSummaryEntry {
						continue
					}
					var c ResourceCount
					tab.Nested(func(e *netlink.AttributeDecoder) error {
						for e.Next() {
							switch e.Type() {
							case attrResSummaryName:
								c.Name = e.String()
							case attrResSummaryCurr:
								c.Current = e.Uint64()
							}
						}
						return e.Err()
					})
					s.Counts = append(s.Counts, c)
				}
				return tab.Err()
			})
		}
	}
	return s, ad.Err()
}

// decodeTable walks one dump message of a resource table: the device
// attributes at the top, then the table (tableAttr) of entries (entryAttr).
// entry is called once per entry with a decoder positioned before its
// first attribute and the device index and name seen so far.
func decodeTable(b []byte, tableAttr, entryAttr uint16, entry func(e *netlink.AttributeDecoder, dev uint32, name string) error) error {
	ad, err := newDecoder(b)
	if err != nil {
		return err
	}
	var dev uint32
	var name string
	for ad.Next() {
		switch ad.Type() {
		case attrDevIndex:
			dev = ad.Uint32()
		case attrDevName:
			name = ad.String()
		case tableAttr:
			ad.Nested(func(tab *netlink.AttributeDecoder) error {
				for tab.Next() {
					if tab.Type() != entryAttr {
						continue
					}
					tab.Nested(func(e *netlink.AttributeDecoder) error {
						if err := entry(e, dev, name); err != nil {
							return err
						}
						return e.Err()
					})
				}
				return tab.Err()
			})
		}
	}
	return ad.Err()
}

// appendQPs decodes one RES_QP_GET dump message and appends its QPs to dst.
func appendQPs(dst []QP, b []byte) ([]QP, error) {
	err := decodeTable(b, attrResQP, attrResQPEntry, func(e *netlink.AttributeDecoder, dev uint32, name string) error {
		q := QP{Device: dev, DeviceName: name}
		for e.Next() {
			switch e.Type() {
			case attrPortIndex:
				q.Port, q.Has = e.Uint32(), q.Has|HasPort
			case attrResLQPN:
				q.LQPN = e.Uint32()
			case attrResRQPN:
				q.RQPN, q.Has = e.Uint32(), q.Has|HasRQPN
			case attrResRQPSN:
				q.RQPSN, q.Has = e.Uint32(), q.Has|HasRQPSN
			case attrResSQPSN:
				q.SQPSN, q.Has = e.Uint32(), q.Has|HasSQPSN
			case attrResPathMigState:
				q.PathMigState, q.Has = PathMigState(e.Uint8()), q.Has|HasPathMigState
			case attrResType:
				q.Type = QPType(e.Uint8())
			case attrResState:
				q.State = QPState(e.Uint8())
			case attrResPID:
				q.PID, q.Has = e.Uint32(), q.Has|HasPID
			case attrResKernName:
				q.KernName, q.Has = e.String(), q.Has|HasKernName
			case attrResPDN:
				q.PDN, q.Has = e.Uint32(), q.Has|HasPDN
			case attrResSubtype:
				q.Subtype, q.Has = e.String(), q.Has|HasSubtype
			}
		}
		dst = append(dst, q)
		return nil
	})
	return dst, err
}

// appendPDs decodes one RES_PD_GET dump message.
func appendPDs(dst []PD, b []byte) ([]PD, error) {
	err := decodeTable(b, attrResPD, attrResPDEntry, func(e *netlink.AttributeDecoder, dev uint32, _ string) error {
		p := PD{Device: dev}
		for e.Next() {
			switch e.Type() {
			case attrResPDN:
				p.PDN = e.Uint32()
			case attrResCtxN:
				p.CtxN, p.Has = e.Uint32(), p.Has|HasCtxN
			case attrResPID:
				p.PID, p.Has = e.Uint32(), p.Has|HasPID
			case attrResKernName:
				p.KernName, p.Has = e.String(), p.Has|HasKernName
			}
		}
		dst = append(dst, p)
		return nil
	})
	return dst, err
}

// appendCtxs decodes one RES_CTX_GET dump message.
func appendCtxs(dst []Ctx, b []byte) ([]Ctx, error) {
	err := decodeTable(b, attrResCtx, attrResCtxEntry, func(e *netlink.AttributeDecoder, dev uint32, _ string) error {
		c := Ctx{Device: dev}
		for e.Next() {
			switch e.Type() {
			case attrResCtxN:
				c.CtxN, c.Has = e.Uint32(), c.Has|HasCtxN
			case attrResPID:
				c.PID, c.Has = e.Uint32(), c.Has|HasPID
			}
		}
		dst = append(dst, c)
		return nil
	})
	return dst, err
}

func decodeChardev(b []byte) (Chardev, error) {
	var c Chardev
	ad, err := newDecoder(b)
	if err != nil {
		return c, err
	}
	for ad.Next() {
		switch ad.Type() {
		case attrChardevName:
			c.Name = ad.String()
		case attrChardev:
			c.Dev = ad.Uint64()
		case attrChardevABI:
			c.ABI = ad.Uint64()
		case attrUverbsDriverID:
			c.DriverID = ad.Uint32()
		}
	}
	return c, ad.Err()
}
