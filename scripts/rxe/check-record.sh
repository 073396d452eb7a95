#!/usr/bin/env bash
# check-record.sh [DIR]: `qpdrain check --device rxe0 -j` on each kernel in RXE_KERNELS, through
# `qpdrain vm run`, recorded as DIR/rxe-<kernel>.json (default .cache/providers; the rxe stage
# runs it there, `make providers-rxe` into testdata/providers, from which docs/PROVIDERS.md's
# tables are rendered: internal/providers). RXE_CHECK_REPLACE=1 removes DIR's records of kernels
# not in this run. Settings: RXE_KERNELS, RXE_CACHE (scripts/rxe/common.sh), RXE_TIMEOUT.
# Exit status: qpdrain vm's, or 1 when a kernel's record is missing or not the check's JSON.
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
cd "$RXE_ROOT"
out=${1:-$RXE_ROOT/.cache/providers}
mkdir -p .cache
go build -o .cache/qpdrain ./cmd/qpdrain
log=$RXE_ROOT/.cache/check-record.log
echo "== qpdrain check on rxe0, recorded per kernel into $out"
# The markers are internal/providers' BeginMark and EndMark; the check's exit status 1 (the device
# deviates) is a finding, not a failure; its stderr comes after the record, not inside it.
# shellcheck disable=SC2016 # the guest's shell expands it
.cache/qpdrain vm run --cache "$RXE_CACHE" --kernels "$RXE_KERNELS" --files "$RXE_ROOT/.cache/qpdrain" -- \
	sh -c 'echo "@@qpdrain-check-json begin"; "$0" check --device rxe0 -j 2>/tmp/check.err; rc=$?; echo "@@qpdrain-check-json end exit=$rc"; cat /tmp/check.err >&2; [ "$rc" -le 1 ]' \
	"$RXE_ROOT/.cache/qpdrain" | tee "$log"
replace=()
[ "${RXE_CHECK_REPLACE:-0}" = 1 ] && replace=(-replace)
go run ./internal/providers record -out "$out" "${replace[@]}" <"$log"
