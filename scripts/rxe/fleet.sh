#!/usr/bin/env bash
# fleet.sh: the fleet end to end on rxe (docs/LEAKS.md, "The fleet end to end"): cmd/qpdrain's
# TestFleetPrometheusRxe in the guest through `qpdrain vm run`, with Debian's prometheus copied in
# beside the test binary and deploy/qpdrain-rules.yaml: a planted leak, the real qpdrain exporter
# over TLS with basic auth, a real Prometheus with the shipped rules, the leak alert pending, firing
# and resolved after qpdrain reap, the exporter-down alert pending and firing. The rxe stage runs it
# (scripts/rxe-test.sh); `make demo-fleet` runs it with FLEET_PLOT=FILE.png, which plots the series
# the test read from Prometheus. Settings: FLEET_KERNELS (default 6.12), RXE_CACHE, RXE_TIMEOUT.
# Exit status: qpdrain vm's (0 passed, 1 failed, 3 cannot run here); 2 when prometheus is missing.
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"
cd "$RXE_ROOT"

prom=$(command -v prometheus) || {
	echo "fleet: prometheus is missing (Debian's package prometheus; scripts/deps.sh installs it)" >&2
	exit 2
}
out=$RXE_ROOT/.cache/fleet
mkdir -p "$out"
go build -o .cache/qpdrain ./cmd/qpdrain
go test -c -o "$out/qpdrain.test" ./cmd/qpdrain
# The test runs in cmd/qpdrain's path, where it finds ../../deploy/qpdrain-rules.yaml.
cd cmd/qpdrain
rc=0
"$RXE_ROOT/.cache/qpdrain" vm run --cache "$RXE_CACHE" --kernels "${FLEET_KERNELS:-6.12}" \
	--timeout "${RXE_TIMEOUT:-480}s" --files "$prom" --files ../../deploy/qpdrain-rules.yaml -- \
	"$out/qpdrain.test" -test.run '^TestFleetPrometheusRxe$' -test.v -test.timeout 400s \
	-qpdrain.prometheus="$prom" | tee "$out/vm.log" || rc=$?
# A test that skipped did not run: the fleet was not seen.
if grep -q -- '--- SKIP: TestFleetPrometheusRxe' "$out/vm.log"; then
	echo "fleet: TestFleetPrometheusRxe skipped" >&2
	exit 1
fi
if [ "$rc" = 0 ] && [ -n "${FLEET_PLOT:-}" ]; then
	cd "$RXE_ROOT"
	sed -n 's/^\[[^]]*\] @@FLEET //p' "$out/vm.log" >"$out/series.txt"
	go run ./metrics/internal/fleetplot -o "$FLEET_PLOT" <"$out/series.txt"
	echo "fleet: plot of the run: $FLEET_PLOT"
fi
exit "$rc"
