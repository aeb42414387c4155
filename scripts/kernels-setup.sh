#!/usr/bin/env bash
# Installs what the kernel tier (scripts/kernels.sh) needs, as root on Debian:
# qemu and virtme-ng, and the Debian kernels users run, unpacked into
# $RAMPART_KERNEL_CACHE with their modules copied to /lib/modules, where the
# guest (which shares this machine's root) finds them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/kernels.env
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends qemu-system-x86 kmod busybox-static >/dev/null
[ -x "$VNG" ] || python3 -m pip install -q "virtme-ng==$VIRTME_NG_VERSION"
mkdir -p "$RAMPART_KERNEL_CACHE"
for k in $RAMPART_KERNELS; do
  dir="$RAMPART_KERNEL_CACHE/$k"
  if [ ! -f "$dir/boot/vmlinuz-$k" ]; then
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get download -qq "linux-image-$k" >/dev/null)
    dpkg -x "$tmp"/linux-image-"$k"_*.deb "$dir"
    rm -rf "$tmp"
  fi
  [ -d "/lib/modules/$k" ] || { mkdir -p /lib/modules && cp -a "$dir/lib/modules/$k" /lib/modules/; }
  # What the package's postinst would do: the index modprobe reads, in both
  # trees (virtme-ng links the one beside the kernel image into the guest).
  [ -f "/lib/modules/$k/modules.dep" ] || depmod -a "$k"
  [ -f "$dir/lib/modules/$k/modules.dep" ] || depmod -b "$dir" -a "$k"
done
echo "kernels ready: $RAMPART_KERNELS"
