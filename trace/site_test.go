package trace

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindingSites: each kind of finding carries the call site of the verb
// it is about, placed in the object the map records before it cover (the
// latest, when an address range was loaded twice), inherited by a forked
// child, not by an exec'd image; Symbolize names the function and caller=
// matches it.
func TestFindingSites(t *testing.T) {
	s := &stream{}
	rec := func(ms, pid int, kind string, kv ...string) {
		fmt.Fprintf(&s.b, "%s t=%d pid=%d tid=%d %s\n", kind, int64(ms)*1_000_000+5_000_000_000, pid, pid, strings.Join(kv, " "))
	}
	rec(0, 100, "start", "exe=/bin/prog")
	rec(0, 100, "map", "base=0x0", "lo=0x1000", "hi=0x5000", "path=/bin/prog")
	rec(0, 100, "map", "base=0x7000", "lo=0x7000", "hi=0x9000", "path=/lib/libold.so")
	rec(0, 100, "map", "base=0x6000", "lo=0x7000", "hi=0x9000", "path=/lib/libx.so") // libold.so unloaded, libx.so where it was
	rec(1, 100, "open", "ctx=0x10", "dev=rxe0")
	rec(1, 100, "cq", "ctx=0x10", "cq=0x20", "cqe=1", "ex=0", "site=0x1100")
	rec(2, 100, "qp", "ctx=0x10", "qp=0x31", "qpn=17", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0", "site=0x1200")
	rec(2, 100, "qp", "ctx=0x10", "qp=0x32", "qpn=18", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0", "site=0x7100")
	rec(3, 100, "recv", "qp=0x31", "wr=0x1", "site=0x1300")
	rec(3, 100, "recv", "qp=0x31", "wr=0x2", "site=0x1300")
	rec(4, 200, "fork", "ppid=100")
	rec(5, 200, "qpd", "qp=0x31", "begin=1", "site=0x1400")
	rec(5, 200, "qpd", "qp=0x31", "ret=0", "site=0x1400")
	rec(6, 100, "mod", "qp=0x32", "state=6", "ret=0")
	rec(7, 100, "recv", "qp=0x32", "wr=0x3", "site=0x7200")
	rec(8, 100, "ev", "ctx=0x10", "type=1", "qp=0x32", "qpn=18", "site=0xa000")
	rec(9, 300, "start", "exe=/bin/other")
	rec(9, 300, "open", "ctx=0x10", "dev=rxe0")
	rec(9, 300, "cq", "ctx=0x10", "cq=0x20", "cqe=16", "ex=0", "site=0x1100")
	rec(9, 300, "qp", "ctx=0x10", "qp=0x31", "qpn=40", "type=2", "scq=0x20", "rcq=0x20", "srq=0x0", "sig_all=0", "ex=0", "site=0x1200")
	rec(9, 300, "recv", "qp=0x31", "wr=0x1", "site=0x1300")
	rec(500, 100, "exit")
	rec(500, 300, "exit")
	rep := Analyze(s.records(t), Options{})
	got := map[string]string{}
	for _, f := range rep.Findings {
		site := "none"
		if f.Site != nil {
			site = f.Site.Verb + " " + f.Site.String()
		}
		got[fmt.Sprintf("%s %d %s", f.Kind, f.PID, f.Object)] = site
	}
	want := map[string]string{
		// the child's destroy, placed by the maps it inherited
		"destroyed-with-outstanding 200 qpn 17":                  "ibv_destroy_qp prog+0x1400 (/bin/prog)",
		"cq-over-size 100 cq 0x20":                               "ibv_create_cq prog+0x1100 (/bin/prog)",
		"posted-in-error-not-flushed 100 qpn 18":                 "ibv_post_recv libx.so+0x1200 (/lib/libx.so)",
		"async-event-not-acked 100 IBV_EVENT_QP_FATAL of qpn 18": "ibv_get_async_event 0xa000",
		// never destroyed: its create; an exec'd image has no maps until its own
		"destroyed-with-outstanding 300 qpn 40": "ibv_create_qp 0x1200",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("findings' sites:\n%v\nwant\n%v\n%s", got, want, text(t, rep))
	}
	rep.Symbolize(func(module string, off uint64) (string, uint64, bool) {
		if module == "/bin/prog" {
			return fmt.Sprintf("f%x", off&^0xff), off & 0xff, true
		}
		return "", 0, false
	})
	out := text(t, rep)
	for _, w := range []string{"  ibv_destroy_qp called at prog!f1400+0x0 (/bin/prog)\n", "  ibv_post_recv called at libx.so+0x1200 (/lib/libx.so)\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s", w, out)
		}
	}
	sups, err := ParseSuppressions(strings.NewReader("cq-over-size caller=prog!f12*\n"+
		"cq-over-size caller=/bin/*!f11*\n"+
		"posted-in-error-not-flushed caller=*\n"+ // a site without a function: not matched
		"destroyed-with-outstanding caller=f14??\n"), "s")
	if err != nil {
		t.Fatal(err)
	}
	rep.Suppress(sups)
	var supp []string
	for _, f := range rep.Suppressed {
		supp = append(supp, fmt.Sprintf("%s %d %s", f.Kind, f.PID, f.SuppressedBy))
	}
	if fmt.Sprint(supp) != "[cq-over-size 100 s:2 destroyed-with-outstanding 200 s:4]" {
		t.Errorf("suppressed %v", supp)
	}
}

