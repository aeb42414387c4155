package cli_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"

	"github.com/rampart-fw/rampart/internal/packet"
)

// The attacker's frames for the kernel-oracle test: datagrams from listed
// and allowed sources, to dropped and allowed ports, in every shape the
// parser must survive, each carrying a marker with its id.

var (
	listed4  = netip.MustParsePrefix("198.18.0.0/16")
	mapped4  = netip.MustParseAddr("198.17.0.5") // listed as ::ffff:198.17.0.5
	listed6  = netip.MustParsePrefix("2001:db8:bad::/48")
	allowed4 = netip.MustParsePrefix("100.64.0.0/16")
	allowed6 = netip.MustParsePrefix("2001:db8:600d::/48")
)

const oraclePolicy = `
lists:
  bl: {prefixes: [198.18.0.0/16, "2001:db8:bad::/48", "::ffff:198.17.0.5"]}
rules:
  - {name: bl-drop, src: bl, action: drop}
  - {name: udp-ports, proto: udp, dport: 7000-7999, action: drop}
  - {name: tcp-ports, proto: tcp, dport: 7000-7999, action: drop}
  - {name: syn-8000, proto: tcp, dport: 8000, tcp_flags: "syn,!ack", action: drop}
default: pass
`

// Ports the receiver listens on: allowed ones, and dropped ones.
const (
	udpAllowed = 9999
	tcpAllowed = 9998
	udpDropped = 7000
	tcpDropped = 7001
	tcpSYNRule = 8000
)

// mustDrop reports whether the policy drops what the kernel delivered:
// its source, protocol, destination port and TCP flags. The kernel's view
// is the oracle's: a datagram it delivered is judged as it arrived.
func mustDrop(src netip.Addr, proto int, dport uint16, flags uint8, haveFlags bool) bool {
	src = src.Unmap()
	if listed4.Contains(src) || listed6.Contains(src) || src == mapped4 {
		return true
	}
	if (proto == 6 || proto == 17) && dport >= 7000 && dport <= 7999 {
		return true
	}
	return proto == 6 && dport == tcpSYNRule && haveFlags && flags&0x02 != 0 && flags&0x10 == 0
}

// A datagram's marker: "RPT!", its id, and the id's complement, so that a
// marker a mutation damaged reads as none rather than as another id.
var marker = []byte("RPT!")

func markerOf(id uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(append([]byte{}, marker...), id), ^id)
}

// markedID finds a marker in b.
func markedID(b []byte) (uint32, bool) {
	for i := bytes.Index(b, marker); i >= 0 && i+12 <= len(b); {
		id := binary.BigEndian.Uint32(b[i+4:])
		if binary.BigEndian.Uint32(b[i+8:]) == ^id {
			return id, true
		}
		next := bytes.Index(b[i+1:], marker)
		if next < 0 {
			break
		}
		i += 1 + next
	}
	return 0, false
}

// receiverAddrs are the receiver's addresses and the MACs of the pair.
type receiverAddrs struct {
	v4, v6 netip.Addr
	mac    net.HardwareAddr
	srcMAC net.HardwareAddr
}

// priorityTags is a stack of n VLAN tags of id 0: the kernel strips them one
// after another, however many, and delivers what they carry, with or
// without VLAN devices.
func priorityTags(n int) []uint16 { return make([]uint16, n) }

type oracleDatagram struct {
	id     uint32
	shape  string
	frames [][]byte
}

