#!/usr/bin/env bash
# run-vm.sh KDIR INITRD RUNDIR PKG...: boots the kernel in KDIR with INITRD under qemu (KVM when
# RXE_ACCEL=kvm, TCG otherwise), streams
# the guest's output prefixed by the kernel version, and decides the verdict from the sentinel lines
# (never from qemu's exit status, which is 0 whatever the guest did). Exits 0 when the guest set up
# the device of every provider in RXE_PROVIDERS (rxe0, siw0), every smoke test passed, every
# PKG (a test package, or "run": the command of qpdrain vm run) reported exit=0 on each device, and
# the guest powered off by itself. RXE_SIW_ERROR: why siw.ko could not be built for this kernel (a
# failure of its own; the other providers still run).
# Needs RXE_TOKEN (the one baked into INITRD). RXE_TIMEOUT: seconds before qemu is killed (480).
# RXE_MEM: the guest's memory in MiB (1024; at least 256): 100,000 rxe QPs need about 4096.
# RXE_SMP: the guest's vCPUs (2); 1 runs the device's kernel work and the program on one vCPU, whose
# timings under TCG spread less from round to round.
# RXE_OWNER_PID: the qpdrain process; the VM is stopped within a second or two once it is gone.
# Under KVM, a qemu that exits, aborts or hangs (RXE_KVM_START_TIMEOUT seconds, 120, without a line
# from the guest's /init) before the guest's first sentinel line is a KVM failure, whatever qemu
# printed: with RXE_ACCEL_AUTO=1 the script then writes the reason, one line, to RUNDIR/accel-failed
# and exits 4 without a verdict (vm.sh runs the kernel again under TCG); without it, the kernel fails.
# With RXE_BOOT_RETRY=1, a guest kernel that crashes under TCG before its /init exits 5 without a
# verdict, its first complaint in RUNDIR/boot-failed (vm.sh boots it once more).
# RXE_FAIL_ON_WARN=1 also fails on a kernel WARNING; RXE_BOOT=bzimage boots vmlinuz even when
# the uncompressed PVH vmlinux is there. Leaves console.log (ttyS0: firmware and
# kernel), result.log (ttyS1: tests and sentinels), qemu.err and summary in RUNDIR.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

kdir=$(realpath "${1:?usage: run-vm.sh KDIR INITRD RUNDIR PKG...}")
initrd=$(realpath "${2:?usage: run-vm.sh KDIR INITRD RUNDIR PKG...}")
run=$(realpath -m "${3:?usage: run-vm.sh KDIR INITRD RUNDIR PKG...}")
shift 3
pkgs=("$@")
: "${RXE_TOKEN:?RXE_TOKEN must be set}"
deadline=${RXE_TIMEOUT:-480}
mem=${RXE_MEM:-1024}
[[ $mem =~ ^[0-9]+$ ]] && [ "$mem" -ge 256 ] || rxe_die "RXE_MEM=$mem: want the guest's memory in MiB, at least 256"
kver=$(cat "$kdir/kver")
tag="[$kver]"
mark="@@QPDRAIN-RXE $RXE_TOKEN "

mkdir -p "$run"
: >"$run/console.log"
: >"$run/result.log"
: >"$run/stamps"
rm -f "$run/summary" "$run/accel-failed" "$run/kvm-stopped"

