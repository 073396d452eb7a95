package soft

import (
	"fmt"

	"github.com/qpdrain/qpdrain/ibv"
)

// Connect brings two soft RC QPs in RESET to RTS, each addressing the other
// (by LID), with access granting remote read, write and atomics, MTU 4096,
// rnr_retry 7 (retry forever) and rd_atomic depths of rdAtomic in both
// directions. a and b may live on two devices of one fabric.
func Connect(a, b ibv.QP, rdAtomic uint8) error {
	qa, ok1 := a.(*QP)
	qb, ok2 := b.(*QP)
	if !ok1 || !ok2 || qa == nil || qb == nil {
		return fmt.Errorf("connecting QPs: not soft QPs: %w", ibv.ErrInvalidArgument)
	}
	for _, s := range [][2]*QP{{qa, qb}, {qb, qa}} {
		if err := s[0].ToRTS(s[1].dev.lid, s[1].num, rdAtomic); err != nil {
			return err
		}
	}
	return nil
}

// ToRTS moves a QP in RESET through INIT and RTR to RTS, connected to QP
// dqpn of the device with LID dlid, with the settings Connect describes.
func (q *QP) ToRTS(dlid uint16, dqpn uint32, rdAtomic uint8) error {
	steps := []struct {
		attr ibv.QPAttr
		mask ibv.QPAttrMask
	}{
		{ibv.QPAttr{State: ibv.QPSInit, PortNum: 1,
			AccessFlags: ibv.AccessRemoteRead | ibv.AccessRemoteWrite | ibv.AccessRemoteAtomic},
			ibv.QPAttrState | ibv.QPAttrPKeyIndex | ibv.QPAttrPort | ibv.QPAttrAccessFlags},
		{ibv.QPAttr{State: ibv.QPSRTR, AH: ibv.AHAttr{DLID: dlid, PortNum: 1}, PathMTU: ibv.MTU4096,
			DestQPNum: dqpn, MaxDestRdAtomic: rdAtomic, MinRNRTimer: 12},
			ibv.QPAttrState | ibv.QPAttrAV | ibv.QPAttrPathMTU | ibv.QPAttrDestQPN | ibv.QPAttrRQPSN |
				ibv.QPAttrMaxDestRdAtomic | ibv.QPAttrMinRNRTimer},
		{ibv.QPAttr{State: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: rnrRetryInfinite, MaxRdAtomic: rdAtomic},
			ibv.QPAttrState | ibv.QPAttrTimeout | ibv.QPAttrRetryCnt | ibv.QPAttrRNRRetry | ibv.QPAttrSQPSN |
				ibv.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := q.Modify(s.attr, s.mask); err != nil {
			return err
		}
	}
	return nil
}
