// Package gcpace is where rampart sets how often Go's garbage collector
// runs (GOGC), which two needs pull apart: a short command over a small
// policy spends its time collecting garbage it would drop at exit anyway,
// and an IPv6 table build over millions of prefixes must keep its peak
// memory near what it holds.
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

// GOGC lazily, and while an IPv6 table builds.
const (
	lazyPercent = 400
	lowPercent  = 10
)

var pace struct {
	sync.Mutex
	based    bool
	base     int // GOGC as the process started: what the first change returned
	lazy     bool
	watching bool // a finalizer watches for the end of lazy
	low      int  // builds holding GOGC low
}

// set puts GOGC where the pace says; under pace's lock. Its first call is
// Lazy's or Low's, never one that restores base.
func set() {
	p := pace.base
	switch {
	case pace.low > 0:
		p = lowPercent
	case pace.lazy:
		p = lazyPercent
	}
	if old := debug.SetGCPercent(p); !pace.based {
		pace.base, pace.based = old, true
	}
}

// Lazy lets a short command's heap grow to five times what it holds
// between collections (GOGC=400) until what it holds passes SmallHeap;
// then the process's own GOGC returns. A 10,000-rule policy's apply spent
// 13% of its CPU in the collector at GOGC=100, on a heap that never held
// 40 MB; a list of millions keeps its peak memory, as one cycle at most
// runs lazily past SmallHeap (to five times what it held: 160 MB at most,
// against 64 MB at GOGC=100). Capping that cycle with a memory limit of
// 128 MB raised a 1M-network list's check peak instead (219-257 MB
// against 196). A GOGC the user set is left alone.
func Lazy() {
	if os.Getenv("GOGC") != "" {
		return
	}
	pace.Lock()
	defer pace.Unlock()
	pace.lazy = true
	set()
	if !pace.watching {
		pace.watching = true
		// A finalizer runs after each collection that finds its object
		// unreachable; set again, it runs after the next one too.
		// Runtime metrics have no callback at a cycle's end.
		runtime.SetFinalizer(&cycle{}, watch)
	}
}

// cycle is the object whose finalizer watches the heap; not zero-sized
// and holding a pointer, so that it is an allocation of its own, which
// the collector frees and finalizes (tiny ones are batched).
type cycle struct{ _ *byte }

// live is read only by watch, on the one goroutine finalizers run on.
var live = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}

func watch(c *cycle) {
	metrics.Read(live)
	if live[0].Value.Kind() == metrics.KindUint64 && live[0].Value.Uint64() <= SmallHeap {
		runtime.SetFinalizer(c, watch)
		return
	}
	pace.Lock()
	pace.lazy, pace.watching = false, false
	set()
	pace.Unlock()
}

// Low holds GOGC at 10% until the returned function is called (once; more
// calls do nothing): for an IPv6 table build, whose garbage comes in
// pieces of tens of MB beside a live set of hundreds, nearly all of it
// pointer-free, so that each collection costs little. Builds may overlap
// (tests, a check beside a service's reload): the last to finish restores
// the pace.
func Low() (restore func()) {
	pace.Lock()
	pace.low++
	set()
	pace.Unlock()
	return sync.OnceFunc(func() {
		pace.Lock()
		pace.low--
		set()
		pace.Unlock()
	})
}
