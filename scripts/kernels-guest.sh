#!/usr/bin/env bash
# Runs inside a guest booted by scripts/kernels.sh (usage: OUT NAME): the
# kernel tier's tests, sized for emulation, each package's test binary from
# its package's directory as `go test` would; NAME "nics" runs the NIC
# guest's tests. Results go to OUT/NAME/: a log per run and one line per run
# in `results` ("PASS|FAIL name seconds"), and the name of the run under way
# in `running`. A guest booted again after a panic skips the runs that already
# have a result.
set -uo pipefail
out="$1"
name="$2"
repo="$(cd "$(dirname "$0")/.." && pwd)"
kernel="$(uname -r)"
res="$out/$name"
mkdir -p "$res"
: >>"$res/results"
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
ip link set lo up
export RAMPART_REQUIRE_PRIVILEGED=1
# Sizes for a CPU emulated 10-50x slower than this one: the same cases, fewer
# random frames.
export RAMPART_DIFF_FRAMES=20000 RAMPART_ORACLE_DATAGRAMS=5000 RAMPART_REAPPLY_DATAGRAMS=10000 RAMPART_REAPPLY_SWAPS=8

run() { # name package pattern
  local name="$1" pkg="$2" pattern="$3" start rc
  grep -q " $name " "$res/results" && return
  echo "$name" >"$res/running"
  start=$(date +%s)
  (cd "$repo/internal/$pkg" && timeout 900 "$out/bin/$pkg.test" -test.count=1 -test.v -test.timeout=850s \
    -test.run "^($pattern)\$") >"$res/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && grep -q -- "--- SKIP" "$res/$name.log"; then
    rc=1 # a skipped test is no pass here
  fi
  echo "$([ $rc -eq 0 ] && echo PASS || echo FAIL) $name $(($(date +%s) - start))" >>"$res/results"
  rm -f "$res/running"
}

if [ "$name" = nics ]; then
  modprobe virtio_net
  nics=()
  for i in 0 1 2 3; do
    for _ in $(seq 50); do
      dev="$(grep -l "52:54:00:72:70:0$i" /sys/class/net/*/address 2>/dev/null | head -1)"
      [ -n "$dev" ] && break
      sleep 0.1
    done
    nics+=("$(basename "$(dirname "$dev")")")
  done
  export RAMPART_GUEST_NICS="$(IFS=,; echo "${nics[*]}")"
  echo "NICs: $RAMPART_GUEST_NICS" >"$res/nics"
  run virtio cli 'TestGuestVirtioXDP'
  run bond cli 'TestGuestBondXDP'
  run tune-irq cli 'TestGuestTuneIRQBonds'
  run diagnose-fq cli 'TestGuestDiagnoseFQ'
  run lab-u32 cli 'TestGuestLabDropU32'
  run delay-netem tune 'TestDelayLineNetem'
  echo "RESULT $kernel done"
  exit 0
fi

# prog.Run tables, crafted frames, the differential run against policy.Eval,
# an overlay table grown in place under the loaded program (a hash inner map
# larger than its outer map's template: Linux 5.10),
# every program shape loading, tc through clsact; the SYN-ACK bytes where
# syncookie can be applied (Linux 6.9: bpf_sk_assign_tcp_reqsk).
IFS=. read -r major minor _ <<<"$kernel"
synack=''
if [ "$major" -gt 6 ] || { [ "$major" -eq 6 ] && [ "${minor%%-*}" -ge 9 ]; }; then
  synack='|TestSynAckFrames'
fi
run datapath datapath "TestRequire|TestTable|TestCrafted|TestCraftedFramesAreWhatTheySay|TestDifferential|TestLoadShapes|TestStaticRows|TestOverlayGrows|TestClsact$synack"
# End to end over veth with real datagrams and connections: apply in every
# mode, status, stats, detach; the kernel as oracle; list changes in place;
# the syncookie refusal; version.
run filter cli 'TestFilter|TestDetachClean|TestVersion|TestSyncookieNeedsItsKernel'
run oracle cli 'TestKernelOracle'
run lists cli 'TestListInPlace|TestReapplyUnderFlood'
echo "RESULT $kernel done"
