// Package packet builds Ethernet frames: the tests' inputs, the lookup
// benchmark's and the lab's flood template.
package packet

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frame describes a frame. Zero values give a plain untagged frame between
// 02:00:00:00:00:01 and 02:00:00:00:00:02; TCP and UDP checksums are valid.
type Frame struct {
	SrcMAC    net.HardwareAddr
	DstMAC    net.HardwareAddr
	VLANs     []uint16 // outer first; 0x88a8 is used for the outer of two
	EtherType uint16   // overrides the one implied by Src (e.g. ARP)
	Src, Dst  netip.Addr
	IPOptions []byte   // IPv4 options, a multiple of 4 bytes
	Ext       []ExtHdr // IPv6 extension headers in order
	TOS       uint8    // IPv4's TOS, IPv6's traffic class: DSCP << 2 | ECN
	FlowLabel uint32   // IPv6's, 20 bits
	DF        bool     // IPv4's don't-fragment
	FragOff   uint16   // fragment offset in 8-byte units
	MoreFrags bool
	Fragment  bool // IPv6: add a fragment header even when FragOff is 0
	Proto     uint8
	Sport     uint16
	Dport     uint16
	TCPFlags  uint8
	TCPRes    uint8 // the low four bits of TCP's byte 12: reserved bits, NS
	ICMPType  uint8 // ICMP and ICMPv6; 0 with code 0: an echo request
	ICMPCode  uint8
	Seq, Ack  uint32 // TCP sequence and acknowledgement numbers
	TCPOpts   []byte // TCP options, a multiple of 4 bytes
	Data      []byte // payload bytes after the L4 header
	Payload   int    // zero bytes after Data
}

// ExtHdr is one IPv6 extension header: its type and total length in bytes
// (a multiple of 8, or of 4 for AH).
type ExtHdr struct {
	Type uint8
	Len  int
}

// Bytes renders the frame.
func (f Frame) Bytes() []byte {
	b := make([]byte, 12, 128)
	copy(b[0:6], macOr(f.DstMAC, 2))
	copy(b[6:12], macOr(f.SrcMAC, 1))
	et := f.EtherType
	if et == 0 {
		et = 0x0800
		if f.Src.Is6() {
			et = 0x86dd
		}
	}
	for i, v := range f.VLANs {
		tpid := uint16(0x8100)
		if i == 0 && len(f.VLANs) > 1 {
			tpid = 0x88a8
		}
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, v)
	}
	b = binary.BigEndian.AppendUint16(b, et)
	if et != 0x0800 && et != 0x86dd {
		return append(b, make([]byte, 46)...)
	}
	l4 := f.l4()
	f.fillChecksum(l4)
	if f.Src.Is4() {
		hl := 20 + len(f.IPOptions)
		ip := make([]byte, hl)
		ip[0] = 0x40 | byte(hl/4)
		binary.BigEndian.PutUint16(ip[2:], uint16(hl+len(l4)))
		ip[1] = f.TOS
		frag := f.FragOff & 0x1fff
		if f.MoreFrags {
			frag |= 0x2000
		}
		if f.DF {
			frag |= 0x4000
		}
		binary.BigEndian.PutUint16(ip[6:], frag)
		ip[8] = 64
		ip[9] = f.Proto
		s, d := f.Src.As4(), f.Dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		copy(ip[20:], f.IPOptions)
		binary.BigEndian.PutUint16(ip[10:], Checksum(ip))
		b = append(b, ip...)
		return append(b, l4...)
	}
	var ext []byte
	hdrs := f.Ext
	if f.FragOff != 0 || f.MoreFrags || f.Fragment {
		hdrs = append(append([]ExtHdr{}, hdrs...), ExtHdr{Type: 44, Len: 8})
	}
	next := f.Proto
	// Build back to front so each header names the one after it.
	for i := len(hdrs) - 1; i >= 0; i-- {
		h := make([]byte, hdrs[i].Len)
		h[0] = next
		switch hdrs[i].Type {
		case 44:
			fo := f.FragOff << 3
			if f.MoreFrags {
				fo |= 1
			}
			binary.BigEndian.PutUint16(h[2:], fo)
		case 51:
			h[1] = byte(hdrs[i].Len/4 - 2)
		case 0, 60:
			h[1] = byte(hdrs[i].Len/8 - 1)
			fillOptions(h[2:])
		default:
			h[1] = byte(hdrs[i].Len/8 - 1)
		}
		ext = append(h, ext...)
		next = hdrs[i].Type
	}
	ip := make([]byte, 40)
	ip[0] = 0x60 | f.TOS>>4
	ip[1] = f.TOS<<4 | byte(f.FlowLabel>>16)&0x0f
	ip[2], ip[3] = byte(f.FlowLabel>>8), byte(f.FlowLabel)
	binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(l4)))
	ip[6] = next
	ip[7] = 64
	s, d := f.Src.As16(), f.Dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	b = append(b, ip...)
	b = append(b, ext...)
	return append(b, l4...)
}

