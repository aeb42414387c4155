package datapath_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/compile"
	"github.com/rampart-fw/rampart/internal/datapath"
	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/policy"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// synOpts are a Linux client's SYN options: MSS 1460, SACK permitted,
// timestamps (TSval 0x01020304), window scale 7.
var synOpts = []byte{2, 4, 0x05, 0xb4, 4, 2, 8, 10, 1, 2, 3, 4, 0, 0, 0, 0, 1, 3, 3, 7}

// synAck is a parsed reply.
type synAck struct {
	vlans          []uint16
	src, dst       netip.Addr
	sport, dport   uint16
	seq, ack       uint32
	flags          uint8
	mss            uint16
	wscale         int // -1: absent
	sack           bool
	tsval, tsecr   uint32
	ts             bool
	ipOK, tcpOK    bool
	srcMAC, dstMAC []byte
}

func parseSynAck(t *testing.T, b []byte) synAck {
	t.Helper()
	r := synAck{wscale: -1, dstMAC: b[0:6], srcMAC: b[6:12]}
	off := 12
	et := binary.BigEndian.Uint16(b[off:])
	for et == 0x8100 || et == 0x88a8 {
		r.vlans = append(r.vlans, binary.BigEndian.Uint16(b[off+2:]))
		off += 4
		et = binary.BigEndian.Uint16(b[off:])
	}
	off += 2
	var tcp, pseudo []byte
	switch et {
	case 0x0800:
		ip := b[off : off+20]
		r.ipOK = packet.Checksum(ip) == 0 && ip[0] == 0x45 && ip[9] == 6
		r.src, r.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		tcp = b[off+20 : off+int(binary.BigEndian.Uint16(ip[2:]))]
		pseudo = append(append(append([]byte{}, ip[12:20]...), 0, 6), byte(len(tcp)>>8), byte(len(tcp)))
	case 0x86dd:
		ip := b[off : off+40]
		r.ipOK = ip[6] == 6 && ip[0]>>4 == 6
		r.src, r.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		tcp = b[off+40 : off+40+int(binary.BigEndian.Uint16(ip[4:]))]
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(tcp)>>8), byte(len(tcp)), 0, 0, 0, 6)
	default:
		t.Fatalf("reply of ethertype %#x: %x", et, b)
	}
	r.tcpOK = packet.Checksum(append(pseudo, tcp...)) == 0
	r.sport, r.dport = binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:])
	r.seq, r.ack = binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:])
	r.flags = tcp[13]
	opts := tcp[20 : int(tcp[12]>>4)*4]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			i = len(opts)
			continue
		case 1:
			i++
			continue
		case 2:
			r.mss = binary.BigEndian.Uint16(opts[i+2:])
		case 3:
			r.wscale = int(opts[i+2])
		case 4:
			r.sack = true
		case 8:
			r.ts, r.tsval, r.tsecr = true, binary.BigEndian.Uint32(opts[i+2:]), binary.BigEndian.Uint32(opts[i+6:])
		}
		i += int(opts[i+1])
	}
	return r
}

// linuxSyn is a Linux client's SYN to port 443.
func linuxSyn() packet.Frame {
	return packet.Frame{Src: netip.MustParseAddr("198.51.100.7"), Dst: netip.MustParseAddr("192.0.2.1"), TCPOpts: synOpts,
		SrcMAC: []byte{2, 0, 0, 0, 0, 0xc}, DstMAC: []byte{2, 0, 0, 0, 0, 0x5}, Proto: 6, Sport: 40000, Dport: 443, TCPFlags: 0x02, Seq: 1000}
}

