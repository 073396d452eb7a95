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
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
status=0
for pkg in drain flushcheck; do
	$GO test -c -o "$dir/$pkg.test" "./$pkg"
	echo "== soak ./$pkg: up to $seeds seeds per body, $per each"
	# Run in the package directory, as go test does, for its testdata.
	(cd "$pkg" && QPDRAIN_TEST_DEVICE=soft QPDRAIN_SOFT_SEEDS="$seeds" QPDRAIN_SOFT_EXPLORE_TIME="$per" \
		"$dir/$pkg.test" -test.run '^TestExplore$' -test.timeout 0) | tee "$dir/$pkg.out" | grep -E '^explore |^(--- )?FAIL|^ok|^PASS' || true
	[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
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
		exit (f > 0 || status != 0)
	}' "$dir/drain.out" "$dir/flushcheck.out"
