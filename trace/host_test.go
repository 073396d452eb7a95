package trace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// hostRig builds, on this host, the shim, testdata/fakeverbs (a stand-in
// libibverbs.so.1 with one loopback device, for hosts without RDMA) and the
// named planted programs (linked against the real libibverbs, run against
// the fake through LD_LIBRARY_PATH).
func hostRig(t testing.TB, progs ...string) (shim, dir string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("LD_PRELOAD is Linux's")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc (scripts/deps.sh installs it with libibverbs-dev)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir = t.TempDir()
	shim, err := BuildShim(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "lib")
	if err := os.Mkdir(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	build(t, ctx, "gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", filepath.Join(fake, "libibverbs.so.1"),
		"-Wl,-soname,libibverbs.so.1", "-Wl,--version-script=testdata/fakeverbs/fakeverbs.map", "testdata/fakeverbs/fakeverbs.c")
	for _, p := range progs {
		// --as-needed: a program that dlopen()s libibverbs does not load it at start
		build(t, ctx, "gcc", "-O1", "-Wall", "-o", filepath.Join(dir, p), filepath.Join("testdata", "progs", p+".c"), "-ldl", "-Wl,--as-needed", "-libverbs")
	}
	t.Setenv("LD_LIBRARY_PATH", fake)
	return shim, dir
}

// runOut runs argv (traced with shim, or not when shim is ""), its stdout to
// a file, and returns that output and the result.
func runOut(t testing.TB, shim string, argv ...string) (string, *Result) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var res *Result
	if shim == "" {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout = f
		_ = cmd.Run()
		res = &Result{Status: cmd.ProcessState.String(), ExitCode: cmd.ProcessState.ExitCode()}
	} else if res, err = Run(context.Background(), RunSpec{Shim: shim, Argv: argv, Stdout: f}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b), res
}

// TestHostPlanted traces the planted programs against the fake provider:
// each produces exactly its finding (posted_in_error none: the fake
// flushes a WR posted in ERROR at once), with the program's output and exit
// status unchanged.
func TestHostPlanted(t *testing.T) {
	var names []string
	for n := range planted {
		if !strings.HasPrefix(n, "qpx_") && !strings.HasPrefix(n, "cqx_") { // the fake has no ibv_qp_ex nor ibv_cq_ex: rxe in the VM tests them
			names = append(names, n)
		}
	}
	shim, dir := hostRig(t, names...)
	raises := Options{LastWQE: func(string) (LastWQE, bool) { return LastWQE{Raises: true, Source: "the fake raises it"}, true }}
	for _, name := range names {
		want := planted[name]
		if name == "posted_in_error" {
			want = ""
		}
		t.Run(name, func(t *testing.T) {
			argv := []string{filepath.Join(dir, name)}
			if name == "postpoll" {
				argv = append(argv, "1000")
			}
			plain, pres := runOut(t, "", argv...)
			traced, res := runOut(t, shim, argv...)
			if pres.Status != "exit status 0" || res.Status != pres.Status {
				t.Fatalf("status traced %q, untraced %q", res.Status, pres.Status)
			}
			if mask(traced) != mask(plain) {
				t.Errorf("output traced %q, untraced %q", traced, plain)
			}
			rep := Analyze(res.Records, raises)
			if got := strings.TrimSpace(strings.Join(kindStrings(rep), " ")); got != want {
				t.Errorf("findings %q, want %q:\n%s", got, want, text(t, rep))
			}
			procs := 1
			if name == "fork_destroy" {
				procs = 2 // the child destroys one QP, each pid has its finding
				if f := rep.Findings; len(f) == 2 && (f[0].PID == f[1].PID || f[0].PID != rep.Processes[1].PID || f[0].Count != 4 || f[1].Count != 3) {
					t.Errorf("fork_destroy: want the child's destroy of 4 receives, then the parent's exit with 3:\n%s", text(t, rep))
				}
			}
			if len(rep.Processes) != procs || rep.Processes[0].Devices[0] != "fake0" || !rep.Processes[0].Exited || rep.Processes[0].Program != argv[0] {
				t.Errorf("processes %+v", rep.Processes)
			}
		})
	}
}