// TestSynAckFrames answers SYNs of every shape the parser reads (IPv4 with
// options, IPv6 with extension headers, one and two VLAN tags) at XDP and at
// tc, and checks each reply: sent back, tags kept, addresses and ports
// swapped, the client's sequence acknowledged, options as the client
// offered, checksums right, no IP options or extension headers.
func TestSynAckFrames(t *testing.T) {
	l := load(t, datapath.KindXDP, "rules:\n  - {name: web, dport: [80, 443], action: syncookie}\n")
	c4, s4 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("192.0.2.1")
	c6, s6 := netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::1")
	for _, c := range []struct {
		name string
		f    packet.Frame
	}{
		{"ipv4", packet.Frame{Src: c4, Dst: s4}},
		{"ipv4 options", packet.Frame{Src: c4, Dst: s4, IPOptions: []byte{1, 1, 1, 0}}},
		{"ipv6", packet.Frame{Src: c6, Dst: s6}},
		{"ipv6 extension headers", packet.Frame{Src: c6, Dst: s6, Ext: []packet.ExtHdr{{Type: 0, Len: 8}, {Type: 60, Len: 16}}}},
		{"vlan", packet.Frame{Src: c4, Dst: s4, VLANs: []uint16{100}}},
		{"two vlans ipv6", packet.Frame{Src: c6, Dst: s6, VLANs: []uint16{10, 20}}},
		{"no options", packet.Frame{Src: c4, Dst: s4, TCPOpts: []byte{}}},
	} {
		f := c.f
		f.SrcMAC, f.DstMAC = []byte{2, 0, 0, 0, 0, 0xc}, []byte{2, 0, 0, 0, 0, 0x5}
		f.Proto, f.Sport, f.Dport, f.TCPFlags, f.Seq = 6, 40000, 443, 0x02, 1000
		if f.TCPOpts == nil {
			f.TCPOpts = synOpts
		}
		for _, prog := range []*ebpf.Program{l.objs.RampartXdp, l.objs.RampartTc} {
			in := f.Bytes()
			out := make([]byte, len(in)+64)
			opts := &ebpf.RunOptions{Data: in, DataOut: out}
			ret, err := prog.Run(opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[ebpf.ProgramType]uint32{ebpf.XDP: 3, ebpf.SchedCLS: 7}[prog.Type()]; ret != want {
				t.Fatalf("%s, %v: returned %d, want %d (XDP_TX or a redirect)", c.name, prog.Type(), ret, want)
			}
			r := parseSynAck(t, opts.DataOut)
			wantMSS := map[bool]uint16{true: 1460, false: 1440}[f.Src.Is4()]
			if len(f.TCPOpts) == 0 {
				wantMSS = map[bool]uint16{true: 536, false: 1220}[f.Src.Is4()]
			}
			switch {
			case !bytes.Equal(r.dstMAC, f.SrcMAC) || !bytes.Equal(r.srcMAC, f.DstMAC):
				t.Errorf("%s: MACs not swapped", c.name)
			case len(r.vlans) != len(f.VLANs) || len(f.VLANs) > 0 && r.vlans[0] != f.VLANs[0]:
				t.Errorf("%s: VLAN tags %v, want %v", c.name, r.vlans, f.VLANs)
			case r.src != f.Dst || r.dst != f.Src || r.sport != 443 || r.dport != 40000:
				t.Errorf("%s: %v:%d → %v:%d", c.name, r.src, r.sport, r.dst, r.dport)
			case r.flags != 0x12 || r.ack != 1001:
				t.Errorf("%s: flags %#x ack %d, want SYN-ACK acknowledging 1001", c.name, r.flags, r.ack)
			case !r.ipOK || !r.tcpOK:
				t.Errorf("%s: checksums: IP %v, TCP %v", c.name, r.ipOK, r.tcpOK)
			case r.mss != wantMSS:
				t.Errorf("%s: MSS %d, want %d", c.name, r.mss, wantMSS)
			case len(f.TCPOpts) > 0 && (!r.sack || !r.ts || r.tsecr != 0x01020304 || r.wscale != 7):
				t.Errorf("%s: options sack %v ts %v (echo %#x) wscale %d", c.name, r.sack, r.ts, r.tsecr, r.wscale)
			case len(f.TCPOpts) == 0 && (r.sack || r.ts || r.wscale >= 0):
				t.Errorf("%s: options the client did not offer", c.name)
			}
			// The cookie carries the client's window scale and SACK.
			if len(f.TCPOpts) > 0 && (r.seq&0xf != 7 || r.seq&0x10 == 0) {
				t.Errorf("%s: cookie %#x does not encode wscale 7 and SACK", c.name, r.seq)
			}
		}
	}
	events, err := l.objs.ReadEvents(1)
	if err != nil || events[0].CookiesSent != 14 {
		t.Errorf("cookies sent %+v, %v; want 14", events, err)
	}
}

// TestSynAckInPlace checks the XDP answer written in place, with direct
// packet access, for the SYNs it takes (no VLAN tag, no IP options or
// extension headers; no options, an MSS alone, Linux's options with SACK or
// without; an Ethernet-padded frame) against the answer tc writes with the
// load and store helpers for the same SYN: byte for byte the same frame.
// Shapes it leaves to the helpers (Windows' options, a tag) must agree too.
func TestSynAckInPlace(t *testing.T) {
	l := load(t, datapath.KindXDP, "rules:\n  - {name: web, dport: 443, action: syncookie}\n")
	c4, s4 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("192.0.2.1")
	c6, s6 := netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::1")
	noSack := append([]byte{}, synOpts...)
	noSack[4], noSack[5] = 1, 1
	windows := []byte{2, 4, 0x05, 0xb4, 1, 3, 3, 8, 1, 1, 4, 2}
	for _, c := range []struct {
		name string
		f    packet.Frame
		pad  int
	}{
		{"ipv4 linux", packet.Frame{Src: c4, Dst: s4, TCPOpts: synOpts}, 0},
		{"ipv6 linux", packet.Frame{Src: c6, Dst: s6, TCPOpts: synOpts}, 0},
		{"ipv4 linux without sack", packet.Frame{Src: c4, Dst: s4, TCPOpts: noSack}, 0},
		{"ipv4 mss", packet.Frame{Src: c4, Dst: s4, TCPOpts: []byte{2, 4, 0x05, 0xb4}}, 0},
		{"ipv6 mss", packet.Frame{Src: c6, Dst: s6, TCPOpts: []byte{2, 4, 0x05, 0x8c}}, 0},
		{"ipv4 no options", packet.Frame{Src: c4, Dst: s4, TCPOpts: []byte{}}, 0},
		{"ipv4 no options padded", packet.Frame{Src: c4, Dst: s4, TCPOpts: []byte{}}, 6},
		{"ipv6 no options", packet.Frame{Src: c6, Dst: s6, TCPOpts: []byte{}}, 0},
		{"ipv4 windows", packet.Frame{Src: c4, Dst: s4, TCPOpts: windows}, 0},
		{"ipv6 vlan", packet.Frame{Src: c6, Dst: s6, TCPOpts: synOpts, VLANs: []uint16{7}}, 0},
	} {
		f := c.f
		f.SrcMAC, f.DstMAC = []byte{2, 0, 0, 0, 0, 0xc}, []byte{2, 0, 0, 0, 0, 0x5}
		f.Proto, f.Sport, f.Dport, f.TCPFlags, f.Seq = 6, 40000, 443, 0x02, 0xfffffff0
		in := append(f.Bytes(), make([]byte, c.pad)...)
		var replies [2][]byte
		for i, prog := range []*ebpf.Program{l.objs.RampartXdp, l.objs.RampartTc} {
			opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}
			if _, err := prog.Run(opts); err != nil {
				t.Fatal(err)
			}
			replies[i] = opts.DataOut
		}
		r := parseSynAck(t, replies[0])
		switch {
		case !bytes.Equal(replies[0], replies[1]):
			t.Errorf("%s: XDP answered\n%x\ntc answered\n%x", c.name, replies[0], replies[1])
		case r.flags != 0x12 || r.ack != 0xfffffff1 || !r.ipOK || !r.tcpOK:
			t.Errorf("%s: flags %#x ack %#x checksums IP %v TCP %v", c.name, r.flags, r.ack, r.ipOK, r.tcpOK)
		}
	}
}

