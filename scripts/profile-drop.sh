#!/usr/bin/env bash
# Where a `lab drop` row's receiving CPU spends its time: runs one row (say
# rampart or xdp-floor) with a long warm-up, samples CPU 1 (the receiving
# NAPI thread's) with perf's clock for 3 s in the middle of it, once the
# row's programs are loaded, and prints the share of each function, BPF
# programs by name, then the BPF instructions with the most samples.
# Multiply a share by the row's ns/packet for nanoseconds.
#   usage: scripts/profile-drop.sh LAYER [lab drop flags...]
#   e.g.:  scripts/profile-drop.sh rampart --family 4 --src4 16.0.0.0/4
# Needs root, perf (linux-perf) and a built ./rampart.
set -euo pipefail
layer="${1:?usage: $0 LAYER [lab drop flags...]}"
shift
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }
[ -x ./rampart ] || { echo "no ./rampart here: make build" >&2; exit 1; }
out="$(mktemp -d /tmp/rampart-profile.XXXXXX)"
before="$(grep -c '_rampart_xdp' /proc/kallsyms || true)"
./rampart lab drop --layers "$layer" --repeats 1 --warmup 12s --out "$out/lab" "$@" >"$out/lab.txt" 2>&1 &
lab=$!
trap 'kill "$lab" 2>/dev/null || true' EXIT
# Sampled once the row floods: rampart's row after its lists are loaded
# (a new program in kallsyms), the lab's own programs' a few seconds in.
if [ "$layer" = rampart ]; then
  for _ in $(seq 240); do
    [ "$(grep -c '_rampart_xdp' /proc/kallsyms || true)" -gt "$before" ] && break
    kill -0 "$lab" 2>/dev/null || break
    sleep 0.5
  done
fi
sleep 5
kill -0 "$lab" 2>/dev/null || { echo "the lab ended early:" >&2; cat "$out/lab.txt" >&2; exit 1; }
perf record -q -C 1 -o "$out/perf.data" sleep 3 >/dev/null
wait "$lab" || true
grep -E "^(rampart|xdp-floor|$layer) " "$out/lab.txt" || { cat "$out/lab.txt"; exit 1; }
# perf names the BPF programs loaded when it started (bpf_prog_TAG_NAME):
# the tag is dropped.
perf report -i "$out/perf.data" --no-children --sort sym 2>/dev/null |
  sed -nE 's/^ +([0-9.]+%) +\[.\] (bpf_prog_[0-9a-f]+_)?(.*)$/\1 \3/p' | head -20
echo "hottest BPF instructions:"
perf script -i "$out/perf.data" -F ip,sym,symoff 2>/dev/null |
  awk '$2 ~ /^bpf_prog_/ { sub(/^bpf_prog_[0-9a-f]+_/, "", $2); print $2 }' | sort | uniq -c | sort -rn | head -8
echo "samples and the lab's report: $out"