# clean: strip carriage returns and terminal escape sequences
clean() { sed -u -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r//g'; }

# show LINE: one line of the guest's output as the host prints it
show() {
	local l=$1 w rest key
	case $l in
	*"$mark"*)
		# output without a final newline, then the sentinel on the same line
		[ -z "${l%%"$mark"*}" ] || echo "$tag ${l%%"$mark"*}"
		rest=${l#*"$mark"}
		rest=${rest% uptime=*}
		w=${rest%% *}
		case $w in
		stage) echo "$tag == ${rest#stage } ($(rxe_since "$t0")s)" ;;
		device) echo "$tag ${rest#device }" ;;
		setup-ok) echo "$tag up:$(for p in ${rest#setup-ok}; do printf ' %s0' "$p"; done)" ;;
		setup-fail) echo "$tag SETUP FAILED: ${rest#setup-fail }" ;;
		smoke-fail) echo "$tag SMOKE FAILED: ${rest#smoke-fail }" ;;
		smoke)
			case $rest in *" exit=0") echo "$tag smoke ${rest#smoke }: ok" ;;
			*) echo "$tag smoke ${rest#smoke }: FAILED" ;; esac ;;
		pkg-start)
			key=${rest#pkg-start }
			case $key in run@*) echo "$tag == command on ${key#run@}" ;;
			*) echo "$tag == go test ${key%@*} on ${key##*@}" ;; esac ;;
		pkg) echo "$tag ${rest#pkg }" ;;
		klog | done) ;;
		*) echo "$tag $rest" ;;
		esac
		# the arrival time of each stage, for the summary
		case $w in
		stage) key=${rest#stage } && echo "${key%% *} $(rxe_now)" >>"$run/stamps" ;;
		setup-ok | done) echo "$w $(rxe_now)" >>"$run/stamps" ;;
		esac
		;;
	*) echo "$tag $l" ;;
	esac
}

kernel=$kdir/vmlinuz
[ -f "$kdir/vmlinux" ] && [ "${RXE_BOOT:-}" != bzimage ] && kernel=$kdir/vmlinux
t0=$(rxe_now)
accel=(-accel tcg -cpu max)
[ "${RXE_ACCEL:-tcg}" = kvm ] && accel=(-accel kvm -cpu host)
smp=${RXE_SMP:-2}
[[ $smp =~ ^[0-9]+$ ]] && [ "$smp" -ge 1 ] && [ "$smp" -le 255 ] || rxe_die "RXE_SMP=$smp: want the guest's vCPUs, 1 to 255"
echo "$tag == boot (qemu ${accel[1]^^}, -smp $smp, -m $mem, ${kernel##*/}, deadline ${deadline}s)"
# A serial console, no network, no reboot; oops=panic (an oops ends the run at once instead of hanging it),
# the console on ttyS0 into console.log, and a second serial port (ttyS1) that only /init writes.
# timeout --foreground stays in this script's process group, so that stopping the run (qpdrain vm
# signals the group) stops qemu too; without it, timeout leads a group of its own and qemu outlives
# the run until its deadline.
timeout --foreground -k 5 "$deadline" qemu-system-x86_64 -nographic -no-reboot -m "$mem" -smp "$smp" "${accel[@]}" \
	-kernel "$kernel" -initrd "$initrd" \
	-append 'console=ttyS0 panic=-1 oops=panic quiet' -nic none -monitor none \
	-serial "file:$run/console.log" -serial "file:$run/result.log" \
	</dev/null 2>"$run/qemu.err" &
qpid=$!
# A heartbeat, so that a long quiet test never looks like a dead run: every 30 s without new
# output it says so. Under KVM it also stops qemu when KVM cannot run the guest: qemu reports "KVM
# internal error" and pauses the vCPU instead of exiting (seen in nested guests whose /dev/kvm opens
# and creates VMs fine), or the guest's /init says nothing within RXE_KVM_START_TIMEOUT seconds; the
# reason goes to kvm-stopped. (The reader below must block in a plain read: bash only reaps qemu,
# and tail only sees it gone, when that read is interrupted by SIGCHLD.)
start_limit=${RXE_KVM_START_TIMEOUT:-120}
(
	last=-1 quiet=0 tick=0 nap=
	trap '[ -z "$nap" ] || kill "$nap" 2>/dev/null; exit 0' TERM
	while true; do
		sleep 1 &
		nap=$!
		wait "$nap"
		# qemu gone (and this script with it, if it was killed): nothing left to watch
		kill -0 "$qpid" 2>/dev/null || exit 0
		# qpdrain gone without stopping the run (SIGKILL, a crash): stop everything it started
		if [ -n "${RXE_OWNER_PID:-}" ] && ! kill -0 "$RXE_OWNER_PID" 2>/dev/null; then
			kill -TERM 0
		fi
		tick=$((tick + 1))
		if [ "${accel[1]}" = kvm ] && ! grep -qF "$mark" "$run/result.log" 2>/dev/null; then
			why=
			if grep -q 'KVM internal error' "$run/qemu.err" 2>/dev/null; then
				why="qemu paused the guest's vCPU; qemu was killed"
			elif [ "$tick" -ge "$start_limit" ]; then
				why="no line from the guest's /init within ${start_limit}s; qemu was killed"
			fi
			if [ -n "$why" ]; then
				echo "$why" >"$run/kvm-stopped"
				kill "$qpid" 2>/dev/null
				exit 0
			fi
		fi
		[ $((tick % 30)) = 0 ] || continue
		size=$(stat -c %s "$run/result.log" 2>/dev/null || echo 0)
		if [ "$size" = "$last" ]; then
			quiet=$((quiet + 30))
			echo "$tag ... no output for ${quiet}s, still running ($(rxe_since "$t0")s since boot)"
		else
			quiet=0
		fi
		last=$size
	done
) &
beat=$!
printed=0
qrc=0
# (stderr closed: bash reports a job killed by a signal, qemu's abort, as "Aborted ... timeout ...",
# when it reaps it; the verdict below says what happened)
{
	while IFS= read -r line || [ -n "$line" ]; do
		show "$line"
		printed=$((printed + 1))
		echo "$printed" >"$run/printed"
	done < <(tail -n +1 -s 0.2 -F --pid="$qpid" "$run/result.log" 2>/dev/null | clean)
	kill "$beat" || true
	wait "$beat" || true
	wait "$qpid" || qrc=$? # (not a failed step: the ERR trap stays quiet)
} 2>/dev/null
wall=$(rxe_since "$t0")

