package datapath

import (
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Spare is a next generation's maps, made ahead at a loaded shape's
// capacities on goroutines of their own while the caller compiles the
// policy they will hold. The kernel allocates and zeroes every element of
// a map it creates (here 0.1-1.5 s for the 604 MB array of ten million
// /128s, 12-16 ms for each of a 10,000-rule policy's per-CPU counters):
// made ahead, that work overlaps the compile, much of which runs on one
// CPU. LoadOver takes the maps whose capacity the policy keeps; Close
// frees the rest.
type Spare struct {
	done   chan struct{}
	mu     sync.Mutex // a generation's maps are taken on goroutines
	maps   map[string]*ebpf.Map
	closed bool // maps made after Close are closed at once
}

// MakeSpare starts making a spare generation for shape's programs. It
// makes none (nil) for no shape, for programs of another build, which no
// generation of this one's fills, and when the maps would take over a
// quarter of the memory available: a policy that does not fit the shape
// gets a program of its own, whose maps must not meet a spare's that the
// kernel is still freeing.
func MakeSpare(shape *Objects) *Spare {
	if shape == nil || !shape.ours() {
		return nil
	}
	spec, err := parsedFilter()
	if err != nil {
		return nil
	}
	specs := map[string]*ebpf.MapSpec{}
	var bytes uint64
	for _, g := range shape.generation() {
		if *g.inner != nil {
			m := spec.Maps[g.name].InnerMap.Copy()
			m.MaxEntries = (*g.inner).MaxEntries()
			specs[g.name] = m
			bytes += mapBytes(*g.inner)
		}
	}
	if avail, ok := memAvailable(); !ok || bytes > avail/4 {
		return nil
	}
	s := &Spare{done: make(chan struct{}), maps: map[string]*ebpf.Map{}}
	go func() {
		defer close(s.done)
		var wg sync.WaitGroup
		for name, ms := range specs {
			wg.Go(func() {
				// A map that fails here is made again when needed, where
				// its error is reported.
				m, err := ebpf.NewMap(ms)
				if err != nil {
					return
				}
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.closed {
					m.Close()
					return
				}
				s.maps[name] = m
			})
		}
		wg.Wait()
	}()
	return s
}

// mapBytes is about the memory map m holds from its creation: its
// elements, for every CPU if per-CPU; none for a hash map that allocates
// them as they come.
func mapBytes(m *ebpf.Map) uint64 {
	if m.Flags()&unix.BPF_F_NO_PREALLOC != 0 {
		return 0
	}
	n := uint64(m.MaxEntries()) * uint64(m.ValueSize())
	if m.Type() == ebpf.PerCPUArray || m.Type() == ebpf.PerCPUHash {
		cpus, err := ebpf.PossibleCPU()
		if err == nil {
			n *= uint64(cpus)
		}
	}
	return n
}

// take hands over the spare map made for name if spec could have made it
// (type, sizes and flags), nil otherwise.
func (s *Spare) take(name string, spec *ebpf.MapSpec) *ebpf.Map {
	if s == nil {
		return nil
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.maps[name]
	if m == nil || spec.Compatible(m) != nil {
		return nil
	}
	delete(s.maps, name)
	return m
}

// ready is the memory that the spare maps a generation of spec would take
// hold already, which the memory check must not count again.
func (s *Spare) ready(spec *ebpf.CollectionSpec) uint64 {
	if s == nil {
		return 0
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for name, m := range s.maps {
		if ms := spec.Maps[name]; ms != nil && ms.InnerMap.Compatible(m) == nil {
			n += mapBytes(m)
		}
	}
	return n
}

// Close frees the maps nobody took, and those still being made as they
// come, without waiting for them.
func (s *Spare) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, m := range s.maps {
		m.Close()
	}
	clear(s.maps)
}
