#!/usr/bin/env bash
# Where a `lab drop` row's receiving CPU spends its time: runs one row (say
# rampart or xdp-floor) with a long warm-up, samples CPU 1 (the receiving
# NAPI thread's) with perf's clock for 3 s in the middle of it, and prints
# the share of each function, BPF programs by name (from /proc/kallsyms,
# read while the row's programs are loaded: perf's own reading of them
# needs a perf built with libbpf), then the BPF instructions with the most
# samples. Multiply a share by the row's ns/packet for nanoseconds.
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
grep '\[bpf\]' /proc/kallsyms | sort >"$out/kallsyms" ||
  { echo "no BPF programs in /proc/kallsyms: sysctl net.core.bpf_jit_kallsyms=1" >&2; exit 1; }
perf record -q -C 1 -o "$out/perf.data" sleep 3 >/dev/null
wait "$lab" || true
grep -E "^(rampart|xdp-floor|$layer) " "$out/lab.txt" || { cat "$out/lab.txt"; exit 1; }
# Samples in the module area that perf names no symbol for, or a BPF one,
# are BPF programs' (modules keep their names). BPF addresses share their top 32 bits: the low 32 compare
# exactly in awk.
perf script -i "$out/perf.data" -F ip,sym 2>/dev/null | awk -v ks="$out/kallsyms" '
  function low(h,   v, i) {
    h = tolower(substr(h, length(h) - 7)); v = 0
    for (i = 1; i <= 8; i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
    return v
  }
  BEGIN {
    while ((getline line < ks) > 0) {
      split(line, ks_f, " ")
      n++; addr[n] = low(ks_f[1]); name[n] = ks_f[3]; sub(/^bpf_prog_[0-9a-f]+_/, "", name[n])
    }
  }
  NF >= 1 {
    total++
    if ($1 ~ /^ffffffffc/ && (NF < 2 || $2 == "[unknown]" || $2 ~ /^bpf_/)) {
      a = low($1); best = 0
      for (i = 1; i <= n; i++) if (addr[i] <= a && (best == 0 || addr[i] > addr[best])) best = i
      where = best ? "BPF " name[best] : "BPF ?"
      if (best) insn[sprintf("%s+0x%x", name[best], a - addr[best])]++
    } else {
      where = NF > 1 ? $2 : "?"
    }
    count[where]++
  }
  END {
    for (c in count) printf "%5.1f%% %s\n", 100 * count[c] / total, c | "sort -rn | head -20"
    close("sort -rn | head -20")
    print "hottest BPF instructions:"
    for (i in insn) printf "  %5.1f%% %s\n", 100 * insn[i] / total, i | "sort -rn | head -8"
  }'
echo "samples and the lab's report: $out"
