package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/vm"
)

// planted are the test programs of testdata/progs and the findings each
// must produce, exactly (in the order they happen).
var planted = map[string]string{
	"fork_destroy":       string(DestroyedWithOutstanding) + " " + string(DestroyedWithOutstanding),
	"dlopen_outstanding": string(DestroyedWithOutstanding),
	"cqx_destroyed_wc":   string(CompletionForDestroyedQP),
	"rping_wrid0":        "",
	"polled_in_post":     "",
	"clean":              "",
	"outstanding":        string(DestroyedWithOutstanding),
	"srq_lastwqe":        string(SRQDestroyedBeforeLastWQE),
	"destroyed_wc":       string(CompletionForDestroyedQP),
	"cq_oversize":        string(CQOverSize),
	"unacked":            string(EventNotAcked),
	"posted_in_error":    string(PostedInErrorNotFlushed),
	"qpx_outstanding":    string(DestroyedWithOutstanding),
	"qpx_bind_mw":        string(DestroyedWithOutstanding),
	"postpoll":           "",
	"two_sites":          string(DestroyedWithOutstanding) + " " + string(DestroyedWithOutstanding),
}

// guestScript runs in the guest once per provider (QPDRAIN_TEST_DEVICE):
// each planted program traced, then (unless QUICK) the real programs (server
// and client over loopback) untraced and traced, their outputs compared with
// the numbers masked, then the overhead loop untraced and traced. On an
// iWARP device (siw0), whose QPs connect only through the RDMA CM, the
// programs that connect by hand (the planted ones, the pingpongs,
// ib_write_bw, the overhead loop) do not run: rping does, QUICK or not.
// Each verdict is one "@@" line, after the "@@ device" line that names the
// device they are of.
const guestScript = `#!/bin/sh
cd "$(dirname "$0")"
QUICK=QUICKVALUE
G=${QPDRAIN_TEST_GID_INDEX:-1}
DEV=${QPDRAIN_TEST_DEVICE:-rxe0}
IWARP=0
ibv_devinfo -d "$DEV" | grep -q 'transport:[[:space:]]*iWARP' && IWARP=1
echo "@@ device $DEV iwarp=$IWARP"
kinds() { grep -oE '^[a-z-]+  pid' "$1" | cut -d' ' -f1 | sort -u | tr '\n' ' '; }
[ $IWARP = 1 ] || for p in PLANTED; do
	./qpdrain trace --shim ./SHIMNAME --report $p.report -- ./$p > $p.out 2>&1
	rc=$?
	echo "@@ $p exit=$rc kinds=$(kinds $p.report)notes=$(grep -c "which $DEV does not raise" $p.report)"
	cat $p.report
done
# qpdrain's own binding (package libibverbs: dlopen and dlvsym) traced
./qpdrain trace --shim ./SHIMNAME --report binding.report -- ./qpdrain check --device "$DEV" --run '^flush-outstanding$' > binding.out 2>&1
echo "@@ binding exit=$? seen=$(grep -oE '[0-9]+ QPs, [0-9]+ CQs, [0-9]+ SRQs, [0-9]+ WRs posted' binding.report | head -1 | tr ' ,' '_.')"
cat binding.report
# call sites: two destroys that differ only by their caller, one suppressed
# by caller= (two_sites connects by hand: not on iWARP)
if [ $IWARP = 0 ]; then
	echo 'destroyed-with-outstanding caller=two_sites!destroy_accepted' > sites.supp
	./qpdrain trace --shim ./SHIMNAME --suppressions sites.supp --report sites.report -- ./two_sites > sites.out 2>&1
	echo "@@ sites exit=$? $(grep -o 'called at [^ ]*' sites.report | tr ' ' _ | tr '\n' ' ')suppressed=$(grep -c '1 destroyed-with-outstanding (sites.supp:1)' sites.report)"
	cat sites.report
fi
pair() {
	port=$1; shift
	"$@" -p "$port" & s=$!
	sleep 1
	"$@" -p "$port" 127.0.0.1; c=$?
	wait $s; echo "exit server=$? client=$c"
}
# numbers masked; and rping's "DISCONNECT EVENT..." line, which its CM
# thread prints or not as it races the process's exit (seen once traced,
# on 6.12 under a loaded host)
mask() { grep -v 'DISCONNECT EVENT' "$1" | sed 's/[0-9a-fx.:]*[0-9][0-9a-fx.:]*/N/g' | sort; }
# cmpair PORT CMD...: server and client of an RDMA CM example (rping's -s/-c)
# on the rxe address
cmpair() {
	port=$1; shift
	"$@" -s -a "$QPDRAIN_TEST_ADDR" -p "$port" & s=$!
	sleep 1
	"$@" -c -a "$QPDRAIN_TEST_ADDR" -p "$port"; c=$?
	wait $s; echo "exit server=$? client=$c"
}
real() {
	name=$1 port=$2 how=${PAIR:-pair}; shift 2
	command -v "$1" >/dev/null || { echo "@@ $name missing"; return; }
	$how $port "$@" > $name.plain 2>&1
	./qpdrain trace -d --shim ./SHIMNAME --report $name.report -- sh -c ". ./pair.sh; $how $((port + 1)) $*" > $name.traced 2>&1
	rc=$?
	mask $name.plain > $name.a; mask $name.traced > $name.b
	same=unchanged; cmp -s $name.a $name.b || same=changed
	echo "@@ $name exit=$rc output=$same status=$(tail -1 $name.traced | tr ' ' ,) kinds=$(kinds $name.report)"
	cat $name.report
	[ $same = unchanged ] || diff $name.a $name.b
}
sed -n '/^pair()/,/^}/p; /^cmpair()/,/^}/p' "$0" > pair.sh
if [ $IWARP = 1 ]; then
	PAIR=cmpair real rping 18630 rping -C 20 -v
	exit 0
fi
[ "$QUICK" = 1 ] && exit 0
real ibv_rc_pingpong 18600 ibv_rc_pingpong -d "$DEV" -g $G -n 100
real ibv_srq_pingpong 18610 ibv_srq_pingpong -d "$DEV" -g $G -n 100 -q 4
real ib_write_bw 18620 ib_write_bw -d "$DEV" -x $G -n 200 -s 4096
PAIR=cmpair real rping 18630 rping -C 20 -v
echo "@@ clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
for i in $(seq ROUNDS); do
	echo "@@ overhead plain $(./postpoll TRIPS)"
	echo "@@ overhead traced $(./qpdrain trace --shim ./SHIMNAME --report /dev/null -- ./postpoll TRIPS)"
done
`

