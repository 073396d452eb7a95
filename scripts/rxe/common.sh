# shellcheck shell=bash
# Shared settings and helpers of the rxe harness (scripts/rxe-test.sh). Sourced, never run.

# The Go packages whose tests run against rxe0 inside the VM. To add one, add it here.
# A listed package that is not in the tree (yet) is skipped with an error line in the summary;
# one that does not compile fails the run.
RXE_TEST_PKGS=${RXE_TEST_PKGS:-./internal/devtest ./ibv ./drain ./flushcheck ./rdmanl ./cmd/qpdrain}

# The kernels, as Debian suites: linux-image-amd64 of each (bookworm: 6.1, -backports: 6.12).
RXE_KERNELS=${RXE_KERNELS:-bookworm bookworm-backports}

# The repository root and the download cache (ignored by git through .cache/).
RXE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RXE_CACHE=${RXE_CACHE:-$RXE_ROOT/.cache/rxe}
# The Debian release whose kernels are tested; its -backports suite gives the newer series.
RXE_DIST=${RXE_DIST:-bookworm}

# Exit status of a step that could not run here (missing packages, no network, not root):
# rxe-test.sh turns it into "rxe stage did not run" outside CI and into a failure in CI.
RXE_EX_ENV=3

rxe_log() { printf 'rxe: %s\n' "$*" >&2; }
rxe_die() { printf 'rxe: ERROR: %s\n' "$*" >&2; exit 1; }
rxe_env_die() { printf 'rxe: cannot run here: %s\n' "$*" >&2; exit "$RXE_EX_ENV"; }

# rxe_now prints seconds since the epoch with milliseconds.
rxe_now() { printf '%s' "${EPOCHREALTIME:0:-3}"; }

# rxe_since START prints the seconds elapsed since START (from rxe_now), one decimal.
rxe_since() { awk -v a="$1" -v b="$(rxe_now)" 'BEGIN { printf "%.1f", b - a }'; }

command -v go >/dev/null 2>&1 || PATH=/usr/local/go/bin:$PATH
