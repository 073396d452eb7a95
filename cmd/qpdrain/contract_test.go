package main

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qpdrain/qpdrain/ibv"
)

// The contract, per command: a bad flag or argument gives its exit code and
// one line on stderr, prints nothing on stdout (with -j: one JSON document
// with the error and the code), and writes no file, before any work
// (wantRefused).
func TestContractBadInputs(t *testing.T) {
	// Directories where a file is wanted, outside DIR (which must stay
	// empty), named as the file would be.
	dirs := t.TempDir()
	promDir, pngDir := filepath.Join(dirs, "x.prom"), filepath.Join(dirs, "plot.png")
	for _, d := range []string{promDir, pngDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// rxe add on a kernel without rdma_rxe: modprobe fails as it does
	// there, and loads nothing here.
	saved := modprobe
	modprobe = func(string) ([]byte, error) {
		return []byte("modprobe: FATAL: Module rdma_rxe not found in directory /lib/modules/6.1.0"), errors.New("exit status 1")
	}
	t.Cleanup(func() { modprobe = saved })
	if infos, err := ibv.Devices(); err != nil || len(infos) == 0 {
		// Without RDMA devices, devices -j prints the error document as
		// qps -j and leaks -j do.
		wantRefused(t, nil, []badInput{{[]string{"devices", "-j"}, exitUnsupported, "no RDMA devices"}})
	}
	wantRefused(t, nil, []badInput{
		{[]string{"bogus"}, exitError, `unknown command "bogus" for "qpdrain"`},
		{[]string{"completion", "bogus"}, exitError, `unknown command "bogus" for "qpdrain completion"`},
		{[]string{"rxe", "bogus"}, exitError, `unknown command "bogus" for "qpdrain rxe": want one of add, del, list`},
		{[]string{"vm", "bogus"}, exitError, `unknown command "bogus" for "qpdrain vm"`},
		{[]string{"vm", "kernels", "--timeout", "500ms"}, exitError, `"500ms" for "--timeout" flag: want at least 1s`},
		{[]string{"vm", "kernels", "--kernels", "5.4"}, exitError, `"5.4" for "--kernels" flag: kernel "5.4"`},
		{[]string{"version", "extra"}, exitError, `unknown command "extra"`},
		{[]string{"devices", "extra"}, exitError, `unknown command "extra"`},
		{[]string{"check", "--bogus"}, exitError, "unknown flag: --bogus"},
		{[]string{"--log-level", "loud", "version"}, exitError, `invalid argument "loud" for "--log-level" flag: want trace, debug, info, warning or error`},
		{[]string{"--log-format", "yaml", "version"}, exitError, `invalid argument "yaml" for "--log-format" flag: want one of text, json`},

		{[]string{"check", "--timeout", "0"}, exitError, `"0" for "--timeout" flag: want at least 100ms`},
		{[]string{"check", "--timeout", "99ms"}, exitError, "want at least 100ms"},
		{[]string{"check", "--soft-quirk", "nope"}, exitError, `unknown quirk "nope"`},
		{[]string{"check", "--cm-addr", "nope"}, exitError, `"nope" for "--cm-addr" flag: not an IP address`},
		{[]string{"check", "--device", "nope"}, exitUnsupported, `no such RDMA device "nope" here`},
		{[]string{"check", "--device", "nope", "-j"}, exitUnsupported, `no such RDMA device "nope" here`},
		{[]string{"check", "--run", "["}, exitError, `invalid argument "[" for "--run" flag: error parsing regexp: missing closing ]`},
		{[]string{"check", "--run", "nope"}, exitError, `invalid argument "nope" for "--run" flag: matches no probe (flush-outstanding, send-in-error, `},
		{[]string{"check", "--skip", "*"}, exitError, `invalid argument "*" for "--skip" flag: error parsing regexp: missing argument to repetition operator`},
		{[]string{"check", "--skip", "nope", "-j"}, exitError, `"nope" for "--skip" flag: matches no probe`},
		{[]string{"check", "--run", "sqd", "--skip", "^s"}, exitError, `no probe left to run by --run "sqd" --skip "^s"`},
		{[]string{"check", "--run", "sqd", "--skip", "^s", "-j"}, exitError, `no probe left to run by --run "sqd" --skip "^s"`},
		{[]string{"check", "--call-timeout", "0"}, exitError, `"0" for "--call-timeout" flag: want at least 1s`},

		{[]string{"simulate", "--qps", "0"}, exitError, `"0" for "--qps" flag`},
		{[]string{"simulate", "--qps", "65537"}, exitError, "soft0 creates at most 65536 QPs (max_qp)"},
		{[]string{"simulate", "--qps", "65537", "-j"}, exitError, "soft0 creates at most 65536 QPs (max_qp)"},
		{[]string{"simulate", "--timeout", "0"}, exitError, `"0" for "--timeout" flag: want a positive duration`},
		{[]string{"simulate", "--max-quarantine", "0"}, exitError, "want at least 1"},
		{[]string{"simulate", "--max-batch", "-1"}, exitError, "want at least 0"},
		{[]string{"simulate", "--taken", "-1"}, exitError, `"-1" for "--taken"`},
		{[]string{"simulate", "--quirk", "nope"}, exitError, `unknown quirk "nope"`},
		{[]string{"simulate", "--policy", "nope"}, exitError, `unknown policy "nope"`},
		{[]string{"simulate", "--qps", "60000", "--taken", "100"}, exitError, "needs a CQ of"},

		{[]string{"churn", "--events", "0"}, exitError, `"0" for "--events" flag: want 1 to 10000000`},
		{[]string{"churn", "--events", "-5"}, exitError, `"-5" for "--events"`},
		{[]string{"churn", "--connect-rate", "0"}, exitError, `"0" for "--connect-rate" flag: want a number above 0`},
		{[]string{"churn", "--connect-rate", "NaN"}, exitError, "want a finite number"},
		{[]string{"churn", "--send-rate", "0"}, exitError, `"--send-rate" flag: want a number above 0`},
		{[]string{"churn", "--lifetime", "0"}, exitError, `"0" for "--lifetime" flag: want a positive duration`},
		{[]string{"churn", "--rx-delay", "0"}, exitError, `"--rx-delay" flag: want a positive duration`},
		{[]string{"churn", "--rx-timeout", "0s"}, exitError, `"--rx-timeout" flag: want a positive duration`},
		{[]string{"churn", "--rx-update-time", "-1s"}, exitError, `"--rx-update-time" flag`},
		{[]string{"churn", "--drain-timeout", "0"}, exitError, `"--drain-timeout" flag: want a positive duration`},
		{[]string{"churn", "--samples", "0"}, exitError, `"0" for "--samples"`},
		{[]string{"churn", "--rows", "-1"}, exitError, `"--rows" flag: want at least 0`},
		{[]string{"churn", "--vanish", "2"}, exitError, "want a fraction from 0 to 1"},
		{[]string{"churn", "--max-qp", "-1"}, exitError, `"--max-qp" flag: want at least 0`},
		{[]string{"churn", "--recvq-size", "0"}, exitError, `"--recvq-size" flag: want at least 1`},
		{[]string{"churn", "--recvq-size", "100000"}, exitError, "--recvq-size 100000: the SRQ holds at most 16384 receives on soft (max_srq_wr)"},
		{[]string{"churn", "--recvq-size", "2000", "--no-srq"}, exitError, "--recvq-size 2000: needs a CQ of 256001 entries, soft takes at most 32767 (max_cqe)"},
		{[]string{"churn", "--max-nonsrq-conn-qp", "5000"}, exitError, `"--max-nonsrq-conn-qp" flag: want 1 to`},
		{[]string{"churn", "--policy", "fast"}, exitError, "--policy"},
		{[]string{"churn", "--quirk", "nope"}, exitError, `unknown quirk "nope"`},
		{[]string{"churn", "--plot", "DIR/x.jpg"}, exitError, "want a file name ending in .png or .svg"},
		{[]string{"churn", "--plot", "DIR/missing/x.png"}, exitError, "missing: no such file or directory"},
		{[]string{"churn", "--plot", "DIR/missing/x.png", "-j"}, exitError, "no such file or directory"},
		{[]string{"churn", "--plot", pngDir}, exitError, `invalid argument "` + pngDir + `" for "--plot" flag: ` + pngDir + ` is a directory`},
		{[]string{"churn", "--plot-until", "-1s"}, exitError, `"--plot-until" flag: want at least 0s`},
		{[]string{"churn", "--device", ""}, exitError, `"--device" flag: want a value`},
		{[]string{"churn", "--device", "nope"}, exitUnsupported, `no such RDMA device "nope" here`},
		{[]string{"churn", "--device", "nope", "--max-qp", "5"}, exitError, "--max-qp applies to the soft device only, not nope"},
		{[]string{"churn", "--device", "nope", "--quirk", "no-last-wqe-reached", "--schedule-seed", "3"}, exitError, "--quirk and --schedule-seed apply to the soft device only, not nope"},

		{[]string{"exporter", "--window", "-1s"}, exitError, `"--window" flag: want a positive duration`},
		{[]string{"exporter", "--window", "0"}, exitError, `"--window" flag`},
		{[]string{"exporter", "--timeout", "0"}, exitError, `"--timeout" flag: want a positive duration`},
		{[]string{"exporter", "--listen", ""}, exitError, `"" for "--web.listen-address" flag: want HOST:PORT or :PORT`},
		{[]string{"exporter", "--listen", ":0"}, exitError, "want 1 to 65535"},
		{[]string{"exporter", "--near-limit", "0"}, exitError, "want a fraction in (0, 1]"},
		{[]string{"exporter", "--near-limit", "1.5"}, exitError, "want a fraction in (0, 1]"},

		{[]string{"leaks", "--textfile", "DIR/missing/x.prom"}, exitError, "no such file or directory"},
		{[]string{"leaks", "--textfile", ""}, exitError, "want a file name"},
		{[]string{"leaks", "--textfile", dirs}, exitError, `invalid argument "` + dirs + `" for "--textfile" flag`},
		{[]string{"leaks", "--textfile", promDir}, exitError, `"--textfile" flag: ` + promDir + ` is a directory`},
		{[]string{"leaks", "--textfile", "DIR/x.txt"}, exitError, `"--textfile" flag: want a file name ending in .prom`},
		{[]string{"leaks", "--timeout", "0"}, exitError, `"--timeout" flag: want a positive duration`},
		{[]string{"leaks", "--near-limit", "0"}, exitError, `"0" for "--near-limit" flag: want a fraction in (0, 1]`},
		{[]string{"leaks", "--near-limit", "NaN"}, exitError, `"NaN" for "--near-limit" flag: want a finite number`},
		{[]string{"leaks", "--interval", "0s"}, exitError, `"0s" for "--interval" flag: want a positive duration`},
		{[]string{"leaks", "--for", "-1s"}, exitError, `"-1s" for "--for" flag: want at least 0s`},

		{[]string{"qps", "--timeout", "0"}, exitError, `"--timeout" flag`},
		{[]string{"qps", "lqpn", "x"}, exitError, `filter lqpn "x"`},
		{[]string{"reap"}, exitError, "give one target"},
		{[]string{"reap", "--pid", "5", "--wait", "0s"}, exitError, `"0s" for "--wait" flag: want a positive duration`},
		{[]string{"reap", "--pid", "-4"}, exitError, `"-4" for "--pid" flag: want a process id`},
		{[]string{"reap", "--pid", "0"}, exitError, `"0" for "--pid" flag: want a process id`},
		{[]string{"reap", "--timeout", "0"}, exitError, `"--timeout" flag`},

		{[]string{"rxe", "add", "a/b", "lo"}, exitError, `device name "a/b"`},
		{[]string{"rxe", "add", strings.Repeat("r", 64), "lo"}, exitError, "want 1 to 63 bytes"},
		{[]string{"rxe", "add", "rxe_t", "nosuchnetdev0"}, exitError, `no such net device "nosuchnetdev0"`},
		{[]string{"rxe", "add", "rxe_t", "lo", "--sysfs", "DIR"}, exitUnsupported, "this kernel has no rdma_rxe module"},
		{[]string{"rxe", "add", "rxe_t"}, exitError, "accepts 2 arg(s)"},
		{[]string{"rxe", "del", "--timeout", "0", "x"}, exitError, `"--timeout" flag`},

		{[]string{"scenario", "nope"}, exitError, "nope"},

		{[]string{"trace"}, exitError, "trace: nothing to trace: give a program to run (after --) or --from FILE"},
		{[]string{"trace", "--from", "DIR/x.rec", "--", "true"}, exitError, "trace: give a program to run (after --) or --from FILE, not both"},
		{[]string{"trace", "--report", "DIR/missing/r.txt", "--", "true"}, exitError, "no such file or directory"},
		{[]string{"trace", "--records", "DIR/missing/r.bin", "--", "true"}, exitError, "no such file or directory"},
		{[]string{"trace", "--last-wqe", "sometimes", "--", "true"}, exitError, "want one of auto, raises, never"},
		{[]string{"trace", "--flush-wait", "0", "--", "true"}, exitError, `"--flush-wait" flag: want a positive duration`},
		{[]string{"trace", "--from", "DIR/missing.rec"}, exitError, "no such file or directory"},
		{[]string{"exporter", "--web.telemetry-path", "/"}, exitError, "--web.telemetry-path"},
	})
}

// Ctrl-C stops check at once: one line, exit 130, and no report of the
// probes that did not run.
func TestContractInterrupt(t *testing.T) {
	for _, args := range [][]string{{"check", "--device", "soft"}, {"check", "--device", "soft", "-j"}, {"simulate", "--qps", "4000"}, {"churn", "--events", "100000", "-j"}} {
		sig := make(chan os.Signal, 1)
		sig <- syscall.SIGINT
		stdout, stderr, code := runCLI(sig, args...)
		if code != exitInterrupted || stderr != "qpdrain: interrupted\n" {
			t.Errorf("qpdrain %q interrupted: exit %d, stderr %q; want %d, one line", args, code, stderr, exitInterrupted)
		}
		for _, never := range []string{"interrupt\n", "not run", "could not check", "drain settings", " safe"} {
			if strings.Contains(stdout, never) {
				t.Errorf("qpdrain %q interrupted printed %q:\n%s", args, never, stdout)
			}
		}
		if wantsJSON(args) && stdout != `{"error":"interrupted","exit_code":130}`+"\n" {
			t.Errorf("qpdrain %q interrupted: stdout %q, want the JSON error document", args, stdout)
		}
	}
}

// A file is written whole through a temporary file, or not at all.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, filepath.Join(dir, "x.png"), "old")
	err := writeFileAtomic(path, func(w io.Writer) error {
		w.Write([]byte("half"))
		return errors.New("disk full")
	})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("writeFileAtomic = %v, want the writer's error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old content", b)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("a failed write left %v", left)
	}
	if err := writeFileAtomic(path, func(w io.Writer) error { _, err := w.Write([]byte("new")); return err }); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("the file holds %q, want new", b)
	}
}

