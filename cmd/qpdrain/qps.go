package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/rdmanl"
	"github.com/qpdrain/qpdrain/rdmanl/inventory"
)

func init() { subcommands = append(subcommands, newQPsCmd) }

// hostOptions are the /proc and sysfs roots the host-view commands read
// (hidden flags: tests point them at recorded trees).
type hostOptions struct {
	proc, sys, dev string
	timeout        time.Duration
}

func (h *hostOptions) flags(cmd *cobra.Command, timeout time.Duration) {
	f := cmd.Flags()
	f.StringVar(&h.proc, "proc", "/proc", "the /proc tree to read")
	f.StringVar(&h.sys, "sysfs", "/sys", "the sysfs tree to read")
	f.StringVar(&h.dev, "devdir", "/dev", "where char devices live")
	for _, n := range []string{"proc", "sysfs", "devdir"} {
		_ = f.MarkHidden(n)
	}
	durationFlag(f, &h.timeout, "timeout", timeout, "give up when the kernel has not answered by then", positive)
}

// oneShotGC lets the heap of a one-shot command (a dump read once or a few
// times, then printed) grow to 5x its live size between collections
// instead of 2x: at 10,000 QPs the collector's background marking was a
// sixth of qps -j's CPU time (profiled on rxe, 6.12), for a few MB more
// peak memory. The returned function restores the setting.
func oneShotGC() (restore func()) {
	old := debug.SetGCPercent(400)
	return func() { debug.SetGCPercent(old) }
}

// dial opens RDMA netlink for one command, bounded by h.timeout from now;
// done closes the connection and ends the context. A host without RDMA
// netlink is rdmanl.Dial's ibv.ErrNoDevice (exit 3, errNotHere).
func (h hostOptions) dial(parent context.Context) (ctx context.Context, conn *rdmanl.Conn, done func(), err error) {
	ctx, cancel := context.WithTimeout(parent, h.timeout)
	if conn, err = rdmanl.Dial(); err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, conn, func() { conn.Close(); cancel() }, nil
}

