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

# RXE_KERNEL_CRASH matches the line a kernel crash report begins with (an extended regex): a BUG
# or an Oops and its "invalid opcode" or "general protection", a data-corruption check's message
# printed before its BUG (lib/list_debug.c: "list_del corruption, ..."), a panic.
RXE_KERNEL_CRASH='BUG:|kernel BUG at|Oops|invalid opcode:|general protection|Unable to handle kernel|list_(add|del) corruption|Kernel panic'
# RXE_KERNEL_COMPLAINT matches the first line of any kernel report of trouble: a crash, a WARNING
# (its "cut here" line first), a lockup or a hung task, a sysrq trigger.
# Used by the scripts that source this file (run-vm.sh).
# shellcheck disable=SC2034
RXE_KERNEL_COMPLAINT="$RXE_KERNEL_CRASH|cut here|WARNING:|sysrq: Trigger|hung_task|soft lockup"

# rxe_now prints seconds since the epoch with milliseconds.
rxe_now() { printf '%s' "${EPOCHREALTIME:0:-3}"; }

# rxe_since START prints the seconds elapsed since START (from rxe_now), one decimal.
rxe_since() { awk -v a="$1" -v b="$(rxe_now)" 'BEGIN { printf "%.1f", b - a }'; }

command -v go >/dev/null 2>&1 || PATH=$PATH:/usr/local/go/bin

# A step that dies under set -e says where, so that no failure is silent.
trap 'rxe_log "ERROR: ${0##*/} line $LINENO: \`$BASH_COMMAND\` failed"' ERR

# rxe_apt SUITE...: the private apt configuration under $RXE_CACHE/apt (sources, lists, an empty
# dpkg status), with the lists of $RXE_DIST (+updates, +security, +backports) and of each SUITE
# outside that family, brought up to date (apt-get update); APT_CONFIG is exported. The host's apt
# sources, lists and pins are never changed, no root is needed, and the host's own `apt-get
# upgrade` never sees these suites. The mirror is the one the host's apt already uses for
# $RXE_DIST (apt-get indextargets), else deb.debian.org (a host that is not Debian, such as a CI
# runner); RXE_APT_MIRROR overrides it. Exits 3 when the lists cannot be fetched, with apt's words.
rxe_apt() {
	local apt=$RXE_CACHE/apt keyring=/usr/share/keyrings/debian-archive-keyring.gpg main_site s
	mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$apt/empty.d"
	: >"$apt/status"
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
		for s in "$@"; do
			case $s in "$RXE_DIST" | "$RXE_DIST"-*) ;; *) echo "$main_site $s" ;; esac
		done
	} | awk -v k="$keyring" '!seen[$0]++ { printf "deb [signed-by=%s] %s %s main\n", k, $1, $2 }' >"$apt/sources.list"
	cat >"$apt/apt.conf" <<EOC
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
EOC
	export APT_CONFIG=$apt/apt.conf
	rxe_log "apt-get update for $* (private lists in $apt)"
	if ! apt-get update -qq --error-on=any >"$apt/update.log" 2>&1; then
		cat "$apt/update.log" >&2
		rxe_env_die "apt-get update failed (no network?): $(grep -m 1 -E '^(E|Err|W):' "$apt/update.log" || tail -n 1 "$apt/update.log")"
	fi
}

# rxe_download PKG VERSION: prints the cached .deb of PKG at VERSION under $RXE_CACHE/debs,
# downloaded with the configuration of rxe_apt (which must have run) when it is missing.
rxe_download() {
	local p=$1 v=$2 debs=$RXE_CACHE/debs d part
	mkdir -p "$debs"
	d=$(find "$debs" -maxdepth 1 -name "${p}_*.deb" -print -quit)
	if [ -z "$d" ] || ! dpkg-deb --info "$d" >/dev/null 2>&1 || [ "$(dpkg-deb -f "$d" Version)" != "$v" ]; then
		part=$debs/.partial.$$
		rm -rf "$part" && mkdir -p "$part"
		rxe_log "downloading $p $v"
		(cd "$part" && apt-get download -qq "$p=$v" 2>"$part.err") ||
			{ cat "$part.err" >&2; rm -rf "$part" "$part.err"; rxe_env_die "apt-get download $p=$v failed: $(grep -m 1 -E '^(E|W):' "$part.err" 2>/dev/null || echo 'see above')"; }
		rm -f "$debs/${p}"_*.deb "$part.err"
		mv "$part"/*.deb "$debs/"
		rmdir "$part"
		d=$(find "$debs" -maxdepth 1 -name "${p}_*.deb" -print -quit)
	fi
	echo "$d"
}
