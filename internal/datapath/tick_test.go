package datapath

import "testing"

// TestKernelTick: the programs' clock (jiffies times the tick) takes this
// kernel's tick, one of 100 to 1000 Hz, and refuses a tick no kernel has.
func TestKernelTick(t *testing.T) {
	for _, hz := range []int64{100, 250, 300, 1000} {
		tick := (1e9 + hz/2) / hz // the kernel's TICK_NSEC
		if got, err := checkTick(tick); err != nil || got != uint64(tick) {
			t.Errorf("%d Hz: %d, %v", hz, got, err)
		}
	}
	for _, tick := range []int64{0, -1, 999_999, 10_000_001, 2e9} {
		if _, err := checkTick(tick); err == nil {
			t.Errorf("a tick of %d ns taken", tick)
		}
	}
	if tick, err := kernelTick(); err != nil || tick < 1e6 || tick > 1e7 {
		t.Errorf("this kernel's tick %d ns, %v", tick, err)
	}
}
