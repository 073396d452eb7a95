# shellcheck shell=bash
# Helpers of qpdrain vm's scripts. Sourced, never run. The Go side (package vm) sets RXE_CACHE and
# the rest of the environment each script documents.

RXE_CACHE=${RXE_CACHE:?RXE_CACHE must be set}
# The Debian release whose mirror and -updates/-security suites the private apt configuration uses.
RXE_DIST=${RXE_DIST:-bookworm}

# Exit status of a step that could not run here (missing packages, no network, not root):
# `qpdrain vm` exits 3 ("not supported here") with it.
RXE_EX_ENV=3

rxe_log() { printf 'rxe: %s\n' "$*" >&2; }
rxe_die() { printf 'rxe: ERROR: %s\n' "$*" >&2; exit 1; }
rxe_env_die() { printf 'rxe: cannot run here: %s\n' "$*" >&2; exit "$RXE_EX_ENV"; }

# rxe_now prints seconds since the epoch with milliseconds.
rxe_now() { printf '%s' "${EPOCHREALTIME:0:-3}"; }

# rxe_since START prints the seconds elapsed since START (from rxe_now), one decimal.
rxe_since() { awk -v a="$1" -v b="$(rxe_now)" 'BEGIN { printf "%.1f", b - a }'; }

command -v go >/dev/null 2>&1 || PATH=$PATH:/usr/local/go/bin

# A step that dies under set -e says where, so that no failure is silent.
trap 'rxe_log "ERROR: ${0##*/} line $LINENO: \`$BASH_COMMAND\` failed"' ERR