type oracleGen struct {
	rng   *rand.Rand
	to    receiverAddrs
	next4 uint32 // IPv4 identifications: unique per source block
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func (g *oracleGen) source(v6, listed bool) netip.Addr {
	rng := g.rng
	if v6 {
		p := allowed6
		if listed {
			p = listed6
		}
		b := p.Addr().As16()
		binary.BigEndian.PutUint64(b[8:], rng.Uint64())
		return netip.AddrFrom16(b)
	}
	if listed && rng.IntN(8) == 0 {
		return mapped4
	}
	p := allowed4
	if listed {
		p = listed4
	}
	b := p.Addr().As4()
	// IPv4 identifications are 16 bits: a new /24 every 65536 datagrams
	// keeps (source, id) unique, so no fragment joins another's queue.
	b[2], b[3] = byte(g.next4>>16), byte(1+rng.IntN(254))
	return netip.AddrFrom4(b)
}

// datagram draws one datagram and cuts it into frames.
func (g *oracleGen) datagram(id uint32) oracleDatagram {
	rng := g.rng
	v6 := rng.IntN(2) == 0
	depth := pick(rng, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 5, 17, 60)
	listed := rng.IntN(5) < 2
	proto := pick[uint8](rng, 17, 17, 17, 17, 6, 6, 6, 1)
	if v6 && proto == 1 {
		proto = 58
	}
	f := packet.Frame{SrcMAC: g.to.srcMAC, DstMAC: g.to.mac, VLANs: priorityTags(depth), Src: g.source(v6, listed), Proto: proto, Sport: uint16(1024 + rng.IntN(60000))}
	f.Dst = g.to.v4
	if v6 {
		f.Dst = g.to.v6
	}
	switch proto {
	case 17:
		f.Dport = pick[uint16](rng, udpAllowed, udpAllowed, udpDropped, uint16(7000+rng.IntN(1000)))
	case 6:
		f.Dport = pick[uint16](rng, tcpAllowed, tcpAllowed, tcpDropped, tcpSYNRule, uint16(7000+rng.IntN(1000)))
		f.TCPFlags = pick[uint8](rng, 0x02, 0x02, 0x12, 0x10, 0x18, uint8(rng.IntN(256)))
	}
	f.Data = markerOf(id)
	f.Payload = rng.IntN(200)

	kind := pick(rng, "plain", "plain", "plain", "ext", "ext", "frag", "frag", "mutated", "mutated", "mutated")
	var shape []string
	if v6 && (kind == "ext" || rng.IntN(4) == 0) {
		var name string
		f.Ext, name = g.chain()
		shape = append(shape, name)
	}
	full := f.Bytes()
	for len(full) > 1400 { // stay within the MTU, tags included
		switch {
		case f.Payload > 0:
			f.Payload = 0
		case len(f.Ext) > 1:
			f.Ext = f.Ext[:len(f.Ext)/2]
		default:
			f.VLANs = f.VLANs[:len(f.VLANs)/2]
		}
		full = f.Bytes()
	}
	frames := [][]byte{full}
	fragID := id // IPv6: 32 bits, unique
	if !v6 {
		fragID = g.next4 // IPv4: 16 bits, unique within the source block
		g.next4++
	}
	if kind == "frag" || rng.IntN(6) == 0 {
		var name string
		frames, name = g.fragment(full, f, fragID)
		shape = append(shape, name)
	}
	if kind == "mutated" || rng.IntN(10) == 0 {
		i := rng.IntN(len(frames))
		var how string
		frames[i], how = g.mutate(frames[i], v6)
		shape = append(shape, "mutated-"+how)
	}
	if len(shape) == 0 {
		shape = append(shape, "plain")
	}
	name := strings.Join(shape, "+")
	if len(f.VLANs) > 0 {
		name += fmt.Sprintf("/vlan%d", len(f.VLANs))
	}
	return oracleDatagram{id: id, shape: name, frames: frames}
}

// chain draws an IPv6 extension-header chain.
func (g *oracleGen) chain() ([]packet.ExtHdr, string) {
	rng := g.rng
	switch rng.IntN(6) {
	case 0:
		n := 1 + rng.IntN(9)
		return repeatExt(60, 8, n), "v6-dstopts-few"
	case 1:
		n := 9 + rng.IntN(150) // up to the MTU
		return repeatExt(60, 8, n), "v6-dstopts-many"
	case 2:
		return []packet.ExtHdr{packet.Ext(0, 520)}, "v6-hbh-520"
	case 3:
		return append([]packet.ExtHdr{packet.Ext(0, 8*(1+rng.IntN(100)))}, repeatExt(60, 16, 1+rng.IntN(20))...), "v6-hbh-dstopts"
	case 4:
		return []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(43, 24), packet.Ext(60, 8*(1+rng.IntN(60)))}, "v6-routing"
	default:
		return []packet.ExtHdr{packet.Ext(51, 24)}, "v6-ah"
	}
}

func repeatExt(typ uint8, size, n int) []packet.ExtHdr {
	out := make([]packet.ExtHdr, n)
	for i := range out {
		out[i] = packet.Ext(typ, size)
	}
	return out
}

// fragmentable is the length of what follows the unfragmentable part.
func fragmentable(full []byte, v6 bool) int {
	l3 := packet.L3Offset(full)
	if !v6 {
		return int(binary.BigEndian.Uint16(full[l3+2:])) - int(full[l3]&0xf)*4
	}
	n := int(binary.BigEndian.Uint16(full[l3+4:]))
	if full[l3+6] == 0 {
		n -= (int(full[l3+41]) + 1) * 8
	}
	return n
}

