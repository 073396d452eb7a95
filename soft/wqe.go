package soft

import "github.com/qpdrain/qpdrain/ibv"

// The soft device copies each posted WR into a compact WQE: one SGE inline,
// anything rarer (more SGEs, atomic operands, the bytes of an
// IBV_SEND_INLINE send) behind a pointer, so a queued send costs 56 bytes
// and a queued receive 32 (see BenchmarkFlush).

// wqeSGL is a WQE's scatter/gather list. A WR without SGEs is held as one
// zero-length SGE, which moves nothing and names no key, exactly like none.
type wqeSGL struct {
	first ibv.SGE
	ext   *wqeExt // nil unless the WR has more than one SGE, is an atomic or is inline
}

// wqeExt holds the rare parts of a WQE.
type wqeExt struct {
	more       []ibv.SGE // SGEs after the first
	compareAdd uint64
	swap       uint64
	inline     []byte // the data of an inline send, copied at post time
}

func makeSGL(sges []ibv.SGE) wqeSGL {
	var s wqeSGL
	if len(sges) > 0 {
		s.first = sges[0]
	}
	if len(sges) > 1 {
		s.ext = &wqeExt{more: append([]ibv.SGE(nil), sges[1:]...)}
	}
	return s
}

// count is the number of SGEs held.
func (s *wqeSGL) count() int {
	if s.ext == nil {
		return 1
	}
	return 1 + len(s.ext.more)
}

func (s *wqeSGL) at(i int) ibv.SGE {
	if i == 0 {
		return s.first
	}
	return s.ext.more[i-1]
}

// recvWQE is a queued receive WR.
type recvWQE struct {
	id uint64
	wqeSGL
}

func newRecvWQE(wr *ibv.RecvWR) recvWQE { return recvWQE{id: wr.ID, wqeSGL: makeSGL(wr.SGL)} }

// sendWQE is a queued send WR.
type sendWQE struct {
	id         uint64
	remoteAddr uint64
	wqeSGL
	imm    uint32
	rkey   uint32
	opcode uint8 // ibv.WROpcode
	flags  uint8 // ibv.SendFlags
}

func newSendWQE(wr *ibv.SendWR) sendWQE {
	var w sendWQE
	w.fill(wr)
	return w
}

// fill copies wr into w.
func (w *sendWQE) fill(wr *ibv.SendWR) {
	w.id, w.remoteAddr = wr.ID, wr.RemoteAddr
	w.wqeSGL = makeSGL(wr.SGL)
	w.imm, w.rkey, w.opcode, w.flags = wr.ImmData, wr.RKey, uint8(wr.Opcode), uint8(wr.Flags)
	if isAtomic(wr.Opcode) {
		if w.ext == nil {
			w.ext = &wqeExt{}
		}
		w.ext.compareAdd, w.ext.swap = wr.CompareAdd, wr.Swap
	}
}

// newInlineWQE makes the WQE of an inline send carrying data, which it
// owns: it has no SGEs, so no lkey is ever checked for it.
func newInlineWQE(wr *ibv.SendWR, data []byte) sendWQE {
	return sendWQE{
		id:         wr.ID,
		remoteAddr: wr.RemoteAddr,
		wqeSGL:     wqeSGL{ext: &wqeExt{inline: data}},
		imm:        wr.ImmData,
		rkey:       wr.RKey,
		opcode:     uint8(wr.Opcode),
		flags:      uint8(wr.Flags),
	}
}

// inlineOpcode reports whether op may carry inline data: the opcodes whose
// data flows from the requester, as rxe's WR_INLINE_MASK (rxe_opcode.c) and
// ibv_post_send(3) have it.
func inlineOpcode(op ibv.WROpcode) bool {
	switch op {
	case ibv.WRSend, ibv.WRSendWithImm, ibv.WRSendWithInv, ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		return true
	}
	return false
}

func isAtomic(op ibv.WROpcode) bool {
	return op == ibv.WRAtomicCmpAndSwp || op == ibv.WRAtomicFetchAndAdd
}

// isRdAtomic reports whether op uses a responder's RDMA READ/atomic resources.
func isRdAtomic(op ibv.WROpcode) bool { return op == ibv.WRRDMARead || isAtomic(op) }

// wcOpcode is the completion opcode of a successful send WR.
func wcOpcode(op ibv.WROpcode) ibv.WCOpcode {
	switch op {
	case ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		return ibv.WCRDMAWrite
	case ibv.WRRDMARead:
		return ibv.WCRDMARead
	case ibv.WRAtomicCmpAndSwp:
		return ibv.WCCompSwap
	case ibv.WRAtomicFetchAndAdd:
		return ibv.WCFetchAdd
	}
	return ibv.WCSend
}

// resolve maps each non-empty SGE of s to bytes of an MR of pd on d that
// grants need, appending them to out, and returns them with their total
// length; false when an SGE names no such MR or falls outside it.
func (d *Device) resolve(pd *PD, s *wqeSGL, need ibv.AccessFlags, out [][]byte) ([][]byte, uint64, bool) {
	var total uint64
	for i := 0; i < s.count(); i++ {
		sge := s.at(i)
		if sge.Length == 0 {
			continue
		}
		b, ok := d.slice(pd, sge.LKey, sge.Addr, sge.Length, need)
		if !ok {
			return nil, 0, false
		}
		out = append(out, b)
		total += uint64(sge.Length)
	}
	return out, total, true
}

// scatter copies the bytes of src, in order, into dst, which has room.
func scatter(dst, src [][]byte) {
	var d []byte
	for _, s := range src {
		for len(s) > 0 {
			for len(d) == 0 {
				d, dst = dst[0], dst[1:]
			}
			k := copy(d, s)
			d, s = d[k:], s[k:]
		}
	}
}
