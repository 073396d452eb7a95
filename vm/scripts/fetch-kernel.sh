#!/usr/bin/env bash
# fetch-kernel.sh SUITE: downloads (never installs) the Debian kernel behind linux-image-amd64 in
# SUITE (bookworm: the 6.1 series; bookworm-backports: 6.12; trixie-backports: the newest the
# archive offers; bullseye: 5.10, on request only), extracts its vmlinuz and the modules qpdrain vm needs, and prints the directory
# that holds them:
#   vmlinuz  vmlinux (when it has a PVH entry)  modules/NAME.ko (decompressed)  modules.order
#   (insmod order)  kver  package
# Everything is cached under $RXE_CACHE; once a suite is resolved a run touches no network.
# RXE_REFRESH=1 resolves the suite again (apt-get update) and fetches a newer kernel if there is one.
#
# apt runs with the private configuration of lib.sh's rxe_apt (never the host's); a suite outside
# $RXE_DIST's family is added to its sources from the same mirror.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

suite=${1:?usage: fetch-kernel.sh SUITE}
# The modules, in load order; their `depends` are added before them automatically. crc32_generic is
# not a declared dependency of rdma_rxe (it asks the crypto API for "crc32" at run time), but
# without it `rdma link add` fails. Newer kernels have no such module (rdma_rxe calls the crc32
# library directly): a missing optional module is left out.
optional=" ${RXE_MODULES_OPTIONAL:-crc32_generic} ${RXE_MODULES_EXTRA:-} "
# rdma_ucm (with rdma_cm, ib_cm, iw_cm) serves programs that connect through librdmacm.
# RXE_MODULES_EXTRA: more modules, each optional (siw's: build-siw.sh checks what siw.ko needs).
read -ra modules <<<"${RXE_MODULES:-crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe dummy rdma_ucm} ${RXE_MODULES_EXTRA:-}"

kernels=$RXE_CACHE/kernels
ref=$kernels/$suite.ref
mkdir -p "$kernels" "$RXE_CACHE/debs"

