package lab

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampart-fw/rampart/internal/packet"
	"github.com/rampart-fw/rampart/internal/testutil"
)

// TestTrafficSources: the sources are distinct, inside the range, and as many
// as asked; a range too small for them is refused.
func TestTrafficSources(t *testing.T) {
	for _, tc := range []struct {
		family int
		src    string
		n      int
	}{{4, "10.0.0.0/8", 100000}, {4, "192.0.2.0/24", 256}, {6, "fd10::/32", 100000}, {6, "2001:db8:ab00::/40", 1 << 16}} {
		f, err := NewTraffic(tc.family, netip.MustParsePrefix(tc.src), tc.n)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[netip.Prefix]bool{}
		for i := range uint32(tc.n) {
			p := f.Source(i)
			if !netip.MustParsePrefix(tc.src).Contains(p.Addr()) || seen[p] {
				t.Fatalf("%s: source %d = %s outside the range or repeated", tc.src, i, p)
			}
			seen[p] = true
		}
	}
	if _, err := NewTraffic(4, netip.MustParsePrefix("192.0.2.0/24"), 257); err == nil {
		t.Error("257 sources in a /24 accepted")
	}
	if _, err := NewTraffic(6, netip.MustParsePrefix("10.0.0.0/8"), 1); err == nil {
		t.Error("an IPv4 range for the IPv6 flood accepted")
	}
}

// TestUnlistedList: an unlisted run's list is as long as the flood's
// sources and holds none of them; the range must hold both.
func TestUnlistedList(t *testing.T) {
	for _, tc := range []struct {
		family int
		src    string
		n      int
	}{{4, "192.0.2.0/24", 128}, {4, "10.0.0.0/8", 100000}, {6, "2001:db8:ab00::/40", 1 << 15}} {
		f, err := NewTraffic(tc.family, netip.MustParsePrefix(tc.src), tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Unlisted(); err != nil {
			t.Fatal(err)
		}
		flood := map[netip.Prefix]bool{}
		for i := range uint32(tc.n) {
			flood[f.Source(i)] = true
		}
		list := f.Prefixes()
		if len(list) != tc.n {
			t.Fatalf("%s: a list of %d, want %d", tc.src, len(list), tc.n)
		}
		for _, p := range list {
			if flood[p] || !netip.MustParsePrefix(tc.src).Contains(p.Addr()) {
				t.Fatalf("%s: listed %s is a flood source, or outside the range", tc.src, p)
			}
		}
	}
	f, err := NewTraffic(4, netip.MustParsePrefix("192.0.2.0/24"), 129)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Unlisted(); err == nil {
		t.Error("129 sources and as many unlisted in a /24 accepted")
	}
}

// TestGeneratorFrames runs the generator once per frame, outside live mode,
// and checks what it would send: a source the blocklist lists, a random
// port, and checksums that verify; a SYN flood's frames are SYNs to the
// port. Each run starts from what the last left, as recycled pages do, and
// every other run from a page a receiver rewrote (a SYN-ACK sent back with
// XDP_TX comes back to the generator's pool): the frame must be whole again.
func TestGeneratorFrames(t *testing.T) {
	testutil.Privileged(t)
	for _, tc := range []struct {
		family int
		src    string
		proto  uint8
	}{{4, "10.0.0.0/8", 17}, {6, "fd10::/32", 17}, {4, "10.0.0.0/8", 6}, {6, "fd10::/32", 6}} {
		f, err := NewTraffic(tc.family, netip.MustParsePrefix(tc.src), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if tc.proto == 6 {
			f.Proto, f.Port = 6, 80
		}
		listed := map[netip.Prefix]bool{}
		for i := range f.Count {
			listed[f.Source(i)] = true
		}
		topo := &Topology{GenIndex: 1, GenMAC: []byte{2, 0, 0, 0, 0, 1}, RxMAC: []byte{2, 0, 0, 0, 0, 2}}
		objs, err := LoadObjects(topo, f)
		if err != nil {
			t.Fatal(err)
		}
		defer objs.Close()
		frame := f.frame(topo.GenMAC, topo.RxMAC)
		ports := map[uint16]bool{}
		for i := range 200 {
			if i%2 == 1 {
				for j := range frame {
					frame[j] ^= 0x5a
				}
			}
			out := make([]byte, len(frame))
			if _, err := objs.LabGen.Run(&ebpf.RunOptions{Data: frame, DataOut: out}); err != nil {
				t.Fatal(err)
			}
			frame = out
			if !bytes.Equal(out[:12], append(slices.Clone(topo.RxMAC), topo.GenMAC...)) {
				t.Fatalf("MACs % x, want the receiver's then the generator's", out[:12])
			}
			var src netip.Prefix
			var l4 []byte
			if tc.family == 4 {
				ip := out[14:34]
				if packet.Checksum(ip) != 0 {
					t.Fatalf("IPv4 header checksum does not verify: % x", ip)
				}
				src = netip.PrefixFrom(netip.AddrFrom4([4]byte(ip[12:16])), 32)
				l4 = out[34:]
			} else {
				ip := out[14:54]
				src, _ = netip.AddrFrom16([16]byte(ip[8:24])).Prefix(64)
				l4 = out[54:]
			}
			if !listed[src] {
				t.Fatalf("source %s is not one of the flood's listed sources", src)
			}
			if !l4ChecksumOK(out, tc.family, tc.proto) {
				t.Fatalf("L4 checksum does not verify: % x", out)
			}
			if dport := binary.BigEndian.Uint16(l4[2:]); dport != f.Port {
				t.Fatalf("destination port %d, want %d", dport, f.Port)
			}
			if tc.proto == 6 && l4[13] != 0x02 {
				t.Fatalf("TCP flags %#x, want a SYN", l4[13])
			}
			sport := binary.BigEndian.Uint16(l4)
			if sport < 1024 {
				t.Fatalf("source port %d below 1024", sport)
			}
			ports[sport] = true
		}
		if len(ports) < 150 {
			t.Errorf("IPv%d proto %d: only %d distinct source ports in 200 frames", tc.family, tc.proto, len(ports))
		}
	}
}

func l4ChecksumOK(frame []byte, family int, proto uint8) bool {
	var pseudo, l4 []byte
	if family == 4 {
		ip := frame[14:34]
		l4 = frame[34:]
		pseudo = append(append([]byte{}, ip[12:20]...), 0, proto, 0, byte(len(l4)))
	} else {
		ip := frame[14:54]
		l4 = frame[54:]
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, 0, byte(len(l4)), 0, 0, 0, proto)
	}
	return packet.Checksum(append(pseudo, l4...)) == 0
}
