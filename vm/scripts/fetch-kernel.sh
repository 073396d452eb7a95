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
# apt runs with a private configuration under $RXE_CACHE/apt (sources, lists, archives, an empty
# dpkg status): the host's apt sources, lists and pins are never changed, no root is needed, and
# the host's own `apt-get upgrade` never sees the backports suite. The mirror is the one the host's
# apt already uses for $RXE_DIST (apt-get indextargets), else deb.debian.org (a host that is not
# Debian, such as a CI runner); RXE_APT_MIRROR overrides it. A suite outside $RXE_DIST's family is
# added to the sources from the same mirror.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

suite=${1:?usage: fetch-kernel.sh SUITE}
# The modules, in load order; their `depends` are added before them automatically. crc32_generic is
# not a declared dependency of rdma_rxe (it asks the crypto API for "crc32" at run time), but
# without it `rdma link add` fails. Newer kernels have no such module (rdma_rxe calls the crc32
# library directly): a missing optional module is left out.
optional=" ${RXE_MODULES_OPTIONAL:-crc32_generic} "
# rdma_ucm (with rdma_cm, ib_cm, iw_cm) serves programs that connect through librdmacm.
read -ra modules <<<"${RXE_MODULES:-crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe dummy rdma_ucm}"

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
# --- private apt configuration ---------------------------------------------------------------
apt=$RXE_CACHE/apt
mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/empty.d"
: >"$apt/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || rxe_env_die "$keyring missing (package debian-archive-keyring)"
{
	# The host's Debian sites for $RXE_DIST, -updates and -security, plus -backports.
	# shellcheck disable=SC2016 # apt's own $(FIELD) syntax
	apt-get indextargets --format '$(SITE) $(RELEASE)' 'Created-By: Packages' 2>/dev/null |
		awk -v d="$RXE_DIST" '$2 == d || $2 == d "-updates" || $2 == d "-security"' | sort -u
} >"$apt/sites"
main_site=${RXE_APT_MIRROR:-$(awk -v d="$RXE_DIST" '$2 == d { print $1; exit }' "$apt/sites")}
if [ -z "$main_site" ]; then
	main_site=http://deb.debian.org/debian
	rxe_log "the host's apt has no $RXE_DIST source: using $main_site (RXE_APT_MIRROR overrides it)"
	echo "http://deb.debian.org/debian-security $RXE_DIST-security" >"$apt/sites"
fi
{
	if [ -n "${RXE_APT_MIRROR:-}" ] || ! grep -q " $RXE_DIST\$" "$apt/sites"; then
		echo "$main_site $RXE_DIST"
		echo "$main_site $RXE_DIST-updates"
		awk '$2 ~ /-security$/' "$apt/sites"
	else
		cat "$apt/sites"
	fi
	echo "$main_site $RXE_DIST-backports"
	case $suite in "$RXE_DIST" | "$RXE_DIST"-*) ;; *) echo "$main_site $suite" ;; esac
} | awk -v k="$keyring" '{ printf "deb [signed-by=%s] %s %s main\n", k, $1, $2 }' >"$apt/sources.list"
cat >"$apt/apt.conf" <<EOF
Dir::Etc::SourceList "$apt/sources.list";
Dir::Etc::SourceParts "$apt/empty.d";
Dir::Etc::Parts "$apt/empty.d";
Dir::Etc::Preferences "$apt/empty.d/none";
Dir::Etc::PreferencesParts "$apt/empty.d";
Dir::State::Lists "$apt/lists";
Dir::State::status "$apt/status";
Dir::Cache "$apt";
Dir::Cache::archives "$apt/archives";
APT::Sandbox::User "$(id -un)";
Acquire::Languages "none";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
EOF
export APT_CONFIG=$apt/apt.conf

rxe_log "$suite: apt-get update (private lists in $apt)"
apt-get update -qq --error-on=any >"$apt/update.log" 2>&1 || { cat "$apt/update.log" >&2; rxe_env_die "apt-get update failed (no network?)"; }

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
# download PKG: the cached .deb of PKG at $version, downloaded when missing
download() {
	local p=$1 d part
	d=$(find "$debs" -maxdepth 1 -name "${p}_*.deb" -print -quit)
	if [ -z "$d" ] || ! dpkg-deb --info "$d" >/dev/null 2>&1 ||
		[ "$(dpkg-deb -f "$d" Version)" != "$version" ]; then
		part=$debs/.partial.$$
		rm -rf "$part" && mkdir -p "$part"
		rxe_log "$suite: downloading $p $version"
		(cd "$part" && apt-get download -qq "$p=$version") || { rm -rf "$part"; rxe_env_die "apt-get download $p failed"; }
		rm -f "$debs/${p}"_*.deb
		mv "$part"/*.deb "$debs/"
		rmdir "$part"
		d=$(find "$debs" -maxdepth 1 -name "${p}_*.deb" -print -quit)
	fi
	echo "$d"
}
deb=$(download "$pkg")
# Debian's newer kernels (trixie-backports' 7.x) split the image package: it holds no kernel and
# depends on linux-binary-KVER (vmlinuz) and linux-modules-KVER of the same version.
for p in $(split_parts "$deb"); do download "$p" >/dev/null; done

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
