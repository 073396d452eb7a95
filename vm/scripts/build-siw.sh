#!/usr/bin/env bash
# build-siw.sh KDIR SUITE ERRFILE: builds siw.ko, the kernel's soft iWARP (drivers/infiniband/sw/siw),
# for the kernel in KDIR (from fetch-kernel.sh, which resolved it from SUITE) into KDIR/siw/siw.ko.
# Debian's kernels do not build it (# CONFIG_RDMA_SIW is not set), so it is built out of tree from
# that kernel's own Debian packages, downloaded (never installed) through lib.sh's rxe_apt at the
# kernel package's version: drivers/infiniband/sw/siw from linux-source-MAJOR.MINOR, built against
# linux-headers-KVER (its .config and Module.symvers: vermagic and modversions CRCs match the kernel)
# with linux-headers-KVER-common and linux-kbuild-*, with the host's gcc:
#   make -C linux-headers-KVER M=siw CONFIG_RDMA_SIW=m CC=gcc \
#        CONFIG_DEBUG_INFO_BTF_MODULES= CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT= modules
# (no BTF for the module: it needs pahole and nothing here reads it; -fmin-function-alignment is
# gcc 14's, and without it the kernel's Makefile falls back to -falign-functions of the same size).
# A kbuild tool the host's glibc cannot run (trixie's linux-kbuild needs glibc 2.38, bookworm has
# 2.36: modpost and objtool) runs under the loader and libraries of the kernel's own Debian release
# (libc6 and the libraries linux-kbuild depends on, from SUITE's release, extracted beside it).
# The module's dependencies (modinfo's depends) must be in KDIR/modules.order: vm.sh asks
# fetch-kernel.sh for them (RXE_MODULES_EXTRA).
#
# Built once per kernel: a warm KDIR/siw touches no network, nor does a build from packages already
# in $RXE_CACHE/debs, where they stay.
# On failure the exit status is non-zero and ERRFILE holds one line with the compiler's, apt's or
# modinfo's own words (the whole log is KDIR/siw.log). RXE_SIW_MAKE_ARGS adds make arguments.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

kdir=$(realpath "${1:?usage: build-siw.sh KDIR SUITE ERRFILE}")
suite=${2:?usage: build-siw.sh KDIR SUITE ERRFILE}
errfile=${3:?usage: build-siw.sh KDIR SUITE ERRFILE}
kver=$(cat "$kdir/kver")
out=$kdir/siw
log=$kdir/siw.log
: >"$errfile"
rm -f "$log" # (a fresh file: a cache copied with hard links shares the old one)
if [ -f "$out/.complete" ] && [ -f "$out/siw.ko" ]; then
	exit 0
fi

# fail WHY: the one line vm.sh shows, then exit 1
fail() {
	echo "$*" >"$errfile"
	rxe_log "siw: $kver: ERROR: $*"
	exit 1
}
# apt's failures (rxe_apt, rxe_download) are this kernel's siw failing, not the run's
rxe_env_die() { fail "$*"; }

start=$(rxe_now)
read -r _ version <"$kdir/package"
upstream=${version%%-*}
source_pkg=linux-source-$(cut -d. -f1,2 <<<"$upstream")
release=${suite%-backports}
rxe_log "siw: $kver: building siw.ko from $source_pkg $version (log $log)"

# dl PKG [VERSION]: the package's cached .deb (at VERSION; without one, any cached version), else
# downloaded (VERSION, else the one $release has) once apt's lists are fetched: packages already
# in the cache need no network.
apt_ready=0
dl() {
	local p=$1 v=${2:-} d
	d=$(find "$RXE_CACHE/debs" -maxdepth 1 -name "${p}_*.deb" -print -quit 2>/dev/null || true)
	if [ -n "$d" ] && { [ -z "$v" ] || [ "$(dpkg-deb -f "$d" Version 2>/dev/null)" = "$v" ]; }; then
		echo "$d"
		return
	fi
	if [ "$apt_ready" = 0 ]; then
		rxe_apt "$suite" "$release" >&2
		apt_ready=1
	fi
	if [ -z "$v" ]; then
		# shellcheck disable=SC2016 # awk's fields
		v=$(apt-cache madison "$p" | awk -F'|' -v r=" $release/" 'index($3, r) { gsub(/ /, "", $2); print $2; exit }')
		[ -n "$v" ] || fail "$p: apt knows no version of it in $release (linux-kbuild's tools need it)"
	fi
	rxe_download "$p" "$v"
}

headers=$(dl "linux-headers-$kver" "$version")
parts=("$headers")
for p in $(dpkg-deb -f "$headers" Depends | tr ',' '\n' | awk '$1 ~ /^linux-(headers|kbuild)-/ { print $1 }'); do
	d=$(dl "$p" "$version")
	parts+=("$d")
