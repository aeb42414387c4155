#!/usr/bin/env bash
# Installs what rampart needs on a fresh Debian machine (as root) and builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  clang-19 llvm-19 gcc libc6-dev libbpf-dev linux-libc-dev iproute2 bpftool ca-certificates git make \
  iptables nftables ipset xdp-tools util-linux ethtool procps iperf3 iputils-ping curl \
  nginx-light libnginx-mod-stream haproxy prometheus bird2 gobgpd >/dev/null
# CrowdSec's post-install registers with its online Central API unless this
# file exists and is not empty: the tests run its Local API offline.
mkdir -p /etc/crowdsec
[ -s /etc/crowdsec/online_api_credentials.yaml ] ||
  echo "# offline: rampart's tests run the Local API alone" >/etc/crowdsec/online_api_credentials.yaml
apt-get install -y -qq --no-install-recommends crowdsec >/dev/null
# After crowdsec, whose cscli its post-install uses; without systemd (CI,
# containers) its service does not start, and rampart's lab runs it alone.
apt-get install -y -qq --no-install-recommends crowdsec-firewall-bouncer >/dev/null
if ! command -v go >/dev/null; then
  apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
go mod download
bash scripts/kernels-setup.sh
make build
echo "built ./rampart"
