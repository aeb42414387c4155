package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Objects is one loaded policy: an XDP and a tc program over one set of maps,
// so that `auto` can fall back from XDP to tc without loading lists twice.
type Objects struct {
	XDP      *ebpf.Program
	TC       *ebpf.Program
	Counters *ebpf.Map
	ListsV4  *ebpf.Map
	ListsV6  *ebpf.Map
}

// Kind selects one of the two programs.
type Kind int

const (
	KindXDP Kind = iota
	KindTC
)

// Prog returns the program of the given kind.
func (o *Objects) Prog(k Kind) *ebpf.Program {
	if k == KindTC {
		return o.TC
	}
	return o.XDP
}

// Load builds a fresh program and fresh maps holding img. Nothing is attached.
// A verifier rejection is returned whole.
func Load(img *Image) (*Objects, error) {
	if len(img.Rules) > MaxRules {
		return nil, fmt.Errorf("%d rules: at most %d", len(img.Rules), MaxRules)
	}
	spec, err := loadFilter()
	if err != nil {
		return nil, fmt.Errorf("read embedded BPF object: %w", err)
	}
	var rules [MaxRules]Rule
	copy(rules[:], img.Rules)
	for name, v := range map[string]any{
		"rules":           rules,
		"rule_count":      uint32(len(img.Rules)),
		"default_action":  img.DefaultAction,
		"need_src_lookup": boolByte(img.NeedSrc),
		"need_dst_lookup": boolByte(img.NeedDst),
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	spec.Maps["lists_v4"].MaxEntries = uint32(max(1, len(img.V4)))
	spec.Maps["lists_v6"].MaxEntries = uint32(max(1, len(img.V6)))

	var objs struct {
		Counters *ebpf.Map `ebpf:"counters"`
		ListsV4  *ebpf.Map `ebpf:"lists_v4"`
		ListsV6  *ebpf.Map `ebpf:"lists_v6"`
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("the kernel's verifier rejected the filter program:\n%+v", ve)
		}
		return nil, fmt.Errorf("load BPF objects: %w", err)
	}
	defer coll.Close()
	if err := coll.Assign(&objs); err != nil {
		return nil, err
	}
	o := &Objects{XDP: coll.DetachProgram("rampart_xdp"), TC: coll.DetachProgram("rampart_tc"), Counters: objs.Counters, ListsV4: objs.ListsV4, ListsV6: objs.ListsV6}
	if err := o.fill(img); err != nil {
		o.Close()
		return nil, err
	}
	return o, nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func (o *Objects) fill(img *Image) error {
	if err := putAll(o.ListsV4, img.V4); err != nil {
		return fmt.Errorf("fill IPv4 lists: %w", err)
	}
	if err := putAll(o.ListsV6, img.V6); err != nil {
		return fmt.Errorf("fill IPv6 lists: %w", err)
	}
	return nil
}

// putAll writes entries with batch updates, falling back to one at a time
// where the map type has no batch operation.
func putAll[K LPMKeyV4 | LPMKeyV6](m *ebpf.Map, entries []Entry[K]) error {
	keys := make([]K, len(entries))
	vals := make([]uint64, len(entries))
	for i, e := range entries {
		keys[i], vals[i] = e.Key, e.Mask
	}
	const chunk = 1 << 16
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		if _, err := m.BatchUpdate(keys[i:j], vals[i:j], nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return err
			}
			for k := i; k < j; k++ {
				if err := m.Put(keys[k], vals[k]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Close releases the file descriptors; pinned objects stay in the kernel.
func (o *Objects) Close() {
	for _, c := range []interface{ Close() error }{o.XDP, o.TC, o.Counters, o.ListsV4, o.ListsV6} {
		if c != nil {
			c.Close()
		}
	}
}

// Pin places the objects under dir, which must not exist yet.
func (o *Objects) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, p := range map[string]interface{ Pin(string) error }{
		"xdp": o.XDP, "tc": o.TC, "counters": o.Counters, "lists_v4": o.ListsV4, "lists_v6": o.ListsV6,
	} {
		if err := p.Pin(filepath.Join(dir, name)); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("pin %s: %w", name, err)
		}
	}
	return nil
}

// ReadCounters sums the per-CPU counters of every slot.
func ReadCounters(m *ebpf.Map) ([]Counter, error) {
	out := make([]Counter, NumSlots)
	var percpu []Counter
	for slot := uint32(0); slot < NumSlots; slot++ {
		if err := m.Lookup(slot, &percpu); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", slot, err)
		}
		for _, c := range percpu {
			out[slot].Packets += c.Packets
			out[slot].Bytes += c.Bytes
		}
	}
	return out, nil
}

func (k Kind) String() string {
	if k == KindTC {
		return "tc"
	}
	return "xdp"
}
