#!/bin/sh
# Vendors the libbpf and Linux UAPI headers that bpf/*.c include, and the
# headers those include in turn, from the Debian packages named here: the
# objects are built with -nostdinc (the Makefile's generate), so they depend
# on these files and on nothing in the build host's /usr/include. asm/ is
# ours (README) and stays. Needs apt-get, dpkg and clang-19.
#
#	bpf/include/update.sh
set -eu

LIBBPF_DEV=1:1.1.2-0+deb12u1 # Debian 12 (bookworm)
LINUX_LIBC_DEV=6.1.192-2     # Debian 12 security updates

cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$tmp" && apt-get download "libbpf-dev=$LIBBPF_DEV" "linux-libc-dev=$LINUX_LIBC_DEV")
for deb in "$tmp"/*.deb; do
	dpkg -x "$deb" "$tmp/root"
done
usr="$tmp/root/usr/include"

# The headers the sources reach, as clang lists them over asm/ and the
# packages' tree.
rm -rf asm-generic bpf linux
for src in ../*.c; do
	clang-19 -target bpfel -nostdinc -I. -I"$usr" -M "$src"
done | tr -s ' \\' '\n' | sed -n "s|^$usr/||p" | sort -u | while read -r h; do
	mkdir -p "$(dirname "$h")"
	cp "$usr/$h" "$h"
done