// TestELFSymbols: an offset is named by the function symbol holding it, a
// return address at a function's end (its last call's) by that function;
// an unreadable object or offset 0 by none; a stripped object's functions
// from its separate debug file, found by build ID as Debian's -dbgsym
// packages install it, and without it not at all (its .dynsym has no
// hidden_fn).
func TestELFSymbols(t *testing.T) {
	for _, tool := range []string{"gcc", "objcopy", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	dir := t.TempDir()
	src, prog := filepath.Join(dir, "p.c"), filepath.Join(dir, "p")
	if err := os.WriteFile(src, []byte("__attribute__((noinline)) int hidden_fn(int x) { return x * 3 + 1; }\nint main(int c, char **v) { (void)v; return hidden_fn(c); }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	build(t, ctx, "gcc", "-O1", "-Wl,--build-id", "-o", prog, src)
	f, err := elf.Open(prog)
	if err != nil {
		t.Fatal(err)
	}
	var fn elf.Symbol
	for _, s := range funcs(f.Symbols()) {
		if s.Name == "hidden_fn" {
			fn = s
		}
	}
	id := buildID(f)
	f.Close()
	if fn.Value == 0 || fn.Size < 4 || len(id) < 2 {
		t.Fatalf("hidden_fn at %#x, size %d, build ID %x", fn.Value, fn.Size, id)
	}
	sym := ELFSymbols()
	if name, off, ok := sym(prog, fn.Value+2); !ok || name != "hidden_fn" || off != 2 {
		t.Errorf("offset 2 into hidden_fn: %q+%d %v", name, off, ok)
	}
	if name, _, ok := sym(prog, fn.Value+fn.Size); !ok || name != "hidden_fn" {
		t.Errorf("a return address at the end of hidden_fn: %q %v", name, ok)
	}
	if _, _, ok := sym(prog, 0); ok {
		t.Error("offset 0 named")
	}
	if _, _, ok := sym(filepath.Join(dir, "none"), fn.Value); ok {
		t.Error("a missing object named")
	}
	debug := filepath.Join(dir, "debug", ".build-id", fmt.Sprintf("%x", id[:1]))
	if err := os.MkdirAll(debug, 0o755); err != nil {
		t.Fatal(err)
	}
	build(t, ctx, "objcopy", "--only-keep-debug", prog, filepath.Join(debug, fmt.Sprintf("%x.debug", id[1:])))
	build(t, ctx, "strip", "--strip-all", prog)
	if name, _, ok := ELFSymbols()(prog, fn.Value+2); ok && name == "hidden_fn" {
		t.Fatalf("the stripped program without its debug file named hidden_fn")
	}
	old := debugRoot
	debugRoot = filepath.Join(dir, "debug")
	defer func() { debugRoot = old }()
	if name, off, ok := ELFSymbols()(prog, fn.Value+2); !ok || name != "hidden_fn" || off != 2 {
		t.Errorf("stripped, its debug file installed: %q+%d %v, want hidden_fn+2", name, off, ok)
	}
}
