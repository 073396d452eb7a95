#!/usr/bin/env bash
# stage.sh TESTDIR OUT: the part of the initramfs every kernel shares, as OUT.cpio (newc,
# uncompressed): a busybox root with the host's rdma-core user space (libibverbs, the rxe provider,
# ibv_devinfo, ibv_rc_pingpong, ibv_srq_pingpong), iproute2's ip and rdma, the payload, every
# library ldd names, init as /init and its configuration. build-initrd.sh adds a kernel's modules.
# The payload: go-test, the test binaries in TESTDIR (from build-tests.sh); run, RXE_FILES (each at
# its own path; the libraries of every ELF file among them) and, with RXE_PYTHON=1, the host's
# /usr/bin/python3 and its standard library. The guest's settings come from the environment:
# RXE_TOKEN (required), RXE_MODE, RXE_CMD, RXE_CWD, RXE_TEST_TIMEOUT, RXE_TEST_ARGS,
# RXE_SMOKE_TIMEOUT, RXE_ACTIVE_TIMEOUT, RXE_ADD_CMD (how /init creates rxe0), RXE_PROVIDERS (rxe,
# siw or both, space-separated).
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

tdir=$(realpath -m "${1:?usage: stage.sh TESTDIR OUT}")
out=$(realpath -m "${2:?usage: stage.sh TESTDIR OUT}")
: "${RXE_TOKEN:?RXE_TOKEN must be set}"
mode=${RXE_MODE:-go-test}

root=$out
rm -rf "$root" && mkdir -p "$root"
cd "$root"
mkdir -p usr/bin usr/sbin usr/lib/modules usr/lib64 etc/libibverbs.d etc/qpdrain-rxe \
	dev proc sys tmp root run tests src
# Merged /usr, as on the host: ldd's /lib/... and /lib64/... paths resolve inside the image.
ln -s usr/bin bin
ln -s usr/sbin sbin
ln -s usr/lib lib
ln -s usr/lib64 lib64

# copy_libs FILE: every library ldd names for FILE, at its own path (ldd fails on static
# binaries; they need nothing). A library ldd cannot find fails the run here, before any boot.
copy_libs() {
	local l libs
	libs=$(ldd "$1" 2>/dev/null || true)
	if grep -q 'not found' <<<"$libs"; then
		rxe_die "$1 needs $(awk '/not found/ { printf "%s ", $1 }' <<<"$libs")which ldd cannot find on the host: missing library"
	fi
	for l in $(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$libs"); do
		[ -e "$root/$l" ] && continue
		mkdir -p "$root/$(dirname "$l")"
		cp -L "$l" "$root/$l"
	done
}
# is_elf FILE: FILE starts with the ELF magic
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }
# copy_elf FILE...: each file at its own path, and its libraries
copy_elf() {
	local f
	for f in "$@"; do
		[ -e "$f" ] || rxe_env_die "$f missing on the host"
		mkdir -p "$root/$(dirname "$f")"
		cp -L "$f" "$root/$f"
		copy_libs "$f"
	done
}
# copy_tree PATH: a file or directory at its own path (symlinks followed), with the libraries of
# every ELF file in it
copy_tree() {
	local p=$1 f
	[ -e "$p" ] || rxe_die "$p: no such file or directory on the host"
	mkdir -p "$root/$(dirname "$p")"
	cp -rL --remove-destination "$p" "$root/$(dirname "$p")/"
	while IFS= read -r -d '' f; do
		if is_elf "$f"; then copy_libs "$f"; fi
	done < <(find "$p" -type f -print0)
}

# RXE_PROVIDERS: the kernel providers the guest sets up (rxe, siw); each needs rdma-core's user
# space provider (the host's: a library and its .driver file); siw's smoke test is rping.
providers=${RXE_PROVIDERS:-rxe}
copy_elf /usr/sbin/ip /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ibv_srq_pingpong
for prov in $providers; do
	lib=$(find /usr/lib/x86_64-linux-gnu/libibverbs -name "lib$prov-rdmav*.so" -print -quit 2>/dev/null || true)
	[ -n "$lib" ] || rxe_env_die "the $prov provider lib$prov-rdmav*.so is missing (package ibverbs-providers)"
	copy_elf "$lib"
	cp "/etc/libibverbs.d/$prov.driver" etc/libibverbs.d/
	if [ "$prov" = siw ]; then
		command -v rping >/dev/null || rxe_env_die "rping is missing (package rdmacm-utils): siw's smoke test"
		copy_elf "$(command -v rping)"
		# glibc dlopens libgcc_s for pthread_exit, which rping's threads call: ldd does not name it
		copy_elf /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
	fi
