package lab

import (
	"encoding/binary"
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

// BatchSize is how many frames the kernel prepares and flushes at once in
// live-frames mode, the kernel's own default.
const BatchSize = 64

// runChunk is how many frames one BPF_PROG_RUN call sends: about a tenth
// of a second at the rates seen, so a stop is noticed promptly.
const runChunk = 1 << 20

// Traffic is what the generator sends for one family. Its sources are
// Count addresses (IPv6: /64s) spread over a range; the generator computes
// source i as base | ((i * mult) & mask) in the varying 32-bit word, which
// an odd mult makes a bijection, and a study's blocklist lists exactly
// these sources (or, Unlisted, as many others).
type Traffic struct {
	Family           int
	Count            uint32
	base, mask, mult uint32
	hi               [4]byte // IPv6: the fixed first 32 bits
	// ListFrom is the list's first source: the list holds sources
	// ListFrom to ListFrom+Count-1 of the same spread. 0: the flood's own;
	// Count: as many others, none of them the flood's (Unlisted).
	ListFrom uint32
	Proto    uint8  // UDP, or TCP for a SYN flood
	Port     uint16 // destination port
	// FloorBytes sizes lab_xdp_floor's array: what rampart's tables take
	// for the sources as a list (TableBytes). 0 gives it one word.
	FloorBytes uint64
}

// NewTraffic spreads count sources over prefix, UDP to DstPort. IPv4
// varies the host bits; IPv6 varies bits 32-63 below the prefix and
// randomises the rest.
func NewTraffic(family int, prefix netip.Prefix, count int) (*Traffic, error) {
	if (family == 4) != prefix.Addr().Is4() {
		return nil, fmt.Errorf("source range %s is not IPv%d", prefix, family)
	}
	prefix = prefix.Masked()
	a := prefix.Addr().As16()
	f := &Traffic{Family: family, Count: uint32(count), Proto: unix.IPPROTO_UDP, Port: DstPort}
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

// Source is the i-th source as the blocklist lists it.
func (f *Traffic) Source(i uint32) netip.Prefix {
	w := f.base | (i*f.mult)&f.mask
	if f.Family == 4 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], w)
		return netip.PrefixFrom(netip.AddrFrom4(a), 32)
	}
	var a [16]byte
	copy(a[:], f.hi[:])
	binary.BigEndian.PutUint32(a[4:], w)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// Unlisted makes the list Count sources of the same spread that the flood
// never sends from: the flood is then of unlisted sources, at the same
// list size. The range must hold twice Count.
func (f *Traffic) Unlisted() error {
	if uint64(f.Count)*2 > uint64(f.mask)+1 {
		return fmt.Errorf("the source range holds fewer than %d sources, the flood's and as many unlisted: give a wider range", uint64(f.Count)*2)
	}
	f.ListFrom = f.Count
	return nil
}

// Listed is the list's i-th source.
func (f *Traffic) Listed(i uint32) netip.Prefix { return f.Source(f.ListFrom + i) }

// Prefixes lists the sources as the list files hold them.
func (f *Traffic) Prefixes() []netip.Prefix {
	out := make([]netip.Prefix, f.Count)
	for i := range out {
		out[i] = f.Listed(uint32(i))
	}
	return out
}

// WriteList writes the sources as a list file, one prefix a line, and
// returns its path.
func (f *Traffic) WriteList(dir string) (string, error) {
	path := filepath.Join(dir, fmt.Sprintf("flood-v%d.txt", f.Family))
	b := make([]byte, 0, int(f.Count)*24)
	for i := range f.Count {
		b = f.Listed(i).AppendTo(b)
		b = append(b, '\n')
	}
	return path, os.WriteFile(path, b, 0o644)
}

// frame is the template the generator rewrites: the study's UDP packet with
// 16 bytes of payload to the traffic's destination, or a SYN with an MSS
// option; source address and port (and a SYN's sequence number) are
// overwritten per frame, checksums kept valid.
func (f *Traffic) frame(srcMAC, dstMAC net.HardwareAddr) []byte {
	src, dst := GenAddr4, RxAddr4
	if f.Family == 6 {
		src, dst = GenAddr6, RxAddr6
	}
	fr := packet.Frame{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, Proto: f.Proto, Sport: 40000, Dport: f.Port}
	if f.Proto == unix.IPPROTO_TCP {
		fr.TCPFlags, fr.TCPOpts = 0x02, []byte{2, 4, 0x05, 0xb4}
	} else {
		fr.Payload = 16
	}
	return fr.Bytes()
}

// Generator runs lab_gen on one CPU, inside the generator's namespace (so
// bpf_redirect finds its veth), until halted.
type Generator struct {
	stop chan struct{}
	wg   sync.WaitGroup
	err  error
}

// StartGenerator sends tr from t's generator side at the full rate of one
// CPU.
func StartGenerator(objs *Objects, t *Topology, tr *Traffic, cpu int) *Generator {
	frame := tr.frame(t.GenMAC, t.RxMAC)
	g := &Generator{stop: make(chan struct{})}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		// The thread is left locked, and so discarded when this goroutine
		// ends, because it no longer is in our namespace.
		if err := PinSelf(cpu); err != nil {
			g.err = fmt.Errorf("pin the generator to CPU %d: %w", cpu, err)
			return
		}
		if err := netns.Enter(t.GenNs); err != nil {
			g.err = err
			return
		}
		opts := &ebpf.RunOptions{Data: frame, Repeat: runChunk, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES, BatchSize: BatchSize}
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

// Halt stops the generator and returns what stopped it early, if anything.
func (g *Generator) Halt() error {
	close(g.stop)
	g.wg.Wait()
	return g.err
}