done
src=$(dl "$source_pkg" "$version")

tmp=$kdir/.siw.$$
rm -rf "$tmp" && mkdir -p "$tmp/root" "$tmp/src"
trap 'rm -rf "$tmp"' EXIT
for d in "${parts[@]}"; do dpkg -x "$d" "$tmp/root"; done
hdr=$tmp/root/usr/src/linux-headers-$kver
[ -f "$hdr/Makefile" ] || fail "linux-headers-$kver $version has no usr/src/linux-headers-$kver/Makefile"
# The headers' Makefile includes the -common package's by its installed path: point it here.
sed -i "s#/usr/src/#$tmp/root/usr/src/#g" "$hdr/Makefile"

# Kbuild tools too new for the host's glibc run under their own release's loader and libraries.
host_glibc=$(getconf GNU_LIBC_VERSION | awk '{ print $2 }')
kbuild=$(find "$tmp/root/usr/lib" -maxdepth 1 -name 'linux-kbuild-*' -print -quit)
wrap=()
while IFS= read -r -d '' f; do
	[ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || continue
	need=$(objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
	[ -n "$need" ] || continue
	[ "$(printf '%s\n%s\n' "$need" "$host_glibc" | sort -V | tail -n 1)" = "$host_glibc" ] || wrap+=("$f")
done < <(find "$kbuild" -type f -perm -u+x -print0)
if [ ${#wrap[@]} -gt 0 ]; then
	kbuild_deb=$(printf '%s\n' "${parts[@]}" | grep '/linux-kbuild-')
	libs=$(dpkg-deb -f "$kbuild_deb" Depends | tr ',' '\n' | awk '$1 ~ /^lib/ { print $1 }')
	rxe_log "siw: $kver: ${#wrap[@]} kbuild tools need a newer glibc than the host's $host_glibc: running them with $release's $(tr '\n' ' ' <<<"$libs")"
	for p in $libs; do
		d=$(dl "$p")
		dpkg -x "$d" "$tmp/libc"
	done
	ld=$tmp/libc/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
	[ -x "$ld" ] || fail "$release's libc6 has no usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
	for f in "${wrap[@]}"; do
		mv "$f" "$f.bin"
		printf '#!/bin/sh\nexec %s --library-path %s:/usr/lib/x86_64-linux-gnu %s "$@"\n' \
			"$ld" "$tmp/libc/usr/lib/x86_64-linux-gnu" "$f.bin" >"$f"
		chmod 755 "$f"
	done
fi

rxe_log "siw: $kver: extracting drivers/infiniband/sw/siw from $(basename "$src")"
dpkg-deb --fsys-tarfile "$src" | tar -xO --wildcards '*/linux-source-*.tar.xz' | xz -dc |
	tar -x -C "$tmp/src" --wildcards '*/drivers/infiniband/sw/siw/*' ||
	fail "$(basename "$src") holds no drivers/infiniband/sw/siw"
b=$(find "$tmp/src" -type d -path '*/drivers/infiniband/sw/siw' -print -quit)
[ -n "$b" ] || fail "$(basename "$src") holds no drivers/infiniband/sw/siw"

read -ra extra <<<"${RXE_SIW_MAKE_ARGS:-}"
t=$(rxe_now)
if ! make -C "$hdr" M="$b" CONFIG_RDMA_SIW=m CC=gcc CONFIG_DEBUG_INFO_BTF_MODULES= \
	CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT= "${extra[@]}" modules >"$log" 2>&1; then
	# the compiler's (or make's) first complaint
	why=$(grep -m 1 -E '(fatal )?error:' "$log" || grep -m 1 -E 'not found|No rule|\*\*\*' "$log" || tail -n 1 "$log")
	fail "make failed: ${why#"$b/"}"
fi
ko=$b/siw.ko
[ -f "$ko" ] || fail "make built no siw.ko (see $log)"
magic=$(modinfo -F vermagic "$ko")
[ "${magic%% *}" = "$kver" ] || fail "siw.ko's vermagic is \"$magic\", the kernel is $kver"
for d in $(modinfo -F depends "$ko" | tr ',' ' '); do
	grep -qx "$d" "$kdir/modules.order" || fail "siw.ko depends on $d, which is not among $kver's modules (modules.order)"
done
rm -rf "$out" && mkdir -p "$out"
cp "$ko" "$out/siw.ko"
echo "$source_pkg $version" >"$out/package"
touch "$out/.complete"
rxe_log "siw: $kver: siw.ko built in $(rxe_since "$t")s ($(rxe_since "$start")s with downloads and extraction; depends: $(modinfo -F depends "$ko"))"
