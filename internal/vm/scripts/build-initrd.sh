#!/usr/bin/env bash
# build-initrd.sh KDIR TESTDIR OUT: writes OUT, an uncompressed busybox initramfs (newc cpio) for
# the kernel in KDIR (from fetch-kernel.sh) with the host's rdma-core user space (libibverbs, the rxe
# provider, ibv_devinfo, ibv_rc_pingpong, ibv_srq_pingpong), iproute2's ip and rdma, the test
# binaries in TESTDIR (from build-tests.sh), every library ldd names, and scripts/rxe/init as /init.
# The guest's settings come from the environment: RXE_TOKEN (required), RXE_TEST_TIMEOUT,
# RXE_TEST_ARGS, RXE_SMOKE_TIMEOUT, RXE_ACTIVE_TIMEOUT, RXE_ADD_CMD (how /init creates rxe0).
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"

kdir=$(realpath "${1:?usage: build-initrd.sh KDIR TESTDIR OUT}")
tdir=$(realpath "${2:?usage: build-initrd.sh KDIR TESTDIR OUT}")
out=$(realpath -m "${3:?usage: build-initrd.sh KDIR TESTDIR OUT}")
: "${RXE_TOKEN:?RXE_TOKEN must be set}"

root=$out.root
rm -rf "$root" && mkdir -p "$root"
trap 'rm -rf "$root"' EXIT
cd "$root"
mkdir -p usr/bin usr/sbin usr/lib/modules usr/lib64 etc/libibverbs.d etc/qpdrain-rxe \
	dev proc sys tmp root run tests src
# Merged /usr, as on the host: ldd's /lib/... and /lib64/... paths resolve inside the image.
ln -s usr/bin bin
ln -s usr/sbin sbin
ln -s usr/lib lib
ln -s usr/lib64 lib64

# copy_libs FILE: every library ldd names for FILE, at its own path (ldd fails on static
# binaries; they need nothing)
copy_libs() {
	local l
	for l in $(ldd "$1" 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'); do
		[ -e "$root/$l" ] && continue
		mkdir -p "$root/$(dirname "$l")"
		cp -L "$l" "$root/$l"
	done
}
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

provider=$(find /usr/lib/x86_64-linux-gnu/libibverbs -name 'librxe-rdmav*.so' -print -quit 2>/dev/null || true)
[ -n "$provider" ] || rxe_env_die "the rxe provider librxe-rdmav*.so is missing (package ibverbs-providers)"
copy_elf /usr/sbin/ip /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong \
	/usr/bin/ibv_srq_pingpong "$provider"
cp /etc/libibverbs.d/rxe.driver etc/libibverbs.d/

# busybox and its applets, where no real tool of that name was copied
cp /bin/busybox usr/bin/busybox
copy_libs /bin/busybox # none when it is busybox-static
for a in $(/bin/busybox --list); do
	[ -e "usr/bin/$a" ] || [ -e "usr/sbin/$a" ] || ln -s busybox "usr/bin/$a"
done

# the kernel's modules, in insmod order
cp "$kdir"/modules/*.ko usr/lib/modules/
cp "$kdir/modules.order" usr/lib/modules/order

# the test binaries, their libraries and the packages' testdata
pkgs=$(tr '\n' ' ' <"$tdir/pkgs")
for p in $pkgs; do
	[ -x "$tdir/$p.test" ] || rxe_die "test binary $tdir/$p.test is missing"
	cp "$tdir/$p.test" "$tdir/$p.dir" tests/
	copy_libs "$tdir/$p.test"
done
cp -r "$tdir/src/." src/

# the command that creates rxe0; the project's CLI is built in when it is the one
add_cmd=${RXE_ADD_CMD:-rdma link add rxe0 type rxe netdev dummy0}
if [ "${add_cmd%% *}" = qpdrain ]; then
	(cd "$RXE_ROOT" && go build -o "$root/usr/bin/qpdrain" ./cmd/qpdrain) || rxe_die "go build ./cmd/qpdrain failed"
	copy_libs "$root/usr/bin/qpdrain"
fi

cp "$RXE_ROOT/scripts/rxe/init" init
chmod 755 init
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
	echo "TOKEN=$(q "$RXE_TOKEN")"
	echo "PKGS=$(q "$pkgs")"
	echo "TEST_TIMEOUT=$(q "${RXE_TEST_TIMEOUT:-300}")"
	echo "TEST_ARGS=$(q "${RXE_TEST_ARGS:-}")"
	echo "SMOKE_TIMEOUT=$(q "${RXE_SMOKE_TIMEOUT:-60}")"
	echo "ACTIVE_TIMEOUT=$(q "${RXE_ACTIVE_TIMEOUT:-20}")"
	echo "ADD_CMD=$(q "$add_cmd")"
} >etc/qpdrain-rxe/config

find . -print0 | LC_ALL=C sort -z | cpio --null --reproducible --quiet -o -H newc -R 0:0 >"$out"
