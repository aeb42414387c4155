#!/usr/bin/env bash
# What one frame costs rampart's XDP program alone: no receive path, no
# cache miss (the same frame every time, through BPF_PROG_TEST_RUN). The
# program is lab drop's: its policy over its 1M flood sources (hosts of
# 10.0.0.0/8, /64s of fd10::/32), a listed and an unlisted UDP frame of
# each family. With --egress, the program is the egress one (tc) of lab
# egress's policy, a list of destinations to drop, over the same IPv4
# hosts, and the frames go to a listed and an unlisted destination. Give
# several builds to compare them: each is applied in a namespace of its
# own, then the rounds alternate between them, so that a noisy machine's
# noise falls on every build alike. Prints, per build and frame, the
# program's verdict and the min and median ns over the rounds.
#   usage: scripts/frame-cost.sh [--egress] [RAMPART...]   (default: ./rampart)
# Needs root and bpftool. The lab's rows (lab drop, scripts/profile-drop.sh)
# add the receive path and the table's miss; this is the rest.
set -euo pipefail
hook=ingress
if [ "${1:-}" = --egress ]; then
  hook=egress
  shift
fi
[ $# -gt 0 ] || set -- ./rampart
command -v bpftool >/dev/null || { echo "bpftool is missing: apt-get install bpftool" >&2; exit 1; }
dir="$(mktemp -d /tmp/rampart-frame-cost.XXXXXX)"
builds=$#
cleanup() {
  for n in $(seq "$builds"); do ip netns del "rfc$n" 2>/dev/null || true; rm -rf "/sys/fs/bpf/rfc$n"; done
}
trap cleanup EXIT

# The lab's sources: source i is the base | (i * multiplier) & mask.
awk 'BEGIN { for (i = 0; i < 1000000; i++) { w = (i * 3635633) % 16777216
  printf "10.%d.%d.%d\n", int(w / 65536), int(w / 256) % 256, w % 256 } }' >"$dir/flood-v4.txt"
awk 'BEGIN { for (i = 0; i < 1000000; i++) { w = (i * 2654435761) % 4294967296
  printf "fd10:0:%x:%x::/64\n", int(w / 65536), w % 65536 } }' >"$dir/flood-v6.txt"
cat >"$dir/policy.yaml" <<EOF
lists:
  flood: {files: ["$dir/flood-v4.txt", "$dir/flood-v6.txt"]}
rules:
  - {name: drop-flood, src: flood, proto: udp, dport: 1234, action: drop}
default: pass
EOF
cat >"$dir/egress.yaml" <<EOF
lists:
  deny: {files: ["$dir/flood-v4.txt"], family: 4}
rules:
  - {name: deny, dst: deny, action: drop}
default: pass
EOF
# UDP to port 1234 from 10.0.0.0 (listed) and 11.0.0.1, fd10::1 and fd11::1.
eth=020202020202040404040404
v4=4500002e000100004011
udp=9c4004d2001a0000787878787878787878787878787878787878
v6=60000000001a1140
dst6=fd000000000000000000000000000001
frame() { echo "$2" | xxd -r -p >"$dir/$1.bin"; }
frame v4-listed "${eth}0800${v4}aaab0a000000c6120001${udp}"
frame v4-unlisted "${eth}0800${v4}a9aa0b000001c6120001${udp}"
frame v6-listed "${eth}86dd${v6}fd100000000000000000000000000001${dst6}${udp}"
frame v6-unlisted "${eth}86dd${v6}fd110000000000000000000000000001${dst6}${udp}"
frames="v4-listed v4-unlisted v6-listed v6-unlisted"
policy="$dir/policy.yaml" egress=()
if [ $hook = egress ]; then
  # From 198.18.0.1 to 10.0.0.0 (listed) and 11.0.0.1.
  frame v4-listed "${eth}0800${v4}aaabc61200010a000000${udp}"
  frame v4-unlisted "${eth}0800${v4}a9aac61200010b000001${udp}"
  frames="v4-listed v4-unlisted" policy="$dir/egress.yaml" egress=(--egress)
fi

progs=()
n=0
for bin in "$@"; do
  n=$((n + 1))
  ns="rfc$n"
  ip netns add "$ns"
  ip -n "$ns" link add b0 type veth peer name b0p
  ip -n "$ns" link set b0 up
  "$bin" --netns "$ns" --pin-root "/sys/fs/bpf/$ns" --state-root "$dir/state$n" apply -f "$policy" --iface b0 ${egress[@]+"${egress[@]}"} >/dev/null
  progs+=("$(bpftool link show pinned "/sys/fs/bpf/$ns/netns-$ns/b0/$hook/link" | grep -o 'prog [0-9]*' | head -1 | cut -d' ' -f2)")
done
for round in $(seq 7); do
  for i in $(seq 0 $((n - 1))); do
    for f in $frames; do
      out="$(bpftool prog run id "${progs[$i]}" data_in "$dir/$f.bin" repeat 2000000)"
      echo "$i $f $(echo "$out" | grep -o 'Return value: [0-9]*' | grep -o '[0-9]*$') $(echo "$out" | grep -o 'average): [0-9]*' | grep -o '[0-9]*$')"
    done
  done
done >"$dir/rounds"
i=0
for bin in "$@"; do
  for f in $frames; do
    verdict="$(awk -v i=$i -v f="$f" -v h=$hook '$1 == i && $2 == f {
      if (h == "egress") print ($3 == 2 ? "drop" : $3 == 4294967295 ? "pass" : "tc " $3)
      else print ($3 == 1 ? "drop" : $3 == 2 ? "pass" : "xdp " $3)
      exit }' "$dir/rounds")"
    ns="$(awk -v i=$i -v f="$f" '$1 == i && $2 == f { print $4 }' "$dir/rounds" | sort -n | awk '{ v[NR] = $1 } END { printf "min %d ns, median %d ns", v[1], v[int((NR + 1) / 2)] }')"
    echo "$bin $f: $verdict, $ns"
  done
  i=$((i + 1))
done
