package datapath_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
)

// The frames an attacker crafts to get around a drop: long and cut IPv6
// header chains, cut L4 headers, tiny fragments, lying IP lengths, VLAN
// stacks. Each has its expected verdict and counter slot, in XDP and tc, with
// unparsed frames dropped and passed.
const craftedPolicy = `
lists:
  bl: {prefixes: ["2001:db8:bad::/48", 198.18.0.0/24, "::ffff:198.19.0.5"]}
rules:
  - {name: bl-drop, src: bl, action: drop}
  - {name: udp-ports, proto: udp, dport: 7000-7999, action: drop}
  - {name: syn-drop, proto: tcp, dport: 8000, tcp_flags: "syn,!ack", action: drop}
  - {name: ssh, proto: tcp, dport: 22, action: pass}
default: pass
unparsed: %s
`

const (
	slotBL = abi.SlotRule0 + iota
	slotUDPPorts
	slotSynDrop
	slotSSH
)

// verdicts: what a case expects: a rule's slot, or unparsed or malformed,
// whose action is the policy's.
const (
	unparsedSlot  = abi.SlotUnparsed
	malformedSlot = abi.SlotMalformed
)

type crafted struct {
	name  string
	frame []byte
	slot  int
}

// edit4 changes an IPv4 header in place and fixes its checksum.
func edit4(b []byte, fn func(ip []byte)) []byte {
	ip := b[packet.L3Offset(b):]
	fn(ip)
	hl := int(ip[0]&0xf) * 4
	if hl >= 20 && hl <= len(ip) {
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], packet.Checksum(ip[:hl]))
	}
	return b
}

func setTotLen(b []byte, n int) []byte {
	return edit4(b, func(ip []byte) { binary.BigEndian.PutUint16(ip[2:], uint16(n)) })
}

func setPayloadLen(b []byte, n int) []byte {
	binary.BigEndian.PutUint16(b[packet.L3Offset(b)+4:], uint16(n))
	return b
}

func destOpts(n, size int) []packet.ExtHdr {
	out := make([]packet.ExtHdr, n)
	for i := range out {
		out[i] = packet.Ext(60, size)
	}
	return out
}

