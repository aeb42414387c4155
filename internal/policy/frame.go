package policy

import (
	"encoding/binary"
	"net/netip"
)

// Frame parsing mirrors bpf/parse.h rule for rule; the differential tests
// hold the two together. A hand-written parser rather than gopacket because
// the oracle must classify cut and invalid frames exactly as the BPF side
// does.

// L4 header bytes a rule needs: TCP and UDP ports are bytes 0-3, the TCP
// flags byte 13.
const (
	l4Ports = 4
	l4Flags = 14
	l4ICMP  = 2
)

// Class says how far a frame was understood.
type Class int

const (
	ClassIP        Class = iota
	ClassNonIP           // not IPv4 or IPv6 (ARP, LLDP…)
	ClassMalformed       // an IP frame whose L3 header is cut or invalid
)

// L4State says how much of the L4 header a frame carries.
type L4State int

const (
	// L4Header: the protocol is known and L4Len bytes of its header were
	// read (TCP and UDP; other protocols have nothing rules read).
	L4Header L4State = iota
	// L4None: a non-first fragment: the protocol is known, there is no
	// header (its datagram is judged by the first fragment).
	L4None
	// L4Unknown: an IPv6 header chain that does not end inside the
	// datagram: the protocol is unknown too.
	L4Unknown
)

// Packet is what the parser extracts from a frame.
type Packet struct {
	Src, Dst  netip.Addr
	Len       int // L3 length: IPv4 total length, IPv6 payload + 40
	Proto     int
	Sport     uint16
	Dport     uint16
	TCPFlags  uint8
	TCPRes    uint8 // TCP's byte 12 under the data offset: reserved bits, NS
	L4        L4State
	L4Len     int // TCP and UDP: 0, 4 (ports) or 14 (ports and flags) bytes read; ICMP: 0 or 2
	IsIPv6    bool
	ICMPType  uint8 // ICMP and ICMPv6, when L4Len is 2
	ICMPCode  uint8
	DSCP      uint8  // IPv4's TOS, IPv6's traffic class, without ECN
	FlowLabel uint32 // IPv6's
	Frag      uint8  // FragDF… ; IPv6: from the chain's fragment header
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

// icmpOf is the family's ICMP protocol.
func icmpOf(ipv6 bool) int {
	if ipv6 {
		return protoICMPv6
	}
	return protoICMP
}

func isIPv6Ext(nh int) bool {
	return nh == extHopByHop || nh == extRouting || nh == extFragment || nh == extDestOpts || nh == extAH
}

// ParseFrame reads an Ethernet frame the way the data plane does.
func ParseFrame(f []byte) (Packet, Class) {
	var p Packet
	if len(f) < 14 {
		return p, ClassMalformed
	}
	etype := binary.BigEndian.Uint16(f[12:])
	off := 14
	// Any number of VLAN tags: the kernel strips priority tags (id 0) one
	// after another and delivers what they carry.
	for etype == 0x8100 || etype == 0x88a8 {
		if off+4 > len(f) {
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
	}
	return p, ClassNonIP
}

// parseIPv4 validates the header as the kernel's ip_rcv_core does.
func parseIPv4(f []byte, off int, p Packet) (Packet, Class) {
	if off+20 > len(f) || f[off]>>4 != 4 {
		return p, ClassMalformed
	}
	ip := f[off:]
	hlen := int(ip[0]&0xf) * 4
	if hlen < 20 || off+hlen > len(f) {
		return p, ClassMalformed
	}
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot == 0 { // a GSO packet past 64 KiB (BIG TCP): the frame says
		tot = len(f) - off
	}
	if tot < hlen || off+tot > len(f) {
		return p, ClassMalformed
	}
	p.Len = tot
	p.Proto = int(ip[9])
	p.DSCP = ip[1] >> 2
	p.Src = netip.AddrFrom4([4]byte(ip[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
	fo := binary.BigEndian.Uint16(ip[6:])
	if fo&0x4000 != 0 {
		p.Frag |= FragDF
	}
	p.Frag |= fragBits(fo&0x1fff != 0, fo&0x2000 != 0)
	if fo&0x1fff != 0 {
		p.L4 = L4None
		return p, ClassIP
	}
	return parseL4(f, off+hlen, off+tot, p), ClassIP
}

func parseIPv6(f []byte, off int, p Packet) (Packet, Class) {
	if off+40 > len(f) || f[off]>>4 != 6 {
		return p, ClassMalformed
	}
	ip := f[off:]
	end := off + 40 + int(binary.BigEndian.Uint16(ip[4:]))
	if end == off+40 { // payload length 0: a jumbogram or BIG TCP; the frame says
		end = len(f)
	}
	if end > len(f) {
		return p, ClassMalformed
	}
	p.IsIPv6 = true
	p.Len = end - off
	p.DSCP = (ip[0]<<4 | ip[1]>>4) >> 2
	p.FlowLabel = binary.BigEndian.Uint32(ip[0:4]) & MaxFlowLabel
	p.Src = netip.AddrFrom16([16]byte(ip[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
	nh := int(ip[6])
	off += 40
	// Walk the chain to its end: every header is at least 8 bytes, so the
	// walk ends within the datagram.
	for isIPv6Ext(nh) {
		if off > end || end-off < 8 {
			return cutChain(p), ClassIP
		}
		h := f[off:]
		cur := nh
		nh = int(h[0])
		switch cur {
		case extAH:
			off += (int(h[1]) + 2) * 4
		case extFragment:
			off += 8
		default:
			off += (int(h[1]) + 1) * 8
		}
		if off > end {
			return cutChain(p), ClassIP
		}
		if cur == extFragment {
			fo := binary.BigEndian.Uint16(h[2:])
			p.Frag = fragBits(fo&0xfff8 != 0, fo&1 != 0)
			if fo&0xfff8 != 0 {
				p.Proto, p.L4 = nh, L4None
				return p, ClassIP
			}
		}
	}
	p.Proto = nh
	return parseL4(f, off, end, p), ClassIP
}

// fragBits are the fragment bits of an offset (past the first fragment or
// not) and a more-fragments flag.
func fragBits(later, more bool) uint8 {
	switch {
	case later && more:
		return FragIs
	case later:
		return FragIs | FragLast
	case more:
		return FragFirst
	}
	return 0
}

// cutChain marks a packet whose IPv6 header chain leaves the datagram.
func cutChain(p Packet) Packet {
	p.Proto, p.L4 = 0, L4Unknown
	return p
}

// parseL4 reads the ports and flags of a TCP or UDP header at off, as far
// as the datagram (ending at end) holds them.
func parseL4(f []byte, off, end int, p Packet) Packet {
	p.L4 = L4Header
	avail := max(end-off, 0)
	if p.Proto == icmpOf(p.IsIPv6) {
		if avail >= l4ICMP {
			p.ICMPType, p.ICMPCode, p.L4Len = f[off], f[off+1], l4ICMP
		}
		return p
	}
	if p.Proto != protoTCP && p.Proto != protoUDP {
		return p
	}
	switch {
	case avail >= l4Flags:
		p.TCPFlags, p.TCPRes = f[off+13], f[off+12]&0x0f
		p.L4Len = l4Flags
	case avail >= l4Ports:
		p.L4Len = l4Ports
	default:
		return p
	}
	p.Sport = binary.BigEndian.Uint16(f[off:])
	p.Dport = binary.BigEndian.Uint16(f[off+2:])
	return p
}
