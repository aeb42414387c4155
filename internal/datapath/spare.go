package datapath

import (
	"sync"

	"github.com/cilium/ebpf"
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
	done chan struct{}
	mu   sync.Mutex // a generation's maps are taken on goroutines
	maps map[string]*ebpf.Map
}

// MakeSpare starts making a spare generation for shape's programs; nil
// (no spare) when shape is nil.
func MakeSpare(shape *Objects) *Spare {
	if shape == nil {
		return nil
	}
	spec, err := parsedFilter()
	if err != nil {
		return nil
	}
	specs := map[string]*ebpf.MapSpec{}
	for _, g := range shape.generation() {
		if *g.inner != nil {
			m := spec.Maps[g.name].InnerMap.Copy()
			m.MaxEntries = (*g.inner).MaxEntries()
			specs[g.name] = m
		}
	}
	s := &Spare{done: make(chan struct{}), maps: map[string]*ebpf.Map{}}
	go func() {
		defer close(s.done)
		var wg sync.WaitGroup
		for name, ms := range specs {
			wg.Go(func() {
				// A map that fails here is made again when needed, where
				// its error is reported.
				if m, err := ebpf.NewMap(ms); err == nil {
					s.mu.Lock()
					s.maps[name] = m
					s.mu.Unlock()
				}
			})
		}
		wg.Wait()
	}()
	return s
}

// take hands over the spare map made for name if it is what spec makes,
// nil otherwise.
func (s *Spare) take(name string, spec *ebpf.MapSpec) *ebpf.Map {
	if s == nil {
		return nil
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.maps[name]
	if m == nil || m.Type() != spec.Type || m.KeySize() != spec.KeySize || m.ValueSize() != spec.ValueSize ||
		m.MaxEntries() != spec.MaxEntries || m.Flags() != spec.Flags {
		return nil
	}
	delete(s.maps, name)
	return m
}

// bytes is about what the spare maps hold: memory already taken for the
// generation, which CheckMemory must not count again.
func (s *Spare) bytes() uint64 {
	if s == nil {
		return 0
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for _, m := range s.maps {
		n += uint64(m.MaxEntries()) * uint64(m.ValueSize())
	}
	return n
}

// Close frees the maps nobody took.
func (s *Spare) Close() {
	if s == nil {
		return
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.maps {
		m.Close()
	}
	clear(s.maps)
}
