#!/usr/bin/env bash
# make soak: explores many adversarial schedules of the soft device with the
# drain and flush-check test bodies (devtest.Explore), each body bounded in
# time, and prints "N passed, N failed" over every seed explored.
#   SOAK_SEEDS  seeds per body (default 100000)
#   SOAK_TIME   how long each body keeps starting seeds (default 20s)
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
seeds=${SOAK_SEEDS:-100000}
per=${SOAK_TIME:-20s}
# A bare number is seconds; anything else must be a Go duration, checked here so that a typo is one
# clear error rather than every body failing at its start.
case $per in *[!0-9]*) ;; *) per=${per}s ;; esac
[[ $per =~ ^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$ ]] || { echo "soak: SOAK_TIME=$per is not a duration (20s, 1m30s)" >&2; exit 2; }
[[ $seeds =~ ^[1-9][0-9]*$ ]] || { echo "soak: SOAK_SEEDS=$seeds is not a positive number" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0
for pkg in drain flushcheck; do
	$GO test -c -o "$dir/$pkg.test" "./$pkg"
	echo "== soak ./$pkg: up to $seeds seeds per body, $per each"
	# Run in the package directory, as go test does, for its testdata.
	# The test binary's own status, not the filter's: grep finding nothing is no failure, a binary
	# that failed is one even when it printed no summary.
	rc=0
	(cd "$pkg" && QPDRAIN_TEST_DEVICE=soft QPDRAIN_SOFT_SEEDS="$seeds" QPDRAIN_SOFT_EXPLORE_TIME="$per" \
		"$dir/$pkg.test" -test.run '^TestExplore$' -test.timeout 0) >"$dir/$pkg.out" 2>&1 || rc=$?
	grep -E '^explore |^(--- )?FAIL|^ok|^PASS' "$dir/$pkg.out" || true
	if [ "$rc" != 0 ]; then
		echo "soak: ./$pkg's test binary exited $rc (its last lines follow)" >&2
		tail -n 20 "$dir/$pkg.out" >&2
		status=1
	fi
done
# Summary lines: "explore NAME: P passed, F failed in S.SSSs (R seeds a second)".
awk -v status="$status" '
	/^explore / {
		p += $3; f += $5; sec = $8; sub(/s$/, "", sec)
		if (FILENAME ~ /drain[.]out$/) { dn += $3 + $5; dt += sec }
	}
	END {
		if (dt > 0) printf "soak: drain bodies: %d seeds in %.1f s, %.0f seeds a second\n", dn, dt, dn / dt
		printf "soak: %d passed, %d failed\n", p, f
		# No seed explored is no evidence: a soak that ran nothing fails.
		if (p + f == 0) print "soak: no seed was explored" > "/dev/stderr"
		exit (f > 0 || status != 0 || p + f == 0)
	}' "$dir/drain.out" "$dir/flushcheck.out"
