package datapath_test

import (
	"fmt"
	"testing"

	"github.com/rampart-fw/rampart/internal/abi"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
)

const tablePolicy = `
lists:
  bad4: {prefixes: [198.51.100.0/24, 203.0.113.7]}
  good4: {prefixes: [198.51.100.128/25]}
  bad6: {prefixes: ["2001:db8:bad::/48"]}
rules:
  - {name: allow-good, src: good4, action: pass}
  - {name: drop-bad, src: [bad4, bad6], action: drop}
  - {name: drop-dst, dst: 192.0.2.99, action: drop}
  - {name: dns-amp, proto: udp, sport: 53, length: 512-65535, action: drop}
  - {name: syn-closed, proto: tcp, dport: 1-1023, tcp_flags: "syn,!ack", action: drop}
  - {name: v6-icmp, family: 6, proto: icmpv6, action: drop}
  - {name: udp-high, proto: udp, dport: 40000-40010, action: drop}
  - {name: frag-any, proto: 17, src: 10.9.0.0/16, action: drop}
default: pass
`

const (
	slotAllowGood = abi.SlotRule0 + iota
	slotDropBad
	slotDropDst
	slotDNSAmp
	slotSynClosed
	slotV6ICMP
	slotUDPHigh
	slotFragAny
)

type tcase struct {
	name   string
	frame  []byte
	action uint8
	slot   int
}

func tableCases() []tcase {
	pass, drop := uint8(abi.ActionPass), uint8(abi.ActionDrop)
	v4 := func(src, dst string) packet.Frame {
		return packet.Frame{Src: ip(src), Dst: ip(dst), Proto: 17, Sport: 1000, Dport: 2000}
	}
	v6 := func(src, dst string) packet.Frame {
		return packet.Frame{Src: ip(src), Dst: ip(dst), Proto: 17, Sport: 1000, Dport: 2000}
	}
	with := func(f packet.Frame, mod func(*packet.Frame)) []byte { mod(&f); return f.Bytes() }
	cases := []tcase{
		{"v4 default", v4("10.0.0.1", "10.0.0.2").Bytes(), pass, abi.SlotDefault},
		{"v4 src list", v4("198.51.100.1", "10.0.0.2").Bytes(), drop, slotDropBad},
		{"v4 src single address", v4("203.0.113.7", "10.0.0.2").Bytes(), drop, slotDropBad},
		{"v4 neighbour of single address", v4("203.0.113.8", "10.0.0.2").Bytes(), pass, abi.SlotDefault},
		{"v4 allow inside drop", v4("198.51.100.200", "10.0.0.2").Bytes(), pass, slotAllowGood},
		{"v4 dst prefix", v4("10.0.0.1", "192.0.2.99").Bytes(), drop, slotDropDst},
		{"v6 src list", v6("2001:db8:bad::1", "2001:db8::2").Bytes(), drop, slotDropBad},
		{"v6 outside list", v6("2001:db8:bae::1", "2001:db8::2").Bytes(), pass, abi.SlotDefault},
		{"dns big", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Sport = 53; f.Payload = 600 }), drop, slotDNSAmp},
		{"dns small", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Sport = 53; f.Payload = 100 }), pass, abi.SlotDefault},
		{"dns big v6", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Sport = 53; f.Payload = 600 }), drop, slotDNSAmp},
		{"tcp syn low port", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Proto = 6; f.Dport = 22; f.TCPFlags = 0x02 }), drop, slotSynClosed},
		{"tcp synack low port", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Proto = 6; f.Dport = 22; f.TCPFlags = 0x12 }), pass, abi.SlotDefault},
		{"tcp syn high port", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Proto = 6; f.Dport = 8080; f.TCPFlags = 0x02 }), pass, abi.SlotDefault},
		{"tcp syn v6", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Proto = 6; f.Dport = 1023; f.TCPFlags = 0x02 }), drop, slotSynClosed},
		{"udp with tcp flags rule", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Dport = 22 }), pass, abi.SlotDefault},
		{"icmpv6", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Proto = 58 }), drop, slotV6ICMP},
		{"icmp v4 not icmpv6", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Proto = 1 }), pass, abi.SlotDefault},
		{"udp port range lo", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Dport = 40000 }), drop, slotUDPHigh},
		{"udp port range hi", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Dport = 40010 }), drop, slotUDPHigh},
		{"udp port range above", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.Dport = 40011 }), pass, abi.SlotDefault},
		{"numeric proto", with(v4("10.9.1.1", "10.0.0.2"), func(f *packet.Frame) {}), drop, slotFragAny},
		{"vlan", with(v4("198.51.100.1", "10.0.0.2"), func(f *packet.Frame) { f.VLANs = []uint16{100} }), drop, slotDropBad},
		{"qinq", with(v4("198.51.100.1", "10.0.0.2"), func(f *packet.Frame) { f.VLANs = []uint16{100, 200} }), drop, slotDropBad},
		{"qinq v6", with(v6("2001:db8:bad::1", "2001:db8::2"), func(f *packet.Frame) { f.VLANs = []uint16{100, 200} }), drop, slotDropBad},
		{"three tags", with(v4("198.51.100.1", "10.0.0.2"), func(f *packet.Frame) { f.VLANs = []uint16{1, 2, 3} }), drop, slotDropBad},
		{"arp", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.EtherType = 0x0806 }), pass, abi.SlotNonIP},
		{"arp in vlan", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.EtherType = 0x0806; f.VLANs = []uint16{5} }), pass, abi.SlotNonIP},
		{"ipv4 options", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.IPOptions = make([]byte, 40); f.Dport = 40005 }), drop, slotUDPHigh},
		{"v4 first fragment has ports", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.MoreFrags = true; f.Dport = 40005 }), drop, slotUDPHigh},
		{"v4 non-first fragment no ports", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) { f.FragOff = 100; f.Dport = 40005 }), pass, abi.SlotDefault},
		{"v4 non-first fragment L3 match", with(v4("198.51.100.1", "10.0.0.2"), func(f *packet.Frame) { f.FragOff = 100 }), drop, slotDropBad},
		{"v4 non-first fragment proto match", with(v4("10.9.0.1", "10.0.0.2"), func(f *packet.Frame) { f.FragOff = 100 }), drop, slotFragAny},
		{"v6 first fragment has ports", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Fragment = true; f.MoreFrags = true; f.Dport = 40005 }), drop, slotUDPHigh},
		{"v6 non-first fragment no ports", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.FragOff = 10; f.Dport = 40005 }), pass, abi.SlotDefault},
		{"v6 non-first fragment L3 match", with(v6("2001:db8:bad::1", "2001:db8::2"), func(f *packet.Frame) { f.FragOff = 10 }), drop, slotDropBad},
		{"v6 hop-by-hop", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Ext = []packet.ExtHdr{packet.Ext(0, 8)}; f.Dport = 40001 }), drop, slotUDPHigh},
		{"v6 ext chain", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) {
			f.Ext = []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(60, 16), packet.Ext(43, 24), packet.Ext(51, 12), packet.Ext(60, 8)}
			f.Proto, f.Dport, f.TCPFlags = 6, 80, 0x02
		}), drop, slotSynClosed},
		{"v6 chain of 8 then l4", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) {
			f.Ext = []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8)}
			f.Fragment, f.Dport = true, 40001
		}), drop, slotUDPHigh},
		{"v6 chain of 9 then l4", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) {
			f.Ext = []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8), packet.Ext(60, 8)}
			f.Dport = 40001
		}), drop, slotUDPHigh},
		{"v6 headers past 512 bytes", with(v6("2001:db8::1", "2001:db8::2"), func(f *packet.Frame) { f.Ext = []packet.ExtHdr{packet.Ext(60, 2048)}; f.Dport = 40001 }), drop, slotUDPHigh},
		{"bad ip version", with(v4("10.0.0.1", "10.0.0.2"), func(f *packet.Frame) {}), drop, abi.SlotMalformed},
		{"ihl below 5", nil, drop, abi.SlotMalformed},
	}
	// An IPv4 header with version 6 in an IPv4 ethertype.
	cases[len(cases)-2].frame[14] = 0x65
	bad := v4("10.0.0.1", "10.0.0.2").Bytes()
	bad[14] = 0x44
	cases[len(cases)-1].frame = bad
	return cases
}

