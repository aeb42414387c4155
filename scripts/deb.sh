#!/usr/bin/env bash
# Builds rampart_<version>_<arch>.deb in out/: the binary, the systemd unit,
# the example policy as configuration, shell completions and man pages
# generated from the command table, and the fail2ban action.
set -euo pipefail
cd "$(dirname "$0")/.."
version="0.1.0+git$(git log -1 --format=%cd.%h --date=format:%Y%m%d 2>/dev/null || echo 0)"
arch="$(dpkg --print-architecture)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/rampart-fw/rampart/internal/cli.Version=$version -X github.com/rampart-fw/rampart/internal/cli.Commit=$(git rev-parse HEAD 2>/dev/null)" -o "$stage/usr/sbin/rampart" ./cmd/rampart
bin="$stage/usr/sbin/rampart"
install -D -m 0644 packaging/rampart.service "$stage/lib/systemd/system/rampart.service"
install -D -m 0644 packaging/default "$stage/etc/default/rampart"
install -D -m 0644 examples/policy.yaml "$stage/etc/rampart/policy.yaml"
install -D -m 0644 examples/blocklist.netset "$stage/etc/rampart/blocklist.netset"
install -D -m 0644 packaging/fail2ban/rampart.conf "$stage/usr/share/doc/rampart/fail2ban/rampart.conf"
install -D -m 0644 README.md "$stage/usr/share/doc/rampart/README.md"
mkdir -p "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" "$stage/usr/share/fish/vendor_completions.d"
"$bin" completion bash > "$stage/usr/share/bash-completion/completions/rampart"
"$bin" completion zsh > "$stage/usr/share/zsh/vendor-completions/_rampart"
"$bin" completion fish > "$stage/usr/share/fish/vendor_completions.d/rampart.fish"
"$bin" gen-man "$stage/usr/share/man/man8"
gzip -9n "$stage"/usr/share/man/man8/*.8
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: rampart
Version: $version
Architecture: $arch
Maintainer: rampart developers <rampart@localhost>
Section: net
Priority: optional
Depends: iproute2
Recommends: nftables
Installed-Size: $(du -sk "$stage" | cut -f1)
Description: host firewall for packet floods (XDP and tc)
 rampart compiles one declarative policy into BPF programs at the fastest
 layer an interface offers, filters by lists of millions of addresses in
 and out, rate-limits and answers SYN floods with cookies, and runs as a
 service with live reload, Prometheus metrics and a ban API.
CONTROL
printf '/etc/rampart/policy.yaml\n/etc/rampart/blocklist.netset\n/etc/default/rampart\n' > "$stage/DEBIAN/conffiles"
cat > "$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
# Not enabled here: the interfaces to filter go in /etc/default/rampart
# first; then systemctl enable --now rampart.
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
SCRIPT
cat > "$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl stop rampart.service || true; fi
SCRIPT
cat > "$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
if [ "$1" = purge ]; then rm -rf /var/lib/rampart; fi
SCRIPT
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"
mkdir -p out
dpkg-deb --root-owner-group -Zxz --build "$stage" "out/rampart_${version}_${arch}.deb" >/dev/null
echo "out/rampart_${version}_${arch}.deb"
