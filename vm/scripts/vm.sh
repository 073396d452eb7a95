#!/usr/bin/env bash
# vm.sh: the driver behind `qpdrain vm go-test` and `qpdrain vm run` (package vm runs it from the
# copy of these scripts it writes into the cache). Builds one payload, then boots one VM per kernel
# with it and prints one verdict. The Go side has checked the arguments and sets:
#   RXE_MODE        go-test | run
#   RXE_SUITES      the kernels, as NAME=SUITE words (6.12=bookworm-backports)
#   RXE_ACCEL       kvm | tcg; RXE_ACCEL_AUTO=1: KVM was not asked for, so a qemu that fails under
#                   KVM before the guest starts (run-vm.sh exits 4) runs that kernel, and the rest,
#                   under TCG; when TCG then starts the guest, run/kvm-fallback gets qemu's message
#                   (package vm records it in the cache's kvm-broken)
#   RXE_CACHE       the cache directory (kernels, debs, private apt state, the last run)
#   RXE_PKGS        go-test: the packages, as go test takes them (./..., ./ibv); run in the module
#                   that holds the current directory
#   RXE_CMD         run: the command line, shell-quoted; RXE_FILES: files and directories to copy,
#                   one absolute path a line; RXE_CWD: the guest's working directory; RXE_PYTHON=1
#   RXE_QPDRAIN_BIN the running qpdrain binary (copied in when RXE_ADD_CMD starts with qpdrain)
#   RXE_PROVIDERS   the providers, space-separated: rxe (rxe0), siw (siw0, its module built per
#                   kernel by build-siw.sh); the payload runs once per provider. A kernel whose
#                   siw.ko cannot be built fails with build-siw.sh's one line, and its rxe still runs
# and passes on RXE_TIMEOUT, RXE_MEM, RXE_SMP, RXE_TEST_ARGS, RXE_GO_TEST_FLAGS, RXE_ADD_CMD, RXE_REFRESH, RXE_DIST.
#
# Exit status: 0 when every kernel passed; 1 when anything failed; 3 when it cannot run here
# (host packages missing and not root, no network to fill the cache).
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
start=$(rxe_now)

echo "vm: [1/4] host packages"
"$here/deps.sh"

export RXE_PROVIDERS=${RXE_PROVIDERS:-rxe}
siw=0
case " $RXE_PROVIDERS " in *" siw "*) siw=1 ;; esac
# siw.ko's dependencies, in load order: crc32c_generic, the "crc32c" that libcrc32c (softdep pre:
# crc32c) and siw's crypto_alloc_shash ask for, then libcrc32c (6.12 and older); newer kernels have
# neither (siw calls the crc32c library), and fetch-kernel.sh leaves them out
[ "$siw" = 0 ] || export RXE_MODULES_EXTRA="crc32c_generic libcrc32c"

echo "vm: [2/4] kernels (cache $RXE_CACHE)"
kdirs=() kprovs=() kerrs=()
for ns in $RXE_SUITES; do
	name=${ns%%=*} suite=${ns#*=}
	kd=$("$here/fetch-kernel.sh" "$suite")
	kdirs+=("$kd")
	echo "vm:   $name ($suite): $(cat "$kd/package") -> $(cat "$kd/kver")"
	provs=$RXE_PROVIDERS err=
	if [ "$siw" = 1 ]; then
		t=$(rxe_now)
		errfile=$(mktemp)
		if "$here/build-siw.sh" "$kd" "$suite" "$errfile"; then
			echo "vm:   $name: siw.ko from $(cat "$kd/siw/package") ready in $(rxe_since "$t")s"
		else
			err="siw.ko for $(cat "$kd/kver") could not be built: $(cat "$errfile")"
			[ -s "$errfile" ] || err="${err}build-siw.sh failed (see above)"
			echo "vm:   $name: $err; siw0 left out, the other providers run"
			provs=$(tr ' ' '\n' <<<"$RXE_PROVIDERS" | grep -vx siw | tr '\n' ' ' | sed 's/ *$//')
		fi
		rm -f "$errfile"
	fi
	kprovs+=("$provs")
	kerrs+=("$err")
done
echo "vm:   kernels ready in $(rxe_since "$start")s"

t=$(rxe_now)
run=$RXE_CACHE/run
mkdir -p "$run"
payload=$run/payload
# The sentinel's token: random, so that no output of the payload can fake a verdict line.
RXE_TOKEN=$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')
export RXE_TOKEN
echo "vm: [3/4] payload ($RXE_MODE)"
units=()
case $RXE_MODE in
go-test)
	"$here/build-tests.sh" "$run/tests"
	mapfile -t units <"$run/tests/pkgs"
	[ ${#units[@]} -gt 0 ] || rxe_die "no test package to run (see above)"
	;;
run)
	rm -rf "$run/tests"
	units=(run)
	;;
*) rxe_die "RXE_MODE=$RXE_MODE: want go-test or run" ;;
esac
"$here/stage.sh" "$run/tests" "$payload"
echo "vm:   payload ($(du -sh "$payload.cpio" | cut -f1)) ready in $(rxe_since "$t")s"

