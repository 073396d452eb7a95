package trace

import (
	"debug/elf"
	"fmt"
	"path"
	"sort"
)

// Site is where a program called a verb: the return address into the
// caller (the shim records one, not a stack), the object it lies in and,
// after Report.Symbolize, the function.
type Site struct {
	// Verb is the verb called there ("ibv_destroy_qp"; "ibv_create_qp"
	// and "ibv_create_cq" for their _ex forms too).
	Verb string `json:"verb"`
	// Addr is the return address in the process.
	Addr uint64 `json:"addr"`
	// Module is the path of the object holding Addr (the program, or a
	// library), as the process loaded it; empty when the shim recorded
	// no object there.
	Module string `json:"module,omitempty"`
	// Offset is Addr in Module's own ELF addresses (Addr less the load
	// bias), as its symbols and addr2line count.
	Offset uint64 `json:"offset,omitempty"`
	// Func is the function holding Offset, from Module's ELF symbols, and
	// FuncOffset Offset's distance from its start; empty when none.
	Func       string `json:"func,omitempty"`
	FuncOffset uint64 `json:"func_offset,omitempty"`
}

// String prints s as "prog!func+0x1c (/path/prog)", "prog+0x1234
// (/path/prog)" without a function, or the bare address without an object.
func (s *Site) String() string {
	switch {
	case s.Module == "":
		return fmt.Sprintf("0x%x", s.Addr)
	case s.Func == "":
		return fmt.Sprintf("%s+0x%x (%s)", path.Base(s.Module), s.Offset, s.Module)
	}
	return fmt.Sprintf("%s!%s+0x%x (%s)", path.Base(s.Module), s.Func, s.FuncOffset, s.Module)
}

// module is an object loaded in a process, from the shim's map record.
type module struct {
	path         string
	base, lo, hi uint64
}

type siteKey struct {
	addr uint64
	verb string
}

// site resolves the site record r carries, for verb, against the objects p
// had loaded by then (the latest covering the address: one unloaded and
// replaced by another is the other's); nil when r has none.
func (p *proc) site(r Record, verb string) *Site {
	k := siteKey{r.Uint("site"), verb}
	if k.addr == 0 {
		return nil
	}
	if s := p.sites[k]; s != nil {
		return s
	}
	s := &Site{Verb: verb, Addr: k.addr}
	for i := len(p.mods) - 1; i >= 0; i-- {
		if m := p.mods[i]; m.lo <= k.addr && k.addr < m.hi {
			s.Module, s.Offset = m.path, k.addr-m.base
			break
		}
	}
	if p.sites == nil {
		p.sites = map[siteKey]*Site{}
	}
	p.sites[k] = s
	return s
}

// Symbolizer names the function of an object at an offset in its ELF
// addresses (Site.Offset), and returns the offset from the function's
// start; ok is false when it cannot.
type Symbolizer func(module string, off uint64) (fn string, fnOff uint64, ok bool)

// ELFSymbols returns a Symbolizer that reads each object's ELF symbols
// once (.symtab, else .dynsym) and names an offset by the nearest function
// symbol at or before it (none when that symbol's size ends before it).
// Its result is not safe for concurrent use.
func ELFSymbols() Symbolizer {
	tabs := map[string][]elf.Symbol{}
	return func(module string, off uint64) (string, uint64, bool) {
		syms, ok := tabs[module]
		if !ok {
			syms = funcSymbols(module)
			tabs[module] = syms
		}
		if off == 0 {
			return "", 0, false
		}
		// a return address follows its call: the call's byte is the one before
		i := sort.Search(len(syms), func(i int) bool { return syms[i].Value > off-1 }) - 1
		if i < 0 {
			return "", 0, false
		}
		if s := syms[i]; s.Size == 0 || off-1 < s.Value+s.Size {
			return s.Name, off - s.Value, true
		}
		return "", 0, false
	}
}

// debugRoot is where separate debug files are looked up by build ID
// (Debian's -dbgsym packages install them there); a variable for the tests.
var debugRoot = "/usr/lib/debug"

// funcSymbols reads file's defined function symbols, by address: its
// .symtab, else that of its separate debug file (DEBUGROOT/.build-id/NN/
// REST.debug, by its GNU build ID: a distribution's programs are stripped),
// else its .dynsym; none when it cannot be read (gone, or not ELF).
func funcSymbols(file string) []elf.Symbol {
	f, err := elf.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := funcs(f.Symbols())
	if len(out) == 0 {
		if id := buildID(f); len(id) > 1 {
			if d, err := elf.Open(fmt.Sprintf("%s/.build-id/%x/%x.debug", debugRoot, id[:1], id[1:])); err == nil {
				out = funcs(d.Symbols())
				d.Close()
			}
		}
	}
	if len(out) == 0 {
		out = funcs(f.DynamicSymbols())
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Value < out[j].Value })
	return out
}

func funcs(syms []elf.Symbol, _ error) []elf.Symbol {
	var out []elf.Symbol
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && s.Value != 0 {
			out = append(out, s)
		}
	}
	return out
}

// buildID is f's GNU build ID (its NT_GNU_BUILD_ID note), or nil.
func buildID(f *elf.File) []byte {
	sec := f.Section(".note.gnu.build-id")
	if sec == nil {
		return nil
	}
	b, err := sec.Data()
	// namesz, descsz, type, "GNU\x00", then the ID
	if err != nil || len(b) < 16 || f.ByteOrder.Uint32(b[8:]) != 3 || string(b[12:16]) != "GNU\x00" {
		return nil
	}
	n := int(f.ByteOrder.Uint32(b[4:]))
	if 16+n > len(b) {
		return nil
	}
	return b[16 : 16+n]
}

// Symbolize names the functions of the findings' call sites with sym (a
// site without an object, or whose object sym cannot read, keeps its
// offset). Call it before Suppress: a suppression's caller= matches the
// function.
func (r *Report) Symbolize(sym Symbolizer) {
	for _, fs := range [][]Finding{r.Findings, r.Suppressed} {
		for _, f := range fs {
			if s := f.Site; s != nil && s.Module != "" && s.Func == "" {
				s.Func, s.FuncOffset, _ = sym(s.Module, s.Offset)
			}
		}
	}
}
