# shellcheck shell=bash
# Settings of the project's rxe stage (scripts/rxe-test.sh, which runs `qpdrain vm go-test`).
# Sourced, never run.

# The Go packages whose tests run against rxe0 inside the VM. To add one, add it here.
# A listed package that is not in the tree (yet) is skipped with an error line in the summary;
# one that does not compile fails the run.
RXE_TEST_PKGS=${RXE_TEST_PKGS:-./internal/testing/devtest ./internal/testing/cmtest ./librdmacm ./ibv ./libibverbs ./drain ./flushcheck ./rdmanl ./ipoibcm ./ipoibcm/churn ./cmd/qpdrain}

# The providers the packages above run on, once each: rxe (rxe0), siw (siw0), or rxe,siw.
RXE_PROVIDERS=${RXE_PROVIDERS:-rxe}

# soft iWARP's step (when RXE_PROVIDERS leaves siw out): these packages, and of their tests those
# RXE_SIW_TEST_RUN matches, on siw0 (docs/TESTING.md says what skips there and why).
# RXE_SIW_TEST_PKGS= leaves it out.
RXE_SIW_TEST_PKGS=${RXE_SIW_TEST_PKGS-$RXE_TEST_PKGS}
RXE_SIW_TEST_RUN=${RXE_SIW_TEST_RUN:-.}

# The kernels, as Debian suites: linux-image-amd64 of each (bookworm: 6.1, -backports: 6.12,
# trixie-backports: the newest, 7.3 today). qpdrain vm's names work too: 6.1, 6.12, newest, all.
RXE_KERNELS=${RXE_KERNELS:-bookworm bookworm-backports trixie-backports}

# The repository root and the download cache (ignored by git through .cache/).
RXE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RXE_CACHE=${RXE_CACHE:-$RXE_ROOT/.cache/rxe}

command -v go >/dev/null 2>&1 || PATH=/usr/local/go/bin:$PATH