# vmlinux KDIR: the uncompressed ELF kernel out of KDIR/vmlinuz, as KDIR/vmlinux, when the kernel
# has a PVH entry (CONFIG_PVH): qemu boots it directly, skipping the bzImage's decompressor, which
# under TCG costs ~2.5 s for an xz kernel. Best effort: without it qemu boots vmlinuz.
vmlinux() {
	local k=$1 i off
	local magics=($'\xfd7zXZ' $'\x28\xb5\x2f\xfd' $'\x1f\x8b\x08')
	local unpack=("xz -dc --single-stream" "zstd -qdc" "gzip -dc")
	[ -f "$k/vmlinux" ] && return 0
	grep -q '^CONFIG_PVH=y' "$k/config" 2>/dev/null || return 0
	for i in 0 1 2; do
		off=$(LC_ALL=C grep -abo "${magics[$i]}" "$k/vmlinuz" | head -n 1 | cut -d: -f1 || true)
		[ -n "$off" ] || continue
		# shellcheck disable=SC2086 # the decompressor's command line
		tail -c +"$((off + 1))" "$k/vmlinuz" | ${unpack[$i]} >"$k/vmlinux.tmp" 2>/dev/null || true
		if [ "$(head -c 4 "$k/vmlinux.tmp" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
			mv "$k/vmlinux.tmp" "$k/vmlinux"
			return 0
		fi
	done
	rm -f "$k/vmlinux.tmp"
}

debs=$RXE_CACHE/debs
# split_parts DEB: the packages a split kernel image package depends on for its kernel and modules
split_parts() {
	dpkg-deb -f "$1" Depends | tr ',' '\n' | awk '$1 ~ /^linux-(binary|modules)-[0-9]/ { print $1 }'
}

# parts_cached DEB: every split part of DEB is in the cache
parts_cached() {
	local p
	for p in $(split_parts "$1"); do
		compgen -G "$debs/${p}_*.deb" >/dev/null || return 1
	done
}

# has_modules KDIR: every module asked for is in KDIR (or optional and absent from the package)
has_modules() {
	local m
	for m in "${modules[@]}"; do
		grep -qx "$m" "$1/modules.order" || grep -qx "$m" "$1/modules.absent" 2>/dev/null || return 1
	done
}

deb=
if [ "${RXE_REFRESH:-0}" != 1 ] && [ -f "$ref" ] && [ -f "$kernels/$(cat "$ref")/.complete" ]; then
	kd=$kernels/$(cat "$ref")
	if has_modules "$kd"; then
		vmlinux "$kd"
		echo "$kd"
		exit 0
	fi
	# The pinned kernel lacks a module asked for (the list grew): extract again from its package,
	# when the cache still has it, without resolving the suite again.
	read -r pkg version <"$kd/package"
	deb=$(find "$debs" -maxdepth 1 -name "${pkg}_*.deb" -print -quit)
	if [ -n "$deb" ] && [ "$(dpkg-deb -f "$deb" Version 2>/dev/null)" = "$version" ] && parts_cached "$deb"; then
		rxe_log "$suite: $(cat "$ref") lacks modules of ${modules[*]}: extracting $pkg again"
	else
		deb=
	fi
fi

if [ -z "$deb" ]; then
rxe_apt "$suite"
apt=$RXE_CACHE/apt

# Which kernel: the dependency of the metapackage linux-image-amd64 in that suite. Backports are
# NotAutomatic, so the stock policy already picks $RXE_DIST (+updates, +security) for the base
# suite; any other suite (a -backports one, or an older release such as bullseye, whose versions
# the newer $RXE_DIST would outrank) is chosen with APT::Default-Release.
opts=()
[ "$suite" = "$RXE_DIST" ] || opts=(-o "APT::Default-Release=$suite")
deps=$(apt-cache "${opts[@]}" depends linux-image-amd64) || rxe_env_die "$suite: apt knows no linux-image-amd64"
pkg=$(awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }' <<<"$deps")
[ -n "$pkg" ] || rxe_die "$suite: no linux-image-amd64 dependency found"
version=$(apt-cache "${opts[@]}" show --no-all-versions "$pkg" | awk '$1 == "Version:" { print $2; exit }')
rxe_log "$suite: kernel package $pkg $version"

# --- download ----------------------------------------------------------------------------------
deb=$(rxe_download "$pkg" "$version")
# Debian's newer kernels (trixie-backports' 7.x) split the image package: it holds no kernel and
# depends on linux-binary-KVER (vmlinuz) and linux-modules-KVER of the same version.
for p in $(split_parts "$deb"); do rxe_download "$p" "$version" >/dev/null; done

# The lists (~120 MB with apt's caches) are only needed to resolve a suite again: drop them.
rm -rf "$apt/lists" "$apt"/*.bin
fi

# --- extract -----------------------------------------------------------------------------------
tmp=$kernels/.extract.$$
rm -rf "$tmp" && mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
for d in "$deb" $(for p in $(split_parts "$deb"); do find "$debs" -maxdepth 1 -name "${p}_*.deb" -print -quit; done); do
	rxe_log "$suite: dpkg -x $(basename "$d")"
	dpkg -x "$d" "$tmp/root"
done
# /boot/vmlinuz-KVER, or (split packages) /usr/lib/modules/KVER/vmlinuz
vmlinuz=$(find "$tmp/root" -path '*/boot/vmlinuz-*' -print -quit)
if [ -n "$vmlinuz" ]; then
	kver=${vmlinuz##*/vmlinuz-}
else
	vmlinuz=$(find "$tmp/root" -path '*/lib/modules/*/vmlinuz' -print -quit)
	[ -n "$vmlinuz" ] || rxe_die "$pkg has no boot/vmlinuz-* nor lib/modules/*/vmlinuz"
	kver=${vmlinuz%/vmlinuz}
	kver=${kver##*/}
fi
mdir=$(find "$tmp/root" -path "*/lib/modules/$kver" -type d -print -quit)
[ -n "$mdir" ] || rxe_die "$pkg has no lib/modules/$kver"
kdir=$kernels/$kver
rm -rf "$kdir" && mkdir -p "$kdir/modules"

modfile() { # modfile NAME: the module's file in the package (names may use - or _)
	local alt=${1//_/-}
	find "$mdir/kernel" \( -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" \
		-o -name "$alt.ko" -o -name "$alt.ko.xz" -o -name "$alt.ko.zst" \) -print -quit
}
order=()
add() { # add NAME: add NAME after its dependencies
	local m=$1 f d
	for d in "${order[@]}"; do [ "$d" = "$m" ] && return 0; done
	f=$(modfile "$m")
	if [ -z "$f" ] && [ "${optional#* "$m" }" != "$optional" ]; then
		rxe_log "$kver: optional module $m not in $pkg: left out"
		echo "$m" >>"$kdir/modules.absent"
		return 0
	fi
	[ -n "$f" ] || rxe_die "$kver: module $m not found in $pkg"
	for d in $(modinfo -F depends "$f" | tr ',' ' '); do add "$d"; done
	case $f in
	*.xz) xz -dc "$f" >"$kdir/modules/$m.ko" ;;
	*.zst) zstd -qdc "$f" >"$kdir/modules/$m.ko" ;;
	*) cp "$f" "$kdir/modules/$m.ko" ;;
	esac
	order+=("$m")
}
for m in "${modules[@]}"; do add "$m"; done
printf '%s\n' "${order[@]}" >"$kdir/modules.order"
cp "$vmlinuz" "$kdir/vmlinuz"
cfg=$(find "$tmp/root" \( -path "*/boot/config-$kver" -o -path "*/lib/modules/$kver/config" \) -print -quit)
[ -z "$cfg" ] || cp "$cfg" "$kdir/config"
echo "$kver" >"$kdir/kver"
echo "$pkg $version" >"$kdir/package"
vmlinux "$kdir"
touch "$kdir/.complete"
echo "$kver" >"$ref"
rxe_log "$suite: kernel $kver ready ($(tr '\n' ' ' <"$kdir/modules.order"))"
echo "$kdir"
