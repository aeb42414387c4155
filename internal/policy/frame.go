package policy

import (
	"encoding/binary"
	"net/netip"
)

// Frame parsing mirrors bpf/parse.h rule for rule; the differential tests
// hold the two together. A hand-written parser rather than gopacket because
// the oracle must classify malformed frames exactly as the BPF side does.

// MaxHeaderOffset: headers beyond it are not parsed (the frame is malformed).
const MaxHeaderOffset = 512

const ipv6MaxExtHeaders = 8

// Class says how far a frame was understood.
type Class int

const (
	ClassIP Class = iota
	ClassNonIP
	ClassMalformed
)

// Packet is what the parser extracts from a frame.
type Packet struct {
	Src, Dst netip.Addr
	Len      int // L3 length from the header
	Proto    int
	Sport    uint16
	Dport    uint16
	TCPFlags uint8
	HasPorts bool
	IsIPv6   bool
}

const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58

	extHopByHop = 0
	extRouting  = 43
	extFragment = 44
	extAH       = 51
	extDestOpts = 60
)

// ParseFrame reads an Ethernet frame the way the data plane does.
func ParseFrame(f []byte) (Packet, Class) {
	var p Packet
	have := func(off, n int) bool { return off+n <= len(f) }
	if !have(0, 14) {
		return p, ClassMalformed
	}
	etype := binary.BigEndian.Uint16(f[12:])
	off := 14
	for i := 0; i < 2 && (etype == 0x8100 || etype == 0x88a8); i++ {
		if !have(off, 4) {
			return p, ClassMalformed
		}
		etype = binary.BigEndian.Uint16(f[off+2:])
		off += 4
	}
	switch etype {
	case 0x0800:
		return parseIPv4(f, off, p)
	case 0x86dd:
		return parseIPv6(f, off, p)
	case 0x8100, 0x88a8:
		return p, ClassMalformed
	}
	return p, ClassNonIP
}

func parseIPv4(f []byte, off int, p Packet) (Packet, Class) {
	if off+20 > len(f) || f[off]>>4 != 4 {
		return p, ClassMalformed
	}
	hlen := int(f[off]&0xf) * 4
	if hlen < 20 || off+hlen > len(f) {
		return p, ClassMalformed
	}
	ip := f[off:]
	p.Len = int(binary.BigEndian.Uint16(ip[2:]))
	p.Proto = int(ip[9])
	p.Src = netip.AddrFrom4([4]byte(ip[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
	if binary.BigEndian.Uint16(ip[6:])&0x1fff != 0 {
		return p, ClassIP // non-first fragment: no L4 header
	}
	return parseL4(f, off+hlen, p)
}

func parseIPv6(f []byte, off int, p Packet) (Packet, Class) {
	if off+40 > len(f) || f[off]>>4 != 6 {
		return p, ClassMalformed
	}
	ip := f[off:]
	p.IsIPv6 = true
	p.Len = int(binary.BigEndian.Uint16(ip[4:])) + 40
	p.Src = netip.AddrFrom16([16]byte(ip[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
	nh := int(ip[6])
	off += 40
	for i := 0; i <= ipv6MaxExtHeaders; i++ {
		if off > MaxHeaderOffset {
			return p, ClassMalformed
		}
		switch nh {
		case extHopByHop, extRouting, extDestOpts:
			if off+2 > len(f) {
				return p, ClassMalformed
			}
			nh = int(f[off])
			off += (int(f[off+1]) + 1) * 8
		case extAH:
			if off+2 > len(f) {
				return p, ClassMalformed
			}
			nh = int(f[off])
			off += (int(f[off+1]) + 2) * 4
		case extFragment:
			if off+8 > len(f) {
				return p, ClassMalformed
			}
			nh = int(f[off])
			fragOff := binary.BigEndian.Uint16(f[off+2:]) & 0xfff8
			off += 8
			if fragOff != 0 {
				p.Proto = nh
				return p, ClassIP
			}
		default:
			p.Proto = nh
			return parseL4(f, off, p)
		}
	}
	return p, ClassMalformed
}

func parseL4(f []byte, off int, p Packet) (Packet, Class) {
	if off > MaxHeaderOffset {
		return p, ClassMalformed
	}
	switch p.Proto {
	case protoTCP:
		if off+20 > len(f) {
			return p, ClassMalformed
		}
		p.Sport = binary.BigEndian.Uint16(f[off:])
		p.Dport = binary.BigEndian.Uint16(f[off+2:])
		p.TCPFlags = f[off+13]
		p.HasPorts = true
	case protoUDP:
		if off+8 > len(f) {
			return p, ClassMalformed
		}
		p.Sport = binary.BigEndian.Uint16(f[off:])
		p.Dport = binary.BigEndian.Uint16(f[off+2:])
		p.HasPorts = true
	}
	return p, ClassIP
}