func (f Frame) l4() []byte {
	var h []byte
	switch f.Proto {
	case 6:
		h = make([]byte, 20, 20+len(f.TCPOpts))
		h[12] = byte(5+len(f.TCPOpts)/4)<<4 | f.TCPRes&0x0f
		h[13] = f.TCPFlags
		binary.BigEndian.PutUint32(h[4:], f.Seq)
		binary.BigEndian.PutUint32(h[8:], f.Ack)
		binary.BigEndian.PutUint16(h[14:], 65535)
		h = append(h, f.TCPOpts...)
	case 17:
		h = make([]byte, 8)
		binary.BigEndian.PutUint16(h[4:], uint16(8+len(f.Data)+f.Payload))
	case 1, 58:
		h = make([]byte, 8)
		h[0], h[1] = f.ICMPType, f.ICMPCode
		if f.ICMPType == 0 && f.ICMPCode == 0 {
			h[0] = map[uint8]byte{1: 8, 58: 128}[f.Proto] // echo request
		}
	}
	if f.Proto == 6 || f.Proto == 17 {
		binary.BigEndian.PutUint16(h[0:], f.Sport)
		binary.BigEndian.PutUint16(h[2:], f.Dport)
	}
	if f.FragOff != 0 {
		h = nil // a non-first fragment carries payload only
	}
	return append(append(h, f.Data...), make([]byte, f.Payload)...)
}

// fillChecksum sets a TCP, UDP, ICMP or ICMPv6 checksum, over the
// pseudo-header but for ICMP (RFC 768, RFC 792, RFC 8200 section 8.1);
// fragments carry none of their own.
func (f Frame) fillChecksum(l4 []byte) {
	off := map[uint8]int{6: 16, 17: 6, 1: 2, 58: 2}[f.Proto]
	if off == 0 || f.FragOff != 0 || f.MoreFrags || len(l4) < off+2 {
		return
	}
	if f.Proto == 1 {
		binary.BigEndian.PutUint16(l4[off:], Checksum(l4))
		return
	}
	pseudo := append(f.Src.AsSlice(), f.Dst.AsSlice()...)
	if f.Src.Is4() {
		pseudo = append(pseudo, 0, f.Proto)
		pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(l4)))
	} else {
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(l4)))
		pseudo = append(pseudo, 0, 0, 0, f.Proto)
	}
	c := Checksum(append(pseudo, l4...))
	if c == 0 && f.Proto == 17 {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(l4[off:], c)
}

// Checksum is the Internet checksum (RFC 1071).
func Checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

func macOr(m net.HardwareAddr, last byte) []byte {
	if len(m) == 6 {
		return m
	}
	return []byte{0x02, 0, 0, 0, 0, last}
}

// fillOptions fills the option area of a hop-by-hop or destination-options
// header with options the kernel accepts: it refuses more than 7 bytes of
// padding in a row and more than 8 options (net.ipv6.max_*_opts_number), so
// long areas carry options of type 0x1e (experimental; "skip if unknown").
func fillOptions(b []byte) {
	for len(b) > 0 {
		n := len(b)
		switch {
		case n == 1:
			b[0] = 0 // Pad1
			return
		case n <= 7:
			b[0], b[1] = 1, byte(n-2) // PadN
			clear(b[2:])
			return
		}
		n = min(n, 257)
		if len(b)-n == 1 {
			n -= 2 // leave a PadN, not a lone Pad1 after a full option
		}
		b[0], b[1] = 0x1e, byte(n-2)
		clear(b[2:n])
		b = b[n:]
	}
}

// Ext is an extension header of type typ and n bytes.
func Ext(typ uint8, n int) ExtHdr { return ExtHdr{Type: typ, Len: n} }