func craftedCases() []crafted {
	listed6, listed4, mapped := ip("2001:db8:bad::9"), ip("198.18.0.7"), ip("198.19.0.5")
	src6, dst6, src4, dst4 := ip("2001:db8:1::1"), ip("2001:db8:2::2"), ip("10.1.0.1"), ip("10.2.0.2")
	udp := func(src, dst string, dport uint16) packet.Frame {
		return packet.Frame{Src: ip(src), Dst: ip(dst), Proto: 17, Sport: 1000, Dport: dport, Payload: 32}
	}
	tcp := func(src, dst string, dport uint16, flags uint8) packet.Frame {
		return packet.Frame{Src: ip(src), Dst: ip(dst), Proto: 6, Sport: 1000, Dport: dport, TCPFlags: flags, Payload: 32}
	}
	with := func(f packet.Frame, mod func(*packet.Frame)) packet.Frame { mod(&f); return f }
	s6, d6, s4, d4 := src6.String(), dst6.String(), src4.String(), dst4.String()

	// An IPv6 chain whose last header claims more bytes than the datagram.
	cutChain := func(src string) []byte {
		b := with(udp(src, d6, 9999), func(f *packet.Frame) { f.Ext = destOpts(3, 8); f.Payload = 0 }).Bytes()
		b[packet.L3Offset(b)+40+16+1] = 40 // the third header claims 328 bytes
		return b
	}
	firstFrag6 := func(src string, dport uint16, l4 int) []byte {
		full := with(udp(src, d6, dport), func(f *packet.Frame) { f.Ext = destOpts(2, 8) }).Bytes()
		// Offsets are 8-byte units: the fragment carries the chain and l4
		// bytes of UDP, the rest follows at offset 24.
		frags := packet.Fragments(full, 7, packet.Piece{Off: 0, Len: 16 + l4}, packet.Piece{Off: 24, Len: 1 << 16})
		return frags[0]
	}
	tinyTCP := func(src string, dport uint16, flags uint8) []byte {
		full := tcp(src, d4, dport, flags).Bytes()
		return packet.Fragments(full, 9, packet.Piece{Off: 0, Len: 8}, packet.Piece{Off: 8, Len: 1 << 16})[0]
	}
	ihl := func(words, tot int, dport uint16) []byte {
		f := udp(s4, d4, dport)
		f.IPOptions = make([]byte, 4*(words-5))
		return setTotLen(f.Bytes(), tot)
	}
	vlans := func(n int) packet.Frame {
		f := udp(listed4.String(), d4, 9999)
		for i := 0; i < n; i++ {
			f.VLANs = append(f.VLANs, uint16(100+i))
		}
		return f
	}
	padded := udp(s4, d4, 7001).Bytes()
	padded = append(padded, make([]byte, 30)...) // Ethernet padding after the datagram
	cutTag := vlans(2).Bytes()[:20]

	return []crafted{
		{"v6 listed plain UDP", udp(listed6.String(), d6, 9999).Bytes(), slotBL},
		{"v6 listed behind 9 destination-options headers", with(udp(listed6.String(), d6, 9999), func(f *packet.Frame) { f.Ext = destOpts(9, 8) }).Bytes(), slotBL},
		{"v6 listed behind a 520-byte hop-by-hop header", with(udp(listed6.String(), d6, 9999), func(f *packet.Frame) { f.Ext = []packet.ExtHdr{packet.Ext(0, 520)} }).Bytes(), slotBL},
		{"v6 port behind 9 destination-options headers", with(udp(s6, d6, 7001), func(f *packet.Frame) { f.Ext = destOpts(9, 8) }).Bytes(), slotUDPPorts},
		{"v6 port behind a 520-byte hop-by-hop header", with(udp(s6, d6, 7001), func(f *packet.Frame) { f.Ext = []packet.ExtHdr{packet.Ext(0, 520)} }).Bytes(), slotUDPPorts},
		{"v6 port behind 180 headers", with(udp(s6, d6, 7001), func(f *packet.Frame) { f.Ext = destOpts(180, 8); f.Payload = 0 }).Bytes(), slotUDPPorts},
		{"v6 port behind a 2048-byte header and a 1024-byte one", with(udp(s6, d6, 7001), func(f *packet.Frame) {
			f.Ext = []packet.ExtHdr{packet.Ext(60, 2048), packet.Ext(60, 1024)}
			f.Payload = 0
		}).Bytes(), slotUDPPorts},
		{"v6 port behind hbh, routing, AH, fragment, dest-opts", with(udp(s6, d6, 7001), func(f *packet.Frame) {
			f.Ext = []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(43, 24), packet.Ext(51, 24), packet.Ext(60, 16)}
			f.Fragment, f.MoreFrags = true, true
		}).Bytes(), slotUDPPorts},
		{"v6 allowed port behind 9 destination-options headers", with(udp(s6, d6, 9999), func(f *packet.Frame) { f.Ext = destOpts(9, 8) }).Bytes(), abi.SlotDefault},
		{"v6 chain leaving the datagram", cutChain(s6), unparsedSlot},
		{"v6 chain leaving the datagram, listed source", cutChain(listed6.String()), slotBL},
		{"v6 first fragment with UDP cut to 2 bytes", firstFrag6(s6, 7001, 2), unparsedSlot},
		{"v6 first fragment with UDP cut to 4 bytes", firstFrag6(s6, 7001, 4), slotUDPPorts},
		{"v6 first fragment with UDP cut, listed source", firstFrag6(listed6.String(), 7001, 2), slotBL},
		{"v6 non-first fragment", packet.Fragments(with(udp(s6, d6, 7001), func(f *packet.Frame) {}).Bytes(), 3, packet.Piece{Off: 0, Len: 8}, packet.Piece{Off: 8, Len: 1 << 16})[1], abi.SlotDefault},
		{"v6 payload length past the frame", setPayloadLen(udp(s6, d6, 9999).Bytes(), 200), malformedSlot},
		{"v6 payload length 0 (jumbo, BIG TCP)", setPayloadLen(udp(s6, d6, 7001).Bytes(), 0), slotUDPPorts},
		{"v4 listed, UDP cut to 2 bytes", setTotLen(udp(listed4.String(), d4, 9999).Bytes(), 22), slotBL},
		{"v4 UDP cut to 2 bytes", setTotLen(udp(s4, d4, 7001).Bytes(), 22), unparsedSlot},
		{"v4 UDP cut to its ports", setTotLen(udp(s4, d4, 7001).Bytes(), 24), slotUDPPorts},
		{"v4 TCP cut to its ports, SYN to a flags rule", setTotLen(tcp(s4, d4, 8000, 0x02).Bytes(), 24), unparsedSlot},
		{"v4 TCP cut to its ports, to an allowed port", setTotLen(tcp(s4, d4, 22, 0x02).Bytes(), 24), slotSSH},
		{"v4 tiny first fragment, SYN to a flags rule", tinyTCP(s4, 8000, 0x02), unparsedSlot},
		{"v4 tiny first fragment to a port no flags rule names", tinyTCP(s4, 22, 0x02), slotSSH},
		{"v4 tiny first fragment, listed source", tinyTCP(listed4.String(), 8000, 0x02), slotBL},
		{"v4 non-first fragment", packet.Fragments(udp(s4, d4, 7001).Bytes(), 4, packet.Piece{Off: 0, Len: 8}, packet.Piece{Off: 8, Len: 1 << 16})[1], abi.SlotDefault},
		{"v4 ihl=15 totlen=40", ihl(15, 40, 7001), malformedSlot},
		{"v4 ihl=6 totlen=28: 4 bytes of UDP", ihl(6, 28, 7001), slotUDPPorts},
		{"v4 ihl=6 totlen=26: 2 bytes of UDP", ihl(6, 26, 7001), unparsedSlot},
		{"v4 total length past the frame", setTotLen(udp(s4, d4, 9999).Bytes(), 1000), malformedSlot},
		{"v4 total length 0 (BIG TCP)", setTotLen(udp(s4, d4, 7001).Bytes(), 0), slotUDPPorts},
		{"v4 with Ethernet padding", padded, slotUDPPorts},
		{"IPv4-mapped list entry", udp(mapped.String(), d4, 9999).Bytes(), slotBL},
		{"3 VLAN tags", vlans(3).Bytes(), slotBL},
		{"4 VLAN tags", vlans(4).Bytes(), slotBL},
		{"5 VLAN tags", vlans(5).Bytes(), slotBL},
		{"300 VLAN tags", vlans(300).Bytes(), slotBL},
		{"300 VLAN tags, cut in the last", vlans(300).Bytes()[:14+299*4+2], malformedSlot},
		{"cut inside a VLAN tag", cutTag, malformedSlot},
	}
}

