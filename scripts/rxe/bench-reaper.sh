#!/usr/bin/env bash
# bench-reaper.sh: the reaper against the device floor on rxe, as docs/BENCH.md measures it:
# drain's BenchmarkDrainDevice/qps=1024/batched (1,024 RC QPs, each with 4 receives counted back
# and a drain WR on its send queue; the floors, batched-poll, and DrainAll fed by Run's loop on the
# completion channel), BENCH_ROUNDS rounds a run (default 20: under an emulator one round can take
# twice another's), BENCH_RUNS runs (default 3) of every kernel in BENCH_KERNELS (default 6.12 6.1;
# qpdrain vm's names), each run one VM per kernel, in turn. The guest has RXE_SMP vCPUs (default 1
# here: rxe's kernel work and the benchmark then share one, and the rounds spread far less than with
# two, docs/BENCH.md). Then a line per kernel and run: the medians of floor-grouped, floor-counted
# and DrainAll, DrainAll's median ratio to floor-grouped (wall, then process CPU) and whether it is
# within BENCH_TARGET (default 1.10). `make bench-rxe` runs it; RXE_CACHE and RXE_TIMEOUT (default
# 1800 s a run) as for the rxe stage (scripts/rxe/common.sh). The logs go to
# .cache/bench-reaper/<UTC time>/run-<N>-<kernel>.log.
# Exit status: 0 when every run of every kernel is within the target, 1 when one is not, 2 when a
# run gave no result (its log is named) or qpdrain vm could not run at all (bad arguments, a host
# that cannot run it, an interrupt: every later run would end the same, so the script stops).
set -uo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
cd "$RXE_ROOT" || exit 2

rounds=${BENCH_ROUNDS:-20}
runs=${BENCH_RUNS:-3}
target=${BENCH_TARGET:-1.10}
kernels=${BENCH_KERNELS:-6.12 6.1}
export RXE_SMP=${RXE_SMP:-1}
for v in "$rounds" "$runs"; do
	case $v in '' | *[!0-9]* | 0) echo "bench-reaper: BENCH_ROUNDS and BENCH_RUNS must be whole numbers from 1, got '$v'" >&2; exit 2 ;; esac
done
awk -v t="$target" 'BEGIN { exit !(t + 0 > 1) }' || { echo "bench-reaper: BENCH_TARGET must be a ratio above 1, got '$target'" >&2; exit 2; }

# a directory a run, so that a later one leaves this one's logs alone
out=$RXE_ROOT/.cache/bench-reaper/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
go build -o .cache/qpdrain ./cmd/qpdrain || exit 2
go test -c -o "$out/drain.test" ./drain || exit 2

# metric LINE NAME: the value before NAME in a benchmark result line
metric() { awk -v m="$2" '{ for (i = 2; i <= NF; i++) if ($i == m) { print $(i - 1); exit } }' <<<"$1"; }

results=()
rc=0
for run in $(seq 1 "$runs"); do
	for k in $kernels; do
		log=$out/run-$run-$k.log
		echo "== run $run of $runs, kernel $k, $rounds rounds, $RXE_SMP vCPU(s): $log"
		vm=0
		.cache/qpdrain vm run --cache "$RXE_CACHE" --kernels "$k" --timeout "${RXE_TIMEOUT:-1800}s" --files "$out/drain.test" -- \
			"$out/drain.test" -test.run '^$' -test.bench 'BenchmarkDrainDevice/qps=1024/batched$' -test.benchtime "${rounds}x" >"$log" 2>&1 || vm=$?
		# 0 and 1 are the guest's verdicts; anything else (docs/VM.md: 2 bad arguments, 3 a host
		# that cannot run it, 130 interrupted) every later run would meet too
		case $vm in 0 | 1) ;; *) cat "$log" >&2; exit 2 ;; esac
		line=$(grep 'BenchmarkDrainDevice/qps=1024/batched' "$log" | grep -m 1 ' batched/floor-grouped' | sed 's/^\[[^]]*\] //')
		if [ -z "$line" ]; then
			results+=("$k run $run: no result (see $log)")
			rc=2
			continue
		fi
		# the last boot's: qpdrain vm boots again under TCG when KVM fails
		accel=$(grep -o '== boot (qemu [A-Za-z]*' "$log" | tail -n 1 | sed 's/== boot (qemu //')
		ratio=$(metric "$line" batched/floor-grouped)
		cpu=$(awk -v a="$(metric "$line" batched-cpu-ms)" -v b="$(metric "$line" floor-grouped-cpu-ms)" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')
		if awk -v r="$ratio" -v t="$target" 'BEGIN { exit !(r <= t) }'; then
			verdict=within
		else
			verdict="NOT within"
			[ "$rc" = 2 ] || rc=1 # no result outranks a miss
		fi
		results+=("$(printf '%s run %d (%s): floor-grouped %s ms, floor-counted %s ms, DrainAll %s ms: %.2fx of floor-grouped (CPU %s), %s %sx' \
			"$k" "$run" "${accel:-?}" "$(metric "$line" floor-grouped-ms)" "$(metric "$line" floor-counted-ms)" \
			"$(metric "$line" batched-ms)" "$ratio" "$cpu" "$verdict" "$target")")
		echo "${results[-1]}"
	done
done
echo "== the reaper on rxe: DrainAll against the grouped device floor, medians of $rounds rounds, $RXE_SMP vCPU(s)"
printf '%s\n' "${results[@]}"
exit "$rc"
