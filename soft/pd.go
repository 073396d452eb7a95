package soft

import (
	"fmt"
	"unsafe"

	"github.com/qpdrain/qpdrain/ibv"
	"github.com/qpdrain/qpdrain/ibv/objtrace"
)

// PD is a protection domain of a soft device.
type PD struct {
	dev *Device
	rec *objtrace.Record
	// Guarded by dev.fab.mu.
	closed bool
	nMR    int
	nQP    int
	nSRQ   int
}

var _ ibv.PD = (*PD)(nil)

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (ibv.PD, error) {
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("allocating a PD on %s: %w", d.name, ibv.ErrClosed)
	}
	if d.nPD >= d.limits.MaxPD {
		return nil, fmt.Errorf("allocating a PD on %s (max %d): %w", d.name, d.limits.MaxPD, ibv.ErrResourceLimit)
	}
	d.nPD++
	return &PD{dev: d, rec: objtrace.Track("soft PD on %s", d.name)}, nil
}

// Context returns the device of the PD.
func (p *PD) Context() ibv.Context { return p.dev }

// Close releases the PD. It fails with ErrBusy while MRs, QPs or SRQs of
// the PD are open.
func (p *PD) Close() error {
	return p.dev.fab.closeObject(&p.closed, p.rec, func() error {
		if p.nMR > 0 || p.nQP > 0 || p.nSRQ > 0 {
			return fmt.Errorf("closing a PD with %d MRs, %d QPs, %d SRQs open: %w", p.nMR, p.nQP, p.nSRQ, ibv.ErrBusy)
		}
		p.dev.nPD--
		return nil
	})
}

// MR is a registered memory region of a soft device. Its lkey and rkey are
// equal, as on many providers.
type MR struct {
	pd     *PD
	buf    []byte
	addr   uint64
	key    uint32
	access ibv.AccessFlags
	rec    *objtrace.Record
	closed bool // guarded by pd.dev.fab.mu
}

var _ ibv.MR = (*MR)(nil)

// validMRAccess are the access flags the soft device implements.
const validMRAccess = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic

// RegMR registers buf, which may be any memory (Go heap included) on the
// soft device. Remote write or atomic access requires local write, as in
// ibv_reg_mr(3).
func (p *PD) RegMR(buf []byte, access ibv.AccessFlags) (ibv.MR, error) {
	d := p.dev
	d.fab.mu.Lock()
	defer d.fab.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("registering an MR: %w", ibv.ErrClosed)
	}
	if len(buf) == 0 || access&^validMRAccess != 0 ||
		access&(ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("registering an MR of %d bytes with access %#x: %w", len(buf), uint32(access), ibv.ErrInvalidArgument)
	}
	if d.nMR >= d.limits.MaxMR {
		return nil, fmt.Errorf("registering an MR on %s (max %d): %w", d.name, d.limits.MaxMR, ibv.ErrResourceLimit)
	}
	mr := &MR{
		pd:     p,
		buf:    buf,
		addr:   uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		key:    uint32(len(d.mrs)+1)<<8 | 0x5a, // index and a variant byte, as on hardware
		access: access,
	}
	mr.rec = objtrace.Track("soft MR key %#x on %s", mr.key, d.name)
	d.mrs = append(d.mrs, mr)
	d.nMR++
	p.nMR++
	return mr, nil
}

// LKey is the local key.
func (m *MR) LKey() uint32 { return m.key }

// RKey is the remote key.
func (m *MR) RKey() uint32 { return m.key }

// Addr is the address of the region's first byte; SGEs and remote peers
// address the region from it.
func (m *MR) Addr() uint64 { return m.addr }

// Buf is the registered memory.
func (m *MR) Buf() []byte { return m.buf }

// Close deregisters the MR; its keys stop working at once.
func (m *MR) Close() error {
	d := m.pd.dev
	return d.fab.closeObject(&m.closed, m.rec, func() error {
		d.mrs[m.key>>8-1] = nil
		d.nMR--
		m.pd.nMR--
		return nil
	})
}

// slice returns the bytes [addr, addr+n) of the MR with key on device d
// if the MR belongs to pd and grants need, or false. The address is turned
// into an offset into the registered slice, never back into a pointer.
func (d *Device) slice(pd *PD, key uint32, addr uint64, n uint32, need ibv.AccessFlags) ([]byte, bool) {
	i := int(key>>8) - 1
	if i < 0 || i >= len(d.mrs) {
		return nil, false
	}
	mr := d.mrs[i]
	if mr == nil || mr.key != key || mr.pd != pd || mr.access&need != need {
		return nil, false
	}
	off := addr - mr.addr
	if addr < mr.addr || off > uint64(len(mr.buf)) || uint64(n) > uint64(len(mr.buf))-off {
		return nil, false
	}
	return mr.buf[off : off+uint64(n)], true
}

// registered returns the bytes [addr, addr+n) of any MR open on device d,
// whatever its PD, key and access, or false. Inline data is read through
// it: a real device reads it from any memory of the process without a key,
// but the soft device turns addresses into offsets only within buffers it
// was given.
func (d *Device) registered(addr uint64, n uint32) ([]byte, bool) {
	for _, mr := range d.mrs {
		if mr == nil || addr < mr.addr {
			continue
		}
		if off := addr - mr.addr; off <= uint64(len(mr.buf)) && uint64(n) <= uint64(len(mr.buf))-off {
			return mr.buf[off : off+uint64(n)], true
		}
	}
	return nil, false
}
