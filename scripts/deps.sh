#!/usr/bin/env bash
# Installs the Debian packages qpdrain's build and tests need, only those missing.
set -euo pipefail
pkgs=(gcc libc6-dev pkg-config libibverbs-dev)
# librdmacm's header (rdma/rdma_cma.h) for package librdmacm, which opens the library at run time.
pkgs+=(librdmacm-dev)
# rping (rdmacm-utils), traced on rxe by the trace package's VM test.
pkgs+=(rdmacm-utils)
# promtool (package prometheus) checks the metrics qpdrain leaks and qpdrain exporter write.
pkgs+=(prometheus)
# The shell scripts are checked by shellcheck (make vet).
pkgs+=(shellcheck)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages ${missing[*]}; run as root or install them" >&2
	exit 1
fi
echo "== installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
