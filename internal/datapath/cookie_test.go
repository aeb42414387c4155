package datapath

import "testing"

// TestCookieSlotShift: the SYN cookies' slot is about a minute of ticks at
// every usual tick rate, and a tick no kernel has is refused.
func TestCookieSlotShift(t *testing.T) {
	for hz, want := range map[int64]uint8{100: 13, 250: 14, 300: 14, 1000: 16} {
		tick := (1e9 + hz/2) / hz // the kernel's TICK_NSEC
		shift, err := slotShift(tick)
		if secs := float64(int64(1)<<shift*tick) / 1e9; err != nil || shift != want || secs < 45 || secs > 90 {
			t.Errorf("%d Hz: shift %d (%.1f s slots), %v; want %d", hz, shift, secs, err, want)
		}
	}
	for _, tick := range []int64{0, -1, 2e9} {
		if _, err := slotShift(tick); err == nil {
			t.Errorf("a tick of %d ns taken", tick)
		}
	}
	shift, err := cookieSlotShift()
	if err != nil || shift < 13 || shift > 16 {
		t.Errorf("this kernel's shift %d, %v", shift, err)
	}
}
