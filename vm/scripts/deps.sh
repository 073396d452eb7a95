#!/usr/bin/env bash
# Installs the Debian packages qpdrain vm needs on the host, only those missing (apt-get, as root).
# Exits 3 when they are missing and cannot be installed here (not root), so that qpdrain vm can say
# it did not run. RXE_PYTHON=1 adds python3 (the guest's Python is the host's); siw in RXE_PROVIDERS
# adds what build-siw.sh and siw's smoke test need.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

pkgs=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils libibverbs-dev librdmacm1
	iproute2 cpio kmod xz-utils zstd debian-archive-keyring)
[ "${RXE_PYTHON:-0}" = 1 ] && pkgs+=(python3)
# siw among RXE_PROVIDERS: build-siw.sh builds siw.ko (gcc, make, objdump), rping is its smoke test
case " ${RXE_PROVIDERS:-rxe} " in *" siw "*) pkgs+=(gcc libc6-dev make binutils rdmacm-utils) ;; esac
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		rxe_env_die "missing Debian packages ${missing[*]} (run as root, or: sudo apt-get install --no-install-recommends ${missing[*]})"
	fi
	rxe_log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || rxe_env_die "apt-get update failed"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
		rxe_env_die "apt-get install ${missing[*]} failed"
fi
for c in qemu-system-x86_64 busybox cpio dpkg-deb modinfo xz ldd apt-get; do
	command -v "$c" >/dev/null || rxe_env_die "command $c not found"
done
[ -x /bin/busybox ] || rxe_env_die "/bin/busybox missing"
