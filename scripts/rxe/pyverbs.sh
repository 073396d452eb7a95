#!/usr/bin/env bash
# pyverbs.sh: rdma-core's own test suite (Debian's python3-pyverbs ships it in
# /usr/share/doc/rdma-core/tests, run_tests.py) on rxe0, on each kernel in RXE_KERNELS, through
# `qpdrain vm run --python`; then the unittest counts per kernel. `make test-pyverbs` runs it;
# docs/PROVIDERS.md records what the failures say about rxe. Settings: RXE_KERNELS, RXE_CACHE
# (scripts/rxe/common.sh), RXE_TIMEOUT (default 1500 s a kernel), PYVERBS_ARGS (more arguments
# for run_tests.py, e.g. a test name).
# Exit status: qpdrain vm's (0 when the suite passed on every kernel, 1 when it failed on one).
set -uo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
cd "$RXE_ROOT" || exit 3

if ! dpkg-query -W -f='${Status}' python3-pyverbs 2>/dev/null | grep -q 'install ok installed'; then
	[ "$(id -u)" = 0 ] || { echo "pyverbs: python3-pyverbs is missing: sudo apt-get install --no-install-recommends python3-pyverbs" >&2; exit 3; }
	echo "== installing python3-pyverbs"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pyverbs >/dev/null
fi

# Debian compresses most of the suite's files (dh_compress: *.py.gz); python needs them plain.
suite=$RXE_ROOT/.cache/pyverbs/tests
rm -rf "$suite" && mkdir -p "${suite%/*}"
cp -r /usr/share/doc/rdma-core/tests "$suite"
gunzip -f "$suite"/*.gz

mkdir -p .cache
go build -o .cache/qpdrain ./cmd/qpdrain
log=$RXE_ROOT/.cache/pyverbs/vm.log
rc=0
# The GID index is the guest's: the shell expands it there.
# shellcheck disable=SC2016
.cache/qpdrain vm run --cache "$RXE_CACHE" --kernels "$RXE_KERNELS" --providers rxe --timeout "${RXE_TIMEOUT:-1500}s" \
	--python --files /usr/lib/python3/dist-packages/pyverbs --files "$suite" -- \
	sh -c 'exec python3 "$0"/run_tests.py --dev rxe0 --gid "$QPDRAIN_TEST_GID_INDEX" -v "$@"' "$suite" ${PYVERBS_ARGS:-} | tee "$log" || rc=$?

echo "== rdma-core's suite per kernel (unittest: ran, passed, skipped, failures, errors)"
for k in $(sed -n 's/^vm \(PASS\|FAIL\) \[\([^]]*\)\].*/\2/p' "$log" | awk '!seen[$0]++'); do
	r=$RXE_CACHE/run/$k/result.txt
	grep -q '^Ran [0-9]* test' "$r" || { echo "pyverbs [$k]: no unittest result (see $r)"; continue; }
	awk -v k="$k" '
		/^Ran [0-9]+ test/ { ran = $2 }
		/^(OK|FAILED)/ {
			line = $0
			while (match(line, /(failures|errors|skipped|expected failures)=[0-9]+/)) {
				kv = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
				split(kv, p, "="); n[p[1]] = p[2]
			}
		}
		END {
			printf "pyverbs [%s]: ran %d, passed %d, skipped %d, failures %d, errors %d\n", k, ran,
				ran - n["skipped"] - n["failures"] - n["errors"] - n["expected failures"], n["skipped"], n["failures"], n["errors"]
		}' "$r"
done
exit "$rc"