# boot KDIR RUNDIR: one VM of the kernel in KDIR, run-vm.sh's exit status. A guest kernel that
# crashed under TCG before its /init ran, before anything under test (run-vm.sh's 5), is booted once
# more, saying so; a second crash is the kernel's verdict.
boot() {
	local rc=0
	RXE_BOOT_RETRY=1 "$here/run-vm.sh" "$1" "$2/initrd" "$2" "${units[@]}" || rc=$?
	[ "$rc" = 5 ] || return "$rc"
	echo "vm: [$(cat "$1/kver")] the guest kernel crashed before its /init ($(cat "$2/boot-failed")): booting it once more"
	"$here/run-vm.sh" "$1" "$2/initrd" "$2" "${units[@]}"
}

echo "vm: [4/4] one VM per kernel"
failed=0
summaries=()
for i in "${!kdirs[@]}"; do
	kd=${kdirs[$i]}
	kver=$(cat "$kd/kver")
	rd=$run/$kver
	mkdir -p "$rd"
	export RXE_KERNEL_PROVIDERS=${kprovs[$i]} RXE_SIW_ERROR=${kerrs[$i]}
	"$here/build-initrd.sh" "$kd" "$payload.cpio" "$rd/initrd"
	rc=0
	boot "$kd" "$rd" || rc=$?
	if [ "$rc" = 4 ] && [ "${RXE_ACCEL_AUTO:-0}" = 1 ]; then
		why=$(cat "$rd/accel-failed")
		echo "vm: [$kver] KVM failed before the guest started: $why; running it under TCG"
		export RXE_ACCEL=tcg
		rc=0
		boot "$kd" "$rd" || rc=$?
		# TCG started the guest where KVM did not: KVM's fault, remembered for later runs
		if grep -q '^stage init' "$rd/sentinels" 2>/dev/null; then
			echo "$why" >"$run/kvm-fallback"
			echo "vm: TCG started the guest: later runs with this qemu on this host kernel use TCG ($RXE_CACHE/kvm-broken; --accel kvm tries KVM)"
		fi
	fi
	[ "$rc" = 0 ] || failed=1
	summaries+=("$(cat "$rd/summary" 2>/dev/null || echo "vm FAIL [$kver] no summary")")
done

echo "== vm summary ($(rxe_since "$start")s in all)"
npass=0 nfail=0 kpass=0 kfail=0
for s in "${summaries[@]}"; do
	echo "$s"
	case $s in "vm PASS"*) kpass=$((kpass + 1)) ;; *) kfail=$((kfail + 1)) ;; esac
	# one count per provider
	while read -r p f; do
		npass=$((npass + p)) nfail=$((nfail + f))
	done < <(grep -oE 'tests [0-9]+ passed [0-9]+ failed' <<<"$s" | awk '{ print $2, $4 }')
done
# A listed package not in the tree (yet) is an error line, not a failure: branches add packages.
if [ -f "$run/tests/skipped" ]; then
	while IFS= read -r s; do echo "vm ERROR: $s: it was skipped"; done <"$run/tests/skipped"
fi
# The closing line CI reads: go-test counts the tests of every kernel, run counts the kernels.
if [ "$RXE_MODE" = run ]; then
	npass=$kpass nfail=$kfail
fi
if [ "$failed" != 0 ]; then
	echo "vm: FAIL (logs in $run/<kernel>/: result.txt, console.txt)"
	# A kernel can fail outside any test (smoke test, panic, hang): count it.
	[ "$nfail" != 0 ] || nfail=1
	echo "vm: $npass passed, $nfail failed"
	exit 1
fi
echo "vm: $npass passed, $nfail failed"