// TestSynWithOptionsPastItsDatagram: a SYN whose header and options run
// past the IP datagram's end (into the frame's padding) is malformed to the
// kernel, which drops it; neither answer may take it for a SYN.
func TestSynWithOptionsPastItsDatagram(t *testing.T) {
	l := load(t, datapath.KindXDP, "rules:\n  - {name: web, dport: 443, action: syncookie}\n")
	f := linuxSyn()
	in := f.Bytes()
	ip := in[14:34]
	binary.BigEndian.PutUint16(ip[2:], 20+20+16) // four bytes of the options past the datagram
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], packet.Checksum(ip))
	for prog, drop := range map[*ebpf.Program]uint32{l.objs.RampartXdp: 1, l.objs.RampartTc: 2} {
		ret, err := prog.Run(&ebpf.RunOptions{Data: in})
		if err != nil {
			t.Fatal(err)
		}
		if ret != drop {
			t.Errorf("%v: returned %d, want %d (dropped)", prog.Type(), ret, drop)
		}
	}
}

// TestCookiesOutliveTheirProgram: programs loaded under one flood key (a
// re-apply keeps the last one) answer a SYN with the same cookie, so the
// ACK to the old program's SYN-ACK proves itself to the new one; under
// another key the cookie differs.
func TestCookiesOutliveTheirProgram(t *testing.T) {
	testutil.Privileged(t)
	pol, err := policy.Parse("test.yaml", []byte("rules:\n  - {name: web, dport: 443, action: syncookie}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := linuxSyn()
	answer := func(key [2]uint64) []byte {
		objs, err := datapath.LoadKeyed(compile.Build(pol), key)
		if err != nil {
			t.Fatal(err)
		}
		defer objs.Close()
		in := f.Bytes()
		opts := &ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)}
		if _, err := objs.RampartXdp.Run(opts); err != nil {
			t.Fatal(err)
		}
		return opts.DataOut
	}
	key, err := datapath.NewFloodKey()
	if err != nil {
		t.Fatal(err)
	}
	// A cookie changes with its time slot, about a minute of jiffies
	// (bpf/syncookie.h): a pair made on either side of a slot's end is
	// made again, once; two slots do not end in the next few ms.
	var first, again []byte
	for try := 0; try < 2; try++ {
		if first, again = answer(key), answer(key); bytes.Equal(first, again) {
			break
		}
	}
	if !bytes.Equal(first, again) {
		t.Errorf("one key, two programs, two answers:\n%x\n%x", first, again)
	}
	other := key
	other[0]++
	if bytes.Equal(first, answer(other)) {
		t.Error("another key gave the same cookie")
	}
}
