#!/usr/bin/env bash
# build-initrd.sh KDIR PAYLOAD OUT: writes OUT, the initramfs for the kernel in KDIR (from
# fetch-kernel.sh): PAYLOAD (stage.sh's cpio, shared by every kernel) followed by a second newc
# archive with the kernel's modules and their insmod order, siw.ko, and this kernel's providers
# (etc/qpdrain-rxe/kernel); the kernel unpacks both, in order.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

kdir=$(realpath "${1:?usage: build-initrd.sh KDIR PAYLOAD OUT}")
payload=$(realpath "${2:?usage: build-initrd.sh KDIR PAYLOAD OUT}")
out=$(realpath -m "${3:?usage: build-initrd.sh KDIR PAYLOAD OUT}")

root=$out.root
rm -rf "$root" && mkdir -p "$root/usr/lib/modules" "$root/etc/qpdrain-rxe"
trap 'rm -rf "$root"' EXIT
cp "$kdir"/modules/*.ko "$root/usr/lib/modules/"
cp "$kdir/modules.order" "$root/usr/lib/modules/order"
# RXE_KERNEL_PROVIDERS: the providers this kernel's guest sets up (vm.sh: RXE_PROVIDERS less one
# that could not be built for it), with siw.ko from build-siw.sh when siw is among them
provs=${RXE_KERNEL_PROVIDERS-${RXE_PROVIDERS:-rxe}}
case " $provs " in *" siw "*) cp "$kdir/siw/siw.ko" "$root/usr/lib/modules/siw.ko" ;; esac
printf "PROVIDERS='%s'\n" "$provs" >"$root/etc/qpdrain-rxe/kernel"
{
	cat "$payload"
	(cd "$root" && find usr etc -print0 | LC_ALL=C sort -z | cpio --null --reproducible --quiet -o -H newc -R 0:0)
} >"$out"