func TestCrafted(t *testing.T) {
	for _, unparsed := range []string{"drop", "pass"} {
		for _, kind := range []datapath.Kind{datapath.KindXDP, datapath.KindTC} {
			l := load(t, kind, fmt.Sprintf(craftedPolicy, unparsed))
			for _, c := range craftedCases() {
				if !runnable(l.prog.Type(), c.frame) {
					continue
				}
				t.Run(fmt.Sprintf("unparsed-%s/%v/%s", unparsed, kind, c.name), func(t *testing.T) {
					act, slot := l.run(t, c.frame)
					want := uint8(abi.ActionPass)
					switch {
					case c.slot == slotBL || c.slot == slotUDPPorts || c.slot == slotSynDrop:
						want = abi.ActionDrop
					case c.slot == unparsedSlot || c.slot == malformedSlot:
						want = map[string]uint8{"drop": abi.ActionDrop, "pass": abi.ActionPass}[unparsed]
					}
					if act != want || slot != c.slot {
						t.Errorf("got action %d slot %d, want action %d slot %d", act, slot, want, c.slot)
					}
					if ref := l.pol.Eval(c.frame); act != uint8(ref.Action) || slot != expectedSlot(ref) {
						t.Errorf("data plane: action %d slot %d; reference: %+v (slot %d)", act, slot, ref, expectedSlot(ref))
					}
				})
			}
			l.objs.Close()
		}
	}
}

// TestCraftedFramesAreWhatTheySay guards the builders above: a case that
// silently built another shape would prove nothing.
func TestCraftedFramesAreWhatTheySay(t *testing.T) {
	for _, c := range craftedCases() {
		if strings.Contains(c.name, "520-byte") && len(c.frame) < 14+40+520 {
			t.Errorf("%s: frame of %d bytes", c.name, len(c.frame))
		}
		if strings.Contains(c.name, "180 headers") && len(c.frame) < 14+40+180*8 {
			t.Errorf("%s: frame of %d bytes", c.name, len(c.frame))
		}
	}
}