func newQPsCmd(opts *globalOptions) *cobra.Command {
	var host hostOptions
	var summary bool
	cmd := &cobra.Command{
		Use:   "qps [link DEV[/PORT]] [lqpn N] [state S] [type T] [pid P] [cgroup PATH] [pod UID] ...",
		Short: "List every QP on the host, with its owner and the processes that hold it, as `rdma resource show qp`",
		Long: `List the QPs of every RDMA device on the host through RDMA netlink, as
"rdma resource show qp" does, with its filters (link DEV[/PORT], lqpn, rqpn,
pdn, pid, sq-psn, rq-psn, type, state, path-mig-state; values are lists such
as "RTS,ERR" or "1-9,12") and its words. Beyond rdma, each QP gets its owner:
the process of the thread the kernel names, else the process the QP's PD or
device context names (the creating thread may have exited), and the
processes that hold its context, its open uverbs file, by an fd or mappings
(the creator, a forked child, a process the fd was passed to): kcmp(2)
groups the fds into open files, and a context is tied to its file through
its live creator or by elimination; where that proves nothing the holders
are the candidates ("holders_certain": false, "one-of" in text). A zombie
creator is gone ("creator_gone"); on a kernel without the context table
(RES_CTX_GET, before 5.11) an owner only that table could name is unknown
("owner_uncertain": true, "owner unknown" in text, and a warning says why).
Each process gets its workload from its
cgroup (the systemd unit, the container, the Kubernetes pod UID and QoS
class; the filters cgroup PATH and pod UID select by it). With -j, objects
carry rdma's keys plus "owner" (its "cgroup" the workload), "creator_gone",
"holders" and "holders_certain"; -d adds owners, their workloads and holders
to text. Filter words are rdma's (state RTS, type RC, path-mig-state
MIGRATED; any case); an unknown word or a port the device lacks is an error.
--summary counts QPs per device by type and state, next to the device's
max_qp. Exits 3 when the host has no RDMA devices, 2 on errors.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			defer oneShotGC()()
			f, err := inventory.ParseFilter(args)
			if err != nil {
				return withExitCode(exitError, err)
			}
			ctx, conn, done, err := host.dial(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			iopts := inventory.Options{
				Proc:   inventory.Proc{Root: host.proc},
				Sys:    inventory.Sys{Root: host.sys},
				DevDir: host.dev,
				Progress: func(dev string, n int) {
					opts.log.WithField("device", dev).WithField("qps", n).Info("read the QP table")
				},
			}
			if f.Device() != "" {
				iopts.Devices = []string{f.Device()}
			}
			snap, err := inventory.Take(ctx, conn, iopts)
			switch {
			case errors.Is(err, inventory.ErrNoDevices):
				return withExitCode(exitUnsupported, err)
			case err != nil:
				return withExitCode(exitError, err)
			}
			if err := f.CheckPort(snap.Devices); err != nil {
				return withExitCode(exitError, err)
			}
			for _, n := range snap.Notes {
				opts.log.Warn(n)
			}
			w := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
			if summary {
				err = printQPSummary(w, snap, &f, opts.json, maxQPs)
			} else {
				err = printQPs(w, snap, &f, opts.json, opts.details)
			}
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			if err != nil {
				return withExitCode(exitError, err)
			}
			return nil
		},
	}
	host.flags(cmd, 2*time.Minute)
	cmd.Flags().BoolVar(&summary, "summary", false, "count QPs per device by type and state, next to max_qp")
	return cmd
}

// printQPs writes the QPs that pass f, grouped by device and port as rdma
// lists them (QPs without a port first), in table order within a port: text
// lines as rdma's, or one JSON array streamed element by element.
func printQPs(w io.Writer, snap *inventory.Snapshot, f *inventory.Filter, asJSON, details bool) error {
	qps := make([]*inventory.QP, 0, len(snap.QPs))
	for i := range snap.QPs {
		if f.Match(&snap.QPs[i]) {
			qps = append(qps, &snap.QPs[i])
		}
	}
	sort.SliceStable(qps, func(i, j int) bool {
		if qps[i].Device != qps[j].Device {
			return qps[i].Device < qps[j].Device
		}
		return qps[i].Port < qps[j].Port
	})
	var b []byte
	if asJSON {
		if _, err := io.WriteString(w, "["); err != nil {
			return err
		}
		var enc qpJSONEncoder
		for i, q := range qps {
			b = b[:0]
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = enc.append(b, q); err != nil {
				return err
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		_, err := io.WriteString(w, "]\n")
		return err
	}
	for _, q := range qps {
		b = appendQPLine(b[:0], q, details)
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// qpJSONEncoder writes one QP of -j output: iproute2's keys in iproute2's
// order (rdma/res-qp.c res_qp_line, rdma/res.c print_link: ifindex,
// ifname, port, lqpn, rqpn, type, subtype, state, rq-psn, sq-psn,
// path-mig-state, pdn, pid, comm), each present exactly when rdma prints
// it, then qpdrain's own: owner (null for none), creator_gone,
// owner_uncertain (only when true), holders ([] for none) and
// holders_certain. It appends the bytes itself:
// encoding/json's reflection was most of qps -j's own CPU time at 10,000
// QPs. Owners and holder lists are shared by the QPs of one process or
// context, so each is marshalled once.
type qpJSONEncoder struct {
	owners  map[*inventory.Owner][]byte
	holders map[*inventory.Holder][]byte
}

func (e *qpJSONEncoder) append(b []byte, q *inventory.QP) ([]byte, error) {
	// Functions rather than closures over b: a captured b escapes, one
	// allocation per QP.
	num := func(b []byte, name string, v uint32) []byte {
		b = append(b, `,"`...)
		b = append(b, name...)
		b = append(b, `":`...)
		return strconv.AppendUint(b, uint64(v), 10)
	}
	str := func(b []byte, name, v string) []byte {
		b = append(b, `,"`...)
		b = append(b, name...)
		b = append(b, `":`...)
		return appendJSONString(b, v)
	}
	b = append(b, `{"ifindex":`...)
	b = strconv.AppendUint(b, uint64(q.Device), 10)
	b = str(b, "ifname", q.DeviceName)
	if q.Has&rdmanl.HasPort != 0 {
		b = num(b, "port", q.Port)
	}
	b = num(b, "lqpn", q.LQPN)
	if q.Has&rdmanl.HasRQPN != 0 {
		b = num(b, "rqpn", q.RQPN)
	}
	b = str(b, "type", q.Type.String())
	if q.Subtype != "" {
		b = str(b, "subtype", q.Subtype)
	}
	b = str(b, "state", q.State.String())
	if q.Has&rdmanl.HasRQPSN != 0 {
		b = num(b, "rq-psn", q.RQPSN)
	}
	if q.Has&rdmanl.HasSQPSN != 0 {
		b = num(b, "sq-psn", q.SQPSN)
	}
	if q.Has&rdmanl.HasPathMigState != 0 {
		b = str(b, "path-mig-state", q.PathMigState.String())
	}
	if q.Has&rdmanl.HasPDN != 0 {
		b = num(b, "pdn", q.PDN)
	}
	if q.Has&rdmanl.HasPID != 0 {
		b = num(b, "pid", q.PID)
	}
	if q.Comm != "" {
		b = str(b, "comm", q.Comm)
	}
	b = append(b, `,"owner":`...)
	if q.Owner == nil {
		b = append(b, "null"...)
	} else {
		j, err := memoJSON(&e.owners, q.Owner, q.Owner)
		if err != nil {
			return nil, err
		}
		b = append(b, j...)
	}
	b = append(b, `,"creator_gone":`...)
	b = strconv.AppendBool(b, q.CreatorGone)
	if q.OwnerUncertain {
		b = append(b, `,"owner_uncertain":true`...)
	}
	b = append(b, `,"holders":`...)
	if len(q.Holders) == 0 {
		b = append(b, "[]"...)
	} else {
		j, err := memoJSON(&e.holders, &q.Holders[0], &q.Holders) // a pointer: boxing the slice allocates
		if err != nil {
			return nil, err
		}
		b = append(b, j...)
	}
	b = append(b, `,"holders_certain":`...)
	b = strconv.AppendBool(b, q.HoldersCertain)
	return append(b, "}\n"...), nil
}

