package gcpace

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// read is a runtime metric's value.
func read(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func gogc() uint64 { return read("/gc/gogc:percent") }

func TestPace(t *testing.T) {
	t.Setenv("GOGC", "")
	os.Unsetenv("GOGC")
	base := gogc()
	restore := Low()
	if got := gogc(); got != lowPercent {
		t.Fatalf("GOGC under Low: %d, want %d", got, lowPercent)
	}
	Lazy()
	if got := gogc(); got != lowPercent {
		t.Fatalf("GOGC under Low after Lazy: %d, want %d: a build's low pace wins", got, lowPercent)
	}
	restore()
	restore() // once only: a second call must not undo another build's Low
	if got := gogc(); got != lazyPercent {
		t.Fatalf("GOGC after the build, lazy: %d, want %d", got, lazyPercent)
	}
	other := Low()
	if got := gogc(); got != lowPercent {
		t.Fatalf("GOGC under a second Low after a restore called twice: %d, want %d", got, lowPercent)
	}
	other()
	// Past SmallHeap held, the process's own pace returns after a
	// collection.
	held := make([][]byte, 0, 64)
	for range 48 {
		b := make([]byte, 1<<20)
		b[0] = 1
		held = append(held, b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for gogc() != base && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if got := gogc(); got != base {
		t.Fatalf("GOGC with %d MB held: %d, want the process's %d", len(held), got, base)
	}
	runtime.KeepAlive(held)
}

func TestLazyLeavesUsersGOGC(t *testing.T) {
	t.Setenv("GOGC", "150")
	before := gogc()
	Lazy()
	if got := gogc(); got != before {
		t.Fatalf("GOGC set by the user went from %d to %d", before, got)
	}
}
