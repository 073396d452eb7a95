package rdmanl

// The decoders below read one reply message's attributes (nldev messages
// carry no family header). They switch on attribute numbers and ignore the
// ones they do not know; a repeated attribute overwrites the earlier value.

func decodeDevice(b []byte) (Device, error) {
	var d Device
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case attrDevIndex:
			d.Index = a.u32()
		case attrDevName:
			d.Name = a.str()
		case attrPortIndex:
			d.Ports = a.u32()
		case attrFWVersion:
			d.FWVersion = a.str()
		case attrNodeGUID:
			d.NodeGUID = a.u64()
		case attrSysImageGUID:
			d.SysImageGUID = a.u64()
		case attrDevNodeType:
			d.NodeType = a.u8()
		case attrDevProtocol:
			d.Protocol = a.str()
		}
	}
	return d, a.err
}

func decodePort(b []byte) (Port, error) {
	var p Port
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case attrDevIndex:
			p.Device = a.u32()
		case attrDevName:
			p.DeviceName = a.str()
		case attrPortIndex:
			p.Port = a.u32()
		case attrPortState:
			p.State = PortState(a.u8())
		case attrPortPhysState:
			p.PhysState = a.u8()
		case attrLID:
			p.LID = a.u32()
		case attrNdevIndex:
			p.NetdevIndex = a.u32()
		case attrNdevName:
			p.Netdev = a.str()
		}
	}
	return p, a.err
}

func decodeSummary(b []byte) (Summary, error) {
	var s Summary
	dev, name, err := walkTable(b, attrResSummary, attrResSummaryEntry, func(e attrs, _ uint32, _ []byte) error {
		var c ResourceCount
		for e.next() {
			switch e.typ {
			case attrResSummaryName:
				c.Name = e.str()
			case attrResSummaryCurr:
				c.Current = e.u64()
			}
		}
		s.Counts = append(s.Counts, c)
		return e.err
	})
	s.Device, s.DeviceName = dev, string(name)
	return s, err
}

// walkTable walks one message of a table: the device attributes at the
// top, then the table (tableAttr) of entries (entryAttr). entry is called
// once per entry with the entry's attributes and the device index and name
// (the raw bytes, for the caller to intern) seen so far; it returns the
// entry's decoding error, which ends the walk. walkTable returns the
// device index and name of the message.
func walkTable(b []byte, tableAttr, entryAttr uint16, entry func(e attrs, dev uint32, name []byte) error) (dev uint32, name []byte, err error) {
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case attrDevIndex:
			dev = a.u32()
		case attrDevName:
			name = a.text()
		case tableAttr:
			tab := attrs{b: a.val}
			for tab.next() {
				if tab.typ != entryAttr {
					continue
				}
				if err := entry(attrs{b: tab.val}, dev, name); err != nil {
					return dev, name, err
				}
			}
			if tab.err != nil {
				return dev, name, tab.err
			}
		}
	}
	return dev, name, a.err
}

// appendTable decodes one dump message of a resource table and appends its
// entries to dst. decode fills row, already appended as a zero T, from the
// entry's attributes and the device index and name; prev is the row before
// (row itself for the first), whose strings a row repeating them shares
// (intern). Rows are filled in place: a QP is about a hundred bytes, and
// passing rows in and out by value made BenchmarkDecodeQPMessages a sixth
// slower. On an error dst comes back as it was.
func appendTable[T any](dst []T, b []byte, tableAttr, entryAttr uint16, decode func(row, prev *T, e attrs, dev uint32, name []byte) error) ([]T, error) {
	n := len(dst)
	var zero T
	_, _, err := walkTable(b, tableAttr, entryAttr, func(e attrs, dev uint32, name []byte) error {
		dst = append(dst, zero)
		row, prev := &dst[len(dst)-1], &dst[max(len(dst)-2, 0)]
		return decode(row, prev, e, dev, name)
	})
	if err != nil {
		return dst[:n], err
	}
	return dst, nil
}

// appendQPs decodes one RES_QP_GET dump message and appends its QPs to dst.
func appendQPs(dst []QP, b []byte) ([]QP, error) {
	return appendTable(dst, b, attrResQP, attrResQPEntry, decodeQP)
}

func decodeQP(q, prev *QP, e attrs, dev uint32, name []byte) error {
	q.Device, q.DeviceName = dev, intern(name, prev.DeviceName)
	for e.next() {
		switch e.typ {
		case attrPortIndex:
			q.Port, q.Has = e.u32(), q.Has|HasPort
		case attrResLQPN:
			q.LQPN = e.u32()
		case attrResRQPN:
			q.RQPN, q.Has = e.u32(), q.Has|HasRQPN
		case attrResRQPSN:
			q.RQPSN, q.Has = e.u32(), q.Has|HasRQPSN
		case attrResSQPSN:
			q.SQPSN, q.Has = e.u32(), q.Has|HasSQPSN
		case attrResPathMigState:
			q.PathMigState, q.Has = PathMigState(e.u8()), q.Has|HasPathMigState
		case attrResType:
			q.Type = QPType(e.u8())
		case attrResState:
			q.State = QPState(e.u8())
		case attrResPID:
			q.PID, q.Has = e.u32(), q.Has|HasPID
		case attrResKernName:
			q.KernName, q.Has = intern(e.text(), prev.KernName), q.Has|HasKernName
		case attrResPDN:
			q.PDN, q.Has = e.u32(), q.Has|HasPDN
		case attrResSubtype:
			q.Subtype, q.Has = intern(e.text(), prev.Subtype), q.Has|HasSubtype
		}
	}
	return e.err
}

// appendPDs decodes one RES_PD_GET dump message and appends its PDs to dst.
func appendPDs(dst []PD, b []byte) ([]PD, error) {
	return appendTable(dst, b, attrResPD, attrResPDEntry, decodePD)
}

func decodePD(p, prev *PD, e attrs, dev uint32, _ []byte) error {
	p.Device = dev
	for e.next() {
		switch e.typ {
		case attrResPDN:
			p.PDN = e.u32()
		case attrResCtxN:
			p.CtxN, p.Has = e.u32(), p.Has|HasCtxN
		case attrResPID:
			p.PID, p.Has = e.u32(), p.Has|HasPID
		case attrResKernName:
			p.KernName, p.Has = intern(e.text(), prev.KernName), p.Has|HasKernName
		}
	}
	return e.err
}

// appendCtxs decodes one RES_CTX_GET dump message and appends its contexts
// to dst.
func appendCtxs(dst []Ctx, b []byte) ([]Ctx, error) {
	return appendTable(dst, b, attrResCtx, attrResCtxEntry, decodeCtx)
}

func decodeCtx(c, _ *Ctx, e attrs, dev uint32, _ []byte) error {
	c.Device = dev
	for e.next() {
		switch e.typ {
		case attrResCtxN:
			c.CtxN, c.Has = e.u32(), c.Has|HasCtxN
		case attrResPID:
			c.PID, c.Has = e.u32(), c.Has|HasPID
		}
	}
	return e.err
}

func decodeChardev(b []byte) (Chardev, error) {
	var c Chardev
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case attrChardevName:
			c.Name = a.str()
		case attrChardev:
			c.Dev = a.u64()
		case attrChardevABI:
			c.ABI = a.u64()
		case attrUverbsDriverID:
			c.DriverID = a.u32()
		}
	}
	return c, a.err
}