// TestHostPostOrder: a completion polled by another thread before the
// post that made it has returned (the fake provider waits in its post
// until it is) is recorded after the post's WR, so the trace of rping's
// pattern (one CQ, every wr_id 0) is clean, without a note.
func TestHostPostOrder(t *testing.T) {
	shim, dir := hostRig(t, "polled_in_post")
	_, res := runOut(t, shim, filepath.Join(dir, "polled_in_post"))
	if res.ExitCode != 0 {
		t.Fatalf("polled_in_post: %s", res.Status)
	}
	var posted, polled [2]int // sends, receives
	for _, r := range res.Records {
		switch {
		case r.Kind == "send":
			posted[0]++
		case r.Kind == "recv":
			posted[1]++
		case r.Kind == "wc":
			i := 0
			if r.Uint("op")&128 != 0 {
				i = 1
			}
			if polled[i]++; polled[i] > posted[i] {
				t.Errorf("line %d: completion %d of the %s queues recorded before the post of its WR (%d posted)", r.Line, polled[i], [2]string{"send", "receive"}[i], posted[i])
			}
		}
	}
	if polled != posted || polled[0] != 6 {
		t.Errorf("%v WRs posted (sends, receives), %v completions polled, want 6 each", posted, polled)
	}
	if rep := Analyze(res.Records, Options{}); !rep.Clean() || len(rep.Notes) != 0 {
		t.Errorf("want clean, no note:\n%s", text(t, rep))
	}
}

// TestHostPartialPost: a post the provider takes up to its bad_wr only is
// one record per WR, then one unposted record for bad_wr and the WRs
// after it; the analysis counts the WRs before bad_wr as posted.
func TestHostPartialPost(t *testing.T) {
	shim, dir := hostRig(t, "partial_post")
	_, res := runOut(t, shim, filepath.Join(dir, "partial_post"))
	if res.ExitCode != 0 {
		t.Fatalf("partial_post: %s", res.Status)
	}
	var unposted []string
	for _, r := range res.Records {
		if r.Kind == "unposted" {
			unposted = append(unposted, r.Str("wrs")+" "+r.Str("ret"))
		}
	}
	rep := Analyze(res.Records, Options{})
	if fmt.Sprint(unposted) != "[1 22]" || !rep.Clean() || rep.Processes[0].Posted != 2 {
		t.Errorf("unposted records (wrs ret) %v, want [1 22] (EINVAL); want clean with 2 WRs posted:\n%s", unposted, text(t, rep))
	}
}

// TestHostForkLock: a child forked while another thread of its parent
// holds the shim's table lock can still take it (the child re-initialises
// it): fork_lock forks 300 times while a thread opens and closes the
// device in a loop, and each child's destroy takes the lock.
func TestHostForkLock(t *testing.T) {
	shim, dir := hostRig(t, "fork_lock")
	out, res := runOut(t, shim, filepath.Join(dir, "fork_lock"), "300")
	if res.ExitCode != 0 {
		t.Errorf("fork_lock: %s, %q: a child deadlocked on the lock its parent's other thread held at fork", res.Status, out)
	}
}

// mask hides the numbers of postpoll's timing line.
func mask(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r == '.' {
			return -1
		}
		return r
	}, s)
}

func kindStrings(rep *Report) []string {
	var s []string
	for _, k := range kinds(rep) {
		s = append(s, string(k))
	}
	return s
}

// TestHostBehaviour: the shim leaves exit statuses and signals as they
// are, follows the processes a program forks and execs, and records nothing
// for processes that open no device.
func TestHostBehaviour(t *testing.T) {
	shim, dir := hostRig(t, "clean")
	for _, tc := range []struct {
		script, status string
		procs          int
	}{
		{"exit 3", "exit status 3", 0},
		{"kill -TERM $$", "signal: terminated", 0},
		{"kill -SEGV $$", "signal: segmentation fault", 0},
		// a shell forks two children that exec the program: two processes traced
		{"./clean & ./clean; wait", "exit status 0", 2},
	} {
		out, res := runOut(t, shim, "sh", "-c", "cd "+dir+" || exit 9; "+tc.script)
		if res.Status != tc.status {
			t.Errorf("%q traced: %q, want %q", tc.script, res.Status, tc.status)
		}
		rep := Analyze(res.Records, Options{})
		if len(rep.Processes) != tc.procs || !rep.Clean() {
			t.Errorf("%q: %d processes, clean %v, want %d clean:\n%s%s", tc.script, len(rep.Processes), rep.Clean(), tc.procs, text(t, rep), out)
		}
	}
}

func TestBuildShimErrors(t *testing.T) {
	t.Setenv("CC", "no-such-compiler-here")
	if _, err := BuildShim(context.Background(), t.TempDir()); !errors.Is(err, ErrNoCompiler) {
		t.Errorf("BuildShim without a compiler: %v, want ErrNoCompiler", err)
	}
	if _, err := Run(context.Background(), RunSpec{Shim: filepath.Join(t.TempDir(), "none.so"), Argv: []string{"true"}}); err == nil {
		t.Error("Run with a missing shim succeeded")
	}
	if _, err := Run(context.Background(), RunSpec{Shim: "x", Argv: nil}); err == nil {
		t.Error("Run without a program succeeded")
	}
}

