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
for pkg in datapath cli tune; do
  go test -c -o "$out/bin/$pkg.test" "./internal/$pkg"
done
failed=0
passed=0

# report NAME: reads a guest's results, counting and printing them.
report() {
  local name="$1" verdict test secs
  if [ ! -s "$out/$name/results" ] || ! grep -q "RESULT .* done" "$out/$name.console"; then
    echo "$name: the guest gave no results (console: $out/$name.console)"
    tail -20 "$out/$name.console" 2>/dev/null || true
    failed=$((failed + 1))
    return
  fi
  while read -r verdict test secs; do
    echo "$name: $verdict $test (${secs}s)"
    if [ "$verdict" = PASS ]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      grep -E -- "^\s*--- FAIL|_test.go:[0-9]+:" "$out/$name/$test.log" | head -40
    fi
  done <"$out/$name/results"
}

# guest NAME KERNEL QEMU-OPTS VNG-ARGS...: boots the kernel (QEMU-OPTS added
# to the one-thread emulation) and runs kernels-guest.sh,
# which writes its results to OUT/NAME. The guest's exit code does not come
# back: the results file says. Its console (-v) shows the kernel's messages.
guest() {
  local name="$1" k="$2" opts="$TCG $3" start panicked=""
  shift 3
  start=$(date +%s)
  echo "$name: booting Linux $k under qemu"
  for try in 1 2 3 4; do
    timeout 1500 "$VNG" -v --run "$RAMPART_KERNEL_CACHE/$k/boot/vmlinuz-$k" --disable-kvm --memory 2G \
      --rwdir "$out" --qemu-opts="$opts" "$@" --exec "bash $PWD/scripts/kernels-guest.sh $out $name" >"$out/$name.console" 2>&1 || true
    if grep -q "RESULT .* done" "$out/$name.console" || ! grep -q "Kernel panic" "$out/$name.console"; then
      break
    fi
    # A kernel that panics anyway (an emulator's fault is not ours to fail
    # on) is booted again, up to four times, and runs what has no result yet.
    # A run the kernel panicked in twice fails: that is no accident.
    local running=""
    [ -f "$out/$name/running" ] && running="$(cat "$out/$name/running")"
    echo "$name: the kernel panicked${running:+ during $running}: $(grep -m1 -E "Oops|BUG:|Kernel panic" "$out/$name.console")"
    if [ -n "$running" ] && [[ " $panicked " == *" $running "* ]]; then
      echo "$name: $running panicked the kernel twice; not booting it again"
      break
    fi
    panicked+=" $running"
    [ "$try" = 4 ] && break
    echo "$name: booting it again for the runs with no result"
    mv "$out/$name.console" "$out/$name.console.$try"
  done
  echo "$name: $(($(date +%s) - start))s"
}

# One host thread runs all of a guest's vCPUs. Under QEMU's multi-threaded
# TCG the kernels panicked on a stale int3 of their own code patching
# (text_poke_bp: static keys flipped as tracepoints, tcx or XDP attach) in
# sched_clock_cpu, hrtimer_start_range_ns, bpf_trace_run4 and
# kfree_skb_list_reason: another vCPU ran the half-patched instruction.
TCG="-accel tcg,thread=single"

# RAMPART_GUESTS picks the guests: all (default), kernels or nics.
guests="${RAMPART_GUESTS:-all}"
kernels=()
[ "$guests" != nics ] && read -r -a kernels <<<"$RAMPART_KERNELS"

# The NIC guest: the newest kernel of the list with four 2-queue virtio_net
# NICs (an MSI-X vector per queue) on 4 vCPUs, wired in pairs by bridges
# here (NIC 0 with 2, 1 with 3), for what needs a real driver, bonding, fq
# or gact.
nic_kernel="${RAMPART_KERNELS##* }"
taps=(rpk-tap0 rpk-tap1 rpk-tap2 rpk-tap3)
cleanup_nics() {
  for dev in "${taps[@]}" rpk-br0 rpk-br1; do ip link del "$dev" 2>/dev/null || true; done
}
nics_guest() {
  local qemu="" i b tap
  trap cleanup_nics EXIT
  cleanup_nics
  for i in 0 1 2 3; do
    ip tuntap add dev "${taps[$i]}" mode tap multi_queue
    qemu+="-netdev tap,id=n$i,queues=2,vhost=off,script=no,downscript=no,ifname=${taps[$i]} "
    qemu+="-device virtio-net-pci,netdev=n$i,mq=on,vectors=6,mac=52:54:00:72:70:0$i "
  done
  for b in 0 1; do
    ip link add "rpk-br$b" type bridge
    ip link set "rpk-br$b" up
    for tap in "${taps[$b]}" "${taps[$((b + 2))]}"; do
      sysctl -qw "net.ipv6.conf.$tap.disable_ipv6=1"
      ip link set "$tap" master "rpk-br$b" up
    done
  done
  guest nics "$nic_kernel" "$qemu" --cpus 4 --disable-microvm
}

# Each guest is one host thread: with two CPUs or more, the newest kernel's
# guest (the longest) boots beside the others, which run one after another.
# Their lines are prefixed with the guest's name; results are counted when
# all are done.
lane() {
  local k
  for k in "$@"; do
    if [ "$k" = nics ]; then nics_guest; else guest "$k" "$k" "" --cpus 2; fi
  done
}
# Background jobs ignore Ctrl-C: an interrupted run stops the lanes' guests
# (timeout passes the signal on to each) and removes the NICs.
lanes=()
stop_lanes() {
  for p in "${lanes[@]}"; do
    pkill -TERM -P "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
  wait
  cleanup_nics
  exit 130
}
names=("${kernels[@]}")
[ "$guests" != kernels ] && names+=(nics)
if [ "$(nproc)" -ge 2 ] && [ "${#kernels[@]}" -ge 1 ] && [ "${#names[@]}" -ge 2 ]; then
  newest="${kernels[-1]}"
  others=()
  for name in "${names[@]}"; do
    [ "$name" = "$newest" ] || others+=("$name")
  done
  trap stop_lanes INT TERM
  lane "$newest" &
  lanes+=($!)
  lane "${others[@]}" &
  lanes+=($!)
  wait
  trap - INT TERM
else
  lane "${names[@]}"
fi
for name in "${names[@]}"; do
  report "$name"
done

echo "kernels: $passed passed, $failed failed (logs: $out)"
[ "$failed" -eq 0 ]
