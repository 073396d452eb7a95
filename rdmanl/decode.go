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
	a := attrs{b: b}
	for a.next() {
		switch a.typ {
		case attrDevIndex:
			s.Device = a.u32()
		case attrDevName:
			s.DeviceName = a.str()
		case attrResSummary:
			s.Counts = s.Counts[:0]
			tab := attrs{b: a.val}
			for tab.next() {
				if tab.typ != attrResSummaryEntry {
					continue
				}
				var c ResourceCount
				e := attrs{b: tab.val}
				for e.next() {
					switch e.typ {
					case attrResSummaryName:
						c.Name = e.str()
					case attrResSummaryCurr:
						c.Current = e.u64()
					}
				}
				if e.err != nil {
					return s, e.err
				}
				s.Counts = append(s.Counts, c)
			}
			if tab.err != nil {
				return s, tab.err
			}
		}
	}
	return s, a.err
}

// decodeTable walks one dump message of a resource table: the device
// attributes at the top, then the table (tableAttr) of entries (entryAttr).
// entry is called once per entry with the entry's attributes and the device
// index and name (the raw bytes, for the caller to intern) seen so far; it
// returns the entry's decoding error.
func decodeTable(b []byte, tableAttr, entryAttr uint16, entry func(e attrs, dev uint32, name []byte) error) error {
	a := attrs{b: b}
	var dev uint32
	var name []byte
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
					return err
				}
			}
			if tab.err != nil {
				return tab.err
			}
		}
	}
	return a.err
}

// appendQPs decodes one RES_QP_GET dump message and appends its QPs to dst;
// on an error dst comes back as it was. Strings repeated from row to row
// share the previous row's.
func appendQPs(dst []QP, b []byte) ([]QP, error) {
	n := len(dst)
	var prev QP
	if n > 0 {
		prev = dst[n-1]
	}
	err := decodeTable(b, attrResQP, attrResQPEntry, func(e attrs, dev uint32, name []byte) error {
		q := QP{Device: dev, DeviceName: intern(name, prev.DeviceName)}
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
		if e.err != nil {
			return e.err
		}
		dst = append(dst, q)
		prev = q
		return nil
	})
	if err != nil {
		return dst[:n], err
	}
	return dst, nil
}

// appendPDs decodes one RES_PD_GET dump message; on an error dst comes back
// as it was.
func appendPDs(dst []PD, b []byte) ([]PD, error) {
	n := len(dst)
	var prevKern string
	err := decodeTable(b, attrResPD, attrResPDEntry, func(e attrs, dev uint32, _ []byte) error {
		p := PD{Device: dev}
		for e.next() {
			switch e.typ {
			case attrResPDN:
				p.PDN = e.u32()
			case attrResCtxN:
				p.CtxN, p.Has = e.u32(), p.Has|HasCtxN
			case attrResPID:
				p.PID, p.Has = e.u32(), p.Has|HasPID
			case attrResKernName:
				p.KernName, p.Has = intern(e.text(), prevKern), p.Has|HasKernName
				prevKern = p.KernName
			}
		}
		if e.err != nil {
			return e.err
		}
		dst = append(dst, p)
		return nil
	})
	if err != nil {
		return dst[:n], err
	}
	return dst, nil
}

// appendCtxs decodes one RES_CTX_GET dump message; on an error dst comes
// back as it was.
func appendCtxs(dst []Ctx, b []byte) ([]Ctx, error) {
	n := len(dst)
	err := decodeTable(b, attrResCtx, attrResCtxEntry, func(e attrs, dev uint32, _ []byte) error {
		c := Ctx{Device: dev}
		for e.next() {
			switch e.typ {
			case attrResCtxN:
				c.CtxN, c.Has = e.u32(), c.Has|HasCtxN
			case attrResPID:
				c.PID, c.Has = e.u32(), c.Has|HasPID
			}
		}
		if e.err != nil {
			return e.err
		}
		dst = append(dst, c)
		return nil
	})
	if err != nil {
		return dst[:n], err
	}
	return dst, nil
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
