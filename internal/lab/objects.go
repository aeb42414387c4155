package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"
)

// Objects are the lab's programs and maps (bpf/lab.c): the generator, the
// drop programs the studies attach, the LPM tries they look lists up in,
// the floor's array, and lab_sink.
type Objects struct{ labObjects }

// LoadObjects loads the lab's programs for one row: the generator aimed at
// the topology's veth with tr's sources, the tries sized for tr's list and
// the floor's array for tr.FloorBytes.
func LoadObjects(t *Topology, tr *Traffic) (*Objects, error) {
	spec, err := loadLab()
	if err != nil {
		return nil, err
	}
	p4, p6 := RxAddr4.As4(), RxAddr6.As16()
	c4, c6 := ClientNet4.Addr().As4(), ClientNet6.Addr().As16()
	frame := tr.frame(t.GenMAC, t.RxMAC)
	var template [10]uint64
	if len(frame) > 8*len(template) {
		return nil, fmt.Errorf("the traffic's frame is %d bytes, the generator's template holds %d", len(frame), 8*len(template))
	}
	for i := range template {
		var b [8]byte
		copy(b[:], frame[min(8*i, len(frame)):])
		template[i] = binary.NativeEndian.Uint64(b[:])
	}
	// The floor's array has rampart's table bytes in 4-byte words.
	floorWords := uint32(min(max(1, tr.FloorBytes/4), math.MaxUint32))
	for name, v := range map[string]any{
		labVarOutIfindex:    uint32(t.GenIndex),
		labVarGenFamily:     uint8(tr.Family),
		labVarGenProto:      tr.Proto,
		labVarClient4Prefix: [3]byte(c4[:3]),
		labVarClient6Prefix: [8]byte(c6[:8]),
		labVarSrcCount:      tr.Count,
		labVarSrcBase:       tr.base,
		labVarSrcMask:       tr.mask,
		labVarSrcMult:       tr.mult,
		labVarGenTemplate:   template,
		labVarSrc6Hi:        binary.NativeEndian.Uint32(tr.hi[:]), // the bytes as they lie in the packet
		labVarDst4Prefix:    [3]byte(p4[:3]),
		labVarDst6Prefix:    [8]byte(p6[:8]),
		labVarFloodPort:     tr.Port,
		labVarFloorWords:    floorWords,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	spec.Maps[labMapLabLpmV4].MaxEntries, spec.Maps[labMapLabLpmV6].MaxEntries = max(1, tr.Count), max(1, tr.Count)
	spec.Maps[labMapLabFloor].MaxEntries = floorWords
	return load(spec)
}

// LoadLPM loads the lab's programs with the IPv4 trie sized for entries
// prefixes, for a filter that needs no generator.
func LoadLPM(entries int) (*Objects, error) {
	spec, err := loadLab()
	if err != nil {
		return nil, err
	}
	spec.Maps[labMapLabLpmV4].MaxEntries = uint32(max(1, entries))
	return load(spec)
}

func load(spec *ebpf.CollectionSpec) (*Objects, error) {
	var objs Objects
	if err := spec.LoadAndAssign(&objs.labObjects, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load lab programs: %+v", ve)
		}
		return nil, fmt.Errorf("load lab programs: %w", err)
	}
	return &objs, nil
}

// AddPrefixes puts every prefix into its family's trie, one update each:
// the trie has no batch update.
func (o *Objects) AddPrefixes(ps []netip.Prefix) error {
	var err error
	for i, p := range ps {
		if p.Addr().Is4() {
			err = o.LabLpmV4.Put(labLabLpmV4Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}, uint8(1))
		} else {
			err = o.LabLpmV6.Put(labLabLpmV6Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}, uint8(1))
		}
		if err != nil {
			return fmt.Errorf("LPM trie, prefix %d: %w", i, err)
		}
	}
	return nil
}

// AttachTC attaches prog as the studies did: a clsact qdisc on ifindex in
// ns and a cls_bpf filter called name in direct-action mode, at ingress,
// or at egress when egress is set.
func AttachTC(ns string, ifindex int, egress bool, prog *ebpf.Program, name string) error {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return netns.Run(ns, func() error {
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscAdd(q); err != nil {
			return fmt.Errorf("add clsact: %w", err)
		}
		f := &netlink.BpfFilter{
			FilterAttrs:  netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd:           prog.FD(),
			Name:         name,
			DirectAction: true,
		}
		if err := netlink.FilterAdd(f); err != nil {
			return fmt.Errorf("add cls_bpf filter: %w", err)
		}
		return nil
	})
}

// Sent is how many frames the generator has sent so far.
func (o *Objects) Sent() (uint64, error) {
	var n uint64
	return n, o.Generated.Get(&n)
}