// fragment cuts a datagram: in order, reversed, shuffled, a tiny first
// fragment, overlapping fragments that disagree on the ports or flags, or an
// IPv6 first fragment whose header chain goes on past it.
func (g *oracleGen) fragment(full []byte, f packet.Frame, id uint32) ([][]byte, string) {
	rng := g.rng
	v6 := f.Src.Is6()
	n := fragmentable(full, v6)
	if n < 24 {
		return [][]byte{full}, "frag-too-short"
	}
	var pieces []packet.Piece
	cut := func(at ...int) {
		prev := 0
		for _, a := range append(at, n) {
			if a > prev && a <= n {
				pieces = append(pieces, packet.Piece{Off: prev, Len: a - prev})
				prev = a
			}
		}
	}
	shape := pick(rng, "frag-inorder", "frag-reversed", "frag-shuffled", "frag-tiny-first", "frag-overlap-ports", "frag-overlap-flags", "frag-chain-split")
	chained := len(f.Ext) > 1 || len(f.Ext) == 1 && f.Ext[0].Type != 0
	if chained && (shape == "frag-overlap-ports" || shape == "frag-overlap-flags") {
		shape = "frag-inorder" // the overlap rewrites an L4 header at the start of the part
	}
	switch shape {
	case "frag-inorder", "frag-reversed", "frag-shuffled":
		at := []int{}
		for a := 8 * (1 + rng.IntN(max(1, n/8-1))); a < n && len(at) < 5; a += 8 * (1 + rng.IntN(max(1, n/16))) {
			at = append(at, a)
		}
		cut(at...)
		if shape == "frag-reversed" {
			for i, j := 0, len(pieces)-1; i < j; i, j = i+1, j-1 {
				pieces[i], pieces[j] = pieces[j], pieces[i]
			}
		}
		if shape == "frag-shuffled" {
			rng.Shuffle(len(pieces), func(i, j int) { pieces[i], pieces[j] = pieces[j], pieces[i] })
		}
	case "frag-tiny-first":
		cut(8)
	case "frag-overlap-ports", "frag-overlap-flags":
		// The first fragment says one thing; a second one, rewriting the
		// same bytes, says another (RFC 1858).
		frag := append([]byte{}, full[len(full)-n:]...)
		if shape == "frag-overlap-ports" {
			binary.BigEndian.PutUint16(frag[2:], pick[uint16](rng, udpDropped, tcpDropped, udpAllowed))
		} else if n > 14 {
			frag[13] ^= 0x12
		}
		pieces = []packet.Piece{{Off: 0, Len: 16}, {Off: 8, Len: n - 8, Data: frag[8:]}}
		if rng.IntN(2) == 0 {
			pieces = []packet.Piece{{Off: 0, Len: n}, {Off: 0, Len: 16, Data: frag[:16]}}
		}
	case "frag-chain-split":
		cut(8 * (1 + rng.IntN(3)))
	}
	return packet.Fragments(full, id, pieces...), shape
}

// mutate damages one frame the ways an attacker would.
func (g *oracleGen) mutate(b []byte, v6 bool) ([]byte, string) {
	rng := g.rng
	b = append([]byte{}, b...)
	l3 := packet.L3Offset(b)
	fix := func() {
		if !v6 && len(b) >= l3+20 {
			hl := min(int(b[l3]&0xf)*4, len(b)-l3)
			b[l3+10], b[l3+11] = 0, 0
			binary.BigEndian.PutUint16(b[l3+10:], packet.Checksum(b[l3:l3+hl]))
		}
	}
	switch rng.IntN(5) {
	case 0:
		return b[:14+rng.IntN(len(b)-14)], "truncated"
	case 1:
		if v6 {
			binary.BigEndian.PutUint16(b[l3+4:], uint16(rng.IntN(len(b)+64)))
			return b, "payload-length"
		}
		b[l3] = 0x40 | byte(rng.IntN(16))
		fix()
		return b, "ihl"
	case 2:
		if v6 {
			// Lengthen or shorten one extension header, if any.
			if isExt(b[l3+6]) {
				b[l3+41] = byte(rng.IntN(256))
			}
			return b, "ext-length"
		}
		binary.BigEndian.PutUint16(b[l3+2:], uint16(rng.IntN(len(b)+64)))
		fix()
		return b, "total-length"
	case 3:
		// Cut the datagram at a random byte and say so in its length: a
		// cut L4 header the lengths agree with.
		keep := 1 + rng.IntN(max(1, len(b)-l3-1))
		if v6 {
			keep = 40 + rng.IntN(max(1, len(b)-l3-40))
			binary.BigEndian.PutUint16(b[l3+4:], uint16(keep-40))
		} else {
			keep = max(keep, int(b[l3]&0xf)*4)
			binary.BigEndian.PutUint16(b[l3+2:], uint16(keep))
			fix()
		}
		return b[:min(len(b), l3+keep)], "cut-consistent"
	default:
		for i := 0; i < 1+rng.IntN(4); i++ {
			b[14+rng.IntN(len(b)-14)] = byte(rng.IntN(256))
		}
		if rng.IntN(2) == 0 {
			fix()
		}
		return b, "flipped"
	}
}

func isExt(nh byte) bool { return nh == 0 || nh == 43 || nh == 44 || nh == 51 || nh == 60 }
