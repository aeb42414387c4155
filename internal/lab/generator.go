package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampart-fw/rampart/internal/netns"

	"github.com/rampart-fw/rampart/internal/packet"
)

// batchSize is how many frames the kernel prepares and flushes at once in
// live-frames mode, the kernel's own default.
const batchSize = 64

// runChunk is how many frames one BPF_PROG_RUN call sends: about a tenth
// of a second at the rates seen, so a stop is noticed promptly.
const runChunk = 1 << 20

// flood is the traffic of one family. Its sources are count addresses
// (IPv6: /64s) spread over a range; the generator computes source i as
// base | ((i * mult) & mask) in the varying 32-bit word, which an odd mult
// makes a bijection, and the lab's blocklist lists exactly these sources.
type flood struct {
	family           int
	count            uint32
	base, mask, mult uint32
	hi               [4]byte // IPv6: the fixed first 32 bits
	proto            uint8   // UDP, or TCP for a SYN flood
	port             uint16  // destination port
}

// newFlood spreads count sources over prefix. IPv4 varies the host bits;
// IPv6 varies bits 32-63 below the prefix and randomises the rest.
func newFlood(family int, prefix netip.Prefix, count int) (*flood, error) {
	if (family == 4) != prefix.Addr().Is4() {
		return nil, fmt.Errorf("source range %s is not IPv%d", prefix, family)
	}
	prefix = prefix.Masked()
	a := prefix.Addr().As16()
	f := &flood{family: family, count: uint32(count), proto: unix.IPPROTO_UDP, port: floodPort}
	word, fixed := binary.BigEndian.Uint32(a[12:]), prefix.Bits()
	if family == 6 {
		if prefix.Bits() > 63 {
			return nil, fmt.Errorf("source range %s: give a prefix of /63 or shorter, sources are /64s", prefix)
		}
		copy(f.hi[:], a[:4])
		word, fixed = binary.BigEndian.Uint32(a[4:8]), max(prefix.Bits()-32, 0)
	}
	varying := 32 - fixed
	if varying < 32 && uint64(count) > uint64(1)<<varying {
		return nil, fmt.Errorf("source range %s holds fewer than %d sources: give a wider range", prefix, count)
	}
	f.mask = uint32(uint64(1)<<varying - 1)
	f.base = word &^ f.mask
	f.mult = (0x9e3779b1 & f.mask) | 1 // odd: a bijection modulo 2^varying
	return f, nil
}

// source is the i-th source as the blocklist lists it.
func (f *flood) source(i uint32) netip.Prefix {
	w := f.base | (i*f.mult)&f.mask
	if f.family == 4 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], w)
		return netip.PrefixFrom(netip.AddrFrom4(a), 32)
	}
	var a [16]byte
	copy(a[:], f.hi[:])
	binary.BigEndian.PutUint32(a[4:], w)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// writeList writes the sources as a list file, one prefix a line.
func (f *flood) writeList(dir string) (string, error) {
	path := filepath.Join(dir, fmt.Sprintf("flood-v%d.txt", f.family))
	b := make([]byte, 0, int(f.count)*24)
	for i := range f.count {
		b = f.source(i).AppendTo(b)
		b = append(b, '\n')
	}
	return path, os.WriteFile(path, b, 0o644)
}

// frame is the template the generator rewrites: the study's UDP packet with
// 16 bytes of payload to the flood's destination, or a SYN with an MSS
// option; source address and port (and a SYN's sequence number) are
// overwritten per frame, checksums kept valid.
func (f *flood) frame(srcMAC, dstMAC net.HardwareAddr) []byte {
	src, dst := genAddr4, rxAddr4
	if f.family == 6 {
		src, dst = genAddr6, rxAddr6
	}
	fr := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: f.proto, Sport: 40000, Dport: f.port}
	if f.proto == unix.IPPROTO_TCP {
		fr.TCPFlags, fr.TCPOpts = 0x02, []byte{2, 4, 0x05, 0xb4}
	} else {
		fr.Payload = 16
	}
	return fr.Bytes()
}

// loadObjects loads the lab's programs for one row: the generator aimed at
// the topology's veth with f's sources, and the drop programs.
func loadObjects(t *topology, f *flood) (*labObjects, error) {
	spec, err := loadLab()
	if err != nil {
		return nil, err
	}
	p4, p6 := rxAddr4.As4(), rxAddr6.As16()
	c4, c6 := clientNet4.Addr().As4(), clientNet6.Addr().As16()
	frame := f.frame(t.genMAC, t.rxMAC)
	var template [10]uint64
	if len(frame) > 8*len(template) {
		return nil, fmt.Errorf("the flood's frame is %d bytes, the generator's template holds %d", len(frame), 8*len(template))
	}
	for i := range template {
		var b [8]byte
		copy(b[:], frame[min(8*i, len(frame)):])
		template[i] = binary.NativeEndian.Uint64(b[:])
	}
	for name, v := range map[string]any{
		labVarOutIfindex:    uint32(t.genIndex),
		labVarGenFamily:     uint8(f.family),
		labVarGenProto:      f.proto,
		labVarClient4Prefix: [3]byte(c4[:3]),
		labVarClient6Prefix: [8]byte(c6[:8]),
		labVarSrcCount:      f.count,
		labVarSrcBase:       f.base,
		labVarSrcMask:       f.mask,
		labVarSrcMult:       f.mult,
		labVarGenTemplate:   template,
		labVarSrc6Hi:        binary.NativeEndian.Uint32(f.hi[:]), // the bytes as they lie in the packet
		labVarDst4Prefix:    [3]byte(p4[:3]),
		labVarDst6Prefix:    [8]byte(p6[:8]),
		labVarFloodPort:     f.port,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	// The xdp-lpm layer's tries hold the list.
	spec.Maps[labMapLabLpmV4].MaxEntries, spec.Maps[labMapLabLpmV6].MaxEntries = max(1, f.count), max(1, f.count)
	var objs labObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load lab programs: %+v", ve)
		}
		return nil, fmt.Errorf("load lab programs: %w", err)
	}
	return &objs, nil
}

// generator runs lab_gen on one CPU, inside the generator's namespace (so
// bpf_redirect finds its veth), until stopped.
type generator struct {
	stop chan struct{}
	wg   sync.WaitGroup
	err  error
}

func startGenerator(objs *labObjects, t *topology, frame []byte, cpu int) *generator {
	g := &generator{stop: make(chan struct{})}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		// The thread is left locked, and so discarded when this goroutine
		// ends, because it no longer is in our namespace.
		if err := pinSelf(cpu); err != nil {
			g.err = fmt.Errorf("pin the generator to CPU %d: %w", cpu, err)
			return
		}
		if err := netns.Enter(t.genNs); err != nil {
			g.err = err
			return
		}
		opts := &ebpf.RunOptions{Data: frame, Repeat: runChunk, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES, BatchSize: batchSize}
		for {
			select {
			case <-g.stop:
				return
			default:
			}
			if _, err := objs.LabGen.Run(opts); err != nil {
				g.err = fmt.Errorf("generator: BPF_PROG_RUN in live-frames mode: %w", err)
				return
			}
		}
	}()
	return g
}

// generated is how many frames the generator has sent so far.
func generated(objs *labObjects) (uint64, error) {
	var n uint64
	return n, objs.Generated.Get(&n)
}

func (g *generator) halt() error {
	close(g.stop)
	g.wg.Wait()
	return g.err
}