# Whatever the live stream missed (tail exits once qemu is gone) is printed now.
clean <"$run/result.log" >"$run/result.txt"
printed=$(cat "$run/printed" 2>/dev/null || echo 0)
tail -n +"$((printed + 1))" "$run/result.txt" | while IFS= read -r line || [ -n "$line" ]; do show "$line"; done
clean <"$run/console.log" >"$run/console.txt"

# --- verdict -------------------------------------------------------------------------------------
fails=()
# (grep finds nothing when the guest never reached /init: that is a verdict, not an error)
sent() { { grep -F "$mark" "$run/result.txt" || true; } | sed "s/^.*$mark//; s/ uptime=[0-9.]*\$//"; }
sent >"$run/sentinels"
last_stage=$(awk '$1 == "stage" { s = $2 } $1 == "pkg-start" { u = $2; sub(/@/, " on ", u); s = "tests, in " u } $1 == "pkg" { s = "tests" }
	END { print s ? s : "boot" }' "$run/sentinels")
# Under KVM, no sentinel line at all means qemu never started the guest's /init: KVM's failure,
# whatever qemu said (an exit, an abort such as status 134 "failed to set MSR", a pause, a hang).
kvm_failed=
if [ "${accel[1]}" = kvm ] && [ ! -s "$run/sentinels" ]; then
	if [ -s "$run/kvm-stopped" ]; then
		kvm_failed=$(cat "$run/kvm-stopped")
	else
		kvm_failed="qemu exited with status $qrc before the guest started"
	fi
	# qemu's own words: its error lines (not a register dump), else its first lines
	msg=$({ grep -iE 'error|assert|fail|kvm' "$run/qemu.err" || head -n 2 "$run/qemu.err"; } |
		grep -v 'terminating on signal' | head -n 2 | tr '\n' ' ' | cut -c 1-400 | sed 's/ *$//' || true)
	kvm_failed="$kvm_failed; qemu said: ${msg:-nothing}"
	if [ "${RXE_ACCEL_AUTO:-0}" = 1 ]; then
		echo "$kvm_failed" >"$run/accel-failed"
		exec 2>/dev/null # (bash may report qemu's abort on its way out too; vm.sh's line says it)
		exit 4
	fi
fi
# Under TCG, a guest kernel that crashed before its /init (no sentinel; an Oops or a panic on the
# console) failed to boot, before any code under test ran: seen once on 7.3 under TCG with -smp 2
# (an int3 Oops in sched_clock_tick, 1.3 s into boot, where nine other boots were clean), the mark
# of an emulated CPU, not of the kernel. With RXE_BOOT_RETRY=1 the script writes the first complaint
# to RUNDIR/boot-failed and exits 5 without a verdict, and vm.sh boots the kernel once more.
if [ "${accel[1]}" = tcg ] && [ ! -s "$run/sentinels" ] && [ "${RXE_BOOT_RETRY:-0}" = 1 ]; then
	crash=$({ grep -m 1 -E "$RXE_KERNEL_CRASH" "$run/console.txt" || true; } | cut -c 1-200)
	if [ -n "$crash" ]; then
		echo "$crash" >"$run/boot-failed"
		exit 5
	fi
fi
if [ -n "$kvm_failed" ]; then
	fails+=("KVM did not start the guest: $kvm_failed; --accel tcg runs it")
elif [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
	fails+=("TIMEOUT: the guest did not power off within ${deadline}s (last stage: $last_stage); qemu was killed")
elif [ "$qrc" != 0 ]; then
	fails+=("qemu exited with status $qrc: $(tail -n 3 "$run/qemu.err" | tr '\n' ' ')")
fi
if grep -q 'Kernel panic' "$run/console.txt"; then
	fails+=("the guest kernel panicked (last stage: $last_stage)")
elif ! grep -qx 'done' "$run/sentinels" && [ "$qrc" = 0 ]; then
	fails+=("the guest stopped without finishing (last stage: $last_stage)")
fi
[ -z "${RXE_SIW_ERROR:-}" ] || fails+=("siw: $RXE_SIW_ERROR")
while IFS= read -r l; do fails+=("setup: ${l#setup-fail }"); done < <(grep '^setup-fail' "$run/sentinels" || true)
while IFS= read -r l; do
	fails+=("smoke test ${l#smoke } (the image or the kernel's provider is broken, not qpdrain)")
done < <(grep '^smoke ' "$run/sentinels" | grep -v ' exit=0$' || true)
read -ra provs <<<"${RXE_PROVIDERS:-rxe}"
up=$(grep '^setup-ok' "$run/sentinels" | head -n 1 || true)
# per device: "dev: smoke a/b, packages x/y, tests ..." (go-test) or "dev: smoke a/b, command exit N"
percounts=()
# the top-level test results of each package run, from the pkg-start sentinel before them: a line
# "PKG@DEV passed failed skipped Name..." naming the tests that failed, so that a CI log's tail,
# which may hold only the summary, says what failed
# shellcheck disable=SC2016 # awk's program
tresults=$(awk -v m="$mark" 'index($0, m) && index($0, " pkg-start ") { u = substr($0, index($0, " pkg-start ") + 11); sub(/ .*/, "", u); cur = u }
	/^--- PASS/ { p[cur]++ } /^--- FAIL/ { f[cur]++; names[cur] = names[cur] " " $3 } /^--- SKIP/ { k[cur]++ }
	END { for (u in p) seen[u]; for (u in f) seen[u]; for (u in k) seen[u]; for (u in seen) print u, p[u] + 0, f[u] + 0, k[u] + 0 names[u] }' "$run/result.txt")
for prov in "${provs[@]}"; do
	dev=${prov}0
	if [ "$prov" = siw ] && [ -n "${RXE_SIW_ERROR:-}" ]; then
		percounts+=("$dev: not built")
		continue
	fi
	if ! grep -qw "$prov" <<<"${up#setup-ok}"; then
		percounts+=("$dev: not up")
		continue
	fi
	s_all=$(grep -c "^smoke $dev:" "$run/sentinels" || true)
	s_ok=$(grep -c "^smoke $dev:.* exit=0\$" "$run/sentinels" || true)
	ready=1
	[ "$s_all" = "$s_ok" ] && [ "$s_all" != 0 ] || ready=0
	pkg_ok=0
	for p in "${pkgs[@]}"; do
		r=$(grep "^pkg $p@$dev exit=" "$run/sentinels" | tail -n 1 || true)
		if [ -z "$r" ]; then
			[ "$ready" = 0 ] || fails+=("$dev: $p: no result (test binary missing or the guest died in it)")
		elif [ "${r##*exit=}" = 0 ]; then
			pkg_ok=$((pkg_ok + 1))
		elif [ "$p" = run ] && [ "${r##*exit=}" = 127 ]; then
			fails+=("$dev: the command was not found in the guest (exit 127)")
		elif [ "$p" = run ]; then
			fails+=("$dev: the command exited with status ${r##*exit=}")
		elif [ "${r##*exit=}" = 127 ]; then
			fails+=("$dev: $p: test binary missing in the guest")
		else
			names=$(awk -v u="$p@$dev" '$1 == u { $1 = $2 = $3 = $4 = ""; sub(/^ +/, ""); print; exit }' <<<"$tresults")
			fails+=("$dev: $p: go test failed (exit ${r##*exit=}): ${names:-no test reported FAIL (a panic or a timeout: see result.txt)}")
		fi
	done
	if [ "${pkgs[*]}" = run ]; then
		r=$(grep "^pkg run@$dev exit=" "$run/sentinels" | tail -n 1 || true)
		if [ -n "$r" ]; then r="exit ${r##*exit=}"; else r="no result"; fi
		percounts+=("$dev: smoke $s_ok/$s_all, command $r")
	else
		read -r np nf ns < <(awk -v d="$dev" '{ sub(/.*@/, "", $1) } $1 == d { p += $2; f += $3; k += $4 } END { print p + 0, f + 0, k + 0 }' <<<"$tresults") || true
		percounts+=("$dev: smoke $s_ok/$s_all, packages $pkg_ok/${#pkgs[@]}, tests $np passed $nf failed $ns skipped")
	fi
done
klog=$(grep '^klog ' "$run/sentinels" | sed 's/^klog //' || true)
warns=$(grep -c 'WARNING' <<<"$klog" || true)
if grep -qE 'BUG|Oops' <<<"$klog"; then
	fails+=("the guest kernel logged a BUG/Oops")
fi
if [ "$warns" != 0 ]; then
	[ "${RXE_FAIL_ON_WARN:-0}" = 1 ] && fails+=("the guest kernel logged $warns WARNING(s)")
fi
if [ -n "$klog" ]; then
	echo "$tag kernel log (rxe, warnings):"
	while IFS= read -r l; do echo "$tag   $l"; done <<<"$klog"
fi
if [ ${#fails[@]} -gt 0 ] && ! grep -qx 'done' "$run/sentinels"; then
	# The guest did not finish: show where the kernel's trouble starts, the first functions of its
	# call trace (those the unwinder is sure of, not its "?" guesses: they name the code at fault,
	# which a caller may match), then how the console ends.
	first=$(grep -nE "$RXE_KERNEL_COMPLAINT" "$run/console.txt" | head -n 1 | cut -d: -f1 || true)
	if [ -n "$first" ]; then
		echo "$tag the guest kernel's first complaint ($run/console.txt:$first):"
		tail -n +"$first" "$run/console.txt" | head -n 15 | sed "s/^/$tag   /" || true
		tail -n +"$first" "$run/console.txt" | awk '/Call Trace:/ { t = 1; next }
			t && (/<\/TASK>/ || /end trace/) { exit }
			t && !/ \? / && /\+0x/ { print; if (++n == 8) exit }' | sed "s/^/$tag   call trace: /" || true
		{ grep 'Kernel panic' "$run/console.txt" || true; } | head -n 1 | sed "s/^/$tag   /"
	fi
	echo "$tag last lines of the guest console:"
	{ grep -v '^$' "$run/console.txt" || true; } | tail -n 12 | sed "s/^/$tag   /"
fi

# times per stage from the host's clock when each sentinel arrived
stamp() { awk -v s="$1" '$1 == s { print $2; exit }' "$run/stamps"; }
span() { # span FROM TO: seconds between two stamps (FROM "t0": qemu start)
	local a b
	if [ "$1" = t0 ]; then a=$t0; else a=$(stamp "$1"); fi
	b=$(stamp "$2")
	[ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1fs", b - a }' || echo "-"
}
times="first test $(span t0 tests), boot $(span t0 init), setup $(span init setup-ok), smoke $(span setup-ok tests), tests $(span tests 'done')"
counts=$(printf '%s; ' "${percounts[@]}")
counts="${counts}kernel warnings $warns"
if [ ${#fails[@]} -eq 0 ]; then
	verdict=PASS
else
	verdict=FAIL
	for f in "${fails[@]}"; do echo "$tag FAIL: $f"; done
fi
echo "vm $verdict [$kver] $counts; wall ${wall}s ($times)" | tee "$run/summary"
[ "$verdict" = PASS ] || exit 1