// --version and version say the same, from the build info.
func TestVersion(t *testing.T) {
	a, _, code := runCLI(nil, "version")
	b, _, code2 := runCLI(nil, "--version")
	if code != 0 || code2 != 0 || a != b || !strings.HasPrefix(a, "qpdrain ") || !strings.Contains(a, "go1.") {
		t.Errorf("version %q (exit %d), --version %q (exit %d)", a, code, b, code2)
	}
	out, _, _ := runCLI(nil, "version", "-j")
	var v buildVersion
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Go == "" || v.Version == "" {
		t.Errorf("version -j %q: %v", out, err)
	}
}

// The exporter's normal end is a signal: it stops serving and exits 0,
// saying nothing.
func TestContractExporterSignal(t *testing.T) {
	useHost(t, leakyHost(100))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sig := make(chan os.Signal, 1)
	type result struct {
		stdout, stderr string
		code           int
	}
	done := make(chan result, 1)
	go func() {
		o, e, c := runCLI(sig, "exporter", "--listen", addr)
		done <- result{o, e, c}
	}()
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err = http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			break
		}
	}
	if err != nil {
		t.Fatalf("the exporter never served %s: %v", addr, err)
	}
	sig <- syscall.SIGTERM
	select {
	case r := <-done:
		// exporter-toolkit's startup lines (the address, TLS on or off) are
		// all it may have said.
		stderr := regexp.MustCompile(`(?m)^.*msg="(Listening on|TLS is disabled\.)".*\n`).ReplaceAllString(r.stderr, "")
		if r.code != exitClean || r.stdout != "" || stderr != "" {
			t.Errorf("exporter stopped by SIGTERM: exit %d, stdout %q, stderr %q; want 0 and nothing past the startup lines", r.code, r.stdout, r.stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exporter did not stop on SIGTERM")
	}
}
