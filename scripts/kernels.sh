#!/usr/bin/env bash
# The kernel tier: the privileged tests that matter for correctness, run in
# guests booted from Debian's kernels under qemu with virtme-ng (software
# emulation: nested KVM is not to be relied on), sharing this machine's root.
# scripts/kernels-setup.sh installs what it needs. Exits non-zero when a test
# fails, or a guest gives no results, on any kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/kernels.env
out="$(mktemp -d /tmp/rampart-kernels.XXXXXX)"
mkdir -p "$out/bin"
for pkg in datapath cli; do
  go test -c -o "$out/bin/$pkg.test" "./internal/$pkg"
done
failed=0
passed=0
for k in $RAMPART_KERNELS; do
  start=$(date +%s)
  echo "kernel $k: booting under qemu"
  # The guest's exit code does not come back: the results file says. Its
  # console (-v) shows the kernel's messages and the script's output.
  timeout 1500 vng -v --run "$RAMPART_KERNEL_CACHE/$k/boot/vmlinuz-$k" --disable-kvm --cpus 2 --memory 2G \
    --rwdir "$out" --exec "bash $PWD/scripts/kernels-guest.sh $out" >"$out/$k.console" 2>&1 || true
  if [ ! -s "$out/$k/results" ] || ! grep -q "RESULT $k done" "$out/$k.console"; then
    echo "kernel $k: the guest gave no results (console: $out/$k.console)"
    tail -20 "$out/$k.console"
    failed=$((failed + 1))
    continue
  fi
  while read -r verdict name secs; do
    echo "kernel $k: $verdict $name (${secs}s)"
    if [ "$verdict" = PASS ]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      grep -E -- "^\s*--- FAIL|_test.go:[0-9]+:" "$out/$k/$name.log" | head -40
    fi
  done <"$out/$k/results"
  echo "kernel $k: $(($(date +%s) - start))s"
done
echo "kernels: $passed passed, $failed failed (logs: $out)"
[ "$failed" -eq 0 ]
