#!/usr/bin/env bash
# check-record.sh [DIR]: `qpdrain check --device rxe0 -j` and `--device siw0 -j` on each kernel in
# RXE_KERNELS, through `qpdrain vm run --providers rxe,siw` (RXE_CHECK_PROVIDERS: rxe, siw or
# rxe,siw, the default), recorded as DIR/rxe-<kernel>.json and DIR/siw-<kernel>.json (default
# .cache/providers; the rxe stage runs it there, `make providers-rxe` into testdata/providers, from
# which docs/PROVIDERS.md's tables are rendered: internal/providers). RXE_CHECK_REPLACE=1 removes
# DIR's records of the run's providers on kernels of the default matrix not in this run. The guest
# side is check-guest.sh.
#
# RXE_CHECK_ARGS adds flags to the check (for 5.10: --call-timeout 20s, so that a verbs call stuck
# in the kernel ends the check with its probe hung). RXE_CHECK_EACH=1 runs each probe in a VM of its
# own (--run '^NAME$'), for a kernel where one probe can wedge the guest: record merges the runs into
# one record per kernel, a probe whose VM never finished it shown as locked with the kernel's first
# complaint; RXE_CHECK_PROBES (names, space-separated) runs only those. RXE_TIMEOUT bounds each VM
# in seconds (qpdrain vm's; 480, 150 with RXE_CHECK_EACH=1: a CPU stuck in rxe keeps the guest from
# powering off, so such a probe's VM lasts until then).
# Settings: RXE_KERNELS, RXE_CACHE (scripts/rxe/common.sh).
#   RXE_KERNELS=5.10 RXE_CHECK_EACH=1 RXE_CHECK_ARGS='--call-timeout 20s' scripts/rxe/check-record.sh testdata/providers
# Exit status: qpdrain vm's, or 1 when a kernel's record is missing or not the check's JSON; with
# RXE_CHECK_EACH=1 only the latter (a probe that hangs or locks the guest up is a finding).
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
cd "$RXE_ROOT"
out=${1:-$RXE_ROOT/.cache/providers}
mkdir -p .cache
go build -o .cache/qpdrain ./cmd/qpdrain
log=$RXE_ROOT/.cache/check-record.log
providers=${RXE_CHECK_PROVIDERS:-rxe,siw}
echo "== qpdrain check on each device of $providers, recorded per kernel into $out"
# The check's exit status 1 (the device deviates) or 4 (a call hung) is a finding, not a failure.
read -ra args <<<"${RXE_CHECK_ARGS:-}"
vmrun=(.cache/qpdrain vm run --cache "$RXE_CACHE" --kernels "$RXE_KERNELS" --providers "$providers" --files "$RXE_ROOT/.cache/qpdrain")
if [ "${RXE_CHECK_EACH:-0}" = 1 ]; then
	# The probes, in the check's order, from a run on the soft device (milliseconds), or RXE_CHECK_PROBES.
	read -ra probes <<<"${RXE_CHECK_PROBES:-}"
	[ ${#probes[@]} -gt 0 ] ||
		mapfile -t probes < <(.cache/qpdrain check --device soft -j | grep -oE '"name": "[a-z][a-z-]*"' | cut -d'"' -f4)
	: >"$log"
	for p in "${probes[@]}"; do
		echo "== probe $p"
		RXE_TIMEOUT=${RXE_TIMEOUT:-150} "${vmrun[@]}" -- \
			"$RXE_ROOT/scripts/rxe/check-guest.sh" "$RXE_ROOT/.cache/qpdrain" --probe "$p" "${args[@]}" | tee -a "$log" || true
	done
else
	"${vmrun[@]}" -- \
		"$RXE_ROOT/scripts/rxe/check-guest.sh" "$RXE_ROOT/.cache/qpdrain" "${args[@]}" | tee "$log"
fi
replace=()
[ "${RXE_CHECK_REPLACE:-0}" = 1 ] && replace=(-replace)
go run ./internal/providers record -out "$out" "${replace[@]}" <"$log"
