package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrBadRecord is wrapped by Parse's errors for a line the shim did not write.
var ErrBadRecord = errors.New("bad trace record")

// Record is one record of the shim, as text: "KIND t=NS pid=PID tid=TID
// KEY=VALUE..." (NS in hex or decimal); the shim writes them binary and Run
// decodes them into these lines, which --records keeps and Parse reads;
// pointers in hex (0x...), counts and enum values in decimal, as libibverbs
// numbers them. The kinds and their keys:
//
//	start   [exe]                  a program image's first record (a new process, or exec); exe its executable
//	fork    ppid                   a child's first record after fork: it shares ppid's objects
//	open    ctx dev traced         ibv_open_device returned ctx (traced=0: the shim's table was full)
//	close   ctx ret                ibv_close_device
//	cq      ctx cq cqe ex          a CQ was created (cqe: the size the provider gave it; ex=1: by ibv_create_cq_ex, its polls not traced)
//	cqd     cq begin | cq ret      ibv_destroy_cq called | returned
//	srq     ctx srq max_wr         an SRQ was created
//	srqd    srq begin | srq ret    ibv_destroy_srq called | returned
//	qp      ctx qp qpn type scq rcq srq max_send_wr max_recv_wr sig_all ex
//	                               a QP was created (ex=1: an ibv_qp_ex send path the shim could not take over)
//	mod     qp state ret           ibv_modify_qp with IBV_QP_STATE
//	qpd     qp begin | qp ret      ibv_destroy_qp called | returned
//	send    qp wr op sig           one WR of ibv_post_send (or of ibv_wr_complete's batch), written before the
//	                               provider's post: a completion polled while the post runs comes after it
//	recv    qp wr                  one WR of ibv_post_recv, the same
//	srecv   srq wr                 one WR of ibv_post_srq_recv, the same
//	unposted qp|srq wrs ret        the post this thread is in failed (ret): the last wrs WRs it recorded, bad_wr
//	                               and those after it, were not posted
//	wc      cq wr st op qpn        one completion ibv_poll_cq returned
//	pollerr cq ret                 ibv_poll_cq returned an error
//	ev      ctx type [qp qpn|cq|srq|port]   ibv_get_async_event returned an event
//	ack     type [qp qpn|cq|srq|port]       ibv_ack_async_event
//	qpxlost qp                     an ibv_wr_start/ibv_wr_complete batch had more WRs than the shim holds
//	fail    verb errno             a create failed
//	exit                           the process exits normally (after a device was opened)
//	map     base lo hi path        an object loaded in the process: its path, load bias and address range
//
// Records of older shims, written after the provider's post, carry ok= on
// send, recv and srecv: ok=0 marks the first WR not posted, which the
// analysis skips.
//
// The records of the verbs a finding can point to (qp, cq, srq, qpd, cqd,
// srqd, send, recv, srecv, ev) carry site=, the return address into the
// verb's caller, which the map records before it place in an object.
type Record struct {
	Kind string
	// Line is the record's line number in its stream, from 1.
	Line int
	// T is CLOCK_MONOTONIC in nanoseconds; PID and TID the writer's.
	T        int64
	PID, TID int
	// fields holds the other keys, as written: a few per record, so a
	// slice (a map would cost several times the record's size).
	fields []field
}

type field struct{ key, value string }

func (r Record) lookup(key string) (string, bool) {
	for _, f := range r.fields {
		if f.key == key {
			return f.value, true
		}
	}
	return "", false
}

// Has reports whether the record has key.
func (r Record) Has(key string) bool { _, ok := r.lookup(key); return ok }

// Str is key's value as written ("" when absent).
func (r Record) Str(key string) string { v, _ := r.lookup(key); return v }

// Uint is key's value as a number (decimal, or hex with 0x); 0 when absent.
func (r Record) Uint(key string) uint64 {
	v, _ := strconv.ParseUint(r.Str(key), 0, 64)
	return v
}

// Int is key's value as a signed number; 0 when absent.
func (r Record) Int(key string) int64 {
	v, _ := strconv.ParseInt(r.Str(key), 0, 64)
	return v
}

// required lists the keys each kind must carry for the analysis; kinds not
// listed are kept and ignored, so newer shims' records do not break older
// analyses.
var required = map[string][]string{
	"open": {"ctx", "dev"}, "close": {"ctx"},
	"cq": {"ctx", "cq", "cqe"}, "cqd": {"cq"},
	"srq": {"ctx", "srq"}, "srqd": {"srq"},
	"qp": {"ctx", "qp", "qpn", "type", "scq", "rcq", "srq"}, "mod": {"qp", "state", "ret"}, "qpd": {"qp"},
	"send": {"qp", "wr"}, "recv": {"qp", "wr"}, "srecv": {"srq", "wr"}, "unposted": {"wrs"},
	"wc": {"cq", "wr", "st", "qpn"}, "pollerr": {"cq"},
	"ev": {"type"}, "ack": {"type"},
	"map": {"base", "lo", "hi"},
}

// Parse reads the shim's records. A line that is not a record (no kind, a
// field without "=", a value that is not a number where one must be, a
// required key missing) is an error wrapping ErrBadRecord with its line
// number; so is a last line without its newline (a record cut short).
func Parse(r io.Reader) ([]Record, error) {
	var out []Record
	err := Scan(r, func(rec Record) { out = append(out, rec) })
	return out, err
}

// Scan reads the shim's records as Parse does, giving each to each as it is
// read, so that a long trace is never held in memory; its errors are
// Parse's.
func Scan(r io.Reader, each func(Record)) error {
	br := bufio.NewReader(r)
	for line := 1; ; line++ {
		s, err := br.ReadString('\n')
		if err == io.EOF {
			if s != "" {
				return fmt.Errorf("%w: line %d: cut short (no newline): %q", ErrBadRecord, line, s)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading trace records: %w", err)
		}
		rec, err := parseLine(strings.TrimSuffix(s, "\n"))
		if err != nil {
			return fmt.Errorf("%w: line %d: %v", ErrBadRecord, line, err)
		}
		rec.Line = line
		each(rec)
	}
}

func parseLine(s string) (Record, error) {
	f := strings.Fields(s)
	if len(f) < 4 {
		return Record{}, fmt.Errorf("%q: want KIND t= pid= tid= and its fields", s)
	}
	rec := Record{Kind: f[0], fields: make([]field, 0, len(f)-4)}
	var head [3]uint64
	for i, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return Record{}, fmt.Errorf("%q: field %q is not KEY=VALUE", s, kv)
		}
		if i < 3 {
			// t, pid and tid come first, in that order
			// t in hex (0x...) since the shim stopped dividing, decimal before
			n, err := strconv.ParseUint(v, 0, 64)
			if want := [3]string{"t", "pid", "tid"}[i]; k != want || err != nil {
				return Record{}, fmt.Errorf("%q: want %s=NUMBER as field %d, not %q", s, want, i+1, kv)
			}
			head[i] = n
			continue
		}
		rec.fields = append(rec.fields, field{k, v})
	}
	rec.T, rec.PID, rec.TID = int64(head[0]), int(head[1]), int(head[2])
	for _, k := range required[rec.Kind] {
		v, ok := rec.lookup(k)
		if !ok {
			return Record{}, fmt.Errorf("%q: %s record without %s=", s, rec.Kind, k)
		}
		if k != "dev" {
			if _, err := strconv.ParseInt(v, 0, 64); err != nil {
				if _, err := strconv.ParseUint(v, 0, 64); err != nil {
					return Record{}, fmt.Errorf("%q: %s=%q is not a number", s, k, v)
				}
			}
		}
	}
	return rec, nil
}