// TestHostKilled: a program that closes every descriptor it did not open
// and is then killed keeps its records up to the kill, and the WRs it left
// are judged.
func TestHostKilled(t *testing.T) {
	shim, dir := hostRig(t, "killed")
	_, res := runOut(t, shim, filepath.Join(dir, "killed"))
	if res.Status != "signal: killed" || res.Lost != 0 {
		t.Fatalf("status %q, %d records lost", res.Status, res.Lost)
	}
	rep := Analyze(res.Records, Options{})
	if len(rep.Findings) != 1 || rep.Findings[0].Count != 5 || !strings.Contains(rep.Findings[0].Evidence, "ended without exiting normally") {
		t.Errorf("want the 5 receives judged at the kill:\n%s", text(t, rep))
	}
}

// TestHostDlopenRunpath: the shim's dlopen passes other libraries straight
// through (a tail call), so a program's dlopen still searches the program's
// own RUNPATH.
func TestHostDlopenRunpath(t *testing.T) {
	shim, dir := hostRig(t)
	ctx := context.Background()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "p.c")
	if err := os.WriteFile(src, []byte(`#include <dlfcn.h>
#include <stdio.h>
int main(void) { void *h = dlopen("libqpdfoo.so", RTLD_NOW); puts(h ? "found" : dlerror()); return !h; }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	build(t, ctx, "gcc", "-shared", "-fPIC", "-o", filepath.Join(sub, "libqpdfoo.so"), "-x", "c", os.DevNull)
	build(t, ctx, "gcc", "-o", filepath.Join(dir, "p"), src, "-ldl", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub")
	out, res := runOut(t, shim, filepath.Join(dir, "p"))
	if res.ExitCode != 0 || out != "found\n" {
		t.Errorf("traced, a library on the program's RUNPATH: %q, %s", out, res.Status)
	}
}

// TestHostCallSite: two destroys that differ only by their caller are two
// findings, each at its own function of the program (the shim's map
// records place the return address, the program's ELF symbols name it),
// and a suppression's caller= takes one and leaves the other.
func TestHostCallSite(t *testing.T) {
	shim, dir := hostRig(t, "two_sites")
	prog := filepath.Join(dir, "two_sites")
	_, res := runOut(t, shim, prog)
	if res.ExitCode != 0 {
		t.Fatalf("two_sites: %s", res.Status)
	}
	for _, tc := range []struct{ supp, kept, suppressed string }{
		{"destroyed-with-outstanding caller=destroy_accepted", "destroy_kept", "destroy_accepted"},
		{"destroyed-with-outstanding caller=two_sites!destroy_k*", "destroy_accepted", "destroy_kept"},
		{"destroyed-with-outstanding caller=" + dir + "/*!destroy_kept", "destroy_accepted", "destroy_kept"},
		{"destroyed-with-outstanding caller=libibverbs*!destroy_kept\ndestroyed-with-outstanding caller=main", "", ""},
	} {
		rep := Analyze(res.Records, Options{})
		rep.Symbolize(ELFSymbols())
		if len(rep.Findings) != 2 {
			t.Fatalf("want 2 findings:\n%s", text(t, rep))
		}
		for _, f := range rep.Findings {
			if s := f.Site; s == nil || s.Verb != "ibv_destroy_qp" || s.Module != prog || !strings.HasPrefix(s.Func, "destroy_") || s.FuncOffset == 0 {
				t.Fatalf("finding's call site %+v, want ibv_destroy_qp in a destroy_ function of %s:\n%s", s, prog, text(t, rep))
			}
		}
		if out := text(t, rep); !strings.Contains(out, "ibv_destroy_qp called at two_sites!destroy_kept+0x") || !strings.Contains(out, "("+prog+")") {
			t.Errorf("report lacks the call site:\n%s", out)
		}
		sups, err := ParseSuppressions(strings.NewReader(tc.supp), "s")
		if err != nil {
			t.Fatal(err)
		}
		rep.Suppress(sups)
		var kept, supp string
		if len(rep.Findings) == 1 {
			kept = rep.Findings[0].Site.Func
		}
		if len(rep.Suppressed) == 1 {
			supp = rep.Suppressed[0].Site.Func
		}
		if tc.kept == "" && (len(rep.Findings) != 2 || len(rep.Suppressed) != 0) || tc.kept != "" && (kept != tc.kept || supp != tc.suppressed) {
			t.Errorf("%q: kept %d (%s), suppressed %d (%s); want %s kept, %s suppressed", tc.supp, len(rep.Findings), kept, len(rep.Suppressed), supp, tc.kept, tc.suppressed)
		}
	}
}