// TestVMTrace traces the planted programs, rdma-core's ibv_rc_pingpong,
// ibv_srq_pingpong and rping and perftest's ib_write_bw (when the host has
// them) on
// real rxe in qemu, on the kernels of RXE_KERNELS: each planted program must
// produce exactly its finding, the real programs must run with unchanged
// output and exit 0; their verdicts and the overhead are logged. With
// -short (the rxe stage) only the planted programs run. RXE_PROVIDERS picks
// the providers (vm.ParseProviders: rxe, siw, both; rxe when unset): on siw
// (iWARP) only rping and qpdrain check's binding are traced, -short or not.
// The overhead loop (on rxe) runs QPDRAIN_TRACE_ROUNDS (default 5) rounds
// of postpoll QPDRAIN_TRACE_TRIPS (default 3000) round trips, untraced then
// traced, alternating in one guest, and logs each side's median and spread
// and the median of the rounds' traced/untraced ratios.
func TestVMTrace(t *testing.T) {
	if os.Getenv("QPDRAIN_VM_TEST") != "1" {
		t.Skip("boots qemu: set QPDRAIN_VM_TEST=1 (make test-rxe does)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	// Not under /tmp: the guest mounts a tmpfs there.
	dir, err := os.MkdirTemp("/var/tmp", "qpdrain-trace-vm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	shim, err := BuildShim(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}

	var names []string
	for name := range planted {
		names = append(names, name)
		build(t, ctx, "gcc", "-O1", "-Wall", "-o", filepath.Join(dir, name), filepath.Join("testdata", "progs", name+".c"), "-ldl", "-Wl,--as-needed", "-libverbs")
	}
	build(t, ctx, "go", "build", "-o", filepath.Join(dir, "qpdrain"), "github.com/qpdrain/qpdrain/cmd/qpdrain")
	script := strings.Replace(guestScript, "PLANTED", strings.Join(names, " "), 1)
	script = strings.ReplaceAll(script, "SHIMNAME", filepath.Base(shim))
	script = strings.Replace(script, "QUICKVALUE", fmt.Sprint(b2i(testing.Short())), 1)
	script = strings.Replace(script, "ROUNDS", envInt(t, "QPDRAIN_TRACE_ROUNDS", 5), 1)
	script = strings.ReplaceAll(script, "postpoll TRIPS", "postpoll "+envInt(t, "QPDRAIN_TRACE_TRIPS", 3000))
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	providers, err := vm.ParseProviders(os.Getenv("RXE_PROVIDERS"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{dir}
	for _, prog := range []struct{ name, pkg string }{{"ib_write_bw", "perftest"}, {"rping", "rdmacm-utils"}} {
		// rping runs on siw with -short too: the one program traced there
		wanted := !testing.Short() || prog.name == "rping" && slices.Contains(providers, vm.ProviderSIW)
		if p, err := exec.LookPath(prog.name); err == nil && wanted {
			files = append(files, p)
			if prog.name == "rping" {
				// its pthread_exit dlopen()s libgcc_s, which ldd does not name
				libgcc, _ := filepath.Glob("/usr/lib/*-linux-gnu/libgcc_s.so.1")
				files = append(files, libgcc...)
			}
		} else if wanted {
			t.Logf("no %s on the host (Debian package %s): it is not traced", prog.name, prog.pkg)
		}
	}
	kernels, err := vm.ParseKernels(os.Getenv("RXE_KERNELS"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := vm.DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	accel, err := vm.ParseAccel(cmp.Or(os.Getenv("QPDRAIN_VM_ACCEL"), "auto"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = vm.Run(ctx, vm.Options{Kernels: kernels, Providers: providers, Cache: cache, Accel: accel, Stdout: &out}, vm.RunSpec{Command: []string{"/bin/sh", filepath.Join(dir, "run.sh")}, Files: files, Dir: dir})
	t.Logf("vm output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	checkVMVerdicts(t, out.String(), len(kernels)*len(providers), !testing.Short())
	logOverhead(t, out.String())
}

// envInt is the positive number in the environment variable name, or def.
func envInt(t *testing.T, name string, def int) string {
	v := os.Getenv(name)
	if v == "" {
		return fmt.Sprint(def)
	}
	if n, err := strconv.Atoi(v); err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return v
}

var overheadLine = regexp.MustCompile(`^\[([^\]]+)\] @@ overhead (plain|traced) .*postpoll: \d+ round trips, ([0-9.]+) us each`)

// logOverhead logs, per kernel, the round trip untraced and traced: the
// median and spread of each side's rounds, the ratio of the medians and the
// median of each round's ratio (traced over the untraced run just before
// it: the pair the host's other load disturbs alike).
func logOverhead(t *testing.T, out string) {
	plain, traced := map[string][]float64{}, map[string][]float64{}
	var kernels []string
	for _, l := range strings.Split(out, "\n") {
		m := overheadLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		us, _ := strconv.ParseFloat(m[3], 64)
		if plain[m[1]] == nil && traced[m[1]] == nil {
			kernels = append(kernels, m[1])
		}
		if m[2] == "plain" {
			plain[m[1]] = append(plain[m[1]], us)
		} else {
			traced[m[1]] = append(traced[m[1]], us)
		}
	}
	for _, k := range kernels {
		p, tr := plain[k], traced[k]
		if len(p) == 0 || len(tr) == 0 {
			continue
		}
		var ratios []float64
		for i := range min(len(p), len(tr)) {
			ratios = append(ratios, tr[i]/p[i])
		}
		t.Logf("%s: overhead: untraced %.2f us median (%.2f-%.2f, %d rounds), traced %.2f us (%.2f-%.2f): medians %.2fx, rounds' ratios %.2fx median (%.2f-%.2f)",
			k, median(p), slices.Min(p), slices.Max(p), len(p), median(tr), slices.Min(tr), slices.Max(tr), median(tr)/median(p), median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func build(t testing.TB, ctx context.Context, cmd string, args ...string) {
	t.Helper()
	if b, err := exec.CommandContext(ctx, cmd, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cmd, strings.Join(args, " "), err, b)
	}
}

var verdictLine = regexp.MustCompile(`^\[([^\]]+)\] @@ (\S+) (.*)$`)

// checkVMVerdicts checks the "@@" lines of every kernel and device (runs of
// them: a kernel's run per provider).
func checkVMVerdicts(t *testing.T, out string, runs int, real bool) {
	t.Helper()
	seen := map[string]map[string]string{} // by "kernel device"
	device := map[string]string{}          // a kernel's device at this line
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := verdictLine.FindStringSubmatch(sc.Text())
		if m == nil || m[2] == "overhead" {
			continue
		}
		if m[2] == "device" {
			device[m[1]] = m[3]
			continue
		}
		run := m[1] + " " + device[m[1]]
		if seen[run] == nil {
			seen[run] = map[string]string{}
		}
		seen[run][m[2]] = m[3]
	}
	if len(seen) != runs {
		t.Fatalf("verdicts from %d kernel and device runs, want %d", len(seen), runs)
	}
	for kernel, got := range seen {
		iwarp := strings.HasSuffix(kernel, " iwarp=1")
		for name, want := range planted {
			if iwarp {
				break // they connect by hand
			}
			wantExit := 0
			if want != "" {
				// the guest lists each kind once
				wantExit, want = 1, strings.Join(slices.Compact(strings.Fields(want)), " ")+" "
			}
			v := got[name]
			if name == "srq_lastwqe" && v == "exit=0 kinds=notes=1" {
				// The device does not raise Last WQE Reached (rxe on 6.1):
				// nothing to wait for, and the report says so.
				t.Logf("%s: %s: clean, the device does not raise Last WQE Reached", kernel, name)
				continue
			}
			if v != fmt.Sprintf("exit=%d kinds=%snotes=0", wantExit, want) {
				t.Errorf("%s: %s: %q, want exit %d and exactly the findings %q", kernel, name, v, wantExit, want)
			}
		}
		// qpdrain check through its own binding: its QPs and WRs seen
		if b := got["binding"]; !regexp.MustCompile(`seen=[1-9][0-9]*_QPs._[1-9][0-9]*_CQs._0_SRQs._[1-9][0-9]*_WRs_posted`).MatchString(b) {
			t.Errorf("%s: qpdrain check traced through its own libibverbs binding: %q, want its QPs, CQs and WRs seen", kernel, b)
		} else {
			t.Logf("%s: binding: %s", kernel, b)
		}
		// two destroys differing by their caller: the one not suppressed
		// shows its function
		if v := got["sites"]; !iwarp && !regexp.MustCompile(`^exit=1 called_at_two_sites!destroy_kept\+0x[0-9a-f]+ suppressed=1$`).MatchString(v) {
			t.Errorf("%s: two_sites with destroy_accepted suppressed by caller=: %q, want destroy_kept's finding and one suppressed", kernel, v)
		}
		realNames := []string{"ibv_rc_pingpong", "ibv_srq_pingpong", "ib_write_bw", "rping"}
		switch {
		case iwarp:
			realNames = []string{"rping"}
		case !real:
			realNames = nil
		}
		for _, name := range realNames {
			v, ok := got[name]
			switch {
			case !ok:
				t.Errorf("%s: no verdict for %s", kernel, name)
			case v == "missing":
				t.Logf("%s: %s is not in the guest", kernel, name)
			case !strings.Contains(v, "output=unchanged") || !strings.Contains(v, "status=exit,server=0,client=0"):
				t.Errorf("%s: %s traced: %s; want its output unchanged and both sides exiting 0", kernel, name, v)
			case name == "rping" && !strings.HasSuffix(v, "kinds="):
				// every WR wr_id 0 on one CQ, flushes at disconnect: what
				// the counts cannot place is a note, never a finding
				t.Errorf("%s: rping traced: %s; want no finding", kernel, v)
			default:
				t.Logf("%s: %s: %s", kernel, name, v)
			}
		}
	}
}