// memoJSON is v marshalled, once per key.
func memoJSON[K comparable](m *map[K][]byte, key K, v any) ([]byte, error) {
	if j, ok := (*m)[key]; ok {
		return j, nil
	}
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if *m == nil {
		*m = map[K][]byte{}
	}
	(*m)[key] = j
	return j, nil
}

// appendJSONString appends s as a JSON string, as encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, _ := json.Marshal(s) // never fails for a string
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendQPLine formats one QP as rdma's text output does (without its
// trailing space), plus owner and holders with details.
func appendQPLine(b []byte, q *inventory.QP, details bool) []byte {
	num := func(name string, v uint32) {
		b = append(b, ' ')
		b = append(b, name...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(v), 10)
	}
	word := func(name, v string) {
		b = append(b, ' ')
		b = append(b, name...)
		b = append(b, ' ')
		b = append(b, v...)
	}
	b = append(b, "link "...)
	b = append(b, q.DeviceName...)
	if q.Has&rdmanl.HasPort != 0 {
		b = append(b, '/')
		b = strconv.AppendUint(b, uint64(q.Port), 10)
	} else {
		b = append(b, "/-"...)
	}
	num("lqpn", q.LQPN)
	if q.Has&rdmanl.HasRQPN != 0 {
		num("rqpn", q.RQPN)
	}
	word("type", q.Type.String())
	if q.Subtype != "" {
		word("subtype", q.Subtype)
	}
	word("state", q.State.String())
	if q.Has&rdmanl.HasRQPSN != 0 {
		num("rq-psn", q.RQPSN)
	}
	if q.Has&rdmanl.HasSQPSN != 0 {
		num("sq-psn", q.SQPSN)
	}
	if q.Has&rdmanl.HasPathMigState != 0 {
		word("path-mig-state", q.PathMigState.String())
	}
	if q.Has&rdmanl.HasPDN != 0 {
		num("pdn", q.PDN)
	}
	if q.Has&rdmanl.HasPID != 0 {
		num("pid", q.PID)
	}
	switch comm := rdmaComm(q); {
	case q.Has&rdmanl.HasPID == 0 && comm != "":
		word("comm", "["+comm+"]")
	case comm != "":
		word("comm", comm)
	}
	if details {
		b = appendOwner(b, q)
	}
	return append(b, '\n')
}

