package inventory

import (
	"errors"
	"slices"
)

// ErrNoKcmp means kcmp(2) cannot compare two processes' files: the kernel
// lacks it (CONFIG_KCMP) or the caller may not ptrace-read the processes.
var ErrNoKcmp = errors.New("kcmp cannot compare the open files")

// ErrFDGone means an fd compared was closed, or its process ended, during
// the scan.
var ErrFDGone = errors.New("fd or process gone")

// SameFileFunc reports whether fd1 of process pid1 and fd2 of pid2 are one
// open file description (dup, fork and SCM_RIGHTS share one; each open(2)
// makes a new one). It fails with ErrFDGone when an fd or process went
// away, and with ErrNoKcmp (or any other error) when it cannot tell.
type SameFileFunc func(pid1 uint32, fd1 int, pid2 uint32, fd2 int) (bool, error)

// File is one open file description of a uverbs char device, with the
// processes whose fds share it. A device context is one such file
// (ib_uverbs_get_context refuses a second context on a file).
type File struct {
	Holders []Holder
}

// groupFiles sorts the fds of holders into open file descriptions with
// same. It reports false when same cannot tell (no kcmp): then nothing is
// known of which fds share a file. Fds closed during the scan are left
// out. Holders with mappings only are not files of their own here.
func groupFiles(holders []Holder, same SameFileFunc) ([]File, bool) {
	if same == nil {
		return nil, false
	}
	type ref struct {
		pid uint32
		fd  int
	}
	var reps []ref // one fd of each file
	var files []File
	for _, h := range holders {
	fds:
		for _, fd := range h.FDs {
			at := -1
			for i, r := range reps {
				eq, err := same(r.pid, r.fd, h.PID, fd)
				if errors.Is(err, ErrFDGone) {
					continue fds
				}
				if err != nil {
					return nil, false
				}
				if eq {
					at = i
					break
				}
			}
			if at < 0 {
				at = len(files)
				reps = append(reps, ref{h.PID, fd})
				files = append(files, File{})
			}
			f := &files[at]
			if n := len(f.Holders); n > 0 && f.Holders[n-1].PID == h.PID {
				f.Holders[n-1].FDs = append(f.Holders[n-1].FDs, fd)
			} else {
				f.Holders = append(f.Holders, Holder{PID: h.PID, Comm: h.Comm, FDs: []int{fd}})
			}
		}
	}
	return files, true
}

// creator is a device context's creating process as the context table
// names it.
type creator struct {
	ctxn uint32
	// pid is the creator's process; live is false when the table names
	// none, or a zombie (it has closed its files).
	pid  uint32
	live bool
}

// heldBy is what keeps one context alive: its holders, and whether they
// are proven (else they are the candidates).
type heldBy struct {
	holders []Holder
	certain bool
}

// tieContexts finds the holders of each context of a device from its
// files, its mappings-only holders and its contexts' creators. A file (or
// a mappings-only process) is tied to a context when the context's live
// creator holds exactly that one, no other context is tied to it the same
// way, or, for the one context left, when exactly one file is left
// (elimination). What cannot be tied so gets the candidates: the creator's
// files, or every file left. It takes a process's mappings to be of one
// file, and every file it sees to have a context (libibverbs opens the
// file to create its context).
func tieContexts(files []File, mapped []Holder, ctxs []creator) map[uint32]heldBy {
	nodes := make([][]Holder, 0, len(files)+len(mapped))
	for _, f := range files {
		nodes = append(nodes, f.Holders)
	}
	for _, m := range mapped {
		nodes = append(nodes, []Holder{m})
	}
	claims := map[int][]uint32{}
	cands := map[uint32][]int{}
	var untied []uint32
	for _, c := range ctxs {
		var of []int
		if c.live {
			for i, n := range nodes {
				if slices.ContainsFunc(n, func(h Holder) bool { return h.PID == c.pid }) {
					of = append(of, i)
				}
			}
		}
		switch len(of) {
		case 0:
			untied = append(untied, c.ctxn)
		case 1:
			claims[of[0]] = append(claims[of[0]], c.ctxn)
		default:
			cands[c.ctxn] = of
		}
	}
	tied := map[uint32]int{}
	taken := make([]bool, len(nodes))
	for n, cs := range claims {
		if len(cs) == 1 {
			tied[cs[0]], taken[n] = n, true
			continue
		}
		// One file has one context: some claim is wrong, none is proof.
		untied = append(untied, cs...)
	}
	var free []int
	for i := range nodes {
		if !taken[i] {
			free = append(free, i)
		}
	}
	switch {
	case len(untied) == 1 && len(free) == 1:
		tied[untied[0]] = free[0]
	default:
		if len(free) == 0 {
			// Every file seen has its context: this one's holder is out of
			// sight (another PID namespace) or a premise failed.
			for i := range nodes {
				free = append(free, i)
			}
		}
		for _, c := range untied {
			cands[c] = free
		}
	}
	out := make(map[uint32]heldBy, len(ctxs))
	for c, n := range tied {
		out[c] = heldBy{holders: mergeHolders(nodes[n]), certain: true}
	}
	for c, ns := range cands {
		var hs []Holder
		for _, n := range ns {
			hs = append(hs, nodes[n]...)
		}
		out[c] = heldBy{holders: mergeHolders(hs)}
	}
	return out
}

// mergeHolders orders holders by pid, one entry per process with all its
// fds.
func mergeHolders(hs []Holder) []Holder {
	out := make([]Holder, 0, len(hs))
	for _, h := range hs {
		i := slices.IndexFunc(out, func(o Holder) bool { return o.PID == h.PID })
		if i < 0 {
			out = append(out, Holder{PID: h.PID, Comm: h.Comm, Mapped: h.Mapped, FDs: slices.Clone(h.FDs)})
			continue
		}
		out[i].FDs = append(out[i].FDs, h.FDs...)
		out[i].Mapped = out[i].Mapped && h.Mapped
	}
	for i := range out {
		slices.Sort(out[i].FDs)
	}
	slices.SortFunc(out, func(a, b Holder) int { return int(a.PID) - int(b.PID) })
	return out
}
