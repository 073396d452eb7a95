#!/usr/bin/env bash
# rxe-test.sh: the project's rxe stage: its Go tests against a real Soft-RoCE device (the kernel's
# rdma_rxe) inside qemu, once per kernel in RXE_KERNELS, through `qpdrain vm go-test` (the same
# harness other projects use; docs/VM.md), then RXE_SIW_TEST_PKGS on siw0, then
# qpdrain trace's planted programs on rxe0 and rping on siw0, then the fleet end to end (scripts/rxe/fleet.sh), then qpdrain
# vm's own VM tests (red runs on purpose).
# `make test-rxe` runs it; docs/TESTING.md explains it. Settings (environment): RXE_TEST_PKGS,
# RXE_KERNELS, RXE_PROVIDERS, RXE_SIW_TEST_PKGS and RXE_SIW_TEST_RUN (defaults in scripts/rxe/common.sh), RXE_CACHE, RXE_REFRESH=1, RXE_TIMEOUT,
# RXE_TEST_ARGS, RXE_GO_TEST_FLAGS, RXE_ADD_CMD, RXE_TRACE_PROVIDERS (the trace step's, default rxe,siw);
# RXE_VM_SELFTEST=0 leaves out qpdrain vm's tests,
# RXE_CHECK_RECORD=0 the check's records (scripts/rxe/check-record.sh).
#
# Exit status: 0 when every kernel passed; 1 when a test, a smoke test or the guest failed. When the
# stage cannot run here (packages missing and not root, no network to fill the cache) it says so
# and exits 0 -- unless CI=true, where the rxe stage is required and that is a failure too.
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/rxe/common.sh"

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

# timed NAME CMD...: runs CMD, adding "NAME Ns" (its status when not 0) to the times the stage prints
# at its end, however it ends, so that a run says what each step cost (docs/TESTING.md)
times=()
timed() {
	local name=$1 t0=$SECONDS rc=0
	shift
	"$@" || rc=$?
	times+=("$name $((SECONDS - t0))s$([ "$rc" = 0 ] || echo " (exit $rc)")")
	return "$rc"
}
# siw's listener can lose a reference it still needs when one of its connections ends in an error
# (the kernel then warns in siw_cep_put, drivers/infiniband/sw/siw/siw_cm.c), and a connect to it is
# refused; its teardown can corrupt the listener list (a list_del BUG in siw_destroy_listen on 6.1, a
# panic): kernel bugs, not the code under test (docs/PROVIDERS.md). Either shows as a kernel
# complaint with a siw function in its trace (qpdrain vm prints the first frames of a crash's).
# again_on_siw_bug NAME LOG CMD... runs CMD, timed as "NAME run N", again while it fails with such a
# complaint in LOG (where CMD writes its output), saying which, up to three runs in all; a failure
# without one, or a third one, returns 1.
siw_kernel_bug='siw_cep_put|siw_[a-z_]+\+0x'
again_on_siw_bug() {
	local name=$1 log=$2 run bug
	shift 2
	for run in 1 2 3; do
		timed "$name run $run" "$@" && return 0
		bug=$(grep -m 1 -oE "$siw_kernel_bug" "$log") && [ "$run" != 3 ] || return 1
		echo "== $name run $run failed with siw's kernel bug ($bug) in the kernel log: again"
	done
}
report_times() {
	[ "${#times[@]}" = 0 ] && return
	local all
	printf -v all '%s; ' "${times[@]}"
	echo "rxe stage times: ${all%; }"
}
trap report_times EXIT

cd "$RXE_ROOT"
echo "== rxe stage: kernels ($RXE_KERNELS), packages ($RXE_TEST_PKGS)"
mkdir -p .cache
go build -o .cache/qpdrain ./cmd/qpdrain
rc=0
# shellcheck disable=SC2086 # RXE_TEST_PKGS is a list
timed "device tests" .cache/qpdrain vm go-test --cache "$RXE_CACHE" --kernels "$RXE_KERNELS" --providers "$RXE_PROVIDERS" $RXE_TEST_PKGS || rc=$?
[ "$rc" = 3 ] && not_run "qpdrain vm cannot run here (see above)"
[ "$rc" = 0 ] || exit "$rc"

case ",${RXE_PROVIDERS// /,}," in *,siw,* | *,all,*) ;; *)
	if [ -n "$RXE_SIW_TEST_PKGS" ]; then
		echo "== siw step: $RXE_SIW_TEST_PKGS on siw0, tests $RXE_SIW_TEST_RUN"
		siw_step() {
			# shellcheck disable=SC2086 # RXE_SIW_TEST_PKGS is a list
			.cache/qpdrain vm go-test --cache "$RXE_CACHE" --kernels "$RXE_KERNELS" --providers siw $RXE_SIW_TEST_PKGS \
				-- -test.run "$RXE_SIW_TEST_RUN" 2>&1 | tee .cache/siw-step.log
		}
		again_on_siw_bug "siw step" .cache/siw-step.log siw_step || exit 1
	fi
	;;
esac

# On siw0 (iWARP, connected only through the RDMA CM) the planted programs, which connect by hand,
# do not run: rping (librdmacm) does.
RXE_TRACE_PROVIDERS=${RXE_TRACE_PROVIDERS:-rxe,siw}
echo "== qpdrain trace's planted programs on rxe, rping on siw, providers $RXE_TRACE_PROVIDERS (docs/TRACE.md)"
QPDRAIN_VM_TEST=1 QPDRAIN_VM_CACHE=$RXE_CACHE RXE_KERNELS=$RXE_KERNELS RXE_PROVIDERS=$RXE_TRACE_PROVIDERS timed trace go test -short -count=1 -timeout 30m -run '^TestVMTrace$' ./trace

echo "== the fleet end to end on rxe: qpdrain exporter, Prometheus and the alert rules (docs/LEAKS.md)"
timed fleet scripts/rxe/fleet.sh

# qpdrain check on each kernel, recorded (make providers-rxe keeps them; docs/PROVIDERS.md). Its siw0
# probes connect through the RDMA CM, where siw's listener bug refused them on 6.12 in CI
# (2026-12-05: every probe after the first pair "connecting: connection refused").
if [ "${RXE_CHECK_RECORD:-1}" != 0 ]; then
	again_on_siw_bug "check records" .cache/check-record.log scripts/rxe/check-record.sh || exit 1
fi

if [ "${RXE_VM_SELFTEST:-1}" != 0 ]; then
	# -v: each test's time, and the KVM fallback lines of TestVMKVMFallback (a fake qemu that fails
	# under KVM); TestVMStopKillsQEMU signals the binary built above.
	echo "== qpdrain vm's own tests (red runs on purpose)"
	QPDRAIN_VM_TEST=1 QPDRAIN_VM_CACHE=$RXE_CACHE QPDRAIN_VM_BIN=$RXE_ROOT/.cache/qpdrain \
		timed "vm's own tests" go test -count=1 -v -timeout 30m -run '^TestVM' ./vm
fi
