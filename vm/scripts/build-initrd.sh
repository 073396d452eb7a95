#!/usr/bin/env bash
# build-initrd.sh KDIR PAYLOAD OUT: writes OUT, the initramfs for the kernel in KDIR (from
# fetch-kernel.sh): PAYLOAD (stage.sh's cpio, shared by every kernel) followed by a second newc
# archive with the kernel's modules and their insmod order; the kernel unpacks both, in order.
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

kdir=$(realpath "${1:?usage: build-initrd.sh KDIR PAYLOAD OUT}")
payload=$(realpath "${2:?usage: build-initrd.sh KDIR PAYLOAD OUT}")
out=$(realpath -m "${3:?usage: build-initrd.sh KDIR PAYLOAD OUT}")

root=$out.root
rm -rf "$root" && mkdir -p "$root/usr/lib/modules"
trap 'rm -rf "$root"' EXIT
cp "$kdir"/modules/*.ko "$root/usr/lib/modules/"
cp "$kdir/modules.order" "$root/usr/lib/modules/order"
{
	cat "$payload"
	(cd "$root" && find usr -print0 | LC_ALL=C sort -z | cpio --null --reproducible --quiet -o -H newc -R 0:0)
} >"$out"
