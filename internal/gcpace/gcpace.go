// Package gcpace is where rampart sets how often Go's garbage collector
// runs (GOGC), which two needs pull apart: a short command over a small
// policy spends its time collecting garbage it would drop at exit anyway,
// and a build of tables of millions of entries must keep its peak memory
// near what it holds.
package gcpace

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// SmallHeap is what a short command's heap holds at most and still has
// the garbage collector run rarely (Lazy).
const SmallHeap = 32 << 20

// Percents of GOGC: lazy while a short command's heap is small, low while
// a big table builds.
const (
	lazyPercent = 400
	lowPercent  = 10
)

var pace struct {
	sync.Mutex
	once sync.Once
	base int // GOGC as the process started
	lazy bool
	low  int // builds holding GOGC low
}

// set puts GOGC where the pace says; under pace's lock.
func set() {
	pace.once.Do(func() {
		pace.base = debug.SetGCPercent(100)
		debug.SetGCPercent(pace.base)
	})
	p := pace.base
	switch {
	case pace.low > 0:
		p = lowPercent
	case pace.lazy:
		p = lazyPercent
	}
	debug.SetGCPercent(p)
}

// Lazy lets a short command's heap grow to five times what it holds
// between collections (GOGC=400) until what it holds passes SmallHeap;
// then the process's own GOGC returns. A 10,000-rule policy's apply spent
// 13% of its CPU in the collector at GOGC=100, on a heap that never held
// 40 MB; a list of millions keeps its peak memory, as one cycle at most
// runs lazily past SmallHeap. A GOGC the user set is left alone.
func Lazy() {
	if os.Getenv("GOGC") != "" {
		return
	}
	pace.Lock()
	pace.lazy = true
	set()
	pace.Unlock()
	// A finalizer runs after each collection that finds its object
	// unreachable; set again, it runs after the next one too. Runtime
	// metrics have no callback at a cycle's end.
	runtime.SetFinalizer(&cycle{}, watch)
}

// cycle is the object whose finalizer watches the heap; not zero-sized
// and holding a pointer, so that it is an allocation of its own, which
// the collector frees and finalizes (tiny ones are batched).
type cycle struct{ _ *byte }

var live = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}

func watch(c *cycle) {
	metrics.Read(live)
	if live[0].Value.Kind() == metrics.KindUint64 && live[0].Value.Uint64() <= SmallHeap {
		runtime.SetFinalizer(c, watch)
		return
	}
	pace.Lock()
	pace.lazy = false
	set()
	pace.Unlock()
}

// Low holds GOGC at 10% until the returned function is called: for a
// build whose garbage comes in pieces of tens of MB beside a live set of
// hundreds, nearly all of it pointer-free, so that each collection costs
// little. Builds may overlap (tests, a check beside a service's reload):
// the last to finish restores the pace.
func Low() (restore func()) {
	pace.Lock()
	pace.low++
	set()
	pace.Unlock()
	return func() {
		pace.Lock()
		pace.low--
		set()
		pace.Unlock()
	}
}
