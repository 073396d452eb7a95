#!/usr/bin/env bash
# rxe-test.sh: runs the project's Go tests against a real Soft-RoCE device (the kernel's rdma_rxe)
# inside qemu, once per Debian kernel in RXE_KERNELS. `make test-rxe` runs it; docs/TESTING.md
# explains it. Settings (environment): RXE_TEST_PKGS and RXE_KERNELS (defaults in
# scripts/rxe/common.sh), RXE_CACHE, RXE_REFRESH=1, RXE_TIMEOUT, RXE_TEST_ARGS, RXE_GO_TEST_FLAGS.
#
# Exit status: 0 when every kernel passed; 1 when a test, a smoke test or the guest failed. When the
# stage cannot run here (packages missing and not root, no network to fill the cache) it says so
# and exits 0 -- unless CI=true, where the rxe stage is required and that is a failure too.
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/rxe/common.sh"
here=$RXE_ROOT/scripts/rxe
start=$(rxe_now)

required=0
case ${CI:-} in true | 1 | yes) required=1 ;; esac

# not_run REASON: the stage cannot run on this machine
not_run() {
	if [ "$required" = 1 ]; then
		echo "rxe: ERROR: the rxe stage is required (CI=$CI) but cannot run: $1" >&2
		exit 1
	fi
	echo "rxe: ***************************************************************************" >&2
	echo "rxe: *** the rxe stage did NOT run: $1" >&2
	echo "rxe: *** nothing was tested against real Soft-RoCE (CI=true makes this an error)" >&2
	echo "rxe: ***************************************************************************" >&2
	exit 0
}
# step WHAT CMD...: runs a harness step; an environment problem (exit 3) becomes not_run
step() {
	local what=$1 rc=0
	shift
	"$@" || rc=$?
	[ "$rc" = 0 ] && return 0
	[ "$rc" = "$RXE_EX_ENV" ] && not_run "$what (see above)"
	exit "$rc"
}

echo "== rxe stage: kernels ($RXE_KERNELS), packages ($RXE_TEST_PKGS)"
echo "rxe: [1/4] host packages"
step "the host lacks packages or commands it needs" "$here/deps.sh"

mkdir -p "$RXE_CACHE"
exec 9>"$RXE_CACHE/lock"
if ! flock -n 9; then
	rxe_log "another rxe run holds $RXE_CACHE/lock; waiting"
	flock 9
fi

echo "rxe: [2/4] kernels (cache $RXE_CACHE)"
kdirs=()
for suite in $RXE_KERNELS; do
	rc=0
	kd=$("$here/fetch-kernel.sh" "$suite") || rc=$?
	[ "$rc" = "$RXE_EX_ENV" ] && not_run "the $suite kernel could not be fetched (see above)"
	[ "$rc" = 0 ] || exit "$rc"
	kdirs+=("$kd")
	echo "rxe:   $suite: $(cat "$kd/package") -> $(cat "$kd/kver")"
done

echo "rxe:   kernels ready in $(rxe_since "$start")s"
t=$(rxe_now)
echo "rxe: [3/4] test binaries (go test -c)"
run=$RXE_CACHE/run
mkdir -p "$run"
"$here/build-tests.sh" "$run/tests"
mapfile -t pkgs <"$run/tests/pkgs"
echo "rxe:   ${#pkgs[@]} test binaries built in $(rxe_since "$t")s"

echo "rxe: [4/4] one VM per kernel"
RXE_TOKEN=$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')
export RXE_TOKEN
failed=0
summaries=()
for kd in "${kdirs[@]}"; do
	kver=$(cat "$kd/kver")
	rd=$run/$kver
	mkdir -p "$rd"
	echo "[$kver] == initramfs"
	"$here/build-initrd.sh" "$kd" "$run/tests" "$rd/initrd"
	"$here/run-vm.sh" "$kd" "$rd/initrd" "$rd" "${pkgs[@]}" || failed=1
	summaries+=("$(cat "$rd/summary" 2>/dev/null || echo "rxe FAIL [$kver] no summary")")
done

echo "== rxe stage summary ($(rxe_since "$start")s in all)"
npass=0 nfail=0
for s in "${summaries[@]}"; do
	echo "$s"
	if [[ $s =~ tests\ ([0-9]+)\ passed\ ([0-9]+)\ failed ]]; then
		npass=$((npass + BASH_REMATCH[1])) nfail=$((nfail + BASH_REMATCH[2]))
	fi
done
while IFS= read -r s; do
	echo "rxe ERROR: RXE_TEST_PKGS lists $s: it was skipped"
done <"$run/tests/skipped"
if [ "$failed" != 0 ]; then
	echo "rxe: FAIL (logs in $run/<kernel>/: result.txt, console.txt)"
	# A kernel can fail outside any test (smoke test, panic, hang): count it.
	[ "$nfail" != 0 ] || nfail=1
	echo "rxe: $npass passed, $nfail failed"
	exit 1
fi
# The plain closing line CI reads: tests run in the guests, all kernels together.
echo "rxe: $npass passed, $nfail failed"
