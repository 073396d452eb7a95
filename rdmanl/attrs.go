package rdmanl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by every error about a reply whose attributes do
// not parse: a length past the end, an attribute shorter than its header,
// or a value of the wrong size.
var ErrMalformed = errors.New("malformed attributes")

// attrs walks netlink attributes (struct nlattr, include/uapi/linux/netlink.h)
// in place. Unlike netlink.AttributeDecoder it copies nothing: a QP dump is
// about a dozen attributes per QP, and a copy of each was most of the
// decoder's time at 10,000 QPs. Values alias the reply buffer, so only the
// strings the caller keeps are copied.
type attrs struct {
	b   []byte
	typ uint16
	val []byte
	err error
}

// nlaTypeMask drops NLA_F_NESTED and NLA_F_NET_BYTEORDER from nla_type.
const nlaTypeMask = 0x3fff

// next moves to the next attribute; false at the end or on an error (err).
func (a *attrs) next() bool {
	if a.err != nil || len(a.b) == 0 {
		return false
	}
	if len(a.b) < 4 {
		a.err = fmt.Errorf("%w: %d bytes left, less than an attribute header", ErrMalformed, len(a.b))
		return false
	}
	l := int(binary.NativeEndian.Uint16(a.b))
	if l < 4 || l > len(a.b) {
		a.err = fmt.Errorf("%w: attribute length %d with %d bytes left", ErrMalformed, l, len(a.b))
		return false
	}
	a.typ = binary.NativeEndian.Uint16(a.b[2:]) & nlaTypeMask
	a.val = a.b[4:l]
	// The last attribute's padding (NLA_ALIGNTO) may be cut off.
	a.b = a.b[min((l+3)&^3, len(a.b)):]
	return true
}

// sized is the value when it has n bytes; otherwise it records the error.
func (a *attrs) sized(n int) []byte {
	if len(a.val) != n {
		a.err = fmt.Errorf("%w: attribute %d is %d bytes, want %d", ErrMalformed, a.typ, len(a.val), n)
		return make([]byte, n)
	}
	return a.val
}

func (a *attrs) u8() uint8   { return a.sized(1)[0] }
func (a *attrs) u32() uint32 { return binary.NativeEndian.Uint32(a.sized(4)) }
func (a *attrs) u64() uint64 { return binary.NativeEndian.Uint64(a.sized(8)) }

// text is a string attribute's bytes without its NUL terminator(s).
func (a *attrs) text() []byte { return bytes.TrimRight(a.val, "\x00") }

// str is a string attribute as a new string.
func (a *attrs) str() string { return string(a.text()) }

// intern is b as a string, prev itself when they are equal: a dump repeats
// the device name and kernel owner on every row, and sharing one string
// saves an allocation per row.
func intern(b []byte, prev string) string {
	if string(b) == prev {
		return prev
	}
	return string(b)
}