// rdmaComm is the comm rdma prints: it reads /proc/<pid>/comm with
// fscanf("%ms"), which stops at the first blank.
func rdmaComm(q *inventory.QP) string {
	if q.Has&rdmanl.HasPID == 0 {
		return q.Comm
	}
	if i := strings.IndexAny(q.Comm, " \t"); i >= 0 {
		return q.Comm[:i]
	}
	return q.Comm
}

func appendOwner(b []byte, q *inventory.QP) []byte {
	switch {
	case q.Owner != nil && q.Owner.Via != inventory.FromKernel:
		b = fmt.Appendf(b, " owner %d/%s via %s", q.Owner.PID, q.Owner.Comm, q.Owner.Via)
		if q.Owner.Zombie {
			b = append(b, " (zombie)"...)
		}
		b = appendWorkload(b, q.Owner.Workload)
	case q.CreatorGone:
		b = append(b, " owner - (creator gone)"...)
	case q.OwnerUncertain:
		b = append(b, " owner unknown"...)
	}
	if q.Owner != nil && q.Owner.Via == inventory.FromKernel {
		return b
	}
	if len(q.Holders) == 0 {
		return append(b, " holders -"...)
	}
	b = append(b, " holders "...)
	if !q.HoldersCertain {
		// Not proven: any of these may hold the QP's context.
		b = append(b, "one-of "...)
	}
	for i, h := range q.Holders {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d/%s", h.PID, h.Comm)
	}
	return b
}

// maxQPs asks the verbs API for a device's max_qp, as leaks.MaxQPLimits
// does for the exporter; false when it cannot (no libibverbs, a
// CGO_ENABLED=0 build, a device it cannot open).
func maxQPs(dev string) (int, bool) {
	l := leaks.MaxQPLimits([]string{dev})[dev]
	return l.MaxQP, l.Unknown == ""
}

// qpSummaryJSON is one device of --summary -j.
type qpSummaryJSON struct {
	IfIndex uint32         `json:"ifindex"`
	IfName  string         `json:"ifname"`
	MaxQP   *int           `json:"max_qp,omitempty"`
	QPs     int            `json:"qp"`
	Types   map[string]int `json:"types"`
	States  map[string]int `json:"states"`
}

func printQPSummary(w io.Writer, snap *inventory.Snapshot, f *inventory.Filter, asJSON bool, maxQP func(string) (int, bool)) error {
	rows := make([]qpSummaryJSON, 0, len(snap.Devices))
	at := map[uint32]int{}
	for _, d := range snap.Devices {
		at[d.Index] = len(rows)
		r := qpSummaryJSON{IfIndex: d.Index, IfName: d.Name, Types: map[string]int{}, States: map[string]int{}}
		if n, ok := maxQP(d.Name); ok {
			r.MaxQP = &n
		}
		rows = append(rows, r)
	}
	for i := range snap.QPs {
		q := &snap.QPs[i]
		if !f.Match(q) {
			continue
		}
		r := &rows[at[q.Device]]
		r.QPs++
		r.Types[q.Type.String()]++
		r.States[q.State.String()]++
	}
	if asJSON {
		return json.NewEncoder(w).Encode(rows)
	}
	for _, r := range rows {
		var b strings.Builder
		fmt.Fprintf(&b, "%d: %s:", r.IfIndex, r.IfName)
		if r.MaxQP != nil {
			fmt.Fprintf(&b, " max_qp %d", *r.MaxQP)
		}
		fmt.Fprintf(&b, " qp %d", r.QPs)
		for i := 0; i < 11; i++ {
			if n := r.Types[rdmanl.QPType(i).String()]; n > 0 && rdmanl.QPType(i).String() != "UNKNOWN" {
				fmt.Fprintf(&b, " %s %d", rdmanl.QPType(i), n)
			}
		}
		for s := rdmanl.QPStateReset; s <= rdmanl.QPStateErr; s++ {
			if n := r.States[s.String()]; n > 0 {
				fmt.Fprintf(&b, " %s %d", s, n)
			}
		}
		b.WriteByte('\n')
		if _, err := io.WriteString(w, b.String()); err != nil {
			return err
		}
	}
	return nil
}