done
# A program may open libibverbs at run time (dlopen, as qpdrain does), so ldd does not name it:
# copy it, and what it links (libnl), explicitly.
copy_elf /usr/lib/x86_64-linux-gnu/libibverbs.so.1
# librdmacm likewise (package librdmacm opens it at run time; it finds rdma_ucm's /dev/infiniband/rdma_cm
# and libibverbs by itself)
copy_elf /usr/lib/x86_64-linux-gnu/librdmacm.so.1
# promtool (package prometheus, scripts/deps.sh) checks the exporter's metrics in the guest
if command -v promtool >/dev/null; then copy_elf "$(command -v promtool)"; fi

# busybox and its applets, where no real tool of that name was copied
cp /bin/busybox usr/bin/busybox
copy_libs /bin/busybox # none when it is busybox-static
for a in $(/bin/busybox --list); do
	[ -e "usr/bin/$a" ] || [ -e "usr/sbin/$a" ] || ln -s busybox "usr/bin/$a"
done

pkgs=
case $mode in
go-test)
	# the test binaries, their libraries and the packages' testdata
	pkgs=$(tr '\n' ' ' <"$tdir/pkgs")
	for p in $pkgs; do
		[ -x "$tdir/$p.test" ] || rxe_die "test binary $tdir/$p.test is missing"
		cp "$tdir/$p.test" "$tdir/$p.dir" tests/
		copy_libs "$tdir/$p.test"
	done
	cp -r "$tdir/src/." src/
	;;
run)
	while IFS= read -r f; do
		if [ -n "$f" ]; then copy_tree "$f"; fi
	done <<<"${RXE_FILES:-}"
	if [ "${RXE_PYTHON:-0}" = 1 ]; then
		# Python 3 and its standard library (with the bytecode caches, which spare the guest
		# compiling them), less its own test suite and the GUI and packaging tools.
		py=/usr/bin/python3
		[ -x "$py" ] || rxe_env_die "$py missing on the host (package python3)"
		copy_elf "$(realpath "$py")"
		ln -sf "$(realpath "$py")" "$root/usr/bin/python3"
		stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
		dyn=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["platstdlib"])')/lib-dynload
		mkdir -p "$root$stdlib"
		tar -C "$stdlib" --exclude=./test --exclude=./idlelib --exclude=./tkinter \
			--exclude=./turtledemo --exclude=./ensurepip --exclude=./lib2to3 --exclude=./site-packages \
			-cf - . | tar -C "$root$stdlib" -xf -
		# the extension modules (in the tree above) need their libraries too
		while IFS= read -r -d '' f; do copy_libs "$f"; done < <(find "$dyn" -name '*.so' -print0 2>/dev/null)
	fi
	;;
esac

# the command that creates rxe0: by default the running qpdrain's `rxe add`, copied in, and
# iproute2's `rdma link add` when the caller is not the qpdrain CLI
default_add="rdma link add rxe0 type rxe netdev dummy0"
[ -n "${RXE_QPDRAIN_BIN:-}" ] && default_add="qpdrain rxe add rxe0 dummy0"
add_cmd=${RXE_ADD_CMD:-$default_add}
if [ "${add_cmd%% *}" = qpdrain ]; then
	[ -x "${RXE_QPDRAIN_BIN:-}" ] || rxe_die "RXE_ADD_CMD runs qpdrain but RXE_QPDRAIN_BIN is not set"
	cp "$RXE_QPDRAIN_BIN" "$root/usr/bin/qpdrain"
	copy_libs "$root/usr/bin/qpdrain"
fi

cp "$here/init" init
chmod 755 init
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
	echo "TOKEN=$(q "$RXE_TOKEN")"
	echo "MODE=$(q "$mode")"
	echo "PKGS=$(q "$pkgs")"
	echo "CMD=$(q "${RXE_CMD:-}")"
	echo "CWD=$(q "${RXE_CWD:-/root}")"
	echo "TEST_TIMEOUT=$(q "${RXE_TEST_TIMEOUT:-300}")"
	echo "TEST_ARGS=$(q "${RXE_TEST_ARGS:-}")"
	echo "SMOKE_TIMEOUT=$(q "${RXE_SMOKE_TIMEOUT:-60}")"
	echo "ACTIVE_TIMEOUT=$(q "${RXE_ACTIVE_TIMEOUT:-20}")"
	echo "ADD_CMD=$(q "$add_cmd")"
	echo "PROVIDERS=$(q "$providers")"
} >etc/qpdrain-rxe/config

find . -print0 | LC_ALL=C sort -z | cpio --null --reproducible --quiet -o -H newc -R 0:0 >"$out.cpio"
cd / && rm -rf "$root"