// truncations cuts frames at every header boundary and in between.
func truncations() []tcase {
	var out []tcase
	for _, f := range []packet.Frame{
		{Src: ip("10.0.0.1"), Dst: ip("10.0.0.2"), Proto: 6, Dport: 80, TCPFlags: 2, IPOptions: make([]byte, 8)},
		{Src: ip("10.0.0.1"), Dst: ip("10.0.0.2"), Proto: 17, Dport: 40001, VLANs: []uint16{1, 2}},
		{Src: ip("2001:db8::1"), Dst: ip("2001:db8::2"), Proto: 17, Dport: 40001, Ext: []packet.ExtHdr{packet.Ext(0, 8), packet.Ext(51, 12)}, Fragment: true},
		{Src: ip("2001:db8::1"), Dst: ip("2001:db8::2"), Proto: 6, Dport: 80, TCPFlags: 2},
	} {
		full := f.Bytes()
		for n := 14; n < len(full); n++ {
			out = append(out, tcase{name: fmt.Sprintf("%s cut at %d", f.Src, n), frame: full[:n], slot: -2})
		}
	}
	return out
}

func TestTable(t *testing.T) {
	for _, kind := range []datapath.Kind{datapath.KindXDP, datapath.KindTC} {
		l := load(t, kind, tablePolicy)
		for _, c := range append(tableCases(), truncations()...) {
			if !runnable(l.prog.Type(), c.frame) {
				continue
			}
			t.Run(fmt.Sprintf("%v/%s", kind, c.name), func(t *testing.T) {
				act, slot := l.run(t, c.frame)
				want := l.pol.Eval(c.frame)
				if c.slot != -2 { // -2: only agreement with the reference is asserted
					if act != c.action || slot != c.slot {
						t.Errorf("got action %d slot %d, want action %d slot %d", act, slot, c.action, c.slot)
					}
				}
				if act != uint8(want.Action) || slot != expectedSlot(want) {
					t.Errorf("data plane: action %d slot %d; reference: %+v (slot %d)", act, slot, want, expectedSlot(want))
				}
			})
		}
	}
}
