package datapath

import (
	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/abi"
)

// HideTCX makes tc attach as on a kernel without tcx (a clsact filter) until
// the returned function runs.
func HideTCX() (restore func()) {
	saved := haveTCX
	haveTCX = func() bool { return false }
	return func() { haveTCX = saved }
}

// SmallWriteWindow makes writeArray map 64 KiB at a time, so that tables of
// a few MB take many windows, until the returned function runs.
func SmallWriteWindow() (restore func()) {
	saved := writeWindow
	writeWindow = 64 << 10
	return func() { writeWindow = saved }
}

// BothSlots puts a's generation in slot 0 and b's in slot 1 of their
// shape's outer maps, and returns what makes a slot live with one map
// update: flips far faster than Activate's, with no grace period, to race
// frames against.
func BothSlots(a, b *Objects) (flip func(slot uint32) error, err error) {
	for i, g := range a.generation() {
		if err := (*g.outer).Put(uint32(0), *g.inner); err != nil {
			return nil, err
		}
		if err := (*g.outer).Put(uint32(1), *b.generation()[i].inner); err != nil {
			return nil, err
		}
	}
	return func(slot uint32) error { return a.shape.Live.Put(uint32(0), abi.Live{Gen: slot, Object: objectID()}) }, nil
}

// AsAnotherBuild marks o's programs as loaded from another build of the
// object, as an earlier release's are.
func AsAnotherBuild(o *Objects) error {
	var live abi.Live
	if err := o.shape.Live.Lookup(uint32(0), &live); err != nil {
		return err
	}
	live.Object++
	return o.shape.Live.Put(uint32(0), live)
}

// SpareIDs are the IDs of s's maps by name, once they are made.
func SpareIDs(s *Spare) map[string]ebpf.MapID {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return mapIDs(s.maps)
}

// GenerationIDs are the IDs of o's own maps by name.
func GenerationIDs(o *Objects) map[string]ebpf.MapID {
	maps := map[string]*ebpf.Map{}
	for _, g := range o.generation() {
		maps[g.name] = *g.inner
	}
	return mapIDs(maps)
}

func mapIDs(maps map[string]*ebpf.Map) map[string]ebpf.MapID {
	ids := map[string]ebpf.MapID{}
	for name, m := range maps {
		if info, err := m.Info(); err == nil {
			ids[name], _ = info.ID()
		}
	}
	return ids
}
